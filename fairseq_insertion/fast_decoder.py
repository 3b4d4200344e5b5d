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

from . import weights as W
from .weights import Projection, blocks, residual


class FusedProjections(NamedTuple):
    """The decoder's attention projections fused for inference (:func:`fused_projections`); the query scaling stays
    in the attention call (folded into the q rows it would round q differently where it is not a power of two)."""

    self_attention: List[Projection]  # per layer q, k and v as one (weights.self_attention_qkv)
    encoder_attention: Projection  # every layer's encoder-attention k and v as one (weights.encoder_keys_values)
    source: Tuple[Tuple[Tensor, tuple], ...]  # the parameters they were made from, to see a change


def _state(p: Tensor) -> tuple:
    return p.data_ptr(), p._version, p.dtype, p.device


def fused_projections(decoder: TransformerDecoderBase,
                      previous: Optional[FusedProjections] = None) -> Optional[FusedProjections]:
    """The fused attention projections of ``decoder`` (``previous`` when it still fits the parameters), or None where
    :func:`cacheable` rejects the layers or a projection is not a plain ``nn.Linear`` (int8 dynamic quantization)."""
    if not cacheable(decoder):
        return None
    projections = [p for layer in decoder.layers for p in W.self_attention_projections(layer.self_attn)]
    projections += W.encoder_attention_projections(decoder.layers)
    if not all(isinstance(p, nn.Linear) for p in projections):  # int8 dynamic quantization
        return None
    parameters = [t for p in projections for t in (p.weight, p.bias) if t is not None]
    if previous is not None and len(parameters) == len(previous.source) and all(
            p is q and _state(p) == state for p, (q, state) in zip(parameters, previous.source)):  # unchanged
        return previous
    return FusedProjections([W.self_attention_qkv(layer.self_attn) for layer in decoder.layers],
                            W.encoder_keys_values(decoder.layers), tuple((p, _state(p)) for p in parameters))


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
        """The keys, values and mask of the sentences ``order`` (A,), in that order (``encoder_out``: see the model)."""
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
    fused = cache.fused.self_attention if cache.fused is not None else None
    return decoder.pair_slots(layers(decoder, x, keep, cache, fused=fused, inplace=True))  # (A, T+1, C)


def layers(decoder: nn.Module, x: Tensor, keep: Optional[Tensor], enc: EncoderCache,
           past: Optional[List[Tuple[Tensor, Tensor]]] = None, fused: Optional[List[Projection]] = None,
           span: Optional[range] = None, kv: Optional[List[Tuple[Tensor, Tensor]]] = None,
           inplace: bool = False) -> Tensor:
    """The decoder layers ``span`` (all by default) over ``x`` (T, A, C) (embedded, or the states of the layer below)
    with ``enc``'s encoder-attention keys and values: each token attends to the tokens ``keep`` (A, 1, T or 1, M + T;
    None: all) allows of the ``past`` keys and values (one a layer of the span, (A, heads, M, d) each; None: M = 0) and
    of its own; after the last layer, the final layer norm and output projection. ``fused``: each layer's q/k/v
    projection (None: one by one); ``kv`` gets each layer's keys and values, past and new (A, heads, M + T, d);
    ``inplace``: residual sums added into the sublayers' fresh outputs (inference). Returns the states (A, T, C)."""
    span = range(len(decoder.layers)) if span is None else span
    for j, i in enumerate(span):
        layer = decoder.layers[i]

        def own_attention(h: Tensor, layer=layer, i=i, j=j) -> Tensor:
            attn = layer.self_attn
            if fused is not None:
                qkv = F.linear(h, *fused[i]).view(*h.shape[:2], 3, attn.num_heads, attn.head_dim)  # (T, A, 3, heads, d)
                q, k, v = qkv.permute(2, 1, 3, 0, 4).unbind(0)
            else:
                q, k, v = (heads(attn, p(h)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            if past is not None:  # (A, heads, M + T, d) each
                k, v = torch.cat([past[j][0], k], 2), torch.cat([past[j][1], v], 2)
            if kv is not None:
                kv.append((k, v))
            return attention(attn, q, k, v, keep, h.shape)

        sublayers = {"self_attn": own_attention,
                     "encoder_attn": lambda h, layer=layer, i=i: attention(
                         layer.encoder_attn, heads(layer.encoder_attn, layer.encoder_attn.q_proj(h)),
                         enc.keys[i], enc.values[i], enc.source_keep, h.shape),
                     "ffn": lambda h, layer=layer: layer.fc2(layer.activation_dropout_module(
                         (torch.relu_ if layer.activation_fn is F.relu else layer.activation_fn)(layer.fc1(h))))}
        add = (lambda a, y, layer=layer: layer.dropout_module(y).add_(a)) if inplace \
            else (lambda a, y, layer=layer: layer.dropout_module(y) + a)
        for name, norm in blocks(layer):
            x = residual(x, sublayers[name], norm, layer.normalize_before, add)
    if span.stop < len(decoder.layers):
        return x.transpose(0, 1)
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    x = x.transpose(0, 1)  # (A, T, C)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return x


def heads(attn: nn.Module, y: Tensor) -> Tensor:
    """(T, A, C) -> (A, heads, T, d)."""
    return y.view(y.size(0), y.size(1), attn.num_heads, attn.head_dim).permute(1, 2, 0, 3)


def attention(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], shape: torch.Size) -> Tensor:
    """fairseq's ``MultiheadAttention`` as one scaled_dot_product_attention call (its attention dropout in
    training): q (A, heads, T, d), k and v (A, heads, M, d), keep (A, 1, T or 1, M) True where attending is allowed
    (None: everywhere) -> (T, A, C)."""
    p = attn.dropout_module.p if attn.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p, scale=attn.scaling)
    return attn.out_proj(y.permute(2, 0, 1, 3).reshape(shape))
