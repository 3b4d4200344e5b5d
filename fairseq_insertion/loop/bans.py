"""What the slot rules bar, computed on the framed canvases: the tokens whose insertion would repeat part of a canvas
(:func:`repeated_tokens`), and next to constraint tokens the pieces that would glue onto a constraint's word
(:func:`word_edge_bans`; :func:`word_edge_table` reads the dictionary's word scheme)."""

from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple

import numpy as np

from .ops import Array, Ops


def repeated_tokens(xp: Ops, framed: Array, ngram: int, neighbours: bool, special: Tuple[int, ...], pad: int) -> Array:
    """Per slot, the tokens whose insertion would repeat part of the canvas: framed (B, T + 2) ``[bos] canvas [eos]``,
    right-padded with ``pad`` (S = T + 1 slots). ``neighbours``: a copy of either neighbour of the slot (``a a b`` from
    ``a b``). ``ngram`` n >= 2: a token c such that an n-gram of the canvas after inserting c into slot l, one that
    holds c, already occurs in the framed canvas (bos/eos count as context) and survives the insertion (n-grams
    spanning slot l are broken by it). Each slot is judged against the current canvas. Tokens in ``special`` are never
    returned. Returns (B, S, M) token ids, ``pad`` where a column holds nothing (M = 0 when both rules are off)."""
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
    """Per slot, what the word-edge rule forbids next to the given (constraint) tokens: framed (B, K+2); given (B, K)
    the canvas tokens that are constraint tokens; joins_next (V,) bool, the entries that form one word with the token
    after them (subword-nmt's ``x@@``), False for the special symbols. Returns three (B, S) bool arrays, read at the
    open slots only: no_next (no token that joins the next one: the slot right before a constraint token, or one that
    must complete a word), no_prev (no token that joins the previous one: the slot right after a constraint token) and
    no_end (no end-of-slot: its left neighbour is a constraint token that continues into the next token, ``schö@@``,
    and its right neighbour is end-of-sentence or a constraint token)."""
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
    """Which entries of a vocabulary glue onto a neighbour in the post-processed text: (scheme, joins_next (V,),
    joins_prev (V,)); the first ``nspecial`` entries (bos, pad, eos, unk) glue onto nothing. ``subword_nmt``
    (``@@ ``): a piece ending in ``@@`` joins the next token. ``_EOW``: a piece not ending in ``_EOW`` joins the next
    token. ``sentencepiece`` (``\u2581`` starts a word): a piece without it that holds a letter or digit joins the
    previous token (punctuation after a word keeps the word whole). ``none``: every token is a word. ``scheme`` None:
    the one most entries are marked for."""
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
