"""int8 graphs whose translations do not depend on their batch: per-row activation scales (docs/deploy.md, int8).

:func:`per_row` rewrites an exported fp32 graph (the branches of an ``If`` included) so that every product by a
weight matrix runs in int8 (onnxruntime's ``MatMulIntegerToFloat``, int32 sums: exact at any batch size), each
activation quantized once (``Abs``, ``ReduceMax``, ``Div``, ``QuantizeLinear``) and shared by the products that read
it. The location query's one column and the products by a graph input stay fp32. :data:`REWRITES`: the export's
``--int8`` schemes on a graph file, in place: :func:`per_row` and onnxruntime's dynamic quantization. Only numpy and
onnx (onnxruntime's quantizer for ``dynamic``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
# weights in 7 bits (-63..63): u8 x s8 products on CPUs without VNNI add pairs in int16 (AVX2's vpmaddubsw), which
# saturates from 255 x 64 x 2 on; with 63 no pair can, so the int32 sums are exact on every x86 CPU
WEIGHT_LEVELS = 63


class _Rewriter:
    """Rewrites one graph's nodes in order; each new value gets a fresh name with the prefix ``q8_``."""

    def __init__(self, graph: "onnx.GraphProto"):
        self.graph = graph
        self.weights = {w.name: w for w in graph.initializer}
        self.producers = {out: node for node in graph.node for out in node.output}
        self.nodes: List["onnx.NodeProto"] = []
        self.quantized: Dict[str, Tuple[str, str, str, float]] = {}  # activation -> rows() of it
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"q8_{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, *inputs: str, domain: str = "", **attrs) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, domain=domain, **attrs))
        return out

    def rows(self, x: str) -> Tuple[str, str, str, float]:
        """x (..., K) float -> its uint8 rows, their scales up to a constant (max |x| of each row, (..., 1)), the
        zero point and the constant (1 / the levels), once per activation: four nodes (a ReLU's: four with a
        ``Clip``, the ``Abs`` gone)."""
        if x not in self.quantized:
            producer = self.producers.get(x)
            relu = producer is not None and producer.op_type == "Relu"
            # a ReLU's output quantized from its input: the row's max, the negatives saturated to 0
            source = producer.input[0] if relu else x
            levels, zero = (255.0, 0) if relu else (127.0, 128)
            amax = self.op("ReduceMax", source if relu else self.op("Abs", x), axes=[-1], keepdims=1)  # (..., 1)
            if relu:  # a row of negatives: its max under 0, clipped to a tiny positive (its levels saturate to 0)
                amax = self.op("Clip", amax, self.const(np.asarray(1e-30, np.float32), "tiny"))
            # a row of zeros (padding) divides 0 by 0; its product is the integer sum times the row's scale, 0
            point = self.const(np.asarray(zero, np.uint8), "zero_point")
            q = self.op("QuantizeLinear", self.op("Div", source, amax),
                        self.const(np.asarray(1.0 / levels, np.float32), "step"), point)  # (..., K): x / amax in levels
            self.quantized[x] = (q, amax, point, 1.0 / levels)
        return self.quantized[x]

    def product(self, x: str, w: np.ndarray, out: str) -> None:
        """out = x w (x (..., K) float, w (K, N)) in int8, written to the value ``out``."""
        w_scale = np.maximum(np.abs(w).max(axis=0), 1e-30) / WEIGHT_LEVELS  # (N,)
        w_q = np.clip(np.rint(w / w_scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)  # (K, N)
        q, amax, zero, step = self.rows(x)
        self.nodes.append(helper.make_node(  # sum_k q w_q x (amax of the row) x (the column's scale x step)
            "MatMulIntegerToFloat", [q, self.const(w_q, "weight_int8"), amax,
                                     self.const((w_scale * step).astype(np.float32), "weight_scale"), zero],
            [out], name=self.fresh("matmulintegertofloat"), domain=MS))

    def attention(self, node: "onnx.NodeProto", w: np.ndarray) -> None:
        """A fused self-attention: its q/k/v product in int8, then the attention (fp32) on the three."""
        C = w.shape[1] // 3
        split = [self.fresh(name) for name in ("q", "k", "v")]
        for i, name in enumerate(split):  # three products of one quantized input: no copy of their outputs
            self.product(node.input[0], w[:, i * C:(i + 1) * C], name)  # (A, T, C)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = [*split, node.input[2] if len(node.input) > 2 else "", node.input[3] if len(node.input) > 3 else ""]
        self.nodes.append(helper.make_node("MultiHeadAttention", inputs, list(node.output[:1]), name=node.name,
                                           domain=MS, num_heads=attrs["num_heads"],
                                           unidirectional=attrs.get("unidirectional", 0)))

    def run(self) -> int:
        """Rewrite the graph's products in place; the number rewritten."""
        rewritten = 0
        for node in self.graph.node:
            w = self.weights.get(node.input[1]) if len(node.input) > 1 else None  # a product's weight matrix (K, N)
            w = numpy_helper.to_array(w) if w is not None and len(w.dims) == 2 and min(w.dims) > 1 \
                and w.data_type == TensorProto.FLOAT else None  # not a graph input or a vector
            if w is not None and node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
                self.product(node.input[0], w, node.output[0])
            elif w is not None and node.op_type == "Attention" and node.domain == MS and len(node.input) <= 4 \
                    and len(node.output) == 1 and {a.name for a in node.attribute} <= {"num_heads", "unidirectional"}:
                # (input, weights, bias, mask) as the export writes it; one with a past or a bias stays as it is
                self.attention(node, w)
            else:
                self.nodes.append(node)
                continue
            rewritten += 1
        nodes = _live(self.nodes, {out.name for out in self.graph.output})
        used = {name for node in nodes for name in node.input} | _subgraph_reads(nodes)
        kept = [w for w in self.graph.initializer if w.name in used]
        del self.graph.node[:], self.graph.initializer[:]
        self.graph.node.extend(nodes)
        self.graph.initializer.extend(kept)
        return rewritten


def _live(nodes: List["onnx.NodeProto"], outputs: set) -> List["onnx.NodeProto"]:
    """``nodes`` less those whose outputs nothing reads (a ReLU whose product now reads its input), in order."""
    read = set(outputs) | _subgraph_reads(nodes)
    live = []
    for node in reversed(nodes):
        if any(out in read for out in node.output):
            live.append(node)
            read.update(node.input)
    return live[::-1]


def _subgraph_reads(nodes) -> set:
    """The names the graphs nested in ``nodes`` read (a subgraph reads the outer graph's values by name)."""
    return {name for node in nodes for a in node.attribute if a.type == onnx.AttributeProto.GRAPH
            for graph in graphs(a.g) for inner in graph.node for name in inner.input}


def graphs(graph: "onnx.GraphProto") -> Iterator["onnx.GraphProto"]:
    """``graph`` and the graphs nested in its nodes (an ``If``'s branches), depth first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from graphs(attribute.g)


def per_row(model: "onnx.ModelProto") -> int:
    """Rewrite ``model``'s products by weight matrices (every graph in it, nested ones first) into int8 with
    per-row activation scales, in place; the number of products rewritten."""
    return sum(_Rewriter(graph).run() for graph in reversed(list(graphs(model.graph))))


def _per_row(out: Path, name: str) -> None:
    model = onnx.load(str(out / name))
    per_row(model)
    onnx.checker.check_model(model)
    onnx.save(model, str(out / name))


def _dynamic(out: Path, name: str) -> None:
    """onnxruntime's dynamic quantization of the graph ``name``, in place (int8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nested = list(graphs(onnx.load(str(out / name)).graph))  # an If's branches too
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
    """In an If's branch the quantizer leaves the Cast of some products' int32 result (the fused attention's output)
    untyped: float, as DefaultTensorType types them at a graph's top level."""
    model = onnx.load(str(path))
    for graph in graphs(model.graph):
        for node in graph.node:
            for attribute in node.attribute:
                if node.op_type == "Cast" and attribute.name == "to" and attribute.i == TensorProto.UNDEFINED:
                    attribute.i = TensorProto.FLOAT
    onnx.save(model, str(path))


REWRITES = {"per-row": _per_row, "dynamic": _dynamic}  # config.INT8_SCHEMES' rewrites of a graph file, in place
