"""The model's layers as ONNX nodes: the encoder, the decoder pass over the open slots (the slot head and the
slot rule), and the scorer (a fairseq Transformer teacher-forced)."""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from torch import nn

from ..export_format import source_names
from ..loop import FEEDS, word_edge_table
from ..slots import SlotRule, choose_graph, closing_graph, closing_outputs, ending_graph
from ..weights import Projection, SlotHeadWeights, blocks, encoder_keys_values, residual, self_attention_qkv, slot_head
from .graph import ExportError, Graph, _io


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
    """fairseq's MultiheadAttention of x (A, T, C) over itself as onnxruntime's fused ``Attention``, then the output
    projection; mask (A, T) int32, 1 where attending is allowed; causal: an autoregressive decoder's."""
    qkv = self_attention_qkv(attn)  # weight (3C, C)
    bias = qkv.bias if qkv.bias is not None else qkv.weight.new_zeros(qkv.weight.size(0))  # (3C,)
    _check_scaling(attn)
    y = g.op("Attention", x, g.const(qkv.weight.t(), "qkv_weight"), g.const(bias, "qkv_bias"), mask,
             domain="com.microsoft", num_heads=attn.num_heads, unidirectional=int(causal))
    return _linear(g, y, attn.out_proj)


def _cross_attention(g: Graph, x: str, attn, keys: str, values: str, mask: str) -> str:
    """fairseq's encoder attention of x (A, T, C) over the keys and values (A, heads, S, d); mask (A, S) int32."""
    _check_scaling(attn)
    y = g.op("MultiHeadAttention", _linear(g, x, attn.q_proj), keys, values, "", mask,
             domain="com.microsoft", num_heads=attn.num_heads)
    return _linear(g, y, attn.out_proj)


def _check_scaling(attn) -> None:
    if not math.isclose(attn.scaling, attn.head_dim ** -0.5, rel_tol=1e-6):
        raise ExportError(f"attention scaling {attn.scaling}: the export covers 1/sqrt(head dim)")


def _layer(g: Graph, x: str, layer: nn.Module, sublayers: Dict[str, Callable[[str], str]]) -> str:
    """A Transformer layer (:func:`fairseq_insertion.weights.blocks`) on x with its ``sublayers`` by name."""
    for name, norm in blocks(layer):
        x = residual(x, sublayers[name], lambda t, n=norm: _layer_norm(g, t, n), layer.normalize_before,
                     lambda a, y: g.op("Add", a, y))
    return x


def _ffn(g: Graph, layer) -> Callable[[str], str]:
    return lambda h: _linear(g, _activation(g, _linear(g, h, layer.fc1), layer.activation_fn), layer.fc2)


def _embed(g: Graph, tokens: str, keep: str, module, encoder: bool, fractional: Optional[str] = None) -> str:
    """fairseq's token embedding x scale + positions (as make_positions: a table sliced by the canvas width would
    cost onnxruntime its shape inference and the fusions) + embedding layer norm; tokens (A, T); ``fractional``
    (A, T, C): the cached decoder's position vectors, added where the table's would be."""
    weight = module.embed_tokens.weight
    if module.embed_scale != 1.0 and getattr(module, "project_in_dim", None) is None:
        weight = weight * module.embed_scale  # the scale folded into the table: the same products
    x = g.op("Gather", g.const(weight, "embed_tokens"), tokens)  # (A, T, C)
    if module.embed_scale != 1.0 and getattr(module, "project_in_dim", None) is not None:
        x = g.op("Mul", x, g.scalar(module.embed_scale))
    noise = getattr(module, "quant_noise", None)  # --quant-noise-pq's product: the decoder's here, the encoder's last
    if noise is not None and not encoder:
        x = _linear(g, x, noise)
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
    if fractional is not None:
        x = g.op("Add", x, fractional)
    if getattr(module, "layernorm_embedding", None) is not None:
        x = _layer_norm(g, x, module.layernorm_embedding)
    if noise is not None and encoder:
        x = _linear(g, x, noise)
    if encoder:  # the encoder zeroes the embeddings of padding
        x = g.op("Mul", x, g.op("Unsqueeze", g.op("Cast", keep, to=TensorProto.FLOAT), g.ints(-1)))
    return x


def _mask(g: Graph, keep: str) -> str:
    """(A, S) True where attending is allowed -> int32, as onnxruntime's attention masks take it."""
    return g.op("Cast", keep, to=TensorProto.INT32)


def _encode(g: Graph, enc: nn.Module) -> Tuple[str, str]:
    """fairseq's TransformerEncoderBase on ``src_tokens`` (B, S): its output (B, S, C), where tokens are real (B, S)."""
    keep = g.op("Not", g.op("Equal", "src_tokens", g.const(np.asarray(enc.padding_idx, np.int64), "pad")))
    x = _embed(g, "src_tokens", keep, enc, encoder=True)
    mask = _mask(g, keep)
    for layer in enc.layers:
        x = _layer(g, x, layer, {"self_attn": lambda h, a=layer.self_attn: _self_attention(g, h, a, mask),
                                 "ffn": _ffn(g, layer)})
    return _layer_norm(g, x, enc.layer_norm), keep


def _keys_values(g: Graph, x: str, layers, rows: Optional[str] = None,
                 names: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """Every decoder layer's (keys, values), each (B, heads, S, d), of the encoder output x (B, S, C) in one product;
    rows (N,): of those sources instead, (N, heads, S, d); names: the graph outputs to write them to."""
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
    """fairseq's TransformerDecoderBase's layer stack on ``tokens`` (A, T), attending to ``keys_values`` (A, heads,
    S, d) each masked by src_mask (A, S): its final states (A, T, C) and where the tokens are real (A, T)."""
    keep = g.op("Not", g.op("Equal", tokens, g.const(np.asarray(dec.padding_idx, np.int64), "pad")))  # (A, T)
    x = _embed(g, tokens, keep, dec, encoder=False)  # (A, T, C)
    return _top(g, dec, _stack(g, dec, x, range(len(dec.layers)), keys_values, _mask(g, keep), src_mask, causal)), keep


def _stack(g: Graph, dec: nn.Module, x: str, layers: range, keys_values: Sequence[Tuple[str, str]], mask: str,
           src_mask: str, causal: bool = False) -> str:
    """The decoder's ``layers`` on x (A, T, C), self-attention masked by ``mask``, layer i attending to
    ``keys_values[i]`` masked by src_mask."""
    for i in layers:
        layer, (k, v) = dec.layers[i], keys_values[i]
        x = _layer(g, x, layer, {
            "self_attn": lambda h, a=layer.self_attn: _self_attention(g, h, a, mask, causal),
            "encoder_attn": lambda h, a=layer.encoder_attn, k=k, v=v: _cross_attention(g, h, a, k, v, src_mask),
            "ffn": _ffn(g, layer)})
    return x


def _top(g: Graph, dec: nn.Module, x: str) -> str:  # the decoder's final layer norm and output projection
    x = _layer_norm(g, x, dec.layer_norm)
    return x if dec.project_out_dim is None else _linear(g, x, dec.project_out_dim)


def encoder_graph(model: nn.Module, shortlisted: bool = False,
                  extra: Optional[Callable[[Graph, str], List["onnx.ValueInfoProto"]]] = None) -> "onnx.ModelProto":
    """src_tokens (B, S) -> every decoder layer's encoder-attention keys and values (B, heads, S, d); ``shortlisted``:
    also ``shortlist`` (B, L) (V: padding) -> its projection rows ``shortlist_weights`` (B, L, C), 0 at padding;
    ``extra(g, keep)``: more outputs (given where the sources are real (B, S)), their descriptions returned."""
    enc, dec = model.encoder, model.decoder
    g = Graph("insertion_encoder")
    x, keep = _encode(g, enc)
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
    more = [] if extra is None else extra(g, keep)
    return g.model([_io("src_tokens", TensorProto.INT64, ["batch", "source"]), *listed_in],
                   [*(_io(name, TensorProto.FLOAT, ["batch", H, "source", d]) for name in names), *listed_out, *more],
                   vocab_size=enc.embed_tokens.num_embeddings)


def scorer_graph(model: nn.Module) -> "onnx.ModelProto":
    """An autoregressive transformer (``--rerank-with``) scoring candidates teacher-forced, as
    :class:`~fairseq_insertion.rerank.AutoregressiveScorer`: ``src_tokens`` (B, S), ``rows`` (N,) each candidate's
    source, ``target`` and ``prev_tokens`` (N, T) -> ``log_probs`` (N,) log p(target | source)."""
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


def _pass(g: Graph, dec: nn.Module, framed: str, open_slots: str, inputs: Dict[str, str], k: str,
          shortlisted: bool = False) -> None:
    """One decoding pass: the decoder over the ``framed`` canvases (A, W), then :func:`_slots`."""
    L = len(dec.layers)
    names = source_names(L)
    x, keep = _decode(g, dec, framed, list(zip(names[:L], names[L:])), "src_mask")  # (A, W, C)
    _slots(g, dec, x, keep, open_slots, inputs, k, shortlisted)


def _slots(g: Graph, dec: nn.Module, x: str, keep: str, open_slots: str, inputs: Dict[str, str], k: str,
           shortlisted: bool = False) -> None:
    """The slot head on the final states x (A, W, C), real where ``keep`` (A, W), at the ``open_slots`` (N,) and the
    slot rule: writes ``tokens``, ``log_probs`` (N, k), ``eos_log_probs`` (N, 1) and ``location`` (A, W-1)."""
    d = dec.dictionary
    bos, eos, pad = d.bos(), d.eos(), d.pad()
    _, joins_next, joins_prev = word_edge_table(list(d.symbols), d.nspecial)
    rule = SlotRule.build((bos, pad, eos), eos, d.unk(), joins_next, joins_prev)
    head = slot_head(dec)
    closure, lookahead = getattr(dec, "closure", None), getattr(dec, "lookahead", None)
    if closure is None and lookahead is None:
        content, ids = _slot_head(g, x, keep, head, open_slots, shortlisted)  # (N, V) or (N, L) each
        choose_graph(g, rule, content, inputs, k, ids)
        return
    if shortlisted:
        raise ExportError("a model with a slot-closure head or a look-ahead closure cannot be exported with "
                          "--shortlist")
    states, _ = _slot_head(g, x, keep, head, open_slots, project=False)  # (N, C)
    if closure is None:
        content = g.op("MatMul", states, g.const(head.output.weight.t(), "output_projection"))  # (N, V)
        choose_graph(g, rule, content, inputs, k)
    else:  # the slot-closure head, then the slot rule on the slots it leaves open
        rows, close_log_probs = closing_graph(g, closure, states, inputs)  # (N',), (N, 1)
        left = {name: g.op("Gather", value, rows, axis=0) for name, value in inputs.items()}  # the slots left open
        content = g.op("MatMul", g.op("Gather", states, rows, axis=0), g.const(head.output.weight.t(),
                                                                                "output_projection"))  # (N', V)
        chosen = choose_graph(g, rule, content, left, k, names=("open_tokens", "open_log_probs", "open_eos_log_probs"))
        closing_outputs(g, rows, close_log_probs, inputs["eos_penalty"], rule.eos, chosen)
    if lookahead is not None:
        ending_graph(g, lookahead, states, "tokens", "log_probs", "eos_log_probs", inputs, k, eos)


def pass_graph(model: nn.Module, shortlisted: bool = False) -> "onnx.ModelProto":
    """One decoding pass, its inputs and outputs :func:`fairseq_insertion.export_format.graph_io`'s; ``shortlisted``:
    the open slots score their sentence's list only (``shortlist`` (A, L), ``shortlist_weights`` (A, L, C))."""
    dec = model.decoder
    g = Graph("insertion_pass")
    _pass(g, dec, "framed", "open_slots", {f.name: f.name for f in FEEDS}, "k", shortlisted)
    return g.model(*pass_io(dec, shortlisted), vocab_size=len(dec.dictionary))


def pass_io(dec: nn.Module, shortlisted: bool) -> Tuple[List["onnx.ValueInfoProto"], List["onnx.ValueInfoProto"]]:
    """The pass graph's inputs and outputs (:func:`pass_graph`)."""
    C, attn = dec.output_projection.weight.size(1), dec.layers[0].encoder_attn
    listed = [_io("shortlist", TensorProto.INT64, ["rows", "listed"]),
              _io("shortlist_weights", TensorProto.FLOAT, ["rows", "listed", C])] if shortlisted else []
    return ([_io("framed", TensorProto.INT64, ["rows", "width"]),
             *(_io(name, TensorProto.FLOAT, ["rows", attn.num_heads, "source", attn.head_dim])
               for name in source_names(len(dec.layers))), _io("src_mask", TensorProto.INT32, ["rows", "source"]),
             _io("open_slots", TensorProto.INT64, ["open"]),
             *(_io(f.name, helper.np_dtype_to_tensor_dtype(np.dtype(f.dtype)), list(f.dims)) for f in FEEDS),
             _io("k", TensorProto.INT64, [1]), *listed],
            [_io("tokens", TensorProto.INT64, ["open", "k"]), _io("log_probs", TensorProto.FLOAT, ["open", "k"]),
             _io("eos_log_probs", TensorProto.FLOAT, ["open", 1]),
             _io("location", TensorProto.FLOAT, ["rows", "slots"]),
             *([_io("ends", TensorProto.BOOL, ["open", 1]), _io("end_log_probs", TensorProto.FLOAT, ["open", 1])]
               if getattr(dec, "lookahead", None) is not None else [])])


def _slot_head(g: Graph, x: str, keep: str, head: SlotHeadWeights, open_slots: str, shortlisted: bool = False,
               project: bool = True) -> Tuple[str, Optional[str]]:
    """The factorized slot head on the final states x (A, W, C), real where ``keep`` (A, W): writes ``location``,
    log p(l) (A, W-1), -inf at padding, and returns the content scores of the ``open_slots`` (N,), (N, V), and None;
    ``shortlisted``: their scores over their sentence's list (N, L) and the listed ids (N, L)."""
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
    if not project:  # the open slots' states
        return Hc, None
    return g.op("MatMul", Hc, g.const(head.output.weight.t(), "output_projection")), None  # (N, V)
