"""The cached decoder's graphs (``--cached-decoder``, :mod:`fairseq_insertion.pass_decoder`): the encoder also gives
the cache of bos and eos, and a pass runs only the tokens the last pass inserted against each cached layer's keys
and values, taking and returning the cache; the top ``--recomputed-layers`` re-read the whole canvas."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto
from torch import nn

from ..export_format import cache_names, source_names
from ..loop import FEEDS
from ..pass_decoder import cached_layers
from ..weights import self_attention_qkv
from .graph import Graph, _io
from .layers import (
    _check_scaling,
    _cross_attention,
    _embed,
    _ffn,
    _layer,
    _linear,
    _mask,
    _slots,
    _stack,
    _top,
    encoder_graph,
    pass_io,
)

FloatKV = List[Tuple[str, str]]


def _own_attention(g: Graph, h: str, attn, past: Optional[Tuple[str, str]], mask: str, new: FloatKV) -> str:
    """Self-attention of the fresh tokens h (A, F, C) over the ``past`` keys and values (A, heads, M, d) and their
    own, masked by ``mask`` (A, M + F) int32; appends their own keys and values (A, heads, F, d) to ``new``."""
    _check_scaling(attn)
    H, d = attn.num_heads, attn.head_dim
    q, k, v = g.op("Split", _linear(g, h, self_attention_qkv(attn)), g.ints(H * d, H * d, H * d), axis=-1, outputs=3)
    k, v = (g.op("Transpose", g.op("Reshape", t, g.ints(0, 0, H, d)), perm=[0, 2, 1, 3]) for t in (k, v))
    new.append((k, v))
    if past is not None:
        k, v = g.op("Concat", past[0], k, axis=2), g.op("Concat", past[1], v, axis=2)
    y = g.op("MultiHeadAttention", q, k, v, "", mask, domain="com.microsoft", num_heads=H)
    return _linear(g, y, attn.out_proj)


def _fresh(g: Graph, dec: nn.Module, tokens: str, positions: str, past: Optional[Sequence[Tuple[str, str]]],
           past_mask: Optional[str], src_mask: str) -> Tuple[str, FloatKV]:
    """The cached layers over the fresh ``tokens`` (A, F) at their ``positions`` (A, F, C): their states (A, F, C)
    (the final states when every layer is cached) and each cached layer's new keys and values."""
    keep = g.op("Not", g.op("Equal", tokens, g.const(np.asarray(dec.padding_idx, np.int64), "pad")))  # (A, F)
    x = _embed(g, tokens, keep, dec, encoder=False, fractional=positions)  # (A, F, C)
    mask = _mask(g, keep) if past_mask is None else g.op("Concat", past_mask, _mask(g, keep), axis=1)  # (A, M + F)
    names, L = source_names(len(dec.layers)), len(dec.layers)
    new: FloatKV = []
    span = cached_layers(dec)
    for i in span:
        layer = dec.layers[i]
        x = _layer(g, x, layer, {
            "self_attn": lambda h, a=layer.self_attn, i=i: _own_attention(
                g, h, a, None if past is None else past[i], mask, new),
            "encoder_attn": lambda h, a=layer.encoder_attn, i=i: _cross_attention(g, h, a, names[i], names[L + i],
                                                                                 src_mask),
            "ffn": _ffn(g, layer)})
    return (_top(g, dec, x) if span.stop == L else x), new


def cached_encoder_graph(model: nn.Module, shortlisted: bool = False) -> "onnx.ModelProto":
    """:func:`~fairseq_insertion.export.layers.encoder_graph`, and the cache before the first pass: bos's and eos's
    keys and values in each cached layer (B, heads, 2, d), their position vectors and states (B, 2, C)."""
    dec = model.decoder

    def start(g: Graph, keep: str) -> List["onnx.ValueInfoProto"]:
        d, C = dec.dictionary, dec.embed_dim
        batch = g.op("Slice", g.op("Shape", "src_tokens"), g.ints(0), g.ints(1))  # (1,)
        tokens = g.op("Expand", g.const(np.asarray([[d.bos(), d.eos()]], np.int64), "ends"),
                      g.op("Concat", batch, g.ints(2), axis=0))  # (B, 2)
        positions = g.output("Expand", "start_positions", g.const(dec.fractional.ends.unsqueeze(0), "end_positions"),
                             g.op("Concat", batch, g.ints(2, C), axis=0))  # (B, 2, C)
        states, new = _fresh(g, dec, tokens, positions, None, None, _mask(g, keep))
        g.output("Identity", "start_states", states)
        _name_cache(g, "start", new)
        return _cache_io(dec, "start", "batch", 2)

    return encoder_graph(model, shortlisted, start)


def _name_cache(g: Graph, prefix: str, kv: FloatKV) -> None:
    names = cache_names(prefix, len(kv))
    for i, (k, v) in enumerate(kv):
        g.output("Identity", names[i], k)
        g.output("Identity", names[len(kv) + i], v)


def _cache_io(dec: nn.Module, prefix: str, rows: str, width) -> List["onnx.ValueInfoProto"]:
    """The cache's values as graph inputs or outputs: ``prefix``_keys_i, _values_i (rows, heads, width, d) each
    cached layer's, ``prefix``_positions and _states (rows, width, C)."""
    attn, C = dec.layers[0].self_attn, dec.embed_dim
    n = len(cached_layers(dec))
    return [*(_io(name, TensorProto.FLOAT, [rows, attn.num_heads, width, attn.head_dim])
              for name in cache_names(prefix, n)),
            _io(f"{prefix}_positions", TensorProto.FLOAT, [rows, width, C]),
            _io(f"{prefix}_states", TensorProto.FLOAT, [rows, width, C])]


def cached_pass_graph(model: nn.Module, shortlisted: bool = False) -> "onnx.ModelProto":
    """One pass of the cached decoder: the fresh tokens ``fresh_tokens`` (A, F) (pad after a row's), their
    neighbours' position vectors ``left_positions``, ``right_positions`` (A, F, C), the cache (``past_*``, M columns,
    ``past_mask`` (A, M) int32) and ``index`` (A, W): each column of ``framed`` (A, W) -> its column of the cache with
    the fresh tokens appended (M + F). Writes the pass graph's outputs (:func:`~.layers.pass_graph`) and the fresh
    tokens' cache (``new_*``, F columns)."""
    dec = model.decoder
    g = Graph("insertion_pass")
    C, n = dec.embed_dim, len(cached_layers(dec))
    positions = g.output("Elu", "new_positions", _linear(g, g.op("Concat", "left_positions", "right_positions",
                                                                  axis=-1), dec.fractional.mix), alpha=1.0)
    past_names = cache_names("past", n)
    past = list(zip(past_names[:n], past_names[n:]))
    x, new = _fresh(g, dec, "fresh_tokens", positions, past, "past_mask", "src_mask")  # (A, F, C)
    g.output("Identity", "new_states", x)
    _name_cache(g, "new", new)
    every = g.op("Concat", "past_states", x, axis=1)  # (A, M + F, C)
    at = g.op("Expand", g.op("Unsqueeze", "index", g.ints(-1)),
              g.op("Concat", g.op("Shape", "index"), g.ints(C), axis=0))  # (A, W, C)
    x = g.op("GatherElements", every, at, axis=1)  # (A, W, C) the canvas's states
    keep = g.op("Not", g.op("Equal", "framed", g.const(np.asarray(dec.padding_idx, np.int64), "pad")))  # (A, W)
    if dec.recomputed:
        names, L = source_names(len(dec.layers)), len(dec.layers)
        x = _top(g, dec, _stack(g, dec, x, range(n, L), list(zip(names[:L], names[L:])), _mask(g, keep), "src_mask"))
    _slots(g, dec, x, keep, "open_slots", {f.name: f.name for f in FEEDS}, "k", shortlisted)
    inputs, outputs = pass_io(dec, shortlisted)
    return g.model(
        [*inputs, _io("fresh_tokens", TensorProto.INT64, ["rows", "fresh"]),
         _io("left_positions", TensorProto.FLOAT, ["rows", "fresh", C]),
         _io("right_positions", TensorProto.FLOAT, ["rows", "fresh", C]),
         *_cache_io(dec, "past", "rows", "cached")[:2 * n], _io("past_mask", TensorProto.INT32, ["rows", "cached"]),
         _io("past_states", TensorProto.FLOAT, ["rows", "cached", C]),
         _io("index", TensorProto.INT64, ["rows", "width"])],
        [*outputs[:4], *_cache_io(dec, "new", "rows", "fresh"), *outputs[4:]], vocab_size=len(dec.dictionary))
