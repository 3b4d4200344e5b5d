"""The cached inference path of the insertion decoder.

In decoding, every pass runs the decoder over new canvases of the same source
sentences. :func:`encoder_cache` projects the encoder output to every layer's
encoder-attention keys and values once per batch; :func:`cached_slot_states`
then runs fairseq's decoder layers over a framed canvas with full
self-attention (what ``extract_features(..., full_context_alignment=True)``
computes), each attention one ``scaled_dot_product_attention`` call.

This is the only code of the package that mirrors fairseq's layer internals
(``TransformerDecoderBase.extract_features``, ``TransformerDecoderLayerBase``,
``MultiheadAttention``). Layers it does not cover (:func:`cacheable`) fall back
to fairseq's ``extract_features``. ``tests/test_fast_decoder.py`` checks both
paths against ``extract_features``.
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerDecoderBase
from torch import Tensor, nn


class EncoderCache(NamedTuple):
    """What every decoding pass reuses of a batch's source side (one entry per sentence).

    Either the encoder-attention keys and values of every decoder layer,
    computed once (``keys``/``values``: per layer (B, heads, S_src, head dim);
    ``padding_mask``: (B, S_src) True at source padding; ``positions``: the
    decoder's position embeddings of a canvas without padding, (1, max target
    positions, C)), or, for decoder layers this fast path does not cover,
    fairseq's ``encoder_out``.
    """

    encoder_out: Optional[Dict[str, List[Tensor]]]
    keys: List[Tensor]
    values: List[Tensor]
    padding_mask: Optional[Tensor]
    positions: Optional[Tensor] = None

    def select(self, order: Tensor) -> "EncoderCache":
        """The cached keys, values and mask of the sentences ``order`` (A,), in that order
        (``encoder_out``, when set, is reordered by the encoder: see the model)."""
        mask = self.padding_mask
        return self._replace(keys=[k.index_select(0, order) for k in self.keys],
                             values=[v.index_select(0, order) for v in self.values],
                             padding_mask=None if mask is None else mask.index_select(0, order))


def cacheable(decoder: TransformerDecoderBase) -> bool:
    """Whether :func:`cached_slot_states` covers these layers (plain pre- or post-norm
    layers with encoder attention; not NormFormer, cross-self-attention, bias_kv, or
    attention dropout kept at inference), in inference."""
    def plain(attn) -> bool:
        return (attn is not None and attn.bias_k is None and not attn.add_zero_attn
                and not attn.dropout_module.apply_during_inference)

    return not decoder.training and not decoder.cross_self_attention and all(
        plain(layer.self_attn) and plain(layer.encoder_attn) and not layer.cross_self_attention
        and layer.c_attn is None and layer.attn_ln is None and layer.ffn_layernorm is None
        and layer.w_resid is None
        for layer in decoder.layers
    )


def encoder_cache(decoder: TransformerDecoderBase, encoder_out: Dict[str, List[Tensor]]) -> EncoderCache:
    """Project the encoder output to every layer's encoder-attention keys and values once
    (or keep ``encoder_out`` for layers :func:`cacheable` rejects)."""
    if not cacheable(decoder):
        return EncoderCache(encoder_out, [], [], None)
    enc = encoder_out["encoder_out"][0]  # (S_src, B, C)
    mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
    S_src, B, _ = enc.shape
    keys, values = [], []
    for layer in decoder.layers:
        attn = layer.encoder_attn
        for proj, out in ((attn.k_proj, keys), (attn.v_proj, values)):
            x = proj(enc).view(S_src, B, attn.num_heads, attn.head_dim)
            out.append(x.permute(1, 2, 0, 3).contiguous())  # (B, heads, S_src, head dim)
    positions = None
    if decoder.embed_positions is not None:  # fairseq's make_positions numbers the real tokens 1, 2, ...
        positions = decoder.embed_positions(enc.new_full((1, decoder.max_positions()), decoder.dictionary.bos(),
                                                         dtype=torch.long))  # (1, P, C)
    return EncoderCache(None, keys, values, mask, positions)


def cached_slot_states(decoder: TransformerDecoderBase, framed: Tensor, cache: EncoderCache) -> Tensor:
    """The insertion decoder's ``slot_states`` in inference, reusing the encoder-attention
    keys and values of ``cache``. decoder: an ``InsertionDecoder`` (``slot_states``,
    ``pair_slots``); framed: (A, T+2) -> slot states (A, T+1, C)."""
    if cache.encoder_out is not None:
        return decoder.slot_states(framed, cache.encoder_out)
    x = decoder.embed_scale * decoder.embed_tokens(framed)  # (A, T+2, C), as in extract_features
    if decoder.quant_noise is not None:
        x = decoder.quant_noise(x)
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if cache.positions is not None:  # canvases are right-padded: a prefix of the table, zero at padding
        positions = cache.positions[:, : framed.size(1)]  # (1, T+2, C)
        x = x + (positions if framed.size(0) == 1 else positions * framed.ne(decoder.padding_idx).unsqueeze(-1))
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    x = decoder.dropout_module(x).transpose(0, 1)  # (T+2, A, C)
    # a single canvas has no padding (the generator trims the batch to its longest canvas);
    # fairseq's extract_features passes no mask then either
    keep = framed.ne(decoder.padding_idx)[:, None, None, :] if framed.size(0) > 1 else None  # (A, 1, 1, T+2)
    src_keep = None if cache.padding_mask is None else ~cache.padding_mask[:, None, None, :]  # (A, 1, 1, S_src)
    for layer, k, v in zip(decoder.layers, cache.keys, cache.values):
        x = _cached_layer(layer, x, keep, k, v, src_keep)
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    x = x.transpose(0, 1)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return decoder.pair_slots(x)  # (A, T+1, C)


def _cached_layer(layer, x: Tensor, keep: Optional[Tensor], k: Tensor, v: Tensor,
                  src_keep: Optional[Tensor]) -> Tensor:
    """One fairseq decoder layer in inference (full self-attention over the canvas), with
    the encoder-attention keys and values given. x: (T, A, C); k, v: (A, heads, S_src, d)."""
    x = _residual(layer, layer.self_attn_layer_norm, x, lambda h: _attention(layer.self_attn, h, h, keep))
    x = _residual(layer, layer.encoder_attn_layer_norm, x,
                  lambda h: _attention(layer.encoder_attn, h, (k, v), src_keep))
    return _residual(layer, layer.final_layer_norm, x,
                     lambda h: layer.fc2(layer.activation_dropout_module(layer.activation_fn(layer.fc1(h)))))


def _residual(layer, norm: nn.Module, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """fairseq's residual block: layer norm before (pre-norm) or after (post-norm) the sum."""
    y = sublayer(norm(x) if layer.normalize_before else x)
    x = layer.residual_connection(layer.dropout_module(y), x)
    return x if layer.normalize_before else norm(x)


def _attention(attn, x: Tensor, kv, keep: Optional[Tensor]) -> Tensor:
    """A fairseq ``MultiheadAttention`` in inference, as one scaled_dot_product_attention call.

    x: (T, A, C) queries; kv: the canvas itself (T, A, C) for self-attention, or the cached
    encoder keys and values, each (A, heads, S_src, d); keep: (A, 1, 1, S) True where
    attending is allowed (None: everywhere)."""
    T, A, C = x.shape

    def heads(y: Tensor) -> Tensor:  # (L, A, C) -> (A, heads, L, d)
        return y.view(y.size(0), A, attn.num_heads, attn.head_dim).permute(1, 2, 0, 3)

    k, v = (heads(attn.k_proj(kv)), heads(attn.v_proj(kv))) if torch.is_tensor(kv) else kv
    x = F.scaled_dot_product_attention(heads(attn.q_proj(x)), k, v, attn_mask=keep, scale=attn.scaling)
    return attn.out_proj(x.permute(2, 0, 1, 3).reshape(T, A, C))
