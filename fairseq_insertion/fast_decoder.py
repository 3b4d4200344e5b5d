"""The cached inference path of the insertion decoder (docs/design.md): :func:`encoder_cache` projects the encoder
output to every layer's encoder-attention keys and values once a batch; :func:`cached_slot_states` runs fairseq's
decoder layers over a framed canvas with full self-attention, each attention one ``scaled_dot_product_attention``
(:func:`fused_projections`). Layers it does not cover (:func:`cacheable`) fall back to ``extract_features``.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerDecoderBase
from torch import Tensor, nn

from .weights import (
    Projection,
    blocks,
    encoder_attention_projections,
    encoder_keys_values,
    residual,
    self_attention_projections,
    self_attention_qkv,
)


class FusedProjections(NamedTuple):
    """The decoder's attention projections fused for inference (:func:`fused_projections`); the query scaling stays
    in the attention call (folded into the q rows it would round q differently where it is not a power of two)."""

    self_attention: List[Projection]  # per layer q, k and v as one (weights.self_attention_qkv)
    encoder_attention: Projection  # every layer's encoder-attention k and v as one (weights.encoder_keys_values)
    source: Tuple[Tuple[Tensor, tuple], ...]  # the parameters they were made from, to see a change (fits)

    def fits(self, parameters: List[Tensor]) -> bool:
        """Whether ``parameters`` are those they were made from, unchanged."""
        return len(parameters) == len(self.source) and all(
            p is q and _state(p) == state for p, (q, state) in zip(parameters, self.source))


def _state(p: Tensor) -> tuple:
    return p.data_ptr(), p._version, p.dtype, p.device


def fused_projections(decoder: TransformerDecoderBase,
                      previous: Optional[FusedProjections] = None) -> Optional[FusedProjections]:
    """The fused attention projections of ``decoder`` (``previous`` when it still fits the parameters), or None where
    :func:`cacheable` rejects the layers or a projection is not a plain ``nn.Linear`` (int8 dynamic quantization)."""
    if not cacheable(decoder):
        return None
    projections = [p for layer in decoder.layers for p in self_attention_projections(layer.self_attn)]
    projections += encoder_attention_projections(decoder.layers)
    if not all(isinstance(p, nn.Linear) for p in projections):  # int8 dynamic quantization
        return None
    parameters = [t for p in projections for t in (p.weight, p.bias) if t is not None]
    if previous is not None and previous.fits(parameters):
        return previous
    return FusedProjections([self_attention_qkv(layer.self_attn) for layer in decoder.layers],
                            encoder_keys_values(decoder.layers), tuple((p, _state(p)) for p in parameters))


class EncoderCache(NamedTuple):
    """What every decoding pass reuses of a batch's source side (one entry per sentence): the encoder-attention keys
    and values of every decoder layer, computed once, or, for layers this path does not cover, ``encoder_out``."""

    encoder_out: Optional[Dict[str, List[Tensor]]]  # fairseq's, for layers not covered (None: the keys and values)
    keys: List[Tensor]  # per layer (B, heads, S_src, head dim)
    values: List[Tensor]  # per layer (B, heads, S_src, head dim)
    source_keep: Optional[Tensor]  # (B, 1, 1, S_src) True at real source tokens; None where no source is padded
    positions: Optional[Tensor] = None  # the decoder's position embeddings of an unpadded canvas (1, max positions, C)
    fused: Optional[FusedProjections] = None  # the model's fused projections; None where they run one by one

    def select(self, order: Tensor) -> "EncoderCache":
        """The cached keys, values and mask of the sentences ``order`` (A,), in that order
        (``encoder_out``, when set, is reordered by the encoder: see the model)."""
        keep = self.source_keep
        return self._replace(keys=[k.index_select(0, order) for k in self.keys],
                             values=[v.index_select(0, order) for v in self.values],
                             source_keep=None if keep is None else keep.index_select(0, order))


def uncovered(decoder: TransformerDecoderBase) -> List[str]:
    """What of the decoder's layers :func:`cached_slot_states` does not cover, named by fairseq's flags (it
    covers plain pre- or post-norm layers with encoder attention)."""
    layers = decoder.layers
    attns = [a for layer in layers for a in (layer.self_attn, layer.encoder_attn) if a is not None]
    found = {
        "--cross-self-attention": decoder.cross_self_attention or any(layer.cross_self_attention for layer in layers),
        "--no-cross-attention": any(layer.encoder_attn is None for layer in layers),
        "--retain-dropout": any(a.dropout_module.apply_during_inference for a in attns),
        "NormFormer (--scale-attn, --scale-fc, --scale-heads, --scale-resids)": any(
            layer.c_attn is not None or layer.attn_ln is not None or layer.ffn_layernorm is not None
            or layer.w_resid is not None for layer in layers),
        "attention bias_kv / add_zero_attn": any(a.bias_k is not None or a.add_zero_attn for a in attns),
    }
    return [flag for flag, there in found.items() if there]


def cacheable(decoder: TransformerDecoderBase) -> bool:
    """Whether :func:`cached_slot_states` covers these layers (nothing :func:`uncovered`), in inference."""
    return not decoder.training and not uncovered(decoder)


def encoder_cache(decoder: TransformerDecoderBase, encoder_out: Dict[str, List[Tensor]],
                  fused: Optional[FusedProjections] = None) -> EncoderCache:
    """Project the encoder output to every layer's encoder-attention keys and values once (or keep ``encoder_out`` for
    layers :func:`cacheable` rejects). ``fused``: the model's :func:`fused_projections` (None: built here)."""
    if not cacheable(decoder):
        return EncoderCache(encoder_out, [], [], None)
    fused = fused if fused is not None else fused_projections(decoder)
    enc = encoder_out["encoder_out"][0]  # (S_src, B, C)
    mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
    source_keep = None if mask is None or not bool(mask.any()) else ~mask[:, None, None, :]  # (B, 1, 1, S_src)
    S_src, B, _ = enc.shape
    if fused is not None:  # every layer's keys and values in one product: (L, 2, B, heads, S_src, head dim)
        attn = decoder.layers[0].encoder_attn
        kv = F.linear(enc, *fused.encoder_attention).view(S_src, B, len(decoder.layers), 2, attn.num_heads,
                                                            attn.head_dim).permute(2, 3, 1, 4, 0, 5).contiguous()
        keys, values = list(kv[:, 0].unbind(0)), list(kv[:, 1].unbind(0))
    else:
        keys, values = encoder_keys_values_per_layer(decoder, enc)
    positions = None
    if decoder.embed_positions is not None:  # fairseq's make_positions numbers the real tokens 1, 2, ...
        positions = decoder.embed_positions(enc.new_full((1, decoder.max_positions()), decoder.dictionary.bos(),
                                                         dtype=torch.long))  # (1, P, C)
    return EncoderCache(None, keys, values, source_keep, positions, fused)


def encoder_keys_values_per_layer(decoder: TransformerDecoderBase, enc: Tensor) -> Tuple[List[Tensor], List[Tensor]]:
    """Each decoder layer's encoder-attention keys and values of the encoder states ``enc`` (S_src, B, C), projection
    by projection: (B, heads, S_src, head dim) each."""
    keys: List[Tensor] = []
    values: List[Tensor] = []
    S_src, B, _ = enc.shape
    for layer in decoder.layers:
        attn = layer.encoder_attn
        for proj, out in ((attn.k_proj, keys), (attn.v_proj, values)):
            x = proj(enc).view(S_src, B, attn.num_heads, attn.head_dim)
            out.append(x.permute(1, 2, 0, 3).contiguous())  # (B, heads, S_src, head dim)
    return keys, values


def cached_slot_states(decoder: TransformerDecoderBase, framed: Tensor, cache: EncoderCache) -> Tensor:
    """The insertion decoder's ``slot_states`` in inference, reusing the encoder-attention keys and values of
    ``cache``. decoder: an ``InsertionDecoder``; framed: (A, T+2) -> slot states (A, T+1, C)."""
    if cache.encoder_out is not None:
        return decoder.slot_states(framed, cache.encoder_out)
    x = decoder.embed_tokens(framed).mul_(decoder.embed_scale)  # (A, T+2, C), as in extract_features
    if decoder.quant_noise is not None:
        x = decoder.quant_noise(x)
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if cache.positions is not None:  # canvases are right-padded: a prefix of the table, zero at padding
        positions = cache.positions[:, : framed.size(1)]  # (1, T+2, C)
        if framed.size(0) == 1:
            x.add_(positions)
        else:  # x + positions * real, the product exact
            x.addcmul_(positions, framed.ne(decoder.padding_idx).unsqueeze(-1).to(x.dtype))
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    x = decoder.dropout_module(x).transpose(0, 1)  # (T+2, A, C)
    # a single canvas has no padding (the generator trims the batch to its longest canvas);
    # fairseq's extract_features passes no mask then either
    keep = framed.ne(decoder.padding_idx)[:, None, None, :] if framed.size(0) > 1 else None  # (A, 1, 1, T+2)
    qkv = cache.fused.self_attention if cache.fused is not None else [None] * len(decoder.layers)
    for layer, k, v, fused in zip(decoder.layers, cache.keys, cache.values, qkv):
        x = _cached_layer(layer, x, keep, k, v, cache.source_keep, fused)
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    x = x.transpose(0, 1)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return decoder.pair_slots(x)  # (A, T+1, C)


def _cached_layer(layer, x: Tensor, keep: Optional[Tensor], k: Tensor, v: Tensor, src_keep: Optional[Tensor],
                  qkv: Optional[Projection]) -> Tensor:
    """One fairseq decoder layer in inference (full self-attention over the canvas), with the encoder-attention keys
    and values given. x: (T, A, C); k, v: (A, heads, S_src, d); qkv: the fused projection (None: one by one)."""
    sublayers = {"self_attn": lambda h: self_attention(layer.self_attn, h, keep, None, qkv)[0],
                 "encoder_attn": lambda h: attention(layer.encoder_attn, heads(layer.encoder_attn,
                                                                               layer.encoder_attn.q_proj(h)),
                                                     k, v, src_keep, h.shape),
                 "ffn": lambda h: layer.fc2(layer.activation_dropout_module(_activation(layer, layer.fc1(h))))}
    for name, norm in blocks(layer):  # the sum added into the sublayer's fresh output (residual_connection's x + y)
        x = residual(x, sublayers[name], norm, layer.normalize_before, lambda a, y: layer.dropout_module(y).add_(a))
    return x


def _activation(layer, h: Tensor) -> Tensor:
    return torch.relu_(h) if layer.activation_fn is F.relu else layer.activation_fn(h)


def heads(attn: nn.Module, y: Tensor) -> Tensor:
    """(T, A, C) -> (A, heads, T, d)."""
    return y.view(y.size(0), y.size(1), attn.num_heads, attn.head_dim).permute(1, 2, 0, 3)


def self_attention(attn: nn.Module, x: Tensor, keep: Optional[Tensor], past: Optional[Tuple[Tensor, Tensor]] = None,
                   qkv: Optional[Projection] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Self-attention of ``x`` (T, A, C) over the ``past`` keys and values (None: none) and its own; ``qkv``: the
    fused q/k/v projection (:class:`FusedProjections`; None: projection by projection). Returns its output
    (T, A, C) and the keys and values, past and new (A, heads, M + T, d) each."""
    if qkv is not None:
        T, A, _ = x.shape
        q, k, v = F.linear(x, *qkv).view(T, A, 3, attn.num_heads, attn.head_dim).permute(2, 1, 3, 0, 4).unbind(0)
    else:
        q, k, v = (heads(attn, p(x)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    if past is not None:
        k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
    return attention(attn, q, k, v, keep, x.shape), k, v


def attention(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], shape: torch.Size) -> Tensor:
    """fairseq's ``MultiheadAttention`` as one scaled_dot_product_attention call (its attention dropout in
    training): q (A, heads, T, d), k and v (A, heads, M, d), keep (A, 1, T or 1, M) True where attending is allowed
    (None: everywhere) -> (T, A, C)."""
    p = attn.dropout_module.p if attn.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p, scale=attn.scaling)
    return attn.out_proj(y.permute(2, 0, 1, 3).reshape(shape))
