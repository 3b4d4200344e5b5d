"""The slot rules: what each open slot brings to the choice of its token besides its scores (:class:`SlotInputs`,
applied by :func:`fairseq_insertion.slots.choose` on torch and :func:`~fairseq_insertion.slots.choose_graph` in
the pass graph). Each rule is a small object (:data:`RULES`, in order) that declares the pass graph's inputs it fills
(:class:`Feed`) and gives their values for a pass's open slots (docs/development.md: adding one); the graph's inputs
are made from :data:`FEEDS`, the rules' feeds in order. Tokens barred by several rules are one ``blocked`` input
(their columns side by side); with a shortlist, positions in each sentence's list."""

from __future__ import annotations

from collections import namedtuple
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import numpy as np

from .bans import repeated_tokens, word_edge_bans
from .ops import Array, Ops
from .state import Canvases
from .steps import DecodeOptions


class Feed(NamedTuple):
    """An input of the pass graph that slot rules fill, one value (or row) an open slot."""

    name: str  # the graph's input and the SlotInputs field
    dtype: Any  # numpy's
    dims: Tuple[Union[str, int], ...]  # the graph's: "open" one a slot; other names are dynamic
    fill: Any  # the value of a slot no rule fills; "pad": the dictionary's pad id


BLOCKED = Feed("blocked", np.int64, ("open", "blocked"), "pad")  # (N, M) tokens barred (pad: none)


class Pass(NamedTuple):
    """What a rule reads of one pass: the state, its framed canvases (A, S + 1) and open slots (A, S)."""

    xp: Ops
    state: Canvases
    framed: Array
    open_: Array
    options: DecodeOptions


class Repetition:
    """``block_neighbour_copies`` and ``no_repeat_ngram_size``: bar the tokens whose insertion would repeat part of
    the canvas (:func:`~fairseq_insertion.loop.bans.repeated_tokens`)."""

    feeds = (BLOCKED,)

    def values(self, p: Pass) -> Dict[str, Array]:
        o = p.options
        if not (o.config.block_neighbour_copies or o.config.no_repeat_ngram_size):
            return {}
        repeats = repeated_tokens(p.xp, p.framed, o.config.no_repeat_ngram_size, o.config.block_neighbour_copies,
                                  (o.bos, o.eos), o.pad)  # (A, S, M)
        return {"blocked": repeats[p.open_]} if repeats.shape[2] else {}  # (N, M); no column bars nothing


class NoUnk:
    """``no_unk``: never insert the unknown word."""

    feeds = (BLOCKED,)

    def values(self, p: Pass) -> Dict[str, Array]:
        o = p.options
        if not o.config.no_unk:
            return {}
        return {"blocked": p.xp.where(p.open_, o.unk, o.pad)[p.open_][:, None]}  # (N, 1)


class EosPenalty:
    """Each slot's EOS penalty (beta): the decode's, or its row's with several ``eos_penalties``."""

    feeds = (Feed("eos_penalty", np.float32, ("open", 1), 0.0),)  # (N,) or one float

    def values(self, p: Pass) -> Dict[str, Array]:
        beta = p.state.eos_penalty
        if beta is None:
            return {"eos_penalty": p.options.config.betas[0]}
        return {"eos_penalty": p.xp.where(p.open_, beta[:, None], 0.0)[p.open_]}  # (N,)


class WordEdges:
    """Next to constraint tokens: the pieces that would glue onto a constraint's word, by the slot's class (0 free,
    1 no piece joining the next token, 2 none joining the previous, 3 neither), and end-of-slot where a
    constraint's word must be completed (:func:`~fairseq_insertion.loop.bans.word_edge_bans`)."""

    feeds = (Feed("word_edges", np.int64, ("open",), 0), Feed("no_end", np.bool_, ("open", 1), False))

    def values(self, p: Pass) -> Dict[str, Array]:
        if p.state.given is None:
            return {}
        o, xp = p.options, p.xp
        no_next, no_prev, no_end = word_edge_bans(xp, p.framed, p.state.given, o.joins_next, o.eos, p.open_,
                                                  p.options.sequence)  # (N,) each
        return {"word_edges": xp.long(no_next) + 2 * xp.long(no_prev), "no_end": no_end}


RULES = (Repetition(), NoUnk(), EosPenalty(), WordEdges())
FEEDS: Tuple[Feed, ...] = tuple({f.name: f for rule in RULES for f in rule.feeds}.values())
SlotInputs = namedtuple("SlotInputs", [f.name for f in FEEDS] + ["shortlist", "slot_rows"], defaults=(None, None))
SlotInputs.__doc__ = """What the open slots (N, row-major) bring to the slot rule besides their scores: one field a
:data:`FEEDS` entry (None: every slot its fill; ``blocked`` (N, M) tokens barred, with a shortlist their positions
in it; ``eos_penalty`` (N,) each slot's beta or one float for all; ``word_edges`` (N,) each slot's word-edge class;
``no_end`` (N,) end-of-slot barred), then ``shortlist`` (A, L) each canvas's list (:attr:`Canvases.shortlist`; None:
every token) and ``slot_rows`` (N,) the canvas of each open slot, with a shortlist."""


def slot_inputs(xp: Ops, state: Canvases, framed: Array, open_: Array, options: DecodeOptions) -> SlotInputs:
    """One pass's :class:`SlotInputs` for the open slots ``open_`` (A, S) of the canvases ``framed`` (A, S + 1):
    every rule's values, the tokens barred by several side by side; with a shortlist, those as positions in it."""
    p, values = Pass(xp, state, framed, open_, options), {}
    for rule in RULES:
        for name, value in rule.values(p).items():
            values[name] = xp.concat([values[name], value], 1) if name in values else value
    if state.shortlist is None:
        return SlotInputs(**{f.name: values.get(f.name) for f in FEEDS})
    slot_rows = xp.where(open_, xp.arange(open_.shape[0], like=state.lengths)[:, None], 0)[open_]  # (N,)
    if "blocked" in values:  # pad: barred anyway
        values["blocked"] = shortlist_positions(xp, state.shortlist, slot_rows, values["blocked"], options.pad)
    return SlotInputs(**{f.name: values.get(f.name) for f in FEEDS}, shortlist=state.shortlist, slot_rows=slot_rows)


def some_slots(inputs: SlotInputs, slots: Any, rows: Optional[slice] = None) -> SlotInputs:
    """The :class:`SlotInputs` of some of the open slots: ``slots`` (a boolean mask (N,) or a slice) taken from every
    per-slot array (each :data:`FEEDS` field and ``slot_rows``; a single value and None stay as they are); ``rows``
    (a slice of the canvases, the slots' own): the shortlist's rows, the slots' rows counted from its start."""
    def take(value: Any) -> Any:
        return value[slots] if getattr(value, "ndim", 0) else value

    kept = inputs._replace(**{f.name: take(getattr(inputs, f.name)) for f in FEEDS}, slot_rows=take(inputs.slot_rows))
    if rows is None or kept.shortlist is None:
        return kept
    return kept._replace(shortlist=kept.shortlist[rows], slot_rows=kept.slot_rows - (rows.start or 0))


def fed(inputs: SlotInputs, n: int, pad: int, constant: Any) -> Dict[str, Any]:
    """The pass graph's rule inputs for ``n`` open slots: each :data:`FEEDS` entry's values, shaped as the graph
    takes them, ``constant(n, value, dtype)`` (n,) where the inputs give one value or none."""
    out = {}
    for f in FEEDS:
        value = getattr(inputs, f.name)
        if value is None or not isinstance(value, np.ndarray):
            value = constant(n, pad if value is None and f.fill == "pad" else f.fill if value is None else value,
                             f.dtype)  # (N,)
        out[f.name] = value[:, None] if len(f.dims) == 2 and value.ndim == 1 else value
    return out


_STRIDE = 1 << 32  # above any token id: rows of ids offset by it sort as one array


def shortlist_positions(xp: Ops, shortlist: Array, slot_rows: Array, tokens: Array, absent: int) -> Array:
    """(N, M) the position of each of ``tokens`` (N, M) in its slot's shortlist (``shortlist`` (A, L) ascending,
    ``slot_rows`` (N,) each slot's row), ``absent`` where the list lacks it."""
    A, Lw = shortlist.shape
    offset = slot_rows[:, None] * _STRIDE  # (N, 1)
    flat = (shortlist + xp.arange(A, like=shortlist)[:, None] * _STRIDE).reshape(-1)  # (A L,) ascending
    want = tokens + offset  # (N, M)
    at = xp.searchsorted(flat, want).clip(max=A * Lw - 1)  # (N, M)
    return xp.where(flat[at] == want, at - slot_rows[:, None] * Lw, absent)
