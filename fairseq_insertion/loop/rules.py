"""What each open slot brings to the slot rule (:mod:`fairseq_insertion.slots`) besides its scores
(:class:`SlotInputs`, built a pass by :func:`slot_inputs`): the tokens the repetition rules bar, its EOS penalty,
the word-edge rule next to constraint tokens (:func:`word_edge_table` reads the dictionary's word scheme) and its
sentence's shortlist."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..config import DecodingConfig
from .ops import Array, Ops
from .state import Canvases


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


def first_insertion_inputs(xp: Ops, batch: int, unk: int, like: Array, shortlist: Optional[Array] = None
                           ) -> SlotInputs:
    """The :class:`SlotInputs` of the empty canvases' one slot when choosing first insertions
    (:func:`first_insertions`): unk barred, end-of-slot barred, no penalty; ``like``: an int64 array;
    ``shortlist`` (B, L): each sentence's (unk's position there is its id)."""
    blocked = xp.full((batch, 1), unk, like=like)  # (B, 1)
    return SlotInputs(blocked=blocked, eos_penalty=0.0, classes=None, no_end=blocked[:, 0] == unk,
                      shortlist=shortlist, slot_rows=None if shortlist is None else xp.arange(batch, like=like))
