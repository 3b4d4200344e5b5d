"""The insertion decoding loop, written once for both backends (paper: "Inference").

Everything after the model's scores lives here: the typed state (:class:`Canvases`,
:class:`SlotScores`, :class:`Insertions`), the step rules that choose a pass's insertions
(:func:`step_rule`, small objects built from the decoding options), the room cap, how insertions
move the canvas (:func:`insertion_destinations`, :func:`place`), the closing of slots, which
sentences stop, the loop itself (:func:`run`) and the one decode driver (:func:`decode`: length
limits, first insertions, candidate rows, the initial state, the loop, the candidates' scores and
order). A backend supplies only its arrays (an :class:`Ops`: :data:`NUMPY` here, ``decoding.TORCH``
for the PyTorch generator) and a :class:`Model` with ``predict`` (the torch model, or the ONNX
session), ``reorder`` (its per-sentence memory follows the sentences that go on), ``first_tokens``
and ``score`` (an optional scorer of the candidates). What each pass hands the slot rule
(:mod:`fairseq_insertion.slots`) is built here too (:func:`slot_inputs`).

The code uses only what numpy arrays and torch tensors share (operators, ``x[idx]``, slicing,
``sum``/``any``/``argmax``/``cumsum`` along an axis, ``clip``); the rest goes through ``Ops``. One
host round trip per pass (:meth:`Ops.host`): on a GPU the loop waits for the device once a pass.

A canvas of k tokens has k + 1 slots; slot l sits just before canvas token l. Framed canvases are
``[bos] canvas [eos]``, right-padded: slot l lies between columns l and l + 1.

This module imports numpy, the standard library and :mod:`fairseq_insertion.config` only (the
deployment runtime uses it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import numpy as np

from .config import DecodingConfig

Array = Any  # a numpy array or a torch tensor: one backend's arrays
NEG_INF = float("-inf")


class Ops(Protocol):
    """The array operations the loop needs beyond what numpy and torch spell alike."""

    def arange(self, n: int, like: Array) -> Array: ...

    def full(self, shape: Tuple[int, ...], value: Any, like: Array) -> Array:
        """``value`` everywhere, of ``like``'s type and place."""

    def where(self, cond: Array, a: Any, b: Any) -> Array: ...

    def concat(self, arrays: Sequence[Array], axis: int) -> Array: ...

    def argsort(self, x: Array, descending: bool = False) -> Array:
        """Along the last axis, stable: equal values keep their order (the leftmost first)."""

    def long(self, x: Array) -> Array: ...

    def cast(self, x: Array, like: Array) -> Array: ...

    def put(self, out: Array, index: Array, values: Any) -> Array:
        """``out[r, index[r, j]] = values[r, j]`` (or a scalar), in place; returns ``out``."""

    def gather(self, x: Array, index: Array) -> Array:
        """``x[r, index[r, j]]``."""

    def masked_put(self, mask: Array, values: Array, fill: Any) -> Array:
        """(A, S) ``fill`` with ``values`` (N,) written at ``mask``, row-major."""

    def amax(self, x: Array, axis: int) -> Array: ...

    def permute(self, x: Array, dims: Tuple[int, ...]) -> Array: ...

    def asarray(self, x: np.ndarray, like: Array) -> Array:
        """A numpy array as one of this backend's, beside ``like``."""

    def host(self, *scalars: Array) -> List[int]:
        """Scalars as Python ints, in one round trip."""

    def might(self, cond: Array) -> bool:
        """False only where ``cond`` is known to hold nowhere without a round trip to a device."""

    def searchsorted(self, sorted_: Array, values: Array) -> Array:
        """Where each of ``values`` would go in the ascending 1-D ``sorted_`` (the leftmost place)."""


class NumpyOps:
    """:class:`Ops` for numpy (the deployment runtime)."""

    def arange(self, n: int, like: Array) -> Array:
        return np.arange(n)

    def full(self, shape, value, like):
        return np.full(shape, value, dtype=like.dtype)

    def where(self, cond, a, b):
        return np.where(cond, a, b)

    def concat(self, arrays, axis):
        return np.concatenate(arrays, axis)

    def argsort(self, x, descending=False):
        return np.argsort(-x if descending else x, axis=-1, kind="stable")

    def long(self, x):
        return x.astype(np.int64)

    def cast(self, x, like):
        return x.astype(like.dtype, copy=False)

    def put(self, out, index, values):
        out[np.arange(out.shape[0])[:, None], index] = values
        return out

    def gather(self, x, index):
        return np.take_along_axis(x, index, 1)

    def masked_put(self, mask, values, fill):
        if values.size == mask.size:  # every slot open: no scatter
            return values.reshape(mask.shape)
        out = np.full(mask.shape, fill, dtype=values.dtype)
        out[mask] = values
        return out

    def amax(self, x, axis):
        return x.max(axis)

    def permute(self, x, dims):
        return x.transpose(dims)

    def asarray(self, x, like):
        return x

    def host(self, *scalars):
        return [int(s) for s in scalars]

    def might(self, cond):
        return bool(cond.any())

    def searchsorted(self, sorted_, values):
        return np.searchsorted(sorted_, values)


NUMPY = NumpyOps()


# ---------------------------------------------------------------- the canvas
def frame(xp: Ops, canvas: Array, lengths: Array, bos: int, eos: int, pad: int) -> Array:
    """[bos] canvas [eos], right-padded. canvas: (B, K) -> (B, K + 2)."""
    B, K = canvas.shape
    out = xp.full((B, K + 2), pad, like=canvas)
    out[:, 0] = bos
    out[:, 1:K + 1] = canvas
    return xp.put(out, (lengths + 1)[:, None], eos)


def slot_mask(xp: Ops, lengths: Array, num_slots: int) -> Array:
    """(B, S) True for the k + 1 real slots of each canvas."""
    return xp.arange(num_slots, like=lengths)[None, :] <= lengths[:, None]


def closed_slots(xp: Ops, closed_before: Array, closed_end: Array, lengths: Array, num_slots: int) -> Array:
    """(B, S) True at the closed slots: slot l < k is the slot before token l, slot k the last one.
    closed_before: (B, K) with K < S; closed_end: (B,)."""
    K = closed_before.shape[1]
    closed = xp.full((closed_before.shape[0], num_slots), False, like=closed_end)
    closed[:, :K] = closed_before
    return xp.put(closed, lengths[:, None], closed_end[:, None])


def insertion_destinations(xp: Ops, lengths: Array, insert_mask: Array, num_tokens: int, width: int) -> Array:
    """Where every canvas token and every slot value lands after the insertions.

    lengths: (B,); insert_mask: (B, S), False beyond each canvas's k + 1 slots; num_tokens: K, the
    canvas width; width: W, at least the longest new canvas. Returns (B, K + S): the new column of
    canvas token j (first K columns) and of slot l's value (last S columns); ``W`` for what does not
    land (padding tokens, slots without an insertion). Computed once per step, applied to every
    per-token array with :func:`place`."""
    S = insert_mask.shape[1]
    ins = xp.long(insert_mask)
    before = ins.cumsum(1)  # (B, S) inserts in slots 0..l
    j = xp.arange(num_tokens, like=lengths)[None, :]
    tok_pos = xp.where(j < lengths[:, None], j + before[:, :num_tokens], width)  # (B, K) moved by the inserts before
    ins_pos = xp.where(insert_mask, xp.arange(S, like=lengths)[None, :] + before - ins, width)  # (B, S)
    return xp.concat([tok_pos, ins_pos], 1)


def place(xp: Ops, destinations: Array, canvas: Array, slot_values: Array, width: int, pad: Any) -> Array:
    """Apply :func:`insertion_destinations` to one per-token array: canvas (B, K) and the value inserted
    into each slot (B, S) -> (B, W), ``pad`` after each row's new length."""
    out = xp.full((canvas.shape[0], width + 1), pad, like=canvas)  # one spare column catches what does not land
    return xp.put(out, destinations, xp.concat([canvas, xp.cast(slot_values, canvas)], 1))[:, :width]


def insert(xp: Ops, canvas: Array, lengths: Array, slot_tokens: Array, insert_mask: Array, pad: Any
           ) -> Tuple[Array, Array]:
    """Insert ``slot_tokens[l]`` into every slot l where ``insert_mask`` (B, S): the new canvas (B, K')
    trimmed to the longest row, and the new lengths."""
    new_lengths = lengths + insert_mask.sum(1)
    width = xp.host(new_lengths.max())[0] if canvas.shape[0] > 0 else 0
    dest = insertion_destinations(xp, lengths, insert_mask, canvas.shape[1], width)
    return place(xp, dest, canvas, slot_tokens, width, pad), new_lengths


def repeated_tokens(xp: Ops, framed: Array, ngram: int, neighbours: bool, special: Tuple[int, ...],
                    pad: int) -> Array:
    """Per slot, the tokens whose insertion would repeat part of the canvas.

    framed: (B, T + 2) ``[bos] canvas [eos]``, right-padded with ``pad`` (S = T + 1 slots).
    ``neighbours``: a copy of either neighbour of the slot (``a a b`` from ``a b``). ``ngram`` n >= 2:
    a token c such that an n-gram of the canvas after inserting c into slot l, one that holds c,
    already occurs in the framed canvas (bos/eos count as context) and survives the insertion
    (n-grams spanning slot l are broken by it). Each slot is judged against the current canvas.
    Tokens in ``special`` are never returned. Returns (B, S, M) token ids, ``pad`` where a column
    holds nothing (M = 0 when both rules are off)."""
    B, W = framed.shape
    S = W - 1
    columns = []
    if neighbours:
        columns.append(xp.concat([framed[:, :-1, None], framed[:, 1:, None]], -1))  # (B, S, 2)
    n = int(ngram)
    blank = None  # the n-gram rule's columns on canvases that repeat no token: nothing blocked
    if n >= 2 and W >= n and not xp.might(repeats_a_token(xp, framed, pad)):
        blank = xp.full((B, S, n * (W - n + 1)), pad, like=framed)
    elif n >= 2 and W >= n:  # every offset i of the inserted token in the n-gram at once
        context_cols, rest_cols, token_cols, apart = (xp.asarray(a, like=framed) for a in _ngram_geometry(W, n))
        real = framed != pad
        ext = xp.full((B, W + 2 * n - 2), -1, like=framed)  # the framed canvas, -1 outside it
        ext[:, n - 1:n - 1 + W] = xp.where(real, framed, -1)
        windows = xp.where(real, framed, -2)  # -2 at padding: never matches
        context = ext[:, context_cols]  # (B, n, S, n-1): the slot's n-1 neighbours at offset i
        rest = windows[:, rest_cols]  # (B, n, J, n-1): each window without its offset i
        match = (context[:, :, :, None, :] == rest[:, :, None, :, :]).all(-1) & apart  # (B, n, S, J)
        found = xp.where(match, windows[:, token_cols][:, :, None, :], pad)  # (B, n, S, J)
        columns.append(xp.permute(found, (0, 2, 1, 3)).reshape(B, S, -1))
    if not columns:
        return xp.full((B, S, 0), pad, like=framed) if blank is None else blank
    out = xp.concat(columns, -1) if len(columns) > 1 else columns[0]  # (B, S, M)
    never = out < 0
    for s in special:
        never = never | (out == s)
    out = xp.where(never, pad, out)
    return out if blank is None else xp.concat([out, blank], -1)


def repeats_a_token(xp: Ops, framed: Array, pad: int) -> Array:
    """(B,) whether row b's real tokens hold one token twice. An n-gram rule blocks a token only where the canvas
    repeats one (the slot's context and the n-gram it matches lie at different positions): with none,
    :func:`repeated_tokens` skips the rule."""
    real = framed != pad  # (B, W)
    same = (framed[:, :, None] == framed[:, None, :]) & real[:, :, None]  # (B, W, W), the diagonal at real tokens
    return same.sum((1, 2)) > real.sum(1)


@functools.lru_cache(maxsize=256)
def _ngram_geometry(W: int, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Index arrays of :func:`repeated_tokens` for framed width W and n-grams (cached): the columns (of the framed
    canvas padded by n-1 on each side) holding slot l's context at offset i, framed columns
    l-i+1 .. l-i+n-1 (n, S, n-1); the columns of each window without its offset i (n, J, n-1) and at it
    (n, J); and which windows survive an insertion into each slot (S, J): those not spanning it."""
    S, J = W - 1, W - n + 1
    slot, start, offset = np.arange(S), np.arange(J), np.arange(n)
    others = np.asarray([[j for j in range(n) if j != i] for i in range(n)])  # (n, n-1)
    context = (slot[None, :] - offset[:, None])[:, :, None] + np.arange(n - 1)[None, None, :] + n
    rest = start[None, :, None] + others[:, None, :]  # (n, J, n-1)
    token = start[None, :] + offset[:, None]  # (n, J)
    spans = (start[None, :] <= slot[:, None]) & (start[None, :] >= slot[:, None] - n + 2)  # (S, J)
    return context, rest, token, ~spans


def word_edge_slots(xp: Ops, framed: Array, given: Array, joins_next: Array, eos: int) -> Tuple[Array, Array, Array]:
    """Per slot, what the word-edge rule forbids next to the given (constraint) tokens.

    framed: (B, K+2); given: (B, K) the canvas tokens that are constraint tokens; joins_next: (V,)
    bool, the entries that form one word with the token after them (subword-nmt's ``x@@``), False
    for the special symbols. Returns three (B, S) bool arrays, read at the open slots only:
    no_next (no token that joins the next one: the slot right before a constraint token, or one
    that must complete a word), no_prev (no token that joins the previous one: the slot right after
    a constraint token) and no_end (no end-of-slot: its left neighbour is a constraint token that
    continues into the next token, ``schö@@``, and its right neighbour is end-of-sentence or a
    constraint token)."""
    edge = xp.full((given.shape[0], 1), False, like=given)  # bos and eos are not given
    left_given, right_given = xp.concat([edge, given], 1), xp.concat([given, edge], 1)  # (B, S)
    complete = left_given & joins_next[framed[:, :-1]] & (right_given | (framed[:, 1:] == eos))
    return right_given | complete, left_given, complete


def word_edge_bans(xp: Ops, framed: Array, given: Array, joins_next: Array, eos: int, open_: Array,
                   sequence: bool) -> Tuple[Array, Array, Array]:
    """The word-edge rule at the open slots ``open_`` (A, S), for both backends: (no_next, no_prev,
    no_end), (N,) each, row-major (:func:`word_edge_slots`); with sequence finalization (``sequence``), no
    end-of-sequence while a sentence has a slot that must complete a constraint's word."""
    no_next, no_prev, no_end = word_edge_slots(xp, framed, given, joins_next, eos)  # (A, S)
    if sequence:
        no_end = no_end.any(1)[:, None] & open_
    return no_next[open_], no_prev[open_], no_end[open_]


# the subword schemes whose word edges the decoder keeps at constraints (fairseq's --post-process names); a
# dictionary's entries say which one it uses (word_edge_table)
WORD_SCHEMES = ("subword_nmt", "_EOW", "sentencepiece", "none")
SENTENCEPIECE_SPACE = "\u2581"


def word_edge_table(symbols: Sequence[str], nspecial: int, scheme: Optional[str] = None
                    ) -> Tuple[str, np.ndarray, np.ndarray]:
    """Which entries of a vocabulary glue onto a neighbour in the post-processed text: (scheme,
    joins_next (V,), joins_prev (V,)); the first ``nspecial`` entries (bos, pad, eos, unk) glue onto
    nothing.

    ``subword_nmt`` (``@@ ``): a piece ending in ``@@`` joins the next token. ``_EOW``: a piece not
    ending in ``_EOW`` joins the next token. ``sentencepiece`` (``\u2581`` starts a word): a piece without
    it that holds a letter or digit joins the previous token (punctuation after a word keeps the word
    whole). ``none``: every token is a word. ``scheme`` None: the one most entries are marked for."""
    words = symbols[nspecial:]
    if scheme is None:
        marked = {"subword_nmt": sum(w.endswith("@@") for w in words),
                  "_EOW": sum(w.endswith("_EOW") for w in words),
                  "sentencepiece": sum(w.startswith(SENTENCEPIECE_SPACE) for w in words)}
        best = max(marked, key=marked.get)
        scheme = best if marked[best] else "none"
    if scheme not in WORD_SCHEMES:
        raise ValueError(f"word scheme must be one of {WORD_SCHEMES}, got {scheme!r}")
    if scheme == "subword_nmt":
        nxt = [w.endswith("@@") for w in symbols]
    elif scheme == "_EOW":
        nxt = [not w.endswith("_EOW") for w in symbols]
    else:
        nxt = [False] * len(symbols)
    prev = [scheme == "sentencepiece" and not w.startswith(SENTENCEPIECE_SPACE) and any(c.isalnum() for c in w)
            for w in symbols]
    keep = np.arange(len(symbols)) >= nspecial
    return scheme, np.asarray(nxt, dtype=bool) & keep, np.asarray(prev, dtype=bool) & keep


def gather_canvas(xp: Ops, target: Array, keep: Array, pad: Any) -> Tuple[Array, Array]:
    """The kept tokens in target order, left-aligned and padded: target, keep (B, N) -> the canvas (B, K),
    K the largest kept count (at least 0 columns), and its lengths (B,)."""
    B, N = target.shape
    lengths = xp.long(keep).sum(1)  # (B,)
    pos = xp.arange(N, like=lengths)[None, :]
    order = xp.argsort(xp.where(keep, pos, pos + N))  # (B, N) kept first, in order
    K = xp.host(lengths.max())[0] if B > 0 else 0
    within = xp.arange(K, like=lengths)[None, :] < lengths[:, None]  # (B, K)
    return xp.where(within, xp.gather(target, order[:, :K]), pad), lengths


# ---------------------------------------------------------------- constraints on the initial canvas
class Start(NamedTuple):
    """Where a decode starts: the empty canvas, or one holding hard constraints."""

    tokens: Array  # (B, K) padded with pad
    lengths: Array  # (B,)
    closed_before: Array  # (B, K) the slot just before token j is closed
    closed_end: Array  # (B,) the last slot is closed
    segment: Array  # (B, K) the index of the constraint each token comes from

    @classmethod
    def blank(cls, xp: Ops, batch: int, like: Array, pad: int) -> "Start":
        """The unconstrained start of ``batch`` rows: empty canvases, every slot open; ``like``: an int64 array."""
        none = xp.full((batch, 0), pad, like=like)
        zeros = xp.full((batch,), 0, like=like)
        return cls(tokens=none, lengths=zeros, closed_before=none != none, closed_end=zeros > 0, segment=none + 0)

    def take(self, idx: Array) -> "Start":
        """The rows ``idx`` (N,), e.g. each sentence's once per candidate."""
        return type(self)(*(t[idx] for t in self))


def length_limits(xp: Ops, max_len: Array, empty: Array, given: Array, limit: int) -> Tuple[Array, Array]:
    """Each sentence's length limit once it holds ``given`` (B,) constraint tokens, and the sentences whose
    constraints do not fit it (B,) (their output is empty). max_len: (B,) the limit from the source
    length; empty: (B,) sources without a word, decoded from their constraints (their limit at least the
    constraints' length, at most ``limit``) or to an empty output."""
    unsourced = xp.where(given > 0, xp.where(given > max_len, given, max_len).clip(max=limit), 0)
    max_len = xp.where(empty, unsourced, max_len)
    return max_len, given > max_len


def pack(constraints: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """fairseq's packed form (``fairseq.token_generation_constraints.pack_constraints``) of every sentence's
    constraints (token id lists): (B, C) ``[m, c_1 tokens, 0, c_2 tokens, 0, ...]``, 0 after."""
    rows = [[len(cs)] + [t for c in cs for t in (*c, 0)] for cs in constraints]
    out = np.zeros((len(rows), max((len(r) for r in rows), default=0)), dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
    return out


def constraint_canvas(xp: Ops, packed: Array, gap: int, pad: int) -> Start:
    """The initial canvas of a constrained decode, from fairseq's packed constraints.

    packed: (B, C) in ``fairseq.token_generation_constraints.pack_constraints`` form:
    ``[m, c_1 tokens, 0, c_2 tokens, 0, ..., 0 ...]`` (m constraints, each followed by a 0). A ``gap``
    token inside a constraint marks an open slot (a template's ``___``); it is not put on the canvas.

    Which slots are closed (never receive an insertion): the slot between two adjacent tokens of one
    constraint, unless a gap separates them; the slot before the first token (slot 0) when the first
    constraint is a template (holds a gap) that does not start with a gap; the last slot when the last
    constraint is a template that does not end with a gap. Slots between constraints are open."""
    B = packed.shape[0]
    m = packed[:, 0] if packed.shape[1] > 0 else xp.full((B,), 0, like=packed)  # (B,)
    body = xp.concat([packed[:, 1:], xp.full((B, 1), 0, like=packed)], 1)  # (B, M) a final 0 closes a cut row
    sep = body == 0
    segment = xp.long(sep).cumsum(1) - xp.long(sep)  # (B, M) constraint index of every position
    inside = segment < m[:, None]
    is_gap = (body == gap) & ~sep & inside
    real = ~sep & inside & ~is_gap  # (B, M) tokens that go on the canvas
    glued = real & xp.concat([xp.full((B, 1), False, like=real), real[:, :-1]], 1)  # preceded by a real token
    first_template = (is_gap & (segment == 0)).any(1)  # (B,) templates anchor the sentence start / end
    last_template = (is_gap & (segment == (m - 1)[:, None])).any(1)
    closes_last = sep & (segment + 1 == m[:, None])  # (B, M) the 0 that ends the last constraint
    last_pos = (xp.long(closes_last).argmax(1) - 1).clip(min=0)  # (B,) its last position
    ends_with_gap = xp.gather(is_gap, last_pos[:, None])[:, 0]
    closed_start = first_template & ~is_gap[:, 0]
    closed_end = last_template & ~ends_with_gap & (m > 0)
    tokens, lengths = gather_canvas(xp, body, real, pad)  # (B, K)
    keep_pos, _ = gather_canvas(xp, xp.arange(body.shape[1], like=body)[None, :] + body * 0, real, 0)  # (B, K)
    K = tokens.shape[1]
    within = xp.arange(K, like=body)[None, :] < lengths[:, None]  # (B, K)
    first = xp.arange(K, like=body)[None, :] == 0
    closed_before = (xp.gather(glued, keep_pos) | (first & closed_start[:, None])) & within
    return Start(tokens=tokens, lengths=lengths, closed_before=closed_before, closed_end=closed_end,
                 segment=xp.gather(segment, keep_pos))


# ---------------------------------------------------------------- the state of the loop
class Canvases(NamedTuple):
    """The decoding state: one row per sentence (the active ones inside the loop). Built and changed by
    keyword only."""

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
    history: Optional[List[List[Any]]] = None  # per batch row, every canvas it went through

    def take(self, idx: Array) -> "Canvases":
        """The rows ``idx`` (N,) (the history is per batch row and stays shared)."""
        return self._replace(**{name: getattr(self, name)[idx] for name in _ROW_FIELDS
                                if getattr(self, name) is not None})

    def trimmed(self, width: int) -> "Canvases":
        """The per-token arrays cut to ``width`` columns."""
        return self._replace(**{name: getattr(self, name)[:, :width] for name in _TOKEN_FIELDS
                                if getattr(self, name) is not None})

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
        self.lengths[r] = done.lengths
        self.iterations[r] = done.iterations
        self.final_eos[r] = done.final_eos


_ROW_FIELDS = tuple(f for f in Canvases._fields if f != "history")
_TOKEN_FIELDS = ("tokens", "scores", "closed_before", "given")


class SlotScores(NamedTuple):
    """One pass's prediction for the slots of the active canvases, (A, S) each."""

    open: Array  # slots that may receive a token: real and not closed
    tokens: Array  # the best token of each open slot (eos elsewhere): bos/pad excluded, eos penalised
    log_probs: Array  # its log p(c | l) (the eos penalty included when eos wins)
    location: Array  # log p(l), -inf at padding slots
    final_eos: Array  # (A,) log-prob of this pass's end-of-slot decisions, sum of log p(eos, l), no penalty


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
                eos: int, sequence: bool) -> SlotScores:
    """A pass's :class:`SlotScores` from the model's values at the open slots (N,), row-major: the best
    token, its log p(c | l) and log p(eos | l); ``location`` (A, S) log p(l). ``sequence``: the
    end-of-sequence decision is the best (slot, eos); otherwise every slot that chose end-of-slot."""
    tokens = xp.masked_put(open_, tokens, eos)  # (A, S)
    eos_joint = xp.masked_put(open_, eos_log_probs, NEG_INF) + location  # (A, S) log p(eos, l)
    final_eos = xp.amax(eos_joint, 1) if sequence else xp.where(open_ & (tokens == eos), eos_joint, 0.0).sum(1)
    return SlotScores(open=open_, tokens=tokens, log_probs=xp.masked_put(open_, log_probs, 0.0), location=location,
                      final_eos=final_eos)


class SlotInputs(NamedTuple):
    """What the open slots (N, row-major) bring to the slot rule (:mod:`fairseq_insertion.slots`) besides their
    scores."""

    blocked: Optional[Array]  # (N, M) tokens barred (pad: none), with a shortlist their positions in it;
    # None: nothing barred
    eos_penalty: Any  # (N,) each slot's beta, or one beta (a float) for all
    classes: Optional[Array]  # (N,) word-edge class (0 free, 1 no piece joining the next token, 2 the previous,
    # 3 either); None: every slot 0
    no_end: Optional[Array]  # (N,) end-of-slot barred; None: nowhere
    shortlist: Optional[Array] = None  # (A, L) each canvas's shortlist (Canvases.shortlist); None: every token
    slot_rows: Optional[Array] = None  # (N,) the canvas of each open slot, with a shortlist


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


def slot_inputs(xp: Ops, state: Canvases, framed: Array, open_: Array, config: DecodingConfig, sequence: bool,
                joins_next: Array, bos: int, eos: int, pad: int) -> SlotInputs:
    """One pass's :class:`SlotInputs` for the open slots ``open_`` (A, S) of the canvases ``framed`` (A, S + 1):
    the repetition rules' blocked tokens, each slot's EOS penalty, and next to constraint tokens (``state.given``)
    the word-edge rule (``sequence``: sequence finalization; ``joins_next`` (V,) the pieces that join the next
    token)."""
    blocked = None
    if config.block_neighbour_copies or config.no_repeat_ngram_size:
        repeats = repeated_tokens(xp, framed, config.no_repeat_ngram_size, config.block_neighbour_copies, (bos, eos),
                                  pad)  # (A, S, M)
        blocked = repeats[open_] if repeats.shape[2] else None  # (N, M); zero columns block nothing
    penalty = config.betas[0] if state.eos_penalty is None else \
        xp.where(open_, state.eos_penalty[:, None], 0.0)[open_]  # (N,)
    listed = {}
    if state.shortlist is not None:
        slot_rows = xp.where(open_, xp.arange(open_.shape[0], like=state.lengths)[:, None], 0)[open_]  # (N,)
        listed = dict(shortlist=state.shortlist, slot_rows=slot_rows)
        if blocked is not None:
            blocked = shortlist_positions(xp, state.shortlist, slot_rows, blocked, pad)  # pad: barred anyway
    if state.given is None:
        return SlotInputs(blocked=blocked, eos_penalty=penalty, classes=None, no_end=None, **listed)
    no_next, no_prev, no_end = word_edge_bans(xp, framed, state.given, joins_next, eos, open_, sequence)  # (N,) each
    return SlotInputs(blocked=blocked, eos_penalty=penalty, classes=xp.long(no_next) + 2 * xp.long(no_prev),
                      no_end=no_end, **listed)


# ---------------------------------------------------------------- the step rules
@dataclass(frozen=True)
class ParallelStep:
    """Insert the best token into every open slot whose best is not end-of-slot, at most ``room`` (A,)
    per canvas: the highest-scoring ones (:func:`cap`)."""

    xp: Ops
    eos: int

    def __call__(self, p: SlotScores, room: Array) -> Insertions:
        return Insertions(mask=cap(self.xp, p.open & (p.tokens != self.eos), p.log_probs, room), tokens=p.tokens,
                          log_probs=p.log_probs)


@dataclass(frozen=True)
class GreedySlotStep:
    """Slot finalization: the one (slot, token) with the best log p(c, l) among the slots whose best
    token is not end-of-slot."""

    xp: Ops
    eos: int

    def __call__(self, p: SlotScores, room: Array) -> Insertions:
        ok = p.open & (p.tokens != self.eos)  # (A, S)
        slot = self.xp.where(ok, p.log_probs + p.location, NEG_INF).argmax(1)  # (A,)
        return Insertions(mask=_one_hot(self.xp, slot, ok) & ok.any(1)[:, None], tokens=p.tokens,
                          log_probs=p.log_probs)


@dataclass(frozen=True)
class GreedySequenceStep:
    """Sequence finalization: the best (slot, token) over every open slot and the whole vocabulary (each
    slot's best token is its best over the vocabulary); stop when it is end-of-sequence."""

    xp: Ops
    eos: int

    def __call__(self, p: SlotScores, room: Array) -> Insertions:
        xp = self.xp
        slot = xp.where(p.open, p.log_probs + p.location, NEG_INF).argmax(1)[:, None]  # (A, 1)
        ok = (xp.gather(p.tokens, slot) != self.eos) & xp.gather(p.open, slot)  # (A, 1)
        return Insertions(mask=_one_hot(xp, slot[:, 0], p.open) & ok, tokens=p.tokens, log_probs=p.log_probs)


StepRule = Callable[[SlotScores, Array], Insertions]


def step_rule(xp: Ops, decoding: str, termination: str, eos: int) -> StepRule:
    """The decoding rule: ``parallel``, or ``greedy`` with the model's training termination (``slot``
    or ``sequence`` finalization)."""
    if decoding == "parallel":
        return ParallelStep(xp, eos)
    return GreedySlotStep(xp, eos) if termination == "slot" else GreedySequenceStep(xp, eos)


def cap(xp: Ops, insert: Array, score: Array, room: Array) -> Array:
    """Keep at most ``room`` (A,) insertions per row, the highest-scoring ones; of equal scores, the
    leftmost slots (a stable sort). (A, S)."""
    if not xp.might((insert.sum(1) > room).any()):
        return insert
    order = xp.argsort(xp.where(insert, score, NEG_INF), descending=True)  # (A, S)
    return insert & (xp.argsort(order) < room[:, None])


def _one_hot(xp: Ops, index: Array, like: Array) -> Array:
    return xp.arange(like.shape[1], like=index)[None, :] == index[:, None]


# ---------------------------------------------------------------- the loop
class Backend(Protocol):
    """The model's side of the loop: its arrays and one pass."""

    xp: Ops

    def predict(self, state: Canvases, memory: Any, bounds: "Bounds") -> SlotScores:
        """One pass: the best token and its log p(c | l) for every open slot of ``state`` (a model's backend:
        :func:`predict` with its :data:`ScoreSlots`)."""

    def reorder(self, memory: Any, rows: Array) -> Any:
        """The per-sentence memory (the encoder's output) of the rows ``rows`` (N,), in order."""


class Bounds(NamedTuple):
    """How a decode steps and stops."""

    rule: StepRule
    max_iterations: int  # 0: each row's length limit
    close_ended: bool  # a slot that chose end-of-slot stays closed (slot finalization)
    eos: int
    pad: int
    sequence: bool = False  # greedy sequence finalization: end-of-sequence is the best (slot, eos) of a canvas
    max_per_pass: int = 0  # the most insertions a pass into one canvas (0: as many as its room)

    @classmethod
    def build(cls, xp: Ops, config: DecodingConfig, termination: str, eos: int, pad: int) -> "Bounds":
        """From the decoding options: the step rule (``decoding``, with the model's ``termination``), the
        iteration bound, ``close_ended_slots`` (which only slot-finalization models use), whether the
        end-of-sequence decision is a canvas's best (slot, eos) (greedy decoding of a sequence-finalization
        model) and ``max_per_pass``."""
        return cls(rule=step_rule(xp, config.decoding, termination, eos), max_iterations=config.max_iterations,
                   close_ended=config.close_ended_slots and termination == "slot",
                   sequence=config.decoding == "greedy" and termination == "sequence", eos=eos, pad=pad,
                   max_per_pass=config.max_per_pass)


ScoreSlots = Callable[[Array, Array, SlotInputs], Tuple[Array, Array, Array, Array]]
"""A backend's model and slot rule over one pass's open slots: (``framed`` (A, S + 1), ``open_`` (A, S), their
:class:`SlotInputs`) -> each open slot's best token, its log p(c | l) and log p(eos | l) (N,) each, row-major, and
log p(l) (A, S)."""


def predict(xp: Ops, state: Canvases, bounds: Bounds, config: DecodingConfig, joins_next: Optional[Array], bos: int,
            score: ScoreSlots) -> SlotScores:
    """One pass's :class:`SlotScores`, the sequence around the model that every backend runs: the framed canvases,
    their open slots, the slots' inputs to the slot rule
    (:func:`slot_inputs`: ``config``'s repetition rules and betas, ``joins_next`` (V,) for the word-edge rule),
    the backend's ``score`` and :func:`slot_scores`."""
    framed = frame(xp, state.tokens, state.lengths, bos, bounds.eos, bounds.pad)  # (A, K + 2)
    open_ = open_slots(xp, state, state.tokens.shape[1] + 1)  # (A, S)
    inputs = slot_inputs(xp, state, framed, open_, config, bounds.sequence, joins_next, bos, bounds.eos, bounds.pad)
    tokens, log_probs, eos_log_probs, location = score(framed, open_, inputs)  # (N,) each, (A, S)
    return slot_scores(xp, open_, tokens, log_probs, eos_log_probs, location, bounds.eos, bounds.sequence)


class Pass(NamedTuple):
    """The state after one pass's insertions, and which rows go on."""

    state: Canvases
    keep: Array  # (A,)
    n_keep: int
    kept_width: int  # the longest kept canvas


Record = Callable[[Canvases, Array], None]


def starting(xp: Ops, state: Canvases) -> Tuple[Array, Array]:
    """Where the loop starts: (A,) the rows that take a first pass (below their length limit, with an open slot),
    and (A,) the room of each, the most tokens it may still take (their largest is the iteration bound where
    ``max_iterations`` is 0)."""
    start = (state.max_len > state.lengths) & open_slots(xp, state, state.tokens.shape[1] + 1).any(1)
    return start, (state.max_len - state.lengths).clip(min=0)


def predict_and_step(backend: Backend, bounds: Bounds, state: Canvases, memory: Any, max_iter: int) -> Pass:
    """One pass: the backend's prediction for the open slots, the step rule's insertions and :func:`step`."""
    scores = backend.predict(state, memory, bounds)
    room = state.max_len - state.lengths  # (A,)
    choice = bounds.rule(scores, room.clip(max=bounds.max_per_pass) if bounds.max_per_pass else room)
    return step(backend.xp, state, scores, choice, max_iter, bounds)


def run(backend: Backend, state: Canvases, memory: Any, bounds: Bounds, record: Optional[Record] = None
        ) -> Tuple[Canvases, int]:
    """The insertion loop from ``state``: predict, choose, insert, stop, with finished sentences leaving
    the batch. Closed slots never receive an insertion and count as finished. ``record(state,
    inserted)``: called after every pass (the canvases' history). Returns the final canvases of every
    row, in batch order, and the number of forward passes."""
    xp = backend.xp
    B, K = state.tokens.shape
    start, rooms = starting(xp, state)  # (B,) each
    width, room, n_active, started_width = xp.host(
        state.max_len.max(), rooms.max(), start.sum(), (state.lengths * start).max()) if B else (0, 0, 0, 0)
    out = state.widened(xp, max(width, K), bounds.pad)  # the result, filled in as sentences finish
    max_iter = bounds.max_iterations or room
    state, memory = _keep(backend, state, memory, start, n_active, started_width)
    passes = 0
    for _ in range(max_iter + 1):
        if n_active == 0:
            break
        after = predict_and_step(backend, bounds, state, memory, max_iter)
        passes += 1
        if record is not None:
            record(after.state, after.state.lengths > state.lengths)  # the rows that inserted a token
        state = after.state
        if after.n_keep < n_active:
            out.store(state.take(xp.argsort(xp.long(after.keep))[:n_active - after.n_keep]))  # the finished
            state, memory = _keep(backend, state, memory, after.keep, after.n_keep, after.kept_width)
        n_active = after.n_keep
    if n_active:
        out.store(state)
    return out, passes


def step(xp: Ops, state: Canvases, scores: SlotScores, choice: Insertions, max_iter: int, bounds: Bounds) -> Pass:
    """Apply one step's insertions to every per-token array; say which sentences go on (the pass's one
    host round trip): those that inserted something, are below their length limit and their
    iteration bound."""
    new_len = state.lengths + choice.mask.sum(1)  # (A,)
    inserted = choice.mask.any(1)
    iterations = state.iterations + xp.long(inserted)
    keep = inserted & (new_len < state.max_len) & (iterations < max_iter)
    width, n_keep, kept_width = xp.host(new_len.max(), keep.sum(), (new_len * keep).max())
    K = state.tokens.shape[1]
    dest = insertion_destinations(xp, state.lengths, choice.mask, K, width)  # (A, K+S)
    closed_before, closed_end = state.closed_before, state.closed_end
    none = choice.mask & False  # (A, S) no slot value: a new token opens the slots on both its sides
    if bounds.close_ended:  # the slots that chose end-of-slot close; slot l < k is the one before token l
        ended = scores.open & (scores.tokens == bounds.eos)  # (A, S)
        closed_end = closed_end | xp.gather(ended, state.lengths[:, None])[:, 0]
        closed_before = closed_before | (ended[:, :K] & slot_mask(xp, state.lengths - 1, K))
    new = state._replace(
        tokens=place(xp, dest, state.tokens, choice.tokens, width, bounds.pad),
        scores=place(xp, dest, state.scores, choice.log_probs + scores.location, width, 0.0),  # log p(c, l)
        closed_before=None if closed_before is None else place(xp, dest, closed_before, none, width, False),
        given=None if state.given is None else place(xp, dest, state.given, none, width, False),
        closed_end=closed_end, lengths=new_len, iterations=iterations, final_eos=scores.final_eos)
    return Pass(state=new, keep=keep, n_keep=n_keep, kept_width=kept_width)


def _keep(backend: Backend, state: Canvases, memory: Any, keep: Array, n_keep: int, width: int
          ) -> Tuple[Canvases, Any]:
    """The rows ``keep`` (A,) of the state and of the memory (``n_keep`` of them), longest canvas first (a backend
    may then run the longer and the shorter rows of a pass apart, with less padding), the canvases trimmed to
    ``width``, the longest kept one (so a single canvas has no padding)."""
    if n_keep == len(keep):
        return state, memory
    xp = backend.xp
    idx = xp.argsort(xp.where(keep, state.lengths + 1, 0), descending=True)[:n_keep]  # kept rows, longest first
    return state.take(idx).trimmed(width), backend.reorder(memory, idx)


# ---------------------------------------------------------------- candidates
def candidate_scores(log_prob: Array, lengths: Array, lenpen: float, teacher: Optional[Array] = None,
                     weight: float = 0.0) -> Array:
    """(R,) each candidate's score, by which its sentence's candidates are ordered: the decode's
    log-probability ``log_prob`` (R,) / (n + 1) ** lenpen, its n tokens and the end; with a scorer's
    log-probabilities ``teacher`` (R,) (the end included), the scorer's / (n + 1) ** lenpen + ``weight`` x
    the decode's (``--rerank-weight``)."""
    norm = (lengths + 1) ** lenpen  # (R,)
    return log_prob / norm if teacher is None else (teacher + weight * log_prob) / norm


def first_insertion_inputs(xp: Ops, batch: int, unk: int, like: Array, shortlist: Optional[Array] = None
                           ) -> SlotInputs:
    """The :class:`SlotInputs` of the empty canvases' one slot when choosing first insertions
    (:func:`first_insertions`): unk barred, end-of-slot barred, no penalty; ``like``: an int64 array;
    ``shortlist`` (B, L): each sentence's (unk's position there is its id)."""
    blocked = xp.full((batch, 1), unk, like=like)  # (B, 1)
    return SlotInputs(blocked=blocked, eos_penalty=0.0, classes=None, no_end=blocked[:, 0] == unk,
                      shortlist=shortlist, slot_rows=None if shortlist is None else xp.arange(batch, like=like))


def candidate_targets(xp: Ops, tokens: Array, lengths: Array, eos: int, pad: int) -> Array:
    """(R, W) each candidate as a scorer reads it: its first ``lengths`` (R,) of ``tokens`` (R, K), the end, then
    ``pad``; W the longest plus one."""
    W = xp.host(lengths.max())[0] + 1
    target = xp.full((tokens.shape[0], W), pad, like=tokens)
    width = min(W, tokens.shape[1])
    target[:, :width] = tokens[:, :width]
    columns = xp.arange(W, like=lengths)[None, :]
    return xp.where(columns < lengths[:, None], target, xp.where(columns == lengths[:, None], eos, pad))


def best_first(xp: Ops, scores: Array, n: int) -> Array:
    """(B, n) each sentence's ``n`` candidates (rows b n ... b n + n - 1 of ``scores`` (B n,)), the best first;
    ties keep the row order (the lower EOS penalty's index first)."""
    return xp.argsort(scores.reshape(-1, n), descending=True)


def first_insertions(xp: Ops, tokens: Array, log_probs: Array, room: Array, pad: int) -> Tuple[Start, Array]:
    """The starts of branching decodes (``first_insertions``): row b K + j holds sentence b's j-th best first
    insertion ``tokens`` (B, K) (each backend's K best tokens of the empty canvas's one slot, end-of-slot,
    bos, pad and unk excluded, best first), its slots open, scored ``log_probs`` (B, K) (log p(c | l); the
    one slot's log p(l) is 0); a sentence without ``room`` (B,) for a token (its length limit is 0)
    starts empty. Returns the starts of the B K rows and their tokens' scores (B K, 1)."""
    placed = (room[:, None] & (tokens == tokens)).reshape(-1)  # (B K,)
    start = xp.where(placed[:, None], tokens.reshape(-1, 1), pad)  # (B K, 1)
    scores = xp.where(placed[:, None], log_probs.reshape(-1, 1), 0.0)  # (B K, 1)
    shut = start != start  # (B K, 1) no slot closed
    return Start(tokens=start, lengths=xp.long(placed), closed_before=shut, closed_end=placed & False,
                 segment=xp.long(shut)), scores


def candidate_rows(xp: Ops, batch: int, branches: int, betas: int, like: Array) -> Tuple[Array, Array]:
    """The rows of a decode with candidates: row (b K + j) n + c is sentence b's j-th first insertion (of K
    ``branches``) under its c-th EOS penalty (of n ``betas``). Returns each row's sentence (B K n,) and its
    start row (B K n,) (sentence b's, or its j-th first insertion's row b K + j)."""
    rows = xp.arange(batch * branches * betas, like=like)  # (B K n,)
    return rows // (branches * betas), rows // betas


# ---------------------------------------------------------------- the decode driver
def length_limit(xp: Ops, src_lengths: Array, config: DecodingConfig, limit: int) -> Array:
    """(B,) each sentence's length limit from its source length ``src_lengths`` (B,) (its end-of-sentence
    marker included, as fairseq counts it): ``max_len_a * length + max_len_b`` in float32, as fairseq's, at
    most ``limit`` (the model's target positions less the frame's two)."""
    scaled = xp.cast(src_lengths, like=xp.asarray(np.zeros(0, np.float32), like=src_lengths))
    return xp.long(scaled * config.max_len_a + config.max_len_b).clip(min=0, max=limit)


def start_state(xp: Ops, start: Start, max_len: Array, eos_penalty: Optional[Array], given: bool, closes: bool,
                first_scores: Optional[Array] = None, history: bool = False, shortlist: Optional[Array] = None
                ) -> Canvases:
    """The state before the first pass from each row's ``start``. ``given``: its tokens are constraints whose
    word edges are kept; ``closes``: slots can close (constraints on the canvas, or close-ended slots), else
    the state carries no closed slots; ``first_scores`` (R, 1): the tokens are first insertions
    (:func:`first_insertions`) with these scores, inserted by one iteration; ``history``: keep every canvas;
    ``shortlist`` (R, L): each row's (:func:`fairseq_insertion.slots.shortlist_rows`)."""
    R, K = start.tokens.shape
    zeros = xp.asarray(np.zeros((R, K + 1), np.float32), like=start.lengths)  # (R, K + 1)
    return Canvases(rows=xp.arange(R, like=start.lengths), tokens=start.tokens,
                    scores=zeros[:, :K] if first_scores is None else first_scores,
                    closed_before=start.closed_before if closes else None, closed_end=start.closed_end,
                    lengths=start.lengths + 0, iterations=start.lengths * (0 if first_scores is None else 1),
                    final_eos=zeros[:, K] + 0, max_len=max_len, eos_penalty=eos_penalty,
                    given=xp.arange(K, like=start.lengths)[None, :] < start.lengths[:, None] if given else None,
                    history=[[] for _ in range(R)] if history else None, shortlist=shortlist)


class Model(Backend, Protocol):
    """A :class:`Backend` that also gives each sentence's best first insertions and, with a scorer, scores
    candidates: what :func:`decode` drives."""

    def first_tokens(self, memory: Any, batch: int, k: int, shortlist: Optional[Array]) -> Tuple[Array, Array]:
        """The k best first insertions of each of the ``batch`` sentences (:func:`first_insertions`), best first
        (B, k), and their log p(c | l) (B, k); ``shortlist`` (B, L): each sentence's, or None."""

    def score(self, tokens: Array, lengths: Array, per_source: int) -> Optional[Array]:
        """(B n,) a scorer's log-probability of each candidate (its first ``lengths`` of ``tokens`` (B n, W) and
        the end), sentence b's at rows b n ... b n + n - 1; None without a scorer."""


class Decoded(NamedTuple):
    """Every candidate of a batch's decode: rows (b K + j) n / K + c (:func:`candidate_rows`)."""

    canvases: Canvases  # (B n rows) the final canvases, their history with ``record``
    log_prob: Array  # (B n,) the decode's log-probability: its tokens' log p(c, l) and the final end-of-slot
    teacher: Optional[Array]  # (B n,) the scorer's log-probability, when the backend has a scorer
    score: Array  # (B n,) the ordering score (:func:`candidate_scores`)
    order: Array  # (B, n) each sentence's candidates, best first (indices within the sentence)
    passes: int  # forward passes, the first insertions' included


Arrange = Callable[[Start, Array, Array], Start]  # (start, an unconstrained decode's tokens, its lengths)


def decode(model: Model, memory: Any, start: Start, max_len: Array, config: DecodingConfig, termination: str,
           eos: int, pad: int, word_edges: bool = False, arrange: Optional[Arrange] = None,
           record: Optional[Record] = None, shortlist: Optional[Array] = None) -> Decoded:
    """Decode a batch of B sentences, for any backend: ``memory`` their encoder side, ``start`` (B rows) the
    empty canvases or their constraints, ``max_len`` (B,) their length limits (:func:`length_limit`,
    :func:`length_limits`). With ``config.first_insertions`` K > 1 each sentence branches from its K best first
    insertions, and with several ``config.eos_penalties`` each start is decoded under each penalty, as rows of
    one batch (each source encoded once). ``word_edges``: the dictionary marks word edges; constraints are then
    kept whole words. ``arrange(start, tokens, lengths)``: reorder the constraints once an unconstrained decode of
    every row is known (``constraint_order="unordered"``). ``termination``: the model's (``slot`` or ``sequence``).
    ``shortlist`` (B, L): the tokens each sentence's slots may receive (:func:`fairseq_insertion.slots.shortlist_rows`;
    None: the whole vocabulary)."""
    xp = model.xp
    B, betas, K = max_len.shape[0], config.betas, config.first_insertions
    n = config.candidates
    first_scores, passes = None, 0
    if K > 1:
        tokens, log_probs = model.first_tokens(memory, B, K, shortlist)  # (B, K) each
        start, first_scores = first_insertions(xp, tokens, log_probs, max_len > 0, pad)
        passes = 1
    if n > 1:
        sentence, start_row = candidate_rows(xp, B, K, len(betas), like=max_len)  # (B n,) each
        memory, start, max_len = model.reorder(memory, sentence), start.take(start_row), max_len[sentence]
        shortlist = None if shortlist is None else shortlist[sentence]
        first_scores = None if first_scores is None else first_scores[start_row]
    eos_penalty = xp.asarray(np.tile(np.asarray(betas, np.float32), B * K), like=max_len) if len(betas) > 1 \
        else None  # (B n,) each row's beta; None: the one beta
    bounds = Bounds.build(xp, config, termination, eos, pad)
    given = start.tokens.shape[1] > 0 and first_scores is None  # constraints on the canvas
    if arrange is not None and given:
        blank = Start.blank(xp, B * n, start.lengths, pad)
        unconstrained, _ = run(model, start_state(xp, blank, max_len, eos_penalty, False, bounds.close_ended,
                                                  shortlist=shortlist), memory, bounds)
        start = arrange(start, unconstrained.tokens, unconstrained.lengths)
    state = start_state(xp, start, max_len, eos_penalty, given and word_edges, bounds.close_ended or given,
                        first_scores, record is not None, shortlist)
    out, more = run(model, state, memory, bounds, record)
    real = xp.arange(out.tokens.shape[1], like=out.lengths)[None, :] < out.lengths[:, None]  # (B n, W)
    log_prob = xp.where(real, out.scores, 0.0).sum(1) + out.final_eos  # (B n,)
    teacher = model.score(out.tokens, out.lengths, n) if n > 1 else None
    score = candidate_scores(log_prob, xp.cast(out.lengths, like=log_prob), config.lenpen, teacher,
                             config.rerank_weight)  # (B n,)
    return Decoded(canvases=out, log_prob=log_prob, teacher=teacher, score=score, order=best_first(xp, score, n),
                   passes=passes + more)
