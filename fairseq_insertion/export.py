"""Export a trained insertion model for deployment: ONNX graphs, the dictionaries and the settings.

    python -m fairseq_insertion.export --path CHECKPOINT --data DATA-BIN --out DIR [--int8 [dynamic]] [--step-graph] \
        [decoding options] [--tokenizer moses --bpe-codes CODES --source-lang SRC --target-lang TGT ...]

DIR then holds what :class:`fairseq_insertion.runtime.Translator` loads (no fairseq, no torch):

* ``encoder.onnx``: source tokens (B, S) -> every decoder layer's encoder-attention keys and
  values, ``keys_0``, ..., ``values_0``, ... (B, heads, S, head dim), computed once per batch;
* ``pass.onnx``: one decoding pass: framed canvases (A, T+2), the cached keys and values, the
  source mask (int32, 1 at real tokens), the open slots (N flat indices into the A x (T+1) slots),
  the tokens each open slot may not receive (N, M), each open slot's EOS penalty (N, 1) and the
  word-edge rule at constraints (``word_edges`` (N,): which subword pieces it may not receive;
  ``no_end`` (N, 1): whether it may not end; :func:`~fairseq_insertion.loop.word_edge_bans`) and ``k`` (1,)
  -> each open slot's k best tokens and their log p(c | l) (N, k; k is 1 but for the first insertions),
  its end-of-slot log-probability (N, 1), and log p(l)
  of every slot (A, T+1). Only the open slots go through the vocabulary projection, and no (N, V) table
  leaves the graph;
* ``step.onnx`` and ``loop.onnx``, with ``--step-graph``: a whole decoding pass from the active canvases to the
  next ones (:func:`step_graph`: the loop's own functions of :mod:`fairseq_insertion.loop` emitted as nodes around
  the pass, for the decoding and repetition options given here), and that step as the body of an ONNX ``Loop`` that
  decodes a batch in one run (:func:`loop_graph`); unconstrained decoding without a shortlist;
* ``source_vocab.txt``, ``target_vocab.txt``: one symbol per line, line i = token id i;
* ``settings.json``: the model's ids and sizes, the decoding's options
  (:class:`~fairseq_insertion.decoding.DecodingConfig`'s fields, as given here) and the size and
  sha256 of every other file, which the runtime checks when it loads them; and, when known, how raw
  text was prepared for the model (``preprocessing``: :class:`~fairseq_insertion.preprocess.Preprocessing`,
  which the runtime replays on raw text);
* ``bpe.codes``: the preprocessing's subword-nmt codes, when it has them.

The preprocessing is ``DATA-BIN/preprocess.json`` (``examples/multi30k/prepare.py`` writes it) when
there is one; ``--tokenizer moses`` with ``--bpe-codes``, ``--source-lang``, ``--target-lang``,
``--[no-]normalize-punctuation``, ``--[no-]aggressive-dash-splits``, ... changes it, or gives it when
there is none.

Each graph's metadata holds its vocabulary size (``vocab_size``: the source's in the encoder, the
target's in the pass), which the runtime checks against the vocabulary files.

Batch, source length, canvas length and the number of open slots are dynamic axes. ``--int8``
runs the graphs' products by weight matrices in int8 with per-row activation scales
(:mod:`fairseq_insertion.quantization`: a sentence's translation does not depend on its batch); ``--int8 dynamic``
with onnxruntime's dynamic quantization instead (one activation range over the whole batch: faster at batch 1, and
its outputs move with the batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from . import loop as LOOP
from . import preprocess as P
from .config import RUNTIME_OPTIONS, DecodingConfig, DecodingError, add_runtime_arguments
from .export_format import (
    BPE_CODES,
    CHECKED,
    ENCODER,
    FORMAT_VERSION,
    LOOP_GRAPH,
    PASS,
    QUANTIZATIONS,
    SCORER,
    SETTINGS,
    SHORTLIST,
    SPECIAL_IDS,
    STEP,
    STEP_OPTIONS,
    VOCABS,
    file_digests,
    source_names,
)
from .fast_decoder import cacheable
from .graph_ops import GraphArray, GraphOps
from .loop import word_edge_table
from .quantization import graphs, per_row
from .slots import Shortlist, SlotRule, choose_graph
from .weights import Projection, SlotHeadWeights, encoder_keys_values, self_attention_qkv, slot_head

logger = logging.getLogger(__name__)

OPSET = 17
IR_VERSION = 8  # the oldest that opset 17 allows: readable by every onnxruntime since 1.13


class ExportError(ValueError):
    """A model or an input the export cannot take; the message names it."""


class Graph:
    """A small ONNX graph builder: weights become initializers, every node gets a fresh output name."""

    def __init__(self, name: str):
        self.name, self.nodes, self.initializers, self._count = name, [], [], 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value, hint: str = "const") -> str:
        array = value.detach().float().cpu().numpy() if torch.is_tensor(value) else np.asarray(value)
        name = self._fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.array(array, copy=True, order="C"), name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "shape")

    def scalar(self, value: float) -> str:
        return self.const(np.asarray(value, dtype=np.float32), "scalar")

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs):
        names = [self._fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attrs))
        return names[0] if outputs == 1 else names

    def output(self, op_type: str, name: str, *inputs: str, **attrs) -> str:
        """A node whose output is a graph output called ``name``."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def mark(self) -> Tuple[int, int]:
        """Where the nodes and constants added from now on begin (:meth:`cut` moves them into a subgraph)."""
        return len(self.nodes), len(self.initializers)

    def cut(self, mark: Tuple[int, int], name: str, inputs: list, outputs: list) -> "onnx.GraphProto":
        """The nodes and constants added since ``mark``, moved out of this graph into a subgraph (a ``Loop``'s body,
        an ``If``'s branch) with these inputs and outputs; it reads the outer graph's values by name."""
        nodes, initializers = mark
        graph = helper.make_graph(self.nodes[nodes:], name, inputs, outputs, self.initializers[initializers:])
        del self.nodes[nodes:], self.initializers[initializers:]
        return graph

    def branch(self, name: str, build: Callable[[], Sequence[Tuple[str, Any]]]) -> "onnx.GraphProto":
        """The nodes and constants ``build`` adds, as an ``If``'s branch whose outputs are the (value, numpy element
        type) pairs it returns."""
        mark = self.mark()
        outputs = [helper.make_tensor_value_info(value, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)
                   for value, dtype in build()]
        return self.cut(mark, name, [], outputs)

    def model(self, inputs: list, outputs: list, vocab_size: int) -> "onnx.ModelProto":
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                        helper.make_opsetid("com.microsoft", 1)],
                                  producer_name="fairseq_insertion.export")
        model.ir_version = IR_VERSION
        helper.set_model_props(model, {"vocab_size": str(vocab_size)})  # kept by quantize_dynamic
        onnx.checker.check_model(model)
        return model


def _io(name: str, dtype: int, dims: Sequence) -> "onnx.ValueInfoProto":
    return helper.make_tensor_value_info(name, dtype, list(dims))


def _linear(g: Graph, x: str, linear: Union[nn.Linear, Projection]) -> str:
    """x W^T + b."""
    y = g.op("MatMul", x, g.const(linear.weight.t(), "weight"))
    return y if linear.bias is None else g.op("Add", y, g.const(linear.bias, "bias"))


def _layer_norm(g: Graph, x: str, norm: Optional[nn.Module]) -> str:
    if norm is None:
        return x
    return g.op("LayerNormalization", x, g.const(norm.weight, "ln_weight"), g.const(norm.bias, "ln_bias"),
                axis=-1, epsilon=float(norm.eps))


def _activation(g: Graph, x: str, fn) -> str:
    from fairseq.modules.gelu import gelu

    if fn is F.relu:
        return g.op("Relu", x)
    if fn is gelu:  # x * 0.5 * (1 + erf(x / sqrt(2)))
        erf = g.op("Erf", g.op("Div", x, g.scalar(math.sqrt(2.0))))
        return g.op("Mul", g.op("Mul", x, g.scalar(0.5)), g.op("Add", erf, g.scalar(1.0)))
    raise ExportError(f"activation {getattr(fn, '__name__', fn)}: the export covers relu and gelu")


def _self_attention(g: Graph, x: str, attn, mask: str, causal: bool = False) -> str:
    """fairseq's MultiheadAttention of x (A, T, C) over itself: onnxruntime's fused ``Attention``
    (one q/k/v product, the heads, softmax(q k^T / sqrt(d)) v; int8: ``QAttention``), then the
    output projection. mask: (A, T) int32, 1 where attending is allowed; causal: each position attends
    to itself and those before it only (an autoregressive decoder)."""
    qkv = self_attention_qkv(attn)  # weight (3C, C)
    bias = qkv.bias if qkv.bias is not None else qkv.weight.new_zeros(qkv.weight.size(0))  # (3C,)
    _check_scaling(attn)
    y = g.op("Attention", x, g.const(qkv.weight.t(), "qkv_weight"), g.const(bias, "qkv_bias"), mask,
             domain="com.microsoft", num_heads=attn.num_heads, unidirectional=int(causal))
    return _linear(g, y, attn.out_proj)


def _cross_attention(g: Graph, x: str, attn, keys: str, values: str, mask: str) -> str:
    """fairseq's encoder attention of x (A, T, C) over the cached keys and values (A, heads, S, d):
    onnxruntime's ``MultiHeadAttention``, then the output projection. mask: (A, S) int32."""
    _check_scaling(attn)
    y = g.op("MultiHeadAttention", _linear(g, x, attn.q_proj), keys, values, "", mask,
             domain="com.microsoft", num_heads=attn.num_heads)
    return _linear(g, y, attn.out_proj)


def _check_scaling(attn) -> None:
    if not math.isclose(attn.scaling, attn.head_dim ** -0.5, rel_tol=1e-6):
        raise ExportError(f"attention scaling {attn.scaling}: the export covers 1/sqrt(head dim)")


def _residual(g: Graph, x: str, norm: nn.Module, before: bool, sublayer) -> str:
    """fairseq's residual block: layer norm before (pre-norm) or after (post-norm) the sum."""
    y = g.op("Add", x, sublayer(_layer_norm(g, x, norm) if before else x))
    return y if before else _layer_norm(g, y, norm)


def _ffn(g: Graph, layer) -> Callable[[str], str]:
    return lambda h: _linear(g, _activation(g, _linear(g, h, layer.fc1), layer.activation_fn), layer.fc2)


def _embed(g: Graph, tokens: str, keep: str, module, scale_padding: bool) -> str:
    """fairseq's token embedding x scale + positions (numbered 1, 2, ... over the real tokens,
    padding_idx + position as fairseq's make_positions) + embedding layer norm; tokens (A, T). (Positions
    sliced from the table by the canvas width instead would cost onnxruntime its shape inference, and with
    it the fusion of the residual adds with the layer norms.)"""
    weight = module.embed_tokens.weight
    if module.embed_scale != 1.0 and getattr(module, "project_in_dim", None) is None:
        weight = weight * module.embed_scale  # the scale folded into the table: the same products
    x = g.op("Gather", g.const(weight, "embed_tokens"), tokens)  # (A, T, C)
    if module.embed_scale != 1.0 and getattr(module, "project_in_dim", None) is not None:
        x = g.op("Mul", x, g.scalar(module.embed_scale))
    if getattr(module, "project_in_dim", None) is not None:
        x = _linear(g, x, module.project_in_dim)
    if module.embed_positions is not None:
        pad = module.padding_idx
        P = module.max_positions()
        with torch.no_grad():  # the table as the module computes it: row pad + i for position i, 0 at pad
            rows = module.embed_positions(torch.full((1, P), pad + 1, dtype=torch.long))[0]  # (P, C)
            table = torch.cat([torch.zeros(pad + 1, rows.size(1)), rows.float()])
        kept = g.op("Cast", keep, to=TensorProto.INT64)
        positions = g.op("Add", g.op("Mul", g.op("CumSum", kept, g.const(np.asarray(1, np.int64), "axis")), kept),
                         g.const(np.asarray(pad, np.int64), "pad"))
        x = g.op("Add", x, g.op("Gather", g.const(table, "positions"), positions))
    if getattr(module, "layernorm_embedding", None) is not None:
        x = _layer_norm(g, x, module.layernorm_embedding)
    if scale_padding:  # the encoder zeroes the embeddings of padding
        x = g.op("Mul", x, g.op("Unsqueeze", g.op("Cast", keep, to=TensorProto.FLOAT), g.ints(-1)))
    return x


def _mask(g: Graph, keep: str) -> str:
    """(A, S) True where attending is allowed -> int32, as onnxruntime's attention masks take it."""
    return g.op("Cast", keep, to=TensorProto.INT32)


def _encode(g: Graph, enc: nn.Module) -> Tuple[str, str]:
    """fairseq's TransformerEncoderBase in inference on ``src_tokens`` (B, S): its output (B, S, C) and
    where the tokens are real (B, S)."""
    keep = g.op("Not", g.op("Equal", "src_tokens", g.const(np.asarray(enc.padding_idx, np.int64), "pad")))
    x = _embed(g, "src_tokens", keep, enc, scale_padding=True)
    mask = _mask(g, keep)
    for layer in enc.layers:
        before = layer.normalize_before
        x = _residual(g, x, layer.self_attn_layer_norm, before,
                      lambda h, a=layer.self_attn: _self_attention(g, h, a, mask))
        x = _residual(g, x, layer.final_layer_norm, before, _ffn(g, layer))
    return _layer_norm(g, x, enc.layer_norm), keep


def _keys_values(g: Graph, x: str, layers, rows: Optional[str] = None,
                 names: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """Every decoder layer's encoder-attention keys and values of the encoder output x (B, S, C), in one
    product (:func:`~fairseq_insertion.weights.encoder_keys_values`): per layer (keys, values), each
    (B, heads, S, d); rows (N,): those of these sources instead, (N, heads, S, d); names: graph outputs
    to write them to, keys_0, ..., values_0, ... (:func:`~fairseq_insertion.export_format.source_names`)."""
    attn = layers[0].encoder_attn
    L, H, d = len(layers), attn.num_heads, attn.head_dim
    kv = g.op("Reshape", _linear(g, x, encoder_keys_values(layers)), g.ints(0, 0, 2 * L, H, d))  # (B, S, 2L, H, d)
    if rows is not None:
        kv = g.op("Gather", kv, rows, axis=0)  # (N, S, 2L, H, d)
    out = []
    for i in range(2 * L):  # k_0, v_0, k_1, ...
        column = g.op("Gather", kv, g.const(np.asarray(i, dtype=np.int64), "index"), axis=2)  # (B, S, H, d)
        name = names[i // 2 + L * (i % 2)] if names is not None else None
        out.append(g.output("Transpose", name, column, perm=[0, 2, 1, 3]) if name is not None
                   else g.op("Transpose", column, perm=[0, 2, 1, 3]))  # (B, H, S, d)
    return list(zip(out[0::2], out[1::2]))


def _decode(g: Graph, dec: nn.Module, tokens: str, keys_values: Sequence[Tuple[str, str]], src_mask: str,
            causal: bool = False) -> Tuple[str, str]:
    """fairseq's TransformerDecoderBase's layer stack in inference on ``tokens`` (A, T): embeddings, every
    layer (self-attention, causal or over the whole canvas; encoder attention on ``keys_values``, per layer
    (A, heads, S, d) each, masked by src_mask (A, S) int32; FFN; layer norms before or after as
    configured), the final layer norm and output projection: its final states (A, T, C) and where the
    tokens are real (A, T)."""
    keep = g.op("Not", g.op("Equal", tokens, g.const(np.asarray(dec.padding_idx, np.int64), "pad")))  # (A, T)
    x = _embed(g, tokens, keep, dec, scale_padding=False)  # (A, T, C)
    mask = _mask(g, keep)
    for layer, (k, v) in zip(dec.layers, keys_values):
        before = layer.normalize_before
        x = _residual(g, x, layer.self_attn_layer_norm, before,
                      lambda h, a=layer.self_attn: _self_attention(g, h, a, mask, causal))
        x = _residual(g, x, layer.encoder_attn_layer_norm, before,
                      lambda h, a=layer.encoder_attn, k=k, v=v: _cross_attention(g, h, a, k, v, src_mask))
        x = _residual(g, x, layer.final_layer_norm, before, _ffn(g, layer))
    x = _layer_norm(g, x, dec.layer_norm)
    if dec.project_out_dim is not None:
        x = _linear(g, x, dec.project_out_dim)
    return x, keep


def encoder_graph(model: nn.Module, shortlisted: bool = False) -> "onnx.ModelProto":
    """src_tokens (B, S) -> keys and values (B, heads, S, d) of every decoder layer's encoder
    attention. Mirrors fairseq's TransformerEncoderBase in inference. ``shortlisted``: also each sentence's
    list ``shortlist`` (B, L) (:func:`fairseq_insertion.slots.shortlist_rows`; V: padding) -> its rows of the
    vocabulary projection, ``shortlist_weights`` (B, L, C) (zeros at padding), which every pass reuses."""
    enc, dec = model.encoder, model.decoder
    g = Graph("insertion_encoder")
    x, _ = _encode(g, enc)
    L, H, d = len(dec.layers), dec.layers[0].encoder_attn.num_heads, dec.layers[0].encoder_attn.head_dim
    names = source_names(L)
    _keys_values(g, x, dec.layers, names=names)
    listed_in, listed_out = [], []
    if shortlisted:
        W = slot_head(dec).output.weight  # (V, C)
        padded = torch.cat([W, W.new_zeros(1, W.size(1))])  # (V + 1, C)
        g.output("Gather", "shortlist_weights", g.const(padded, "output_projection"), "shortlist", axis=0)  # (B, L, C)
        listed_in = [_io("shortlist", TensorProto.INT64, ["batch", "listed"])]
        listed_out = [_io("shortlist_weights", TensorProto.FLOAT, ["batch", "listed", W.size(1)])]
    return g.model([_io("src_tokens", TensorProto.INT64, ["batch", "source"]), *listed_in],
                   [*(_io(name, TensorProto.FLOAT, ["batch", H, "source", d]) for name in names), *listed_out],
                   vocab_size=enc.embed_tokens.num_embeddings)


def scorer_graph(model: nn.Module) -> "onnx.ModelProto":
    """An autoregressive fairseq transformer (``--rerank-with``, e.g. the distillation teacher) scoring
    candidates, teacher-forced, as :class:`~fairseq_insertion.rerank.AutoregressiveScorer`: ``src_tokens``
    (B, S) each source once, ``rows`` (N,) the source of each candidate, ``target`` (N, T) the candidates
    with end-of-sentence, right-padded, and ``prev_tokens`` (N, T) the same shifted right behind
    end-of-sentence -> ``log_probs`` (N,): log p(target | source), summed over its real tokens."""
    enc, dec = model.encoder, model.decoder
    g = Graph("scorer")
    x, keep = _encode(g, enc)
    keys_values = _keys_values(g, x, dec.layers, rows="rows")  # (N, heads, S, d) each
    src_mask = _mask(g, g.op("Gather", keep, "rows", axis=0))  # (N, S)
    y, _ = _decode(g, dec, "prev_tokens", keys_values, src_mask, causal=True)  # (N, T, C)
    pad = g.const(np.asarray(dec.padding_idx, np.int64), "pad")
    logits = g.op("MatMul", y, g.const(dec.output_projection.weight.t(), "output_projection"))  # (N, T, V)
    token = g.op("Squeeze", g.op("GatherElements", g.op("LogSoftmax", logits, axis=-1),
                                 g.op("Unsqueeze", "target", g.ints(-1)), axis=2), g.ints(-1))  # (N, T)
    scored = g.op("Where", g.op("Equal", "target", pad), g.scalar(0.0), token)
    g.output("ReduceSum", "log_probs", scored, g.ints(1), keepdims=0)
    return g.model([_io("src_tokens", TensorProto.INT64, ["batch", "source"]),
                    _io("rows", TensorProto.INT64, ["candidates"]),
                    _io("target", TensorProto.INT64, ["candidates", "length"]),
                    _io("prev_tokens", TensorProto.INT64, ["candidates", "length"])],
                   [_io("log_probs", TensorProto.FLOAT, ["candidates"])],
                   vocab_size=dec.embed_tokens.num_embeddings)


def _source_inputs(dec: nn.Module) -> List["onnx.ValueInfoProto"]:
    """The source side every pass takes: each decoder layer's encoder-attention keys and values
    (rows, heads, source, d), then src_mask (rows, source) int32."""
    heads, hd = dec.layers[0].encoder_attn.num_heads, dec.layers[0].encoder_attn.head_dim
    return [*(_io(name, TensorProto.FLOAT, ["rows", heads, "source", hd]) for name in source_names(len(dec.layers))),
            _io("src_mask", TensorProto.INT32, ["rows", "source"])]


def _pass(g: Graph, dec: nn.Module, framed: str, open_slots: str, classes: str, blocked: str, eos_penalty: str,
          no_end: str, k: str, shortlisted: bool = False) -> None:
    """One decoding pass into ``g``: the decoder over the ``framed`` canvases (A, W) with the source side
    (:func:`_source_inputs`), the slot head at the ``open_slots`` (N,) and the slot rule with its inputs (``classes``
    (N,), ``blocked`` (N, M), ``eos_penalty`` (N, 1), ``no_end`` (N, 1), ``k`` (1,);
    :func:`~fairseq_insertion.slots.choose_graph`): writes the values ``tokens``, ``log_probs`` (N, k),
    ``eos_log_probs`` (N, 1) and ``location`` (A, W-1)."""
    d = dec.dictionary
    bos, eos, pad = d.bos(), d.eos(), d.pad()
    L = len(dec.layers)
    names = source_names(L)
    x, keep = _decode(g, dec, framed, list(zip(names[:L], names[L:])), "src_mask")  # (A, W, C)
    content, ids = _slot_head(g, x, keep, slot_head(dec), open_slots, shortlisted)  # (N, V) or (N, L) each
    _, joins_next, joins_prev = word_edge_table(list(d.symbols), d.nspecial)
    rule = SlotRule.build((bos, pad, eos), eos, d.unk(), joins_next, joins_prev)
    choose_graph(g, rule, content, classes, blocked, eos_penalty, no_end, k, ids)


def pass_graph(model: nn.Module, shortlisted: bool = False) -> "onnx.ModelProto":
    """One decoding pass (see the module's docstring for its inputs and outputs); ``shortlisted``: the open
    slots score only their sentence's list (``shortlist`` (A, L), ``shortlist_weights`` (A, L, C), from the
    encoder graph)."""
    dec = model.decoder
    g = Graph("insertion_pass")
    _pass(g, dec, "framed", "open_slots", "word_edges", "blocked", "eos_penalty", "no_end", "k", shortlisted)
    C = dec.output_projection.weight.size(1)
    listed = [_io("shortlist", TensorProto.INT64, ["rows", "listed"]),
              _io("shortlist_weights", TensorProto.FLOAT, ["rows", "listed", C])] if shortlisted else []
    return g.model(
        [_io("framed", TensorProto.INT64, ["rows", "width"]), *_source_inputs(dec),
         _io("open_slots", TensorProto.INT64, ["open"]),
         _io("blocked", TensorProto.INT64, ["open", "blocked"]),
         _io("eos_penalty", TensorProto.FLOAT, ["open", 1]),
         _io("word_edges", TensorProto.INT64, ["open"]),
         _io("no_end", TensorProto.BOOL, ["open", 1]),
         _io("k", TensorProto.INT64, [1]), *listed],
        [_io("tokens", TensorProto.INT64, ["open", "k"]), _io("log_probs", TensorProto.FLOAT, ["open", "k"]),
         _io("eos_log_probs", TensorProto.FLOAT, ["open", 1]), _io("location", TensorProto.FLOAT, ["rows", "slots"])],
        vocab_size=len(dec.dictionary))


def _state_inputs(xp: GraphOps, dec: nn.Module, close_ended: bool, whole: bool
                  ) -> Tuple[LOOP.Canvases, GraphArray]:
    """Declare the loop state's graph inputs (:func:`~fairseq_insertion.export_format.step_io`): ``canvas`` (A, K)
    int64, ``scores`` (A, K) float, ``lengths``, ``iterations`` (A,) int64, for the whole loop (``whole``)
    ``final_eos`` (A,) float, ``max_len`` (A,) int64, ``eos_penalty`` (A,) float (each row's beta),
    ``max_iterations`` () int64, with close-ended slots ``closed_before`` (A, K) and ``closed_end`` (A,) bool, then
    the source side (:func:`_source_inputs`). Returns the state and ``max_iterations``."""
    canvas = xp.input("canvas", np.int64, ["rows", "width"])  # (A, K)
    scores = xp.input("scores", np.float32, ["rows", "width"])  # (A, K)
    lengths, iterations = (xp.input(name, np.int64, ["rows"]) for name in ("lengths", "iterations"))  # (A,) each
    final_eos = xp.input("final_eos", np.float32, ["rows"]) if whole else None  # (A,)
    max_len = xp.input("max_len", np.int64, ["rows"])  # (A,)
    eos_penalty = xp.input("eos_penalty", np.float32, ["rows"])  # (A,)
    max_iterations = xp.input("max_iterations", np.int64, [])  # ()
    closed_before = xp.input("closed_before", np.bool_, ["rows", "width"]) if close_ended else None  # (A, K)
    closed_end = xp.input("closed_end", np.bool_, ["rows"]) if close_ended else None  # (A,)
    xp.inputs.extend(_source_inputs(dec))
    return LOOP.Canvases(rows=None, tokens=canvas, scores=scores, closed_before=closed_before, closed_end=closed_end,
                         lengths=lengths, iterations=iterations, final_eos=final_eos, max_len=max_len,
                         eos_penalty=eos_penalty), max_iterations


def _step(g: Graph, xp: GraphOps, dec: nn.Module, config: DecodingConfig, termination: str, state: LOOP.Canvases,
          max_iter: GraphArray, active: Optional[GraphArray] = None) -> LOOP.Pass:
    """One decoding pass from ``state`` emitted into ``g``, the loop's own functions through ``xp``: the framing, the
    open slots, their inputs to the slot rule (the repetition rules of ``config``; no given tokens, no shortlist),
    the pass (:func:`_pass`), the slot scores, the step rule (``config.decoding`` with the model's ``termination``),
    the room cap and :func:`~fairseq_insertion.loop.step` with the iteration bound ``max_iter`` (). ``active`` (A,):
    the rows that take part; the others' slots stay shut (they insert nothing and keep their ``final_eos``)."""
    d = dec.dictionary
    bos, eos, pad = d.bos(), d.eos(), d.pad()
    bounds = LOOP.Bounds.build(xp, config, termination, eos, pad)

    def score(framed: GraphArray, open_: GraphArray, inputs: LOOP.SlotInputs) -> Tuple[GraphArray, ...]:
        open_slots = LOOP.flat_indices(xp, open_)  # (N,)
        N = open_slots.shape[0]
        blocked = xp.full((N, 1), pad, like=open_slots) if inputs.blocked is None else inputs.blocked  # (N, M)
        _pass(g, dec, framed.name, open_slots.name, xp.full((N,), 0, like=open_slots).name, blocked.name,
              inputs.eos_penalty[:, None].name, xp.full((N, 1), False, like=open_).name, xp.constant([1]).name)
        tokens, log_probs, eos_log_probs = (GraphArray(xp, name, dtype, [N, 1]).reshape(-1) for name, dtype in (
            ("tokens", np.int64), ("log_probs", np.float32), ("eos_log_probs", np.float32)))  # (N,) each
        A, S = state.tokens.shape[0], state.tokens.shape[1] + 1
        return tokens, log_probs, eos_log_probs, GraphArray(xp, "location", np.float32, [A, S])  # (A, S)

    p = LOOP.predict(xp, state, bounds, config, None, bos, score, active)
    if active is not None:
        p = p._replace(final_eos=xp.where(active, p.final_eos, state.final_eos))
    return LOOP.step(xp, state, p, bounds.rule(p, state.max_len - state.lengths), max_iter, bounds)


def _check_step(config: DecodingConfig) -> None:
    """Refuse the options the step and loop graphs do not apply."""
    if config.unkpen:
        raise ExportError(f"unkpen {config.unkpen}: the exported pass applies no unknown-word penalty; export with "
                          "unkpen 0")


def _step_inputs(model: nn.Module, config: DecodingConfig, name: str, whole: bool
                 ) -> Tuple[Graph, GraphOps, nn.Module, str, bool, LOOP.Canvases, GraphArray]:
    """A step or loop graph's start (the options refused first): the builder ``name``, its GraphOps, the decoder,
    the model's termination, whether slots close at end-of-slot, and the state's inputs (:func:`_state_inputs`)."""
    _check_step(config)
    dec, termination = model.decoder, model.termination
    g = Graph(name)
    xp = GraphOps(g)
    close_ended = LOOP.Bounds.build(xp, config, termination, dec.dictionary.eos(), dec.dictionary.pad()).close_ended
    state, max_iterations = _state_inputs(xp, dec, close_ended, whole)
    return g, xp, dec, termination, close_ended, state, max_iterations


def step_graph(model: nn.Module, config: DecodingConfig) -> "onnx.ModelProto":
    """A whole decoding pass from the active rows' state to the next (``step.onnx``), the loop's own functions
    (:mod:`fairseq_insertion.loop`) emitted as nodes (:class:`~fairseq_insertion.graph_ops.GraphOps`) around
    :func:`pass_graph`'s pass (:func:`_step`), for unconstrained decoding without a shortlist with ``config``'s
    decoding rule and repetition rules.

    Inputs (:func:`_state_inputs`; ``max_iterations``: the loop's iteration bound). Outputs: ``next_canvas``,
    ``next_scores`` (A, K'), ``next_lengths``, ``next_iterations`` (A,), ``final_eos`` (A,), ``keep`` (A,) the rows
    that go on, ``n_keep`` () their number, ``kept_width`` () the longest of their canvases, and with close-ended
    slots ``next_closed_before`` (A, K'), ``next_closed_end`` (A,)."""
    g, xp, dec, termination, close_ended, state, max_iterations = _step_inputs(model, config, "insertion_step",
                                                                               whole=False)
    after = _step(g, xp, dec, config, termination, state, max_iterations)
    new = after.state
    for name, value in (("next_canvas", new.tokens), ("next_scores", new.scores), ("next_lengths", new.lengths),
                        ("next_iterations", new.iterations), ("final_eos", new.final_eos), ("keep", after.keep),
                        ("n_keep", after.n_keep), ("kept_width", after.kept_width)):
        xp.output(name, value)
    if close_ended:
        xp.output("next_closed_before", new.closed_before)
        xp.output("next_closed_end", new.closed_end)
    return g.model(xp.inputs, xp.outputs, vocab_size=len(dec.dictionary))


def loop_graph(model: nn.Module, config: DecodingConfig) -> "onnx.ModelProto":
    """The whole decoding loop of a batch (``loop.onnx``): :func:`step_graph`'s pass as the body of an ONNX ``Loop``
    that runs while some row goes on, at most the iteration bound + 1 times, as
    :func:`fairseq_insertion.loop.run`: the rows that start (:func:`~fairseq_insertion.loop.starting`) take part, a
    row that stops stays in the batch and inserts nothing more.

    Inputs (:func:`_state_inputs` with ``final_eos``; ``max_iterations``: the option, 0 for each batch's room).
    Outputs: every row's final ``next_canvas``, ``next_scores`` (A, K'), ``next_lengths``, ``next_iterations``,
    ``next_final_eos`` (A,), in batch order, and ``passes`` () the passes run."""
    g, xp, dec, termination, close_ended, state, max_iterations = _step_inputs(model, config, "insertion_loop",
                                                                               whole=True)
    start, room = LOOP.starting(xp, state)  # (A,) each
    bound = xp.where(max_iterations > 0, max_iterations, room.max())  # () as run's
    carried = [state.tokens, state.scores, state.lengths, state.iterations, state.final_eos, start, xp.constant(0)]
    if close_ended:
        carried += [state.closed_before, state.closed_end]
    trips, going = bound + 1, start.any()
    mark = g.mark()
    body = GraphOps(g)  # the body's nodes, moved into its graph below; outer values are read by name
    body.input("iteration", np.int64, [])
    body.input("going", np.bool_, [])
    canvas, scores = (body.input(f"body_{name}", dtype, ["rows", "width"]) for name, dtype in (
        ("canvas", np.int64), ("scores", np.float32)))  # (A, K) each
    lengths, iterations = (body.input(f"body_{name}", np.int64, ["rows"]) for name in ("lengths", "iterations"))
    final_eos = body.input("body_final_eos", np.float32, ["rows"])  # (A,)
    active = body.input("body_active", np.bool_, ["rows"])  # (A,)
    passes = body.input("body_passes", np.int64, [])  # ()
    closed_before = body.input("body_closed_before", np.bool_, ["rows", "width"]) if close_ended else None
    closed_end = body.input("body_closed_end", np.bool_, ["rows"]) if close_ended else None
    outer = LOOP.Canvases(rows=None, tokens=canvas, scores=scores, closed_before=closed_before, closed_end=closed_end,
                          lengths=lengths, iterations=iterations, final_eos=final_eos,
                          max_len=GraphArray(body, state.max_len.name, np.int64, [None]),
                          eos_penalty=GraphArray(body, state.eos_penalty.name, np.float32, [None]))
    after = _step(g, body, dec, config, termination, outer, GraphArray(body, bound.name, np.int64, []), active)
    new = after.state
    body.output("body_going_out", after.keep.any())
    for name, value in (("canvas", new.tokens), ("scores", new.scores), ("lengths", new.lengths),
                        ("iterations", new.iterations), ("final_eos", new.final_eos), ("active", after.keep),
                        ("passes", passes + 1), *((("closed_before", new.closed_before), ("closed_end", new.closed_end))
                                                  if close_ended else ())):
        body.output(f"body_{name}_out", value)
    step = g.cut(mark, "insertion_step", body.inputs, body.outputs)  # (iteration, going, carried) -> (going, carried)
    final = g.op("Loop", trips.name, going.name, *(x.name for x in carried), body=step, outputs=len(carried))
    names = ("next_canvas", "next_scores", "next_lengths", "next_iterations", "next_final_eos", None, "passes")
    for name, value, like in zip(names, final, carried):
        if name is not None:
            xp.output(name, GraphArray(xp, value, like.dtype, [None] * like.ndim))
    return g.model(xp.inputs, xp.outputs, vocab_size=len(dec.dictionary))


def _slot_head(g: Graph, x: str, keep: str, head: SlotHeadWeights, open_slots: str, shortlisted: bool = False
               ) -> Tuple[str, Optional[str]]:
    """The factorized slot head (:func:`fairseq_insertion.weights.slot_states`, ``location_logits``) on the
    final states x (A, W, C) of framed canvases, real where ``keep`` (A, W): writes the output ``location``,
    log p(l) (A, W-1), -inf at padding slots, and returns the content scores of the ``open_slots`` (N,)
    (flat indices into the A x (W-1) slots) alone, (N, V), and None; ``shortlisted``: their scores over their
    sentence's list (the inputs ``shortlist`` (A, L) and ``shortlist_weights`` (A, L, C)), (N, L), and the
    listed ids (N, L)."""
    end = np.iinfo(np.int64).max
    pairs = g.op("Concat", g.op("Slice", x, g.ints(0), g.ints(-1), g.ints(1)),
                 g.op("Slice", x, g.ints(1), g.ints(end), g.ints(1)), axis=-1)  # (A, S, 2C)
    H = _linear(g, pairs, head.pair)  # (A, S, C) slot states
    real = g.op("Slice", keep, g.ints(1), g.ints(end), g.ints(1))  # (A, S)
    loc = g.op("Squeeze", g.op("MatMul", H, g.const(head.location_query.unsqueeze(1), "location_query")), g.ints(-1))
    g.output("LogSoftmax", "location", g.op("Where", real, loc, g.scalar(float("-inf"))), axis=-1)
    C = head.output.weight.size(1)
    if shortlisted:  # each canvas's slots by its sentence's rows of the projection, then the open ones
        scores = g.op("MatMul", H, g.op("Transpose", "shortlist_weights", perm=[0, 2, 1]))  # (A, S, L) (one
        # FusedMatMul once onnxruntime optimises the graph)
        S = g.op("Gather", g.op("Shape", H), g.const(np.asarray(1, np.int64), "slots_axis"), axis=0)  # ()
        ids = g.op("Gather", "shortlist", g.op("Div", open_slots, S), axis=0)  # (N, L)
        listed = g.op("Gather", g.op("Reshape", scores, g.op("Concat", g.ints(-1), g.op("Shape", "shortlist", start=1),
                                                                axis=0)), open_slots, axis=0)  # (N, L)
        return listed, ids
    Hc = g.op("Gather", g.op("Reshape", H, g.ints(-1, C)), open_slots, axis=0)  # (N, C) open slots only
    return g.op("MatMul", Hc, g.const(head.output.weight.t(), "output_projection")), None  # (N, V)


def check_exportable(model: nn.Module) -> None:
    """Refuse what the graphs do not cover, naming it."""
    head = model.decoder.head
    unsupported = []
    if head.joint:
        unsupported.append("--content-location joint")
    if head.K > 1:
        unsupported.append(f"--mixture-components {head.K}")
    if head.context_bias is not None:
        unsupported.append("--context-bias")
    if getattr(model.decoder, "adaptive_softmax", None) is not None:
        unsupported.append("an adaptive softmax")
    model.eval()
    if not cacheable(model.decoder):
        unsupported.append("decoder layers other than plain pre-/post-norm layers with encoder attention")
    if unsupported:
        raise ExportError("the export covers the factorized slot head of plain Transformer layers; this model has "
                          + ", ".join(unsupported))


def load(path: Path, data: Path) -> Tuple[nn.Module, object]:
    """The insertion model of ``path`` with the dictionaries of ``data`` (fairseq's loader)."""
    from fairseq import checkpoint_utils

    from .model import InsertionTransformerModel

    for flag, p in (("--path", path), ("--data", data)):
        if not Path(p).exists():
            raise ExportError(f"{flag} {p}: not found")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data)})
    model = models[0]
    if not isinstance(model, InsertionTransformerModel):
        raise ExportError(f"--path {path}: a {type(model).__name__}, not an insertion_transformer model")
    return model.eval(), task


def export_graphs(model: nn.Module, out: Path, shortlisted: bool = False) -> None:
    """Write ``encoder.onnx`` and ``pass.onnx`` for ``model`` (fp32) into ``out``; ``shortlisted``: the graphs
    that take each sentence's shortlist."""
    check_exportable(model)
    model = model.float().eval()
    with torch.no_grad():
        onnx.save(encoder_graph(model, shortlisted), str(out / ENCODER))
        onnx.save(pass_graph(model, shortlisted), str(out / PASS))


def quantize(out: Path, names: Sequence[str] = (ENCODER, PASS), scheme: str = "per-row") -> None:
    """The graphs ``names`` in int8, in place: ``per-row`` (:func:`fairseq_insertion.quantization.per_row`) or
    ``dynamic`` (onnxruntime's dynamic quantization)."""
    if scheme not in QUANTIZATIONS:
        raise ExportError(f"--int8 {scheme}: expected one of {list(QUANTIZATIONS)}")
    for name in names:
        if scheme == "per-row":
            model = onnx.load(str(out / name))
            per_row(model)
            onnx.checker.check_model(model)
            onnx.save(model, str(out / name))
        else:
            _dynamic(out, name)


def _dynamic(out: Path, name: str) -> None:
    """onnxruntime's dynamic quantization of the graph ``name``, in place (int8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nested = list(graphs(onnx.load(str(out / name)).graph))  # a Loop's body too
    dims = {w.name: w.dims for graph in nested for w in graph.initializer}
    # the products by a weight matrix (and the fused self-attention's q/k/v); attention itself and the
    # one-column location query (quantizing its input would cost more than the product) stay fp32
    nodes = [n.name for graph in nested for n in graph.node if n.op_type in ("MatMul", "Attention")
             and n.input[1] in dims and min(dims[n.input[1]]) > 1]
    options = {"DefaultTensorType": TensorProto.FLOAT, **({"EnableSubgraph": True} if len(nested) > 1 else {})}
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / name
        quantize_dynamic(str(out / name), str(q), weight_type=QuantType.QInt8, nodes_to_quantize=nodes,
                         extra_options=options)
        if len(nested) > 1:
            _typed_casts(q)
        shutil.move(str(q), out / name)


def _typed_casts(path: Path) -> None:
    """In a Loop's body the quantizer cannot infer the type of some products (those of the fused attention's
    output) and leaves the Cast of their int32 result untyped: float, the type DefaultTensorType gives them in a
    graph's top level."""
    model = onnx.load(str(path))
    for graph in graphs(model.graph):
        for node in graph.node:
            for attribute in node.attribute:
                if node.op_type == "Cast" and attribute.name == "to" and attribute.i == TensorProto.UNDEFINED:
                    attribute.i = TensorProto.FLOAT
    onnx.save(model, str(path))


def settings(model: nn.Module, src, tgt, config: DecodingConfig, int8: bool, quantization: str = "per-row") -> dict:
    """What the runtime needs besides the graphs: ids, sizes, limits, the precision (int8: with its
    ``quantization``) and the decoding's options."""
    return {
        "format_version": FORMAT_VERSION,
        "model": {
            "termination": model.termination,
            **{key: getattr(tgt, key)() for key in SPECIAL_IDS},
            "source": {key: getattr(src, key)() for key in SPECIAL_IDS},
            "max_source_positions": int(model.encoder.max_positions()),
            "max_target_positions": int(model.max_decoder_positions()),
            "decoder_layers": len(model.decoder.layers),
            "precision": "int8" if int8 else "fp32",
            **({"quantization": quantization} if int8 else {}),
        },
        "decoding": {k: v for k, v in dataclasses.asdict(config).items() if k in RUNTIME_OPTIONS},
    }


def recorded_preprocessing(data: Path) -> Optional[P.Preprocessing]:
    """``data``'s ``preprocess.json``, if it has one."""
    return P.read_record(data / P.RECORD) if (data / P.RECORD).is_file() else None


def load_scorer(path: Path, task) -> nn.Module:
    """``--rerank-with``: an autoregressive fairseq transformer trained with the insertion model's dictionaries
    (refused, naming the files, otherwise: :meth:`fairseq_insertion.rerank.AutoregressiveScorer.load`)."""
    from .checkpoints import dictionary_files
    from .rerank import AutoregressiveScorer

    try:
        scorer = AutoregressiveScorer.load(str(path), task.source_dictionary, task.target_dictionary,
                                           torch.device("cpu"), dictionaries=dictionary_files(task.cfg))
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    return scorer.model.float().eval()


def export(path: Path, data: Path, out: Path, int8: bool = False, config: Optional[DecodingConfig] = None,
           preprocessing: Optional[P.Preprocessing] = None, scorer: Optional[Path] = None,
           shortlist: Optional[Path] = None, step: bool = False, quantization: str = "per-row") -> Path:
    """Export ``path`` (an insertion checkpoint, its dictionaries in ``data``) into ``out``, with
    ``preprocessing`` (default: ``data``'s ``preprocess.json``, if any), ``scorer`` (an autoregressive
    checkpoint that chooses among candidates, :func:`scorer_graph`) and ``shortlist`` (a table of
    ``python -m fairseq_insertion.shortlist``), if given; ``step``: also the step and loop graphs (:func:`step_graph`,
    :func:`loop_graph`); ``quantization``: how ``int8`` quantizes (:func:`quantize`)."""
    preprocessing = preprocessing or recorded_preprocessing(data)
    if preprocessing is not None:
        P.load(preprocessing)  # its codes checked before the model is loaded
    model, task = load(path, data)
    teacher = load_scorer(scorer, task) if scorer is not None else None
    table = None
    if shortlist is not None:
        try:
            table = Shortlist.load(shortlist, len(task.source_dictionary), len(task.target_dictionary))
        except ValueError as exc:
            raise ExportError(f"--shortlist: {exc}") from None
    return export_model(model, task.source_dictionary, task.target_dictionary, out, int8, config, preprocessing,
                        teacher, table, step, quantization)


def export_model(model: nn.Module, src_dict, tgt_dict, out: Path, int8: bool = False,
                 config: Optional[DecodingConfig] = None, preprocessing: Optional[P.Preprocessing] = None,
                 scorer: Optional[nn.Module] = None, shortlist: Optional[Shortlist] = None, step: bool = False,
                 quantization: str = "per-row") -> Path:
    """Export a loaded insertion model with its fairseq dictionaries into ``out``; ``preprocessing``: how
    raw text was prepared for it (recorded, its codes copied), if known; ``scorer``: a loaded autoregressive
    transformer of the same dictionaries that chooses among candidates (``scorer.onnx``); ``shortlist``: the
    lexical shortlist its slots choose from (``shortlist.npz``, the graphs then take each sentence's list);
    ``step``: also the step and loop graphs for ``config``'s decoding (``step.onnx``, :func:`step_graph`;
    ``loop.onnx``, :func:`loop_graph`); ``quantization``: how ``int8`` quantizes, ``per-row`` or ``dynamic``
    (:func:`quantize`)."""
    config = config or DecodingConfig()
    if int8 and quantization not in QUANTIZATIONS:
        raise ExportError(f"--int8 {quantization}: expected one of {list(QUANTIZATIONS)}")
    if config.unkpen:
        raise ExportError(f"unkpen {config.unkpen}: the exported pass applies no unknown-word penalty; export with "
                          "unkpen 0")
    if preprocessing is not None:
        P.load(preprocessing)  # the codes are subword-nmt's, before anything is written
    if shortlist is not None and (shortlist.target_vocab, len(shortlist.translations)) != (len(tgt_dict),
                                                                                           len(src_dict)):
        raise ExportError(f"the shortlist's dictionaries have {len(shortlist.translations)} source and "
                          f"{shortlist.target_vocab} target entries, the model's {len(src_dict)} and {len(tgt_dict)}")
    if step and shortlist is not None:
        raise ExportError("the step graph covers decoding without a shortlist: export it without --shortlist")
    out.mkdir(parents=True, exist_ok=True)
    export_graphs(model, out, shortlist is not None)
    for name in (STEP, LOOP_GRAPH):
        (out / name).unlink(missing_ok=True)
    if step:
        with torch.no_grad():
            onnx.save(step_graph(model, config), str(out / STEP))
            onnx.save(loop_graph(model, config), str(out / LOOP_GRAPH))
    (out / SCORER).unlink(missing_ok=True)
    if scorer is not None:
        with torch.no_grad():
            onnx.save(scorer_graph(scorer.float().eval()), str(out / SCORER))
    if int8:
        quantize(out, (ENCODER, PASS, *((SCORER,) if scorer is not None else ()),
                       *((STEP, LOOP_GRAPH) if step else ())), quantization)
    for side, dictionary in (("source", src_dict), ("target", tgt_dict)):
        (out / VOCABS[side]).write_text("".join(f"{s}\n" for s in dictionary.symbols), encoding="utf-8")
    (out / BPE_CODES).unlink(missing_ok=True)
    values, names = settings(model, src_dict, tgt_dict, config, int8, quantization), CHECKED
    if scorer is not None:
        values["scorer"], names = SCORER, (*names, SCORER)
    (out / SHORTLIST).unlink(missing_ok=True)
    if shortlist is not None:
        shortlist.save(out / SHORTLIST)
        values["shortlist"], names = SHORTLIST, (*names, SHORTLIST)
    if step:
        values["step"] = {"graph": STEP, "loop": LOOP_GRAPH, **{key: getattr(config, key) for key in STEP_OPTIONS}}
        names = (*names, STEP, LOOP_GRAPH)
    if preprocessing is not None:
        codes = preprocessing.bpe_codes and BPE_CODES
        if codes:
            shutil.copyfile(preprocessing.bpe_codes, out / codes)
            names = (*names, codes)
        values["preprocessing"] = dataclasses.replace(preprocessing, bpe_codes=codes).record()
    values["files"] = file_digests(out, names)
    (out / SETTINGS).write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_insertion.export", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--path", type=Path, required=True, help="an insertion_transformer checkpoint")
    p.add_argument("--data", type=Path, required=True, help="the fairseq-preprocess directory of its dictionaries")
    p.add_argument("--out", type=Path, required=True, help="the directory to write")
    p.add_argument("--int8", nargs="?", const="per-row", default=None, choices=QUANTIZATIONS,
                   help="int8 products: per-row activation scales (the default: a sentence's translation does not "
                   "depend on its batch) or onnxruntime's dynamic quantization (faster at batch 1; its outputs "
                   "move with the batch)")
    p.add_argument("--rerank-with", type=Path, default=None, metavar="CHECKPOINT",
                   help="an autoregressive fairseq transformer of the same dictionaries (e.g. the distillation "
                   "teacher), exported as scorer.onnx: it chooses among the --eos-penalties candidates")
    p.add_argument("--shortlist", type=Path, default=None, metavar="TABLE",
                   help="a lexical shortlist table (python -m fairseq_insertion.shortlist), exported as "
                   f"{SHORTLIST}: each sentence's slots choose among its list only")
    p.add_argument("--step-graph", action="store_true",
                   help=f"also {STEP} (a whole decoding pass, from the canvases to the next, in one graph run) and "
                   f"{LOOP_GRAPH} (a batch's whole decode in one run), for the decoding options given here "
                   "(Translator(..., step_graph=True or 'loop') uses them)")
    add_runtime_arguments(p.add_argument_group("decoding (the runtime's defaults; DecodingConfig's when not given)"))
    P.add_arguments(p.add_argument_group("raw text (how it was prepared for the model, recorded for the runtime)"),
                    f"--data's {P.RECORD} when it has one")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    given = {k: getattr(args, k) for k in RUNTIME_OPTIONS if getattr(args, k) is not None}
    try:
        config = DecodingConfig(**given)
        recorded = recorded_preprocessing(args.data)
        preprocessing = P.from_arguments(args, recorded, str(args.data / P.RECORD)) or recorded
        out = export(args.path, args.data, args.out, args.int8 is not None, config, preprocessing, args.rerank_with,
                     args.shortlist, args.step_graph, args.int8 or "per-row")
    except (ExportError, DecodingError, P.PreprocessError) as exc:
        print(f"python -m fairseq_insertion.export: error: {exc}", file=sys.stderr)
        return 2
    print(f"exported to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


__all__: List[str] = ["ExportError", "encoder_graph", "export", "export_model", "loop_graph", "main", "pass_graph",
                      "scorer_graph", "step_graph"]

if __name__ == "__main__":
    sys.exit(main())
