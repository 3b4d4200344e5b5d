"""The cached decoder (``--cached-decoder``, docs/training.md): every token's states computed once, in the pass
after its insertion, and kept between passes, by fractional positions (:class:`FractionalPositions`) and attention
by pass (:func:`pass_states`, :class:`PassCache`) (Zhang, Zhang and Dolan, "Towards More Efficient Insertion
Transformer with Fractional Positional Encoding", EACL 2023). Training (:func:`trajectory_states`,
:func:`trajectory_slots`): one decoder pass over the whole target under the pass mask of the balanced binary tree
(:func:`fairseq_insertion.canvas.tree_levels`; level d is inserted by pass d) gives every pass's canvas at once.
Same layer code in both: :func:`layers`. Torch; the decoder's modules read by their attributes.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import canvas as C
from . import loop as L
from .decoding import TORCH
from .fast_decoder import EncoderCache, encoder_keys_values_per_layer, layers, uncovered
from .weights import Projection, slot_head

OPTION = "--cached-decoder"


class FractionalPositions(nn.Module):
    """Position vectors: bos's and eos's learned (``ends`` (2, C)), an inserted token's ``ELU(W [p_l; p_r] + b)``
    from its neighbours' at its insertion (:meth:`between`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.ends = nn.Parameter(torch.empty(2, dim).normal_(std=0.5))  # p_bos, p_eos
        self.mix = nn.Linear(2 * dim, dim)  # W, b
        nn.init.xavier_uniform_(self.mix.weight)
        nn.init.zeros_(self.mix.bias)

    def between(self, left: Tensor, right: Tensor) -> Tensor:
        """(.., C) each -> (.., C): the position of a token inserted between these two."""
        return F.elu(self.mix(torch.cat([left, right], -1)))


def check_layers(decoder: nn.Module) -> None:
    """Refuse, in one line, the decoder layers the cached decoder does not run (:func:`~.fast_decoder.uncovered`)."""
    found = uncovered(decoder)
    if found:
        raise ValueError(f"{OPTION} runs plain pre- or post-norm decoder layers with encoder attention; train "
                         f"without {', '.join(found)}")


def encoder_side(decoder: nn.Module, encoder_out: dict) -> EncoderCache:
    """The encoder-attention keys and values of fairseq's ``encoder_out``, with their gradient (training)."""
    enc = encoder_out["encoder_out"][0]  # (S_src, B, C)
    mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
    keys, values = encoder_keys_values_per_layer(decoder, enc)
    return EncoderCache(None, keys, values, None if mask is None else ~mask[:, None, None, :])


def cached_layers(decoder: nn.Module) -> range:
    """The layers whose states a pass keeps: all but the top ``--recomputed-layers``."""
    return range(len(decoder.layers) - decoder.recomputed)


def recomputed(decoder: nn.Module, x: Tensor, real: Tensor, enc: EncoderCache,
               fused: Optional[List[Projection]] = None) -> Tensor:
    """The top ``--recomputed-layers`` over whole canvases, full attention as in the plain decoder: x (A, T, C) the
    cached layers' states of the framed canvases, real (A, T) their columns -> the final states (A, T, C)."""
    if not decoder.recomputed:
        return x
    span = range(len(decoder.layers) - decoder.recomputed, len(decoder.layers))
    return layers(decoder, x.transpose(0, 1), real[:, None, None, :], enc, None, fused, span)


def _embed(decoder: nn.Module, tokens: Tensor, positions: Tensor) -> Tensor:
    """Tokens (A, T) and their position vectors (A, T, C) -> the first layer's input (T, A, C), as fairseq's
    ``extract_features`` embeds them."""
    x = decoder.embed_scale * decoder.embed_tokens(tokens)
    if decoder.quant_noise is not None:
        x = decoder.quant_noise(x)
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    x = x + positions.to(x.dtype)
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    return decoder.dropout_module(x).transpose(0, 1)


# -------------------------------- Training: the whole target under the pass mask
TRAJECTORIES = ("balanced", "sampled")


def framed_levels(target_lengths: Tensor, max_len: int, trajectory: str = "balanced", tau: float = 1.0) -> Tensor:
    """(B, N + 2) the pass that inserts each position of the framed target ``[bos] y [eos]``: bos and eos -1, y_i
    its tree level, padding N + 1. ``trajectory``: ``balanced``, each span's centre (:func:`~.canvas.tree_levels`),
    or ``sampled`` from the binary-tree weights at ``tau`` (:func:`~.canvas.sample_tree_levels`)."""
    real = torch.arange(max_len, device=target_lengths.device).unsqueeze(0) < target_lengths.unsqueeze(1)
    levels = C.tree_levels(target_lengths, max_len) if trajectory == "balanced" \
        else C.sample_tree_levels(target_lengths, max_len, tau)
    levels = levels.masked_fill(~real, max_len + 1)  # (B, N)
    return L.frame(TORCH, levels, target_lengths, -1, -1, max_len + 1)  # bos and eos: -1, before every inserted token


def _token_levels(levels: Tensor) -> Tensor:
    """(B, N + 2) framed levels -> (B, N) the target tokens' (eos's column and padding: N + 1)."""
    tokens = levels[:, 1:-1]
    return tokens.masked_fill(tokens.lt(0), levels.size(1) - 1)


def _rows(x: Tensor, index: Tensor) -> Tensor:
    """x (B, T, C), index (B, N) -> (B, N, C)."""
    return x.gather(1, index.clamp(0, x.size(1) - 1).unsqueeze(-1).expand(-1, -1, x.size(2)))


def trajectory_states(decoder: nn.Module, framed: Tensor, levels: Tensor, target_lengths: Tensor,
                      enc: EncoderCache) -> Tensor:
    """The cached layers' states (B, N + 2, C) of the framed target ``framed`` (B, N + 2) under the pass mask (the
    final states when every layer is cached): each position's as the cached decoder computes it in the pass after its
    insertion, its position vector from those of its neighbours on the canvas it is inserted into. levels:
    :func:`framed_levels`, or any order in which the tokens of one pass have tokens of earlier passes (or bos, eos) on
    both sides."""
    B, T = levels.shape
    N = T - 2
    col = torch.arange(T, device=levels.device).unsqueeze(0)  # (1, T)
    p_bos, p_eos = decoder.fractional.ends[0], decoder.fractional.ends[1]
    P = torch.where(col.eq(0).unsqueeze(-1), p_bos, torch.zeros_like(p_bos))
    P = torch.where(col.eq(target_lengths.unsqueeze(1) + 1).unsqueeze(-1), p_eos, P)  # (B, T, C)
    tokens = _token_levels(levels)  # (B, N)
    passes = int(tokens.masked_fill(tokens.gt(N), -1).max()) + 1 if tokens.numel() else 0
    for d in range(passes):  # one step per pass (tree level): the position vectors of its tokens
        _, start, end = C.slot_spans(tokens < d, target_lengths)  # (B, N) each: the span around each new token
        # start, end + 2: the framed columns of its neighbours on the canvas of levels < d
        new = decoder.fractional.between(_rows(P, start), _rows(P, end + 2))  # (B, N, C)
        at = F.pad(tokens.eq(d), (1, 1)).unsqueeze(-1)  # (B, T, 1)
        P = torch.where(at, F.pad(new, (0, 0, 1, 1)), P)
    x = _embed(decoder, framed, P)  # (T, B, C)
    # (B, 1, T, T): i attends to j inserted in i's pass or before it (bos and eos first), padding (level T - 1) never
    mask = (levels.unsqueeze(1) <= levels.unsqueeze(2)).logical_and(levels.ne(framed.size(1) - 1).unsqueeze(1))
    return layers(decoder, x, mask.unsqueeze(1), enc, span=cached_layers(decoder))


class TrajectorySlots(NamedTuple):
    """The canvases of every pass of a batch's trajectories, one row each (R of them)."""

    sentence: Tensor  # (R,) the sentence of each row
    keep: Tensor  # (R, N) the target positions on the row's canvas (the levels below its pass)
    left: Tensor  # (R, S) the framed-target column of each slot's left neighbour
    real: Tensor  # (R, S) the canvas's k + 1 slots


def trajectory_slots(levels: Tensor, target_lengths: Tensor) -> TrajectorySlots:
    """Every pass of each sentence's tree decode: the canvas before pass t holds the levels below t, for t = 0 .. its
    deepest level + 1 (the last, the whole target, is where every slot ends; floor(log2 n) + 1 for the balanced
    tree). levels: (B, N + 2)."""
    tokens = _token_levels(levels)  # (B, N)
    B, N = tokens.shape
    depth = tokens.masked_fill(tokens.gt(N), -1).amax(1) + 1 if N else target_lengths * 0  # (B,)
    D = int(depth.max()) if B else 0
    t = torch.arange(D + 1, device=levels.device)  # (D + 1,)
    sentence, pass_ = (t.unsqueeze(0) <= depth.unsqueeze(1)).nonzero(as_tuple=True)  # (R,) each
    keep = tokens[sentence] < pass_.unsqueeze(1)  # (R, N)
    columns = torch.arange(1, N + 1, device=levels.device).unsqueeze(0).expand_as(keep)  # framed columns of y
    canvas, k = L.gather_canvas(TORCH, columns, keep, 0)  # (R, K), (R,)
    left = F.pad(canvas, (1, 0))  # (R, K + 1) slot l lies right of column left[l] (bos: 0)
    return TrajectorySlots(sentence, keep, left, L.slot_mask(TORCH, k, canvas.size(1) + 1))


class TrajectoryOutput(NamedTuple):
    """The cached decoder's training output (:func:`trajectory_output`): every pass's slots."""

    content: Tensor  # (M, V) raw content scores of the real slots, row-major
    location: Tensor  # (R, S) location logits
    slots: TrajectorySlots  # the rows: each one pass's canvas of one sentence


def trajectory_output(decoder: nn.Module, framed: Tensor, levels: Optional[Tensor], target_lengths: Optional[Tensor],
                      encoder_out: dict) -> TrajectoryOutput:
    """The scores of every slot of every pass of the framed targets ``framed`` (B, N + 2): the decoder's forward
    in training. levels: :func:`framed_levels`; target_lengths (B,)."""
    if levels is None or target_lengths is None:
        raise ValueError(f"{OPTION}: the decoder trains on whole targets with their levels (--criterion "
                         "insertion_loss)")
    enc = encoder_side(decoder, encoder_out)
    states = trajectory_states(decoder, framed, levels, target_lengths, enc)  # (B, N + 2, C)
    slots = trajectory_slots(levels, target_lengths)
    x = states[slots.sentence]  # (R, T, C)
    k = slots.real.sum(1, keepdim=True) - 1  # (R, 1) canvas lengths
    eos = (target_lengths[slots.sentence] + 1).unsqueeze(1)  # (R, 1) eos's framed column
    if decoder.recomputed:  # each pass's canvas through the top layers: (R, S + 1) columns, bos to eos
        columns = F.pad(slots.left, (0, 1)).scatter(1, k + 1, eos)
        real = torch.arange(columns.size(1), device=k.device).unsqueeze(0) <= k + 1  # (R, S + 1)
        H = decoder.pair_slots(recomputed(decoder, _rows(x, columns), real, enc.select(slots.sentence)))  # (R, S, C)
    else:  # each slot's neighbours' final states, concatenated (right: the next canvas token, eos after the last)
        last = torch.arange(slots.real.size(1), device=k.device).unsqueeze(0) >= k  # (R, S) the last slot and padding
        right = torch.where(last, eos, F.pad(slots.left[:, 1:], (0, 1)))  # (R, S)
        H = slot_head(decoder).pair(torch.cat([_rows(x, slots.left), _rows(x, right)], -1))  # (R, S, C)
    content, location = decoder.head(H, slots.real, decoder.output_layer, slots.real)  # (M, V), (R, S)
    return TrajectoryOutput(content, location, slots)


# -------------------------------- Decoding: a pass runs the tokens the last pass inserted
class PassCache(NamedTuple):
    """What a cached decode keeps between passes, one row per active sentence; M the cached tokens (bos, eos, then
    each pass's insertions, padded), in cache order, which the canvas order maps to by ``index``."""

    encoder: EncoderCache  # the encoder-attention keys and values (fast_decoder)
    keys: List[Tensor]  # per layer (A, heads, M, d)
    values: List[Tensor]  # per layer (A, heads, M, d)
    positions: Tensor  # (A, M, C) each cached token's position vector
    states: Tensor  # (A, M, C) its cached layers' states (the final states when every layer is cached)
    real: Tensor  # (A, M) the cached tokens (False: padding)
    index: Tensor  # (A, T + 2) each column of the last framed canvas -> its cache column (-1: padding)

    def select(self, order: Tensor) -> "PassCache":
        """The rows ``order`` (A',), in that order."""
        return PassCache(self.encoder.select(order), [k.index_select(0, order) for k in self.keys],
                         [v.index_select(0, order) for v in self.values], *(t.index_select(0, order) for t in self[3:]))


def start_cache(decoder: nn.Module, encoder: EncoderCache, batch: int, bos: int, eos: int) -> PassCache:
    """The cache before the first pass: bos and eos, attending to each other alone."""
    device = decoder.fractional.ends.device
    framed = torch.tensor([[bos, eos]], device=device).expand(batch, 2)  # (A, 2)
    positions = decoder.fractional.ends.unsqueeze(0).expand(batch, 2, -1)  # (A, 2, C)
    kv: List[Tuple[Tensor, Tensor]] = []
    states = layers(decoder, _embed(decoder, framed, positions), framed.new_ones(batch, 1, 1, 2, dtype=torch.bool),
                    encoder, None, _fused(encoder), cached_layers(decoder), kv)
    return PassCache(encoder, [k for k, _ in kv], [v for _, v in kv], positions, states,
                     framed.new_ones(batch, 2, dtype=torch.bool), torch.arange(2, device=device).expand(batch, 2))


def _compact(mask: Tensor, values: Tensor, width: int, fill) -> Tensor:
    """The ``values`` (A, T, ...) at ``mask`` (A, T), left-aligned in each row's order: (A, width, ...), ``fill``
    after."""
    rank = torch.where(mask, mask.long().cumsum(1) - 1, width)  # (A, T) each one's column; width: dropped
    out = values.new_full((mask.size(0), width + 1, *values.shape[2:]), fill)
    index = rank.view(*rank.shape, *([1] * (values.dim() - 2))).expand_as(values)
    return out.scatter_(1, index, values)[:, :width]


def pass_states(decoder: nn.Module, framed: Tensor, fresh: Tensor, cache: PassCache) -> Tuple[Tensor, PassCache]:
    """One decoding pass: the final states of the framed canvases ``framed`` (A, T + 2), computing those of the
    ``fresh`` tokens (A, T + 2) (inserted by the last pass; each between two cached ones) and reading the others
    from ``cache``. Returns the states (A, T + 2, C) and the cache with the fresh tokens added."""
    A = framed.size(0)
    real = framed.ne(decoder.padding_idx)  # (A, T + 2)
    old = real & ~fresh  # (A, T + 2) the cached columns, in the previous canvas's order
    n_fresh = fresh.sum(1)  # (A,)
    W = int(n_fresh.max()) if A else 0
    M = cache.real.size(1)
    index = torch.full_like(framed, -1).masked_scatter(old, cache.index[cache.index.ge(0)])
    index = torch.where(fresh, M + fresh.long().cumsum(1) - 1, index)  # (A, T + 2) fresh: appended in canvas order
    if W == 0:
        cache = cache._replace(index=index)
    else:
        left, right = _rows(cache.positions, index.roll(1, 1)), _rows(cache.positions, index.roll(-1, 1))
        positions = _compact(fresh, decoder.fractional.between(left, right), W, 0.0)  # (A, W, C)
        tokens = _compact(fresh, framed, W, decoder.padding_idx)  # (A, W)
        new = torch.arange(W, device=framed.device).unsqueeze(0) < n_fresh.unsqueeze(1)  # (A, W)
        keep = torch.cat([cache.real, new], 1)[:, None, None, :]  # (A, 1, 1, M + W) fresh tokens share a pass
        kv: List[Tuple[Tensor, Tensor]] = []
        states = layers(decoder, _embed(decoder, tokens, positions), keep, cache.encoder,  # (A, W, C)
                        list(zip(cache.keys, cache.values)), _fused(cache.encoder), cached_layers(decoder), kv)
        cache = PassCache(cache.encoder, [k for k, _ in kv], [v for _, v in kv],
                          torch.cat([cache.positions, positions], 1), torch.cat([cache.states, states], 1),
                          torch.cat([cache.real, new], 1), index)
    return recomputed(decoder, _rows(cache.states, index), real, cache.encoder, _fused(cache.encoder)), cache


def _fused(encoder: EncoderCache) -> Optional[List[Projection]]:
    return encoder.fused.self_attention if encoder.fused is not None else None
