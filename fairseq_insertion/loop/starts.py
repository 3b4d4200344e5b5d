"""Where a decode starts: the empty canvas or one holding hard constraints (:class:`Start`,
:func:`constraint_canvas`), the length limits, the branches of first insertions and the rows of candidates."""

from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple

import numpy as np

from ..config import DecodingConfig, DecodingError, _name
from .geometry import gather_canvas
from .ops import Array, Ops


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

    def emptied(self, xp: Ops, rows: Array, pad: int) -> "Start":
        """The same start with the canvases of ``rows`` (B,) emptied (their constraints dropped)."""
        r = rows[:, None]
        return self._replace(tokens=xp.where(r, pad, self.tokens), lengths=xp.where(rows, 0, self.lengths),
                             closed_before=self.closed_before & ~r, closed_end=self.closed_end & ~rows)


class Prepared(NamedTuple):
    """A batch as :func:`prepare` makes it ready for :func:`~fairseq_insertion.loop.decode`, with its lines'
    problems as data for the front end to report."""

    start: Start  # each line's start; a line whose constraints do not fit starts (and stays) empty
    max_len: Array  # (B,) each line's length limit; 0 where its constraints do not fit
    limit: Array  # (B,) the length limit its constraints were held against
    empty: Array  # (B,) its source has no word: decoded from its constraints, or to an empty output
    held: Array  # (B,) the tokens its constraints hold
    unfit: Array  # (B,) its constraints hold more tokens than its limit: not translated, its output empty


def prepare(xp: Ops, src_lengths: Array, start: Start, config: DecodingConfig, limit: int, pad: int,
            constrained: bool, incremental: bool = False) -> Prepared:
    """Each line's start and length limit, from its source length ``src_lengths`` (B,) (the end-of-sentence marker
    counted, as fairseq counts it): ``max_len_a * length + max_len_b`` in float32, as fairseq's, at most ``limit``
    (the model's target positions less the frame's two). A source without a word is decoded from its constraints
    (its limit at least their length, at most ``limit``) or to an empty output. ``constrained``: the lines came with
    constraints, which first insertions (branches from the empty canvas) and an ``incremental`` model (the cached
    decoder: its tokens' positions come from their insertions) refuse."""
    if constrained and incremental:
        raise DecodingError("constraints: a model trained with --cached-decoder starts from the empty canvas (its "
                            "tokens' positions come from their insertions); decode without constraints")
    if constrained and config.first_insertions > 1:
        raise DecodingError(f"{_name('first_insertions')} {config.first_insertions} branches from the empty canvas: "
                            "it applies to unconstrained decoding, not with constraints")
    scaled = xp.cast(src_lengths, like=xp.asarray(np.zeros(0, np.float32), like=src_lengths))
    max_len = xp.long(scaled * config.max_len_a + config.max_len_b).clip(min=0, max=limit)  # (B,)
    empty, held = src_lengths <= 1, start.lengths  # (B,) each
    unsourced = xp.where(held > 0, xp.where(held > max_len, held, max_len).clip(max=limit), 0)
    max_len = xp.where(empty, unsourced, max_len)
    unfit = held > max_len
    return Prepared(start.emptied(xp, unfit, pad), xp.where(unfit, 0, max_len), max_len, empty, held, unfit)


def pack(constraints: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """fairseq's packed form (``fairseq.token_generation_constraints.pack_constraints``) of every sentence's
    constraints (token id lists): (B, C) ``[m, c_1 tokens, 0, c_2 tokens, 0, ...]``, 0 after."""
    rows = [[len(cs)] + [t for c in cs for t in (*c, 0)] for cs in constraints]
    out = np.zeros((len(rows), max((len(r) for r in rows), default=0)), dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
    return out


def constraint_canvas(xp: Ops, packed: Array, gap: int, pad: int) -> Start:
    """The initial canvas of a constrained decode, from fairseq's packed constraints ``packed`` (B, C) (:func:`pack`).
    A ``gap`` token inside a constraint marks an open slot (a template's ``___``); it is not put on the canvas.

    Which slots are closed (never receive an insertion): the slot between two adjacent tokens of one constraint, unless
    a gap separates them; the slot before the first token (slot 0) when the first constraint is a template (holds a
    gap) that does not start with a gap; the last slot when the last constraint is a template that does not end with a
    gap. Slots between constraints are open."""
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


def arrange_constraints(xp: Ops, start: Start, hyp: Array, hyp_lengths: Array) -> Start:
    """``constraint_order="unordered"``: each line's constraints in the order their first tokens first occur in
    ``hyp`` (B, T), its unconstrained translation of lengths (B,) (the absent ones last, in the given order), each
    constraint's tokens together and in order; a line whose first or last slot is closed (an anchored template)
    keeps the given order."""
    tokens, lengths, closed_before, closed_end, segment = start
    B, K = tokens.shape
    if K == 0:
        return start
    G = xp.host(segment.max())[0] + 1  # constraints in the longest line
    j = xp.arange(K, like=lengths)[None, :]
    real = j < lengths[:, None]  # (B, K)
    starts = real & (segment != xp.concat([xp.full((B, 1), -1, like=segment), segment[:, :-1]], 1))  # (B, K)
    first = xp.put(xp.full((B, G + 1), -1, like=tokens), xp.where(starts, segment, G), tokens)[:, :G]  # (B, G)
    T = hyp.shape[1]
    hyp = xp.concat([hyp, xp.full((B, 1), -1, like=hyp)], 1)  # (B, T+1) the last column never within a line
    within = xp.arange(T + 1, like=lengths)[None, :] < hyp_lengths[:, None]  # (B, T+1)
    hit = (first[:, :, None] == hyp[:, None, :]) & within[:, None, :]  # (B, G, T+1)
    given = xp.arange(G, like=lengths)[None, :]  # (1, G)
    key = xp.where(hit.any(2), xp.long(hit).argmax(2), T + given)  # (B, G) the first occurrence, or T + g
    key = xp.where((closed_before[:, 0] | closed_end)[:, None], given, key)
    rank = xp.argsort(xp.argsort(key * (G + 1) + given))  # (B, G) each constraint's place
    token_key = xp.where(real, xp.gather(rank, segment.clip(0, G - 1)) * (K + 1) + j, (G + 1) * (K + 1) + j)
    perm = xp.argsort(token_key)  # (B, K) padding last
    return start._replace(tokens=xp.gather(tokens, perm), closed_before=xp.gather(closed_before, perm),
                          segment=xp.gather(segment, perm))


def first_insertions(xp: Ops, tokens: Array, log_probs: Array, room: Array, pad: int) -> Tuple[Start, Array]:
    """The starts of branching decodes (``first_insertions``): row b K + j holds sentence b's j-th best first insertion
    ``tokens`` (B, K) (:func:`~fairseq_insertion.loop.driver.first_tokens`), its slots open, scored ``log_probs`` (B, K)
    (log p(c | l); the one slot's log p(l) is 0); a sentence without ``room`` (B,) for a token (its length limit is 0)
    starts empty. Returns the starts of the B K rows and their tokens' scores (B K, 1)."""
    placed = (room[:, None] & (tokens == tokens)).reshape(-1)  # (B K,)
    start = xp.where(placed[:, None], tokens.reshape(-1, 1), pad)  # (B K, 1)
    scores = xp.where(placed[:, None], log_probs.reshape(-1, 1), 0.0)  # (B K, 1)
    shut = start != start  # (B K, 1) no slot closed
    return Start(tokens=start, lengths=xp.long(placed), closed_before=shut, closed_end=placed & False,
                 segment=xp.long(shut)), scores
