"""The ONNX graph builder every exported graph is made with (:class:`Graph`), and the export's error."""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from ..errors import InsertionError

OPSET = 17
IR_VERSION = 8  # the oldest that opset 17 allows: readable by every onnxruntime since 1.13


class ExportError(InsertionError):
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

    def branch(self, name: str, build: Callable[[], Sequence[Tuple[str, Any]]]) -> "onnx.GraphProto":
        """The nodes and constants ``build`` adds, as an ``If``'s branch whose outputs are the (value, numpy element
        type) pairs it returns; it reads the outer graph's values by name."""
        nodes, initializers = len(self.nodes), len(self.initializers)
        outputs = [helper.make_tensor_value_info(value, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)
                   for value, dtype in build()]
        graph = helper.make_graph(self.nodes[nodes:], name, [], outputs, self.initializers[initializers:])
        del self.nodes[nodes:], self.initializers[initializers:]  # moved into the branch
        return graph

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
