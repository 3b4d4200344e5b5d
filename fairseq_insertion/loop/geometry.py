"""Canvas geometry: framed canvases, their slots, closed slots, and where a pass's insertions move every per-token
array (:func:`insertion_destinations`, :func:`place`)."""

from __future__ import annotations

from typing import Any, Tuple

from .ops import Array, Ops


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
    """Where every canvas token and every slot value lands after the insertions: lengths (B,); insert_mask (B, S), False
    beyond each canvas's k + 1 slots; num_tokens: K, the canvas width; width: W, at least the longest new canvas.
    Returns (B, K + S): the new column of canvas token j (first K columns) and of slot l's value (last S columns); ``W``
    for what does not land (padding tokens, slots without an insertion). Computed once per step, applied to every
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
