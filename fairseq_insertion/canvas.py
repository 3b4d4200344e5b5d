"""The Insertion Transformer's algorithm as pure tensor functions.

Nothing here imports fairseq. Every function works on a whole padded batch at
once (no Python loops over sentences, slots or tokens) and on whatever device
its inputs live on.

Vocabulary used throughout (Stern et al., 2019):

* target ``y``: the full output sequence, ``n`` tokens, without bos/eos.
* canvas: the partial hypothesis, an ordered subsequence of the target.
* slot ``l``: an insertion location; a canvas of ``k`` tokens has ``k + 1``
  slots, slot ``l`` sitting just before canvas token ``l`` (slot ``k`` is the
  rightmost).
* span of slot ``l``: the target tokens still missing at that slot,
  ``y[i_l .. j_l]``.
* order: ``left_to_right``, ``binary_tree`` or ``uniform`` (the paper's
  training losses); termination: ``slot`` or ``sequence`` finalization.
* end-of-slot / end-of-sequence: one real vocabulary entry (we use eos).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import loop as L
from .config import TERMINATIONS

ORDERS = ("left_to_right", "binary_tree", "uniform")


def log2_bound(n: int | Tensor) -> int | Tensor:
    """floor(log2 n) + 1 for n > 0, else 0: the iterations of a balanced binary-tree decode of
    n tokens (the levels of :func:`tree_levels`). ``n``: an int, or a tensor of any shape, counted
    exactly (the powers of two <= n), the result of the same shape."""
    if isinstance(n, Tensor):
        powers = 2 ** torch.arange(62, device=n.device)  # (P,)
        return (n.long().unsqueeze(-1) >= powers).sum(-1)  # n's shape
    return max(int(n), 0).bit_length()


# ----------------------------------------------------------------------------
# Canvas sampling (paper: "Training and Loss Functions")
# ----------------------------------------------------------------------------
def sample_canvas(
    target_lengths: Tensor, max_len: int, order: str, generator: Optional[torch.Generator] = None
) -> Tensor:
    """Choose which target positions are already on the canvas.

    ``k ~ Uniform{0..n}`` per sentence. ``left_to_right`` keeps the prefix of
    length ``k``; ``binary_tree``/``uniform`` keep a uniformly random
    ``k``-subset (shuffle the indices, keep the first ``k``), in target order.

    target_lengths: (B,) real target lengths n. Returns keep: (B, N) bool,
    False on padding.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose one of {ORDERS}")
    device = target_lengths.device
    B = target_lengths.size(0)
    pos = torch.arange(max_len, device=device).unsqueeze(0)  # (1, N)
    valid = pos < target_lengths.unsqueeze(1)  # (B, N)
    u = torch.rand(B, device=device, generator=generator)  # (B,)
    k = torch.floor(u * (target_lengths + 1).float()).long().clamp(max=target_lengths)  # (B,)
    if order == "left_to_right":
        return pos < k.unsqueeze(1)
    # random permutation rank of every real position; padding ranks last
    r = torch.rand(B, max_len, device=device, generator=generator)  # (B, N)
    r = r.masked_fill(~valid, 2.0)
    rank = r.argsort(dim=1).argsort(dim=1)  # (B, N)
    return (rank < k.unsqueeze(1)) & valid


def tree_levels(target_lengths: Tensor, max_len: int) -> Tensor:
    """The level of every target position in the balanced binary tree that parallel
    decoding walks: level 0 is the centre of the whole target, level d + 1 the centres
    of the spans left after levels 0..d (the left centre of an even span, as the
    binary-tree weights' argmax and the decoder's ties have it).

    target_lengths: (B,). Returns (B, N) long; padding positions get ``N``. A
    canvas of the tokens of levels < d is the state after d parallel iterations
    of a perfect binary-tree decode (floor(log2 n) + 1 levels in all).
    """
    B, N = target_lengths.size(0), max_len
    pos = torch.arange(N, device=target_lengths.device).unsqueeze(0).expand(B, N)
    valid = pos < target_lengths.unsqueeze(1)
    level = torch.full((B, N), N, dtype=torch.long, device=target_lengths.device)
    keep = torch.zeros(B, N, dtype=torch.bool, device=target_lengths.device)
    for d in range(log2_bound(max(N, 1))):  # one step per tree level
        _, start, end = slot_spans(keep, target_lengths)
        centre = valid & ~keep & pos.eq(torch.div(start + end, 2, rounding_mode="floor"))  # (B, N)
        level = level.masked_fill(centre, d)
        keep = keep | centre
    return level


def sample_tree_canvas(target_lengths: Tensor, max_len: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """A canvas that parallel decoding visits: the balanced-binary-tree state after
    ``d ~ Uniform{0..L}`` iterations, L = floor(log2 n) + 1 (d = L: the whole target).

    Returns keep: (B, N) bool, as :func:`sample_canvas`.
    """
    levels = tree_levels(target_lengths, max_len)  # (B, N)
    depth = log2_bound(target_lengths)  # (B,)
    u = torch.rand(target_lengths.size(0), device=target_lengths.device, generator=generator)
    d = torch.floor(u * (depth + 1)).long().clamp(max=depth.long())  # (B,)
    return levels < d.unsqueeze(1)


def gather_canvas(target: Tensor, keep: Tensor, pad: int) -> Tuple[Tensor, Tensor]:
    """The kept tokens in target order, left-aligned and padded: target, keep (B, N) -> canvas (B, K),
    K the largest kept count, and its lengths (B,) (:func:`fairseq_insertion.loop.gather_canvas`)."""
    return L.gather_canvas(TORCH, target, keep, pad)


def frame(canvas: Tensor, lengths: Tensor, bos: int, eos: int, pad: int) -> Tensor:
    """[bos] canvas [eos], right-padded: (B, K) -> (B, K + 2); slot ``l`` lies between columns l and l+1
    (:func:`fairseq_insertion.loop.frame`)."""
    return L.frame(TORCH, canvas, lengths, bos, eos, pad)


def slot_mask(lengths: Tensor, num_slots: int) -> Tensor:
    """(B, S) True for the ``k + 1`` real slots of each canvas."""
    return L.slot_mask(TORCH, lengths, num_slots)


# ----------------------------------------------------------------------------
# Slot spans and weights
# ----------------------------------------------------------------------------
def slot_spans(keep: Tensor, target_lengths: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """For every target position: its slot and the bounds of that slot's span.

    keep: (B, N) bool. Returns (slot, span_start, span_end), each (B, N) long:
    slot = number of kept tokens before the position; span_start / span_end
    are the first / last missing target positions of that slot (inclusive).
    Values are meaningful only at missing positions (``~keep`` and < n).
    """
    B, N = keep.shape
    keep_l = keep.long()
    slot = keep_l.cumsum(1) - keep_l  # (B, N) exclusive count of kept tokens
    pos = torch.arange(N, device=keep.device).unsqueeze(0).expand(B, N)
    prev_kept = torch.where(keep, pos, torch.full_like(pos, -1)).cummax(1).values  # (B, N)
    big = target_lengths.unsqueeze(1).expand(B, N)
    nxt = torch.where(keep, pos, big).flip(1).cummin(1).values.flip(1)  # (B, N)
    return slot, prev_kept + 1, torch.minimum(nxt, big) - 1


def slot_weights(
    span_start: Tensor, span_end: Tensor, order: str, tau: float = 1.0
) -> Tensor:
    """Per missing token weight w_l(i) within its slot's span.

    binary_tree: softmax over the span of -d_l(i)/tau, with
    d_l(i) = |(i_l + j_l)/2 - i|; uniform: 1 / span length. Values at non-missing
    positions are meaningless. Returns (B, N) float, summing to 1 per span.
    """
    B, N = span_start.shape
    pos = torch.arange(N, device=span_start.device).unsqueeze(0).float()
    span_len = (span_end - span_start + 1).clamp(min=1).float()  # (B, N)
    if order == "uniform":
        return 1.0 / span_len
    if order != "binary_tree":
        raise ValueError(f"slot weights are defined for binary_tree and uniform, not {order!r}")
    if not tau > 0:
        raise ValueError(f"--tau must be > 0 for the binary_tree order, got {tau}")
    d = ((span_start + span_end).float() / 2 - pos).abs()  # (B, N)
    # shift by the span's smallest distance (0 for odd, 0.5 for even spans) for stability
    d_min = (span_len.remainder(2) == 0).float() * 0.5
    unnorm = torch.exp(-(d - d_min) / tau)  # (B, N), max 1 within each span
    # partition function of the span in closed form would be fiddly; sum exactly instead
    return unnorm / _span_sum(unnorm, span_start, span_end)


def _span_sum(x: Tensor, span_start: Tensor, span_end: Tensor) -> Tensor:
    """Sum of ``x`` over each position's span, via prefix sums. (B, N)."""
    csum = torch.nn.functional.pad(x.cumsum(1), (1, 0))  # (B, N+1)
    N = x.size(1)
    hi = (span_end + 1).clamp(0, N)
    lo = span_start.clamp(0, N)
    return csum.gather(1, hi) - csum.gather(1, lo)


# ----------------------------------------------------------------------------
# The loss (paper: slot-loss, averaged over slots; termination variants)
# ----------------------------------------------------------------------------
def insertion_loss(
    content_lprobs: Tensor,
    location_lprobs: Tensor,
    target: Tensor,
    target_lengths: Tensor,
    keep: Tensor,
    order: str,
    termination: str,
    eos: int,
    tau: float = 1.0,
    label_smoothing: float = 0.0,
) -> Tuple[Tensor, Tensor]:
    """Per-sentence insertion loss.

    content_lprobs: (B, S, V) log p(c | l); location_lprobs: (B, S) log p(l);
    so log p(c, l) = content + location. S >= k + 1 for every sentence.
    target: (B, N) without eos; keep: (B, N) canvas membership from
    :func:`sample_canvas`.

    Returns (loss, nll), each (B,): ``nll`` is the paper's loss; ``loss`` mixes
    in label smoothing: each slot's target distribution over content becomes
    (1 - eps) * (its weights) + eps * uniform.
    """
    if termination not in TERMINATIONS:
        raise ValueError(f"unknown termination {termination!r}; choose one of {TERMINATIONS}")
    B, S, V = content_lprobs.shape
    N = target.size(1)
    eps = label_smoothing
    k = keep.sum(1)  # (B,) canvas lengths
    slots = slot_mask(k, S)  # (B, S)
    loc = location_lprobs.float()
    eos_nll = -(content_lprobs[:, :, eos].float() + loc)  # (B, S)
    # -(1/V) sum_c log p(c, l): a full pass over (B, S, V), so only when smoothing is on
    smooth = -(content_lprobs.float().mean(-1) + loc) if eps > 0 else None  # (B, S)

    if order == "left_to_right":
        # next token y_{k+1} (or end-of-sequence when complete) in the rightmost slot k
        nxt = target.gather(1, k.clamp(max=N - 1).unsqueeze(1)).squeeze(1) if N > 0 else k
        nxt = torch.where(k < target_lengths, nxt, torch.full_like(nxt, eos))  # (B,)
        lp = content_lprobs[torch.arange(B, device=k.device), k]  # (B, V)
        nll = -(lp.float().gather(1, nxt.unsqueeze(1)).squeeze(1) + loc.gather(1, k.unsqueeze(1)).squeeze(1))
        if smooth is None:
            return nll, nll
        return (1 - eps) * nll + eps * smooth.gather(1, k.unsqueeze(1)).squeeze(1), nll

    valid = torch.arange(N, device=target.device).unsqueeze(0) < target_lengths.unsqueeze(1)
    missing = valid & ~keep  # (B, N)
    slot, start, end = slot_spans(keep, target_lengths)
    slot = slot.clamp(max=S - 1)
    w = slot_weights(start, end, order, tau) * missing  # (B, N)
    # -log p(y_i, l) at every missing token, l = its slot
    tok_lp = content_lprobs.reshape(B, S * V).gather(1, slot * V + target.clamp(0, V - 1)).float()
    tok_nll = -(tok_lp + loc.gather(1, slot))  # (B, N)
    tok_nll = torch.where(missing, tok_nll, torch.zeros_like(tok_nll))
    slot_nll = loc.new_zeros(B, S).scatter_add_(1, slot, w * tok_nll)  # (B, S)
    span_len = loc.new_zeros(B, S).scatter_add_(1, slot, missing.float())  # (B, S)
    empty = slots & (span_len == 0)
    nonempty = slots & (span_len > 0)

    if termination == "slot":
        counted = slots  # empty spans target end-of-slot
    else:
        complete = (k == target_lengths).unsqueeze(1)  # every slot targets end-of-sequence
        counted = torch.where(complete, slots, nonempty)
    slot_nll = torch.where(empty, eos_nll, slot_nll)
    slot_nll = torch.where(counted, slot_nll, torch.zeros_like(slot_nll))
    n_counted = counted.sum(1).clamp(min=1).float()
    nll = slot_nll.sum(1) / n_counted
    if smooth is None:
        return nll, nll
    slot_smooth = torch.where(counted, smooth, torch.zeros_like(smooth))
    return (1 - eps) * nll + eps * slot_smooth.sum(1) / n_counted, nll


# ----------------------------------------------------------------------------
# Applying insertions (paper: "Inference")
# ----------------------------------------------------------------------------
def insertion_destinations(lengths: Tensor, insert_mask: Tensor, num_tokens: int, width: int) -> Tensor:
    """Where every canvas token and every slot value lands after the insertions (B, K + S): see
    :func:`fairseq_insertion.loop.insertion_destinations`."""
    return L.insertion_destinations(TORCH, lengths, insert_mask, num_tokens, width)


def place(destinations: Tensor, canvas: Tensor, slot_values: Tensor, width: int, pad) -> Tensor:
    """Apply :func:`insertion_destinations` to one per-token tensor: (B, K) and (B, S) -> (B, W)."""
    return L.place(TORCH, destinations, canvas, slot_values, width, pad)


def insert(canvas: Tensor, lengths: Tensor, slot_tokens: Tensor, insert_mask: Tensor, pad) -> Tuple[Tensor, Tensor]:
    """Insert ``slot_tokens[l]`` into every slot ``l`` where ``insert_mask`` (B, S), S >= K + 1 allowed
    (slots beyond a canvas's k + 1 must be False): the new canvas (B, K') trimmed to the longest row,
    and the new lengths. Serves parallel decoding (many slots) and greedy decoding (one slot)."""
    return L.insert(TORCH, canvas, lengths, slot_tokens, insert_mask, pad)


# ----------------------------------------------------------------------------
# Hard constraints and templates (the initial canvas is given)
# ----------------------------------------------------------------------------
class InitialCanvas(L.Start):
    """Where a decode starts (:class:`fairseq_insertion.loop.Start`) on torch tensors."""

    __slots__ = ()

    @classmethod
    def empty(cls, batch: int, device, pad: int) -> "InitialCanvas":
        """The unconstrained start: an empty canvas, every slot open."""
        return cls(*L.Start.blank(TORCH, batch, torch.zeros(0, dtype=torch.long, device=device), pad))

    def emptied(self, rows: Tensor, pad: int) -> "InitialCanvas":
        """The same start with the canvases of ``rows`` (B,) emptied (their constraints dropped)."""
        r = rows.unsqueeze(1)
        return self._replace(tokens=self.tokens.masked_fill(r, pad), lengths=self.lengths.masked_fill(rows, 0),
                             closed_before=self.closed_before & ~r, closed_end=self.closed_end & ~rows)


def constraint_canvas(packed: Tensor, gap: int, pad: int) -> InitialCanvas:
    """The initial canvas of a constrained decode, from fairseq's packed constraints (B, C), a ``gap``
    token inside a constraint marking a template's open slot: see :func:`fairseq_insertion.loop.constraint_canvas`
    (the same rule for the runtime). Returns the :class:`InitialCanvas`."""
    return InitialCanvas(*L.constraint_canvas(TORCH, packed, gap, pad))


def closed_slots(closed_before: Tensor, closed_end: Tensor, lengths: Tensor, num_slots: int) -> Tensor:
    """(B, S) True at the closed slots: slot l < k is the slot before token l, slot k the last one."""
    return L.closed_slots(TORCH, closed_before, closed_end, lengths, num_slots)


def order_segments(segment: Tensor, lengths: Tensor, key: Tensor) -> Tensor:
    """A permutation of canvas columns that puts whole constraints in order of ``key``.

    segment: (B, K) constraint index of each canvas token; key: (B, G) one
    sort key per constraint (ties keep the given order). Tokens of one
    constraint stay together and in order. Returns (B, K) indices for
    ``gather`` on the canvas (padding stays last).
    """
    B, K = segment.shape
    G = key.size(1)
    seg_rank = (key * (G + 1) + torch.arange(G, device=key.device)).argsort(1).argsort(1)  # (B, G)
    tok_rank = seg_rank.gather(1, segment.clamp(0, max(G - 1, 0))) if G > 0 else segment
    j = torch.arange(K, device=segment.device).unsqueeze(0)
    real = j < lengths.unsqueeze(1)
    token_key = torch.where(real, tok_rank * (K + 1) + j, (G + 1) * (K + 1) + j)  # (B, K)
    return token_key.argsort(1)


def first_occurrence(tokens: Tensor, lengths: Tensor, query: Tensor) -> Tensor:
    """Index of the first occurrence of each ``query`` token in ``tokens``.

    tokens: (B, T) with real lengths (B,); query: (B, G). Returns (B, G), ``T + g``
    where query token g does not occur (so absent ones sort last, in order).
    """
    T, G = tokens.size(1), query.size(1)
    absent = T + torch.arange(G, device=tokens.device).unsqueeze(0)  # (1, G)
    if T == 0:  # every translation empty (e.g. every line's constraints over its length limit)
        return absent.expand(tokens.size(0), G)
    valid = torch.arange(T, device=tokens.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
    hit = query.unsqueeze(2).eq(tokens.unsqueeze(1)) & valid.unsqueeze(1)  # (B, G, T)
    found = hit.any(2)
    return torch.where(found, hit.long().argmax(2), absent)


# ----------------------------------------------------------------------------
# Decoding: the loop's canvas rules (fairseq_insertion.loop) on torch tensors
# ----------------------------------------------------------------------------
def repeated_tokens(framed: Tensor, ngram: int, neighbours: bool, special: Tuple[int, ...], pad: int) -> Tensor:
    """Per slot, the tokens whose insertion would repeat part of the canvas (B, S, M): see
    :func:`fairseq_insertion.loop.repeated_tokens`."""
    return L.repeated_tokens(TORCH, framed, ngram, neighbours, special, pad)


def word_edge_slots(framed: Tensor, given: Tensor, joins_next: Tensor, eos: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(no_next, no_prev, no_end), (B, S) each: what the word-edge rule forbids next to the given
    (constraint) tokens (see :func:`fairseq_insertion.loop.word_edge_slots`)."""
    return L.word_edge_slots(TORCH, framed, given, joins_next, eos)


class TorchOps:
    """:class:`fairseq_insertion.loop.Ops` for torch tensors (the PyTorch generator), on their device."""

    def arange(self, n: int, like: Tensor) -> Tensor:
        return torch.arange(n, device=like.device)

    def full(self, shape, value, like: Tensor) -> Tensor:
        return torch.full(shape, value, dtype=like.dtype, device=like.device)

    def where(self, cond, a, b) -> Tensor:
        return torch.where(cond, a, b)

    def concat(self, arrays, axis: int) -> Tensor:
        return torch.cat(list(arrays), axis)

    def argsort(self, x: Tensor, descending: bool = False) -> Tensor:
        return x.argsort(dim=-1, descending=descending, stable=True)

    def long(self, x: Tensor) -> Tensor:
        return x.long()

    def cast(self, x: Tensor, like: Tensor) -> Tensor:
        return x.to(like.dtype)

    def put(self, out: Tensor, index: Tensor, values) -> Tensor:
        return out.scatter_(1, index, values)

    def gather(self, x: Tensor, index: Tensor) -> Tensor:
        return x.gather(1, index)

    def masked_put(self, mask: Tensor, values: Tensor, fill) -> Tensor:
        return torch.full(mask.shape, fill, dtype=values.dtype, device=values.device).masked_scatter(mask, values)

    def amax(self, x: Tensor, axis: int) -> Tensor:
        return x.amax(axis)

    def permute(self, x: Tensor, dims) -> Tensor:
        return x.permute(dims)

    def asarray(self, x, like: Tensor) -> Tensor:
        return torch.as_tensor(x, device=like.device)

    def host(self, *scalars: Tensor):
        return torch.stack(list(scalars)).tolist()

    def might(self, cond: Tensor) -> bool:
        return True  # knowing would cost a round trip to the device


TORCH = TorchOps()
