"""The canvas operations of insertion decoding in numpy: the runtime's twin of
:mod:`fairseq_insertion.canvas` (same names, same shapes, same results; ``tests/test_runtime.py``
pins each to its torch original). Whole padded batches at once, no loops over sentences,
slots or tokens.

A canvas of k tokens has k + 1 slots; slot l sits just before canvas token l. Framed
canvases are ``[bos] canvas [eos]``, right-padded: slot l lies between columns l and l + 1.
"""

from __future__ import annotations

import functools
from typing import Tuple

import numpy as np


def frame(canvas: np.ndarray, lengths: np.ndarray, bos: int, eos: int, pad: int) -> np.ndarray:
    """[bos] canvas [eos], right-padded. canvas: (B, K) -> (B, K + 2)."""
    B, K = canvas.shape
    out = np.full((B, K + 2), pad, dtype=np.int64)
    out[:, 0] = bos
    out[:, 1:K + 1] = canvas
    out[np.arange(B), lengths + 1] = eos
    return out


def slot_mask(lengths: np.ndarray, num_slots: int) -> np.ndarray:
    """(B, S) True for the k + 1 real slots of each canvas."""
    return np.arange(num_slots)[None, :] <= lengths[:, None]


def closed_slots(closed_before: np.ndarray, closed_end: np.ndarray, lengths: np.ndarray,
                 num_slots: int) -> np.ndarray:
    """(B, S) True at the closed slots: slot l < k is the slot before token l, slot k the last."""
    B, K = closed_before.shape
    closed = np.zeros((B, num_slots), dtype=bool)
    closed[:, :K] = closed_before
    closed[np.arange(B), lengths] = closed_end
    return closed


def insertion_destinations(lengths: np.ndarray, insert_mask: np.ndarray, num_tokens: int, width: int) -> np.ndarray:
    """Where every canvas token (first K columns) and every slot's value (last S columns) lands
    after the insertions; ``width`` for what does not land. (B, K + S)."""
    B, S = insert_mask.shape
    ins = insert_mask.astype(np.int64)
    before = ins.cumsum(1)  # (B, S) inserts in slots 0..l
    j = np.arange(num_tokens)[None, :]
    tok_pos = np.where(j < lengths[:, None], j + before[:, :num_tokens], width)  # (B, K)
    ins_pos = np.where(insert_mask, np.arange(S)[None, :] + before - ins, width)  # (B, S)
    return np.concatenate([tok_pos, ins_pos], 1)


def place(destinations: np.ndarray, canvas: np.ndarray, slot_values: np.ndarray, width: int, pad) -> np.ndarray:
    """Apply :func:`insertion_destinations` to one per-token array: (B, K) and (B, S) -> (B, W)."""
    B = canvas.shape[0]
    out = np.full((B, width + 1), pad, dtype=canvas.dtype)  # one spare column catches what does not land
    out[np.arange(B)[:, None], destinations] = np.concatenate([canvas, slot_values.astype(canvas.dtype)], 1)
    return out[:, :width]


def repeated_tokens(framed: np.ndarray, ngram: int, neighbours: bool, special: Tuple[int, ...],
                    pad: int) -> np.ndarray:
    """Per slot, the tokens whose insertion would repeat part of the canvas (see
    :func:`fairseq_insertion.canvas.repeated_tokens`): a copy of either neighbour, and with
    ``ngram`` n >= 2 a token that makes an n-gram of the framed canvas that survives the
    insertion occur twice. framed: (B, T + 2) -> (B, S, M) token ids, ``pad`` where a column
    holds nothing; ``special`` tokens are never returned."""
    B, W = framed.shape
    S = W - 1
    columns = []
    if neighbours:
        columns.append(np.stack([framed[:, :-1], framed[:, 1:]], -1))  # (B, S, 2)
    n = int(ngram)
    if n >= 2 and W >= n:  # every offset i of the inserted token in the n-gram at once (torch's loop over i)
        context_cols, rest_cols, token_cols, apart = _ngram_geometry(W, n)
        real = framed != pad
        ext = np.full((B, W + 2 * n - 2), -1, dtype=np.int64)  # the framed canvas, -1 outside it
        ext[:, n - 1:n - 1 + W] = np.where(real, framed, -1)
        windows = np.where(real, framed, -2)  # -2 at padding: never matches
        context = ext[:, context_cols]  # (B, n, S, n-1): the slot's n-1 neighbours at offset i
        rest = windows[:, rest_cols]  # (B, n, J, n-1): each window without its offset i
        match = (context[:, :, :, None, :] == rest[:, :, None, :, :]).all(-1) & apart  # (B, n, S, J)
        found = np.where(match, windows[:, token_cols][:, :, None, :], pad)  # (B, n, S, J)
        columns.append(found.transpose(0, 2, 1, 3).reshape(B, S, -1))
    if not columns:
        return np.full((B, S, 0), pad, dtype=np.int64)
    out = np.concatenate(columns, -1) if len(columns) > 1 else columns[0]  # (B, S, M)
    never = out < 0
    for s in special:
        never |= out == s
    return np.where(never, pad, out).astype(np.int64, copy=False)


@functools.lru_cache(maxsize=256)
def _ngram_geometry(W: int, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Index arrays of :func:`repeated_tokens` for framed width W and n-grams: the columns (of the
    framed canvas padded by n-1 on each side) holding slot l's context at offset i, framed columns
    l-i+1 .. l-i+n-1 (n, S, n-1); the columns of each window without its offset i (n, J, n-1) and at
    it (n, J); and which windows survive an insertion into each slot (S, J): those not spanning it."""
    S, J = W - 1, W - n + 1
    slot, start, offset = np.arange(S), np.arange(J), np.arange(n)
    others = np.asarray([[j for j in range(n) if j != i] for i in range(n)])  # (n, n-1)
    context = (slot[None, :] - offset[:, None])[:, :, None] + np.arange(n - 1)[None, None, :] + n
    rest = start[None, :, None] + others[:, None, :]  # (n, J, n-1)
    token = start[None, :] + offset[:, None]  # (n, J)
    spans = (start[None, :] <= slot[:, None]) & (start[None, :] >= slot[:, None] - n + 2)  # (S, J)
    return context, rest, token, ~spans


def log2_bound(n: np.ndarray) -> np.ndarray:
    """floor(log2 n) + 1 for n > 0, else 0 (the iterations of a balanced binary-tree decode)."""
    n = np.asarray(n, dtype=np.int64)
    return (n[..., None] >= (2 ** np.arange(62, dtype=np.int64))).sum(-1)
