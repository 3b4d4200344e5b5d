"""The Insertion Transformer's training algorithm as pure tensor functions: canvas sampling, slot spans
and weights, the paper's losses. A canvas is gathered and framed by the decoding loop's own rules
(:func:`fairseq_insertion.loop.gather_canvas`, :func:`~fairseq_insertion.loop.frame`), so training shows the
model canvases as decoding does. No fairseq; every function works on a whole padded batch, on its inputs'
device. Names (Stern et al., 2019): target ``y`` (n tokens, no bos/eos); canvas, an ordered subsequence of it;
slot ``l`` just before canvas token ``l`` (k + 1 slots); the span of slot ``l``, the target tokens still missing
there; order ``left_to_right``, ``binary_tree`` or ``uniform``; termination ``slot`` or ``sequence``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import loop as L
from .config import TERMINATIONS
from .decoding import TORCH

ORDERS = ("left_to_right", "binary_tree", "uniform")


def log2_bound(n: int | Tensor) -> int | Tensor:
    """floor(log2 n) + 1 for n > 0, else 0: the iterations of a balanced binary-tree decode of n tokens (the levels
    of :func:`tree_levels`). ``n``: an int, or a tensor counted exactly (the powers of two <= n), of any shape."""
    if isinstance(n, Tensor):
        powers = 2 ** torch.arange(62, device=n.device)  # (P,)
        return (n.long().unsqueeze(-1) >= powers).sum(-1)  # n's shape
    return max(int(n), 0).bit_length()


# -------------------------------- Canvas sampling (paper: "Training and Loss Functions")
def sample_canvas(target_lengths: Tensor, max_len: int, order: str,
                  generator: Optional[torch.Generator] = None) -> Tensor:
    """Which target positions are already on the canvas: ``k ~ Uniform{0..n}`` per sentence; ``left_to_right`` keeps
    the prefix of length ``k``, ``binary_tree``/``uniform`` a uniformly random ``k``-subset, in target order.
    target_lengths: (B,) real target lengths n. Returns keep: (B, N) bool, False on padding."""
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
    r = torch.rand(B, max_len, device=device, generator=generator).masked_fill(~valid, 2.0)  # (B, N)
    rank = r.argsort(dim=1).argsort(dim=1)  # (B, N)
    return (rank < k.unsqueeze(1)) & valid


def tree_levels(target_lengths: Tensor, max_len: int) -> Tensor:
    """(B, N) long, the level of every target position in the balanced binary tree that parallel decoding walks
    (padding: ``N``): level 0 the centre of the whole target, level d + 1 the centres of the spans left after levels
    0..d (the left centre of an even span, as the binary-tree weights' argmax and the decoder's ties have it)."""
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


def sample_tree_levels(target_lengths: Tensor, max_len: int, tau: float = 1.0,
                       generator: Optional[torch.Generator] = None) -> Tensor:
    """Levels as :func:`tree_levels` gives them, but each span's token drawn from its binary-tree weights
    (softmax(-d/tau) around the span's centre: :func:`slot_weights`) instead of taken at the centre: a near-balanced
    order, each pass inserting one token into every span still missing some. (B, N) long; padding ``N``."""
    B, N = target_lengths.size(0), max_len
    valid = torch.arange(N, device=target_lengths.device).unsqueeze(0) < target_lengths.unsqueeze(1)  # (B, N)
    level = torch.full((B, N), N, dtype=torch.long, device=target_lengths.device)
    d = 0
    while bool((valid & level.eq(N)).any()):  # one pass per level
        missing = valid & level.eq(N)
        slot, start, end = slot_spans(~missing & valid, target_lengths)
        u = torch.rand(B, N, device=level.device, generator=generator).clamp(1e-9, 1 - 1e-9)
        key = (slot_weights(start, end, "binary_tree", tau).log() - (-u.log()).log()).masked_fill(~missing, -torch.inf)
        best = key.new_full((B, N + 1), -torch.inf).scatter_reduce(1, slot, key, "amax")  # (B, N + 1) each span's
        level = level.masked_fill(missing & key.eq(best.gather(1, slot)), d)
        d += 1
    return level


def sample_tree_canvas(target_lengths: Tensor, max_len: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """A canvas that parallel decoding visits: the balanced-binary-tree state after ``d ~ Uniform{0..L}`` iterations,
    L = floor(log2 n) + 1 (d = L: the whole target). Returns keep: (B, N) bool, as :func:`sample_canvas`."""
    levels = tree_levels(target_lengths, max_len)  # (B, N)
    depth = log2_bound(target_lengths)  # (B,)
    u = torch.rand(target_lengths.size(0), device=target_lengths.device, generator=generator)
    d = torch.floor(u * (depth + 1)).long().clamp(max=depth.long())  # (B,)
    return levels < d.unsqueeze(1)


# -------------------------------- Slot spans and weights
def slot_spans(keep: Tensor, target_lengths: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """For every target position: its slot (the number of kept tokens before it) and the first / last missing target
    positions of that slot (inclusive). keep: (B, N) bool. Returns (slot, span_start, span_end), each (B, N) long,
    meaningful only at missing positions (``~keep`` and < n)."""
    B, N = keep.shape
    keep_l = keep.long()
    slot = keep_l.cumsum(1) - keep_l  # (B, N) exclusive count of kept tokens
    pos = torch.arange(N, device=keep.device).unsqueeze(0).expand(B, N)
    prev_kept = torch.where(keep, pos, torch.full_like(pos, -1)).cummax(1).values  # (B, N)
    big = target_lengths.unsqueeze(1).expand(B, N)
    nxt = torch.where(keep, pos, big).flip(1).cummin(1).values.flip(1)  # (B, N)
    return slot, prev_kept + 1, torch.minimum(nxt, big) - 1


def slot_weights(span_start: Tensor, span_end: Tensor, order: str, tau: float = 1.0) -> Tensor:
    """Per missing token weight w_l(i) in its slot's span, (B, N) float summing to 1 per span (meaningless elsewhere):
    binary_tree, softmax over the span of -d_l(i)/tau, d_l(i) = |(i_l + j_l)/2 - i|; uniform, 1 / span length."""
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
    # partition function of the span in closed form would be fiddly; sum exactly instead, via prefix sums
    csum = torch.nn.functional.pad(unnorm.cumsum(1), (1, 0))  # (B, N+1)
    hi, lo = (span_end + 1).clamp(0, N), span_start.clamp(0, N)
    return unnorm / (csum.gather(1, hi) - csum.gather(1, lo))


# -------------------------------- The loss (paper: slot-loss, averaged over slots; termination variants)
def insertion_loss(content_lprobs: Tensor, location_lprobs: Tensor, target: Tensor, target_lengths: Tensor,
                   keep: Tensor, order: str, termination: str, eos: int, tau: float = 1.0,
                   label_smoothing: float = 0.0) -> Tuple[Tensor, Tensor]:
    """Per-sentence insertion loss. content_lprobs: (B, S, V) log p(c | l); location_lprobs: (B, S) log p(l), S >=
    k + 1 for every sentence; target: (B, N) without eos; keep: (B, N) canvas membership (:func:`sample_canvas`).
    Returns (loss, nll), each (B,): ``nll`` is the paper's loss; ``loss`` mixes in label smoothing: each slot's target
    distribution over content becomes (1 - eps) * (its weights) + eps * uniform."""
    if termination not in TERMINATIONS:
        raise ValueError(f"unknown termination {termination!r}; choose one of {TERMINATIONS}")
    B, S, V = content_lprobs.shape
    N = target.size(1)
    eps = label_smoothing
    k = keep.sum(1)  # (B,) canvas lengths
    loc = location_lprobs.float()

    if order == "left_to_right":
        # next token y_{k+1} (or end-of-sequence when complete) in the rightmost slot k
        nxt = target.gather(1, k.clamp(max=N - 1).unsqueeze(1)).squeeze(1) if N > 0 else k
        nxt = torch.where(k < target_lengths, nxt, torch.full_like(nxt, eos))  # (B,)
        lp = content_lprobs[torch.arange(B, device=k.device), k]  # (B, V)
        loc_k = loc.gather(1, k.unsqueeze(1)).squeeze(1)  # (B,)
        nll = -(lp.float().gather(1, nxt.unsqueeze(1)).squeeze(1) + loc_k)
        if eps == 0:
            return nll, nll
        return (1 - eps) * nll + eps * -(lp.float().mean(-1) + loc_k), nll  # -(1/V) sum_c log p(c, l)

    slot, start, end = slot_spans(keep, target_lengths)
    slot = slot.clamp(max=S - 1)
    tok_lp = content_lprobs.reshape(B, S * V).gather(1, slot * V + target.clamp(0, V - 1)).float()  # (B, N)
    return _slot_loss(tok_lp, content_lprobs[:, :, eos].float(), content_lprobs.float().mean(-1) if eps > 0 else None,
                      loc, target_lengths, keep, (slot, start, end), order, termination, tau, eps)


def flat_insertion_loss(content_lprobs: Tensor, real: Tensor, location_lprobs: Tensor, target: Tensor,
                        target_lengths: Tensor, keep: Tensor, order: str, termination: str, eos: int, tau: float = 1.0,
                        label_smoothing: float = 0.0) -> Tuple[Tensor, Tensor]:
    """:func:`insertion_loss` with the content of the real slots alone: ``content_lprobs`` (M, V) log p(c | l) of
    the slots ``real`` (R, S) (the k + 1 slots of each canvas), in row-major order; ``location_lprobs`` (R, S);
    target, keep (R, N); binary_tree and uniform orders. Returns (loss, nll), each (R,)."""
    if termination not in TERMINATIONS:
        raise ValueError(f"unknown termination {termination!r}; choose one of {TERMINATIONS}")
    if order == "left_to_right":
        raise ValueError("the loss over real slots alone takes the binary_tree and uniform orders, not left_to_right")
    R, S = real.shape
    V = content_lprobs.size(1)
    row = (real.flatten().long().cumsum(0) - 1).view(R, S)  # (R, S) each real slot's row of content_lprobs
    slot, start, end = slot_spans(keep, target_lengths)
    slot = slot.clamp(max=S - 1)
    tok_lp = content_lprobs[row.gather(1, slot).clamp(min=0), target.clamp(0, V - 1)].float()  # (R, N)
    lp = content_lprobs.float()

    def per_slot(x: Tensor) -> Tensor:  # (M,) -> (R, S), 0 at the slots that are not real
        return x.new_zeros(R, S).masked_scatter(real, x)

    mean = per_slot(lp.mean(-1)) if label_smoothing > 0 else None
    return _slot_loss(tok_lp, per_slot(lp[:, eos]), mean, location_lprobs.float(), target_lengths, keep,
                      (slot, start, end), order, termination, tau, label_smoothing)


def _slot_loss(tok_lp: Tensor, eos_lp: Tensor, mean_lp: Optional[Tensor], loc: Tensor, target_lengths: Tensor,
               keep: Tensor, spans: Tuple[Tensor, Tensor, Tensor], order: str, termination: str, tau: float,
               eps: float) -> Tuple[Tensor, Tensor]:
    """The weighted slot loss from the model's values: ``tok_lp`` (B, N) log p(y_i | l) at each target token's slot,
    ``eos_lp`` (B, S) log p(eos | l), ``mean_lp`` (B, S) the mean of log p(c | l) over the vocabulary (None: no
    smoothing), ``loc`` (B, S) log p(l); ``spans``: :func:`slot_spans` of ``keep``, the slots clamped to S - 1."""
    B, S = loc.shape
    N = tok_lp.size(1)
    slot, start, end = spans
    k = keep.sum(1)  # (B,) canvas lengths
    slots = L.slot_mask(TORCH, k, S)  # (B, S)
    eos_nll = -(eos_lp + loc)  # (B, S)
    # -(1/V) sum_c log p(c, l): a full pass over (B, S, V), so only when smoothing is on
    smooth = -(mean_lp + loc) if mean_lp is not None else None  # (B, S)
    valid = torch.arange(N, device=keep.device).unsqueeze(0) < target_lengths.unsqueeze(1)
    missing = valid & ~keep  # (B, N)
    w = slot_weights(start, end, order, tau) * missing  # (B, N)
    # -log p(y_i, l) at every missing token, l = its slot
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
