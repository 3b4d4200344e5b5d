"""The export's int8 schemes: per-row activation scales (:mod:`fairseq_insertion.quantization`, the default)
and onnxruntime's dynamic quantization."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import onnx
from onnx import TensorProto

from ..export_format import ENCODER, PASS
from ..quantization import graphs, per_row


def quantize(out: Path, names: Sequence[str] = (ENCODER, PASS), scheme: str = "per-row") -> None:
    """The graphs ``names`` in int8, in place, by ``scheme`` (checked by the caller): ``per-row`` or ``dynamic``."""
    for name in names:
        REWRITES[scheme](out, name)


def _per_row(out: Path, name: str) -> None:
    """:func:`fairseq_insertion.quantization.per_row` of the graph ``name``, in place."""
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


REWRITES = {"per-row": _per_row, "dynamic": _dynamic}  # config.INT8_SCHEMES' rewrites
