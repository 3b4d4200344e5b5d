"""The insertion decoder's weights as inference reads them, taken from fairseq's modules in one place: the
fused attention projections, the slot head and a Transformer layer's residual blocks. The cached torch path
(:mod:`fairseq_insertion.fast_decoder`) and the ONNX graph builders (:mod:`fairseq_insertion.export`) both read
them from here. Torch only: no fairseq import, the modules are read by their attributes (``q_proj``, ...).
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn


def blocks(layer: nn.Module) -> Tuple[Tuple[str, nn.Module], ...]:
    """A fairseq Transformer layer in inference: its residual blocks in order, each (sublayer, its layer norm):
    ``self_attn``, ``encoder_attn`` (decoder layers), ``ffn``."""
    cross = (("encoder_attn", layer.encoder_attn_layer_norm),) if getattr(layer, "encoder_attn", None) else ()
    return (("self_attn", layer.self_attn_layer_norm), *cross, ("ffn", layer.final_layer_norm))


def residual(x: Any, sublayer: Callable[[Any], Any], norm: Callable[[Any], Any], before: bool,
             add: Callable[[Any, Any], Any]) -> Any:
    """fairseq's residual block on either path's values: the layer norm ``norm`` before the sublayer (pre-norm,
    ``layer.normalize_before``) or after the sum ``add(x, sublayer's output)`` (post-norm)."""
    y = add(x, sublayer(norm(x) if before else x))
    return y if before else norm(y)


class Projection(NamedTuple):
    """y = x W^T + b: ``weight`` (out, in), ``bias`` (out,) or None (as ``F.linear`` takes them)."""

    weight: Tensor
    bias: Optional[Tensor]


def fuse(linears: Sequence[nn.Linear]) -> Projection:
    """Linear maps of one input stacked into one (inference, no gradient): their outputs side by side, in
    order; a missing bias is zeros where another has one, and the bias is None where none has."""
    with torch.no_grad():
        weight = torch.cat([p.weight for p in linears])  # (sum out, in)
        if all(p.bias is None for p in linears):
            return Projection(weight, None)
        bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in linears])
    return Projection(weight, bias)


def self_attention_projections(attn: nn.Module) -> List[nn.Linear]:
    """A fairseq ``MultiheadAttention``'s q, k and v projections, as :func:`self_attention_qkv` stacks them."""
    return [attn.q_proj, attn.k_proj, attn.v_proj]


def self_attention_qkv(attn: nn.Module) -> Projection:
    """A fairseq ``MultiheadAttention``'s q, k and v projections as one: weight (3C, C), rows q, k, v. The
    query scaling is not folded in (the attention call applies it)."""
    return fuse(self_attention_projections(attn))


def encoder_attention_projections(layers: Sequence[nn.Module]) -> List[nn.Linear]:
    """The encoder-attention k and v projections of ``layers``, as :func:`encoder_keys_values` stacks them."""
    return [p for layer in layers for p in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)]


def encoder_keys_values(layers: Sequence[nn.Module]) -> Projection:
    """Every decoder layer's encoder-attention k and v projections as one: weight (L 2C, C_enc), rows
    k_0, v_0, k_1, v_1, ...: encoder states (.., C_enc) -> (.., L, 2, heads, head dim)."""
    return fuse(encoder_attention_projections(layers))


class SlotHeadWeights(NamedTuple):
    """The slot head of an insertion decoder; ``pair`` and ``output`` are the modules themselves (int8 dynamic
    quantization replaces them by quantized ones, which the torch path calls the same way)."""

    pair: nn.Module  # adjacent final decoder states, concatenated (.., 2C) -> the slot state (.., C)
    location_query: Optional[Tensor]  # q (C,), p(l) = softmax(H q) (None: the joint head)
    output: nn.Module  # a slot state -> its vocabulary scores, weight (V, C), p(c | l) = softmax(h W^T)


def slot_head(decoder: nn.Module) -> SlotHeadWeights:
    """The slot head of an insertion decoder (``slot_proj``, ``head.location_query``, ``output_projection``)."""
    head = decoder.head
    return SlotHeadWeights(decoder.slot_proj, None if head is None else head.location_query, decoder.output_projection)


def slot_states(x: Tensor, head: SlotHeadWeights) -> Tensor:
    """Final decoder states of a framed canvas (B, T+2, C) -> slot states (B, T+1, C): each adjacent pair,
    concatenated (B, T+1, 2C) and projected by ``head.pair``."""
    return head.pair(torch.cat([x[:, :-1], x[:, 1:]], dim=-1))
