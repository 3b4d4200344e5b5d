"""The loop's typed state: the canvases (:class:`Canvases`), one pass's slot scores (:class:`SlotScores`) and a
step's insertions (:class:`Insertions`)."""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional

import numpy as np

from .geometry import closed_slots, slot_mask
from .ops import NEG_INF, Array, Ops
from .starts import Start


class Canvases(NamedTuple):
    """The decoding state: one row per sentence (the active ones inside the loop). Built and changed by keyword only."""

    rows: Array  # (A,) index of each row in the batch
    tokens: Array  # (A, K) canvas tokens, pad after each length
    scores: Array  # (A, K) log p(c, l) of each inserted token when inserted; 0 for constraint tokens
    closed_before: Optional[Array]  # (A, K) the slot just before token j is closed; None: no slot ever closes
    closed_end: Array  # (A,) the last slot is closed
    lengths: Array  # (A,)
    iterations: Array  # (A,) steps that inserted at least one token
    final_eos: Array  # (A,) the latest pass's end-of-slot decisions: sum of their log p(eos, l)
    max_len: Array  # (A,) length limit
    eos_penalty: Optional[Array] = None  # (A,) beta of each row (several per sentence with eos_penalties)
    given: Optional[Array] = None  # (A, K) the constraint tokens, when their word edges are kept
    shortlist: Optional[Array] = None  # (A, L) the tokens its slots may receive (slots.shortlist_rows); None: all
    fresh: Optional[Array] = None  # (A, K) tokens an incremental backend has not read yet; None: not incremental
    history: Optional[List[List[Any]]] = None  # per batch row, every canvas it went through

    def take(self, idx: Array) -> "Canvases":
        """The rows ``idx`` (N,) (the history is per batch row and stays shared)."""
        return self._replace(**{name: getattr(self, name)[idx] for name in self._fields
                                if name != "history" and getattr(self, name) is not None})

    def trimmed(self, width: int) -> "Canvases":
        """The per-token arrays cut to ``width`` columns."""
        cut = {name: getattr(self, name) for name in ("tokens", "scores", "closed_before", "given", "fresh")}
        return self._replace(**{name: value[:, :width] for name, value in cut.items() if value is not None})

    def widened(self, xp: Ops, width: int, pad: int) -> "Canvases":
        """A copy whose tokens and scores are ``width`` wide (at least as wide as now): the result buffer."""
        tokens, scores = xp.full((len(self.lengths), width), pad, like=self.tokens), \
            xp.full((len(self.lengths), width), 0.0, like=self.scores)
        K = self.tokens.shape[1]
        tokens[:, :K], scores[:, :K] = self.tokens, self.scores
        return self._replace(tokens=tokens, scores=scores, lengths=self.lengths + 0,
                             iterations=self.iterations + 0, final_eos=self.final_eos + 0)

    def store(self, done: "Canvases") -> None:
        """Write the finished rows ``done`` into this result buffer at their batch rows."""
        W, r = done.tokens.shape[1], done.rows
        self.tokens[r, :W] = done.tokens
        self.scores[r, :W] = done.scores
        for name in ("lengths", "iterations", "final_eos"):
            getattr(self, name)[r] = getattr(done, name)


class SlotScores(NamedTuple):
    """One pass's prediction for the slots of the active canvases, (A, S) each."""

    open: Array  # slots that may receive a token: real and not closed
    tokens: Array  # the best token of each open slot (eos elsewhere): bos/pad excluded, eos penalised
    log_probs: Array  # its log p(c | l) (the eos penalty included when eos wins)
    location: Array  # log p(l), -inf at padding slots
    final_eos: Array  # (A,) log-prob of this pass's end-of-slot decisions, sum of log p(eos, l), no penalty
    ends: Optional[Array] = None  # the look-ahead closure's: the next pass closes every slot this one leaves here
    end_log_probs: Optional[Array] = None  # its log-probability of that; None (both): no look-ahead


class Insertions(NamedTuple):
    """What one step inserts: ``tokens[l]`` (with score ``log_probs[l]``) into every slot l where ``mask``."""

    mask: Array  # (A, S)
    tokens: Array  # (A, S)
    log_probs: Array  # (A, S) log p(c | l)


def open_slots(xp: Ops, state: Canvases, num_slots: int) -> Array:
    """(A, S) the real slots that are not closed."""
    real = slot_mask(xp, state.lengths, num_slots)
    if state.closed_before is None:
        return real
    return real & ~closed_slots(xp, state.closed_before, state.closed_end, state.lengths, num_slots)


def slot_scores(xp: Ops, open_: Array, tokens: Array, log_probs: Array, eos_log_probs: Array, location: Array,
                eos: int, sequence: bool, ends: Optional[Array] = None, end_log_probs: Optional[Array] = None
                ) -> SlotScores:
    """A pass's :class:`SlotScores` from the model's values at the open slots (N,), row-major: the best
    token, its log p(c | l) and log p(eos | l); ``location`` (A, S) log p(l). ``sequence``: the
    end-of-sequence decision is the best (slot, eos); otherwise every slot that chose end-of-slot. ``ends``,
    ``end_log_probs`` (N,): the look-ahead closure's, or None."""
    tokens = xp.masked_put(open_, tokens, eos)  # (A, S)
    eos_joint = xp.masked_put(open_, eos_log_probs, NEG_INF) + location  # (A, S) log p(eos, l)
    final_eos = xp.amax(eos_joint, 1) if sequence else xp.where(open_ & (tokens == eos), eos_joint, 0.0).sum(1)
    ahead = {} if ends is None else {"ends": xp.masked_put(open_, ends, False),
                                     "end_log_probs": xp.masked_put(open_, end_log_probs, 0.0)}  # (A, S) each
    return SlotScores(open=open_, tokens=tokens, log_probs=xp.masked_put(open_, log_probs, 0.0), location=location,
                      final_eos=final_eos, **ahead)


def start_state(xp: Ops, start: Start, max_len: Array, eos_penalty: Optional[Array], given: bool, closes: bool,
                first_scores: Optional[Array] = None, history: bool = False, shortlist: Optional[Array] = None,
                fresh: bool = False) -> Canvases:
    """The state before the first pass from each row's ``start``. ``given``: its tokens are constraints whose
    word edges are kept; ``closes``: slots can close (constraints on the canvas, or close-ended slots), else
    the state carries no closed slots; ``first_scores`` (R, 1): the tokens are first insertions
    (:func:`first_insertions`) with these scores, inserted by one iteration; ``history``: keep every canvas;
    ``shortlist`` (R, L): each row's (:func:`fairseq_insertion.slots.shortlist_rows`); ``fresh``: keep which tokens an
    incremental backend has not read (at the start, every one)."""
    R, K = start.tokens.shape
    zeros = xp.asarray(np.zeros((R, K + 1), np.float32), like=start.lengths)  # (R, K + 1)
    real = xp.arange(K, like=start.lengths)[None, :] < start.lengths[:, None]  # (R, K)
    return Canvases(rows=xp.arange(R, like=start.lengths), tokens=start.tokens,
                    scores=zeros[:, :K] if first_scores is None else first_scores,
                    closed_before=start.closed_before if closes else None, closed_end=start.closed_end,
                    lengths=start.lengths + 0, iterations=start.lengths * (0 if first_scores is None else 1),
                    final_eos=zeros[:, K] + 0, max_len=max_len, eos_penalty=eos_penalty,
                    given=real if given else None,
                    history=[[] for _ in range(R)] if history else None, shortlist=shortlist,
                    fresh=real if fresh else None)
