"""The decoding loop's functions as ONNX nodes: :class:`GraphOps` is an :class:`~fairseq_insertion.loop.Ops` whose
arrays (:class:`GraphArray`) are values of a graph being built, so that the functions of
:mod:`fairseq_insertion.loop`, called with it, emit their computation into that graph instead of computing it
(the framing, the open slots, the repetition and word-edge rules, the slot scores, the step rules, the room cap,
the placement of insertions and a pass's state update). The logic stays written once, in the loop.

A :class:`GraphArray` knows its ONNX value name, its dtype and its rank; each dimension is an int where known
statically, or a symbolic int64 scalar of the graph (:attr:`GraphArray.shape`). It offers what the loop uses of
numpy's surface: the operators, the index forms ``x[:, None]``, ``x[:, a:b]``, ``x[:, i]``, ``x[idx]`` (an integer
array on one axis), ``x[mask]`` (a boolean mask over the leading axes, row-major), slice assignment (the array then
names the new node's output), and ``sum``, ``any``, ``all``, ``max``, ``cumsum``, ``argmax``, ``clip``,
``reshape``. What the loop reads back on the host (:meth:`GraphOps.host`) stays in the graph as symbolic scalars,
and :meth:`GraphOps.might` always holds: the graph takes the general branch, whose results are the same.

Dtypes follow numpy with two differences: every integer array is int64 and every float array float32 (an integer
array with a float is float32, not float64). Bitwise operators work on booleans only.

``g``, the graph builder, is :class:`fairseq_insertion.export.Graph` (``op`` and ``const`` are used). This module
imports numpy and onnx only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from onnx import ValueInfoProto, helper, numpy_helper

INT, FLOAT, BOOL = np.dtype(np.int64), np.dtype(np.float32), np.dtype(bool)
_END = np.iinfo(np.int64).max  # a slice's open end
Dim = Union[int, "GraphArray", None]  # None: not known yet (read from the graph on demand)


def _kind(x: Any) -> int:
    """0 bool, 1 integer, 2 float: numpy's promotion order, for arrays and Python scalars alike."""
    dtype = x.dtype if isinstance(x, (GraphArray, np.ndarray, np.generic)) else np.asarray(x).dtype
    return 0 if dtype == BOOL else 2 if dtype.kind == "f" else 1


def _merge(a: Dim, b: Dim) -> Dim:
    """The broadcast of two dimensions."""
    if isinstance(a, int) and a != 1:
        return a
    if isinstance(b, int) and b != 1:
        return b
    if isinstance(a, int):
        return b
    if isinstance(b, int):
        return a
    return a if a is b else None


def _broadcast(*shapes: Sequence[Dim]) -> List[Dim]:
    rank = max(len(s) for s in shapes)
    out: List[Dim] = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            out[i] = _merge(out[i], d)
    return out


def _same(dims: Sequence[Dim]) -> Dim:
    """One dimension that several arrays share (a static one if any)."""
    known = [d for d in dims if d is not None]
    return next((d for d in known if isinstance(d, int)), known[0] if known else None)


def _static(d: Any) -> Optional[int]:
    return int(d) if isinstance(d, (int, np.integer)) else None


class GraphArray:
    """One value of the graph being built: its name, dtype and dimensions (see the module's docstring)."""

    __array_ufunc__ = None  # numpy's operators defer to this class's reflected ones
    __hash__ = object.__hash__

    def __init__(self, ops: "GraphOps", name: str, dtype: Any, dims: Sequence[Dim]):
        self.ops, self.name, self.dtype, self._dims = ops, name, np.dtype(dtype), list(dims)

    def __repr__(self) -> str:
        return f"GraphArray({self.name!r}, {self.dtype}, rank {self.ndim})"

    @property
    def ndim(self) -> int:
        return len(self._dims)

    @property
    def shape(self) -> Tuple[Union[int, "GraphArray"], ...]:
        """Each dimension: an int where static, else a symbolic int64 scalar."""
        for i, d in enumerate(self._dims):
            if d is None:
                self._dims[i] = self.ops._dim_of(self, i)
        return tuple(self._dims)

    def __bool__(self) -> bool:
        raise TypeError(f"{self!r}: a graph value has no truth value in Python")

    def __iter__(self):
        raise TypeError(f"{self!r}: a graph value cannot be iterated in Python")

    def __len__(self) -> int:
        if self.ndim and isinstance(self._dims[0], int):
            return self._dims[0]
        raise TypeError(f"{self!r}: the length is not static")

    # ------------------------------------------------------------ operators
    def __add__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Add", self, other)

    def __radd__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Add", other, self)

    def __sub__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Sub", self, other)

    def __rsub__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Sub", other, self)

    def __mul__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Mul", self, other)

    def __rmul__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Mul", other, self)

    def __truediv__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Div", self.ops.cast_to(self, FLOAT) if _kind(self) < 2 else self, other)

    def __neg__(self) -> "GraphArray":
        return self.ops._node("Neg", [self], self.dtype, self._dims)

    def __and__(self, other: Any) -> "GraphArray":
        return self.ops._logical("And", self, other)

    __rand__ = __and__

    def __or__(self, other: Any) -> "GraphArray":
        return self.ops._logical("Or", self, other)

    __ror__ = __or__

    def __invert__(self) -> "GraphArray":
        return self.ops._logical("Not", self)

    def __eq__(self, other: Any) -> "GraphArray":  # type: ignore[override]
        return self.ops._binary("Equal", self, other, BOOL)

    def __ne__(self, other: Any) -> "GraphArray":  # type: ignore[override]
        return ~self.ops._binary("Equal", self, other, BOOL)

    def __lt__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Less", self, other, BOOL)

    def __le__(self, other: Any) -> "GraphArray":
        return self.ops._binary("LessOrEqual", self, other, BOOL)

    def __gt__(self, other: Any) -> "GraphArray":
        return self.ops._binary("Greater", self, other, BOOL)

    def __ge__(self, other: Any) -> "GraphArray":
        return self.ops._binary("GreaterOrEqual", self, other, BOOL)

    def __getitem__(self, key: Any) -> "GraphArray":
        return self.ops._index(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Slice assignment, ``x[:, i] = v`` or ``x[:, a:b] = v``: this array names the updated copy."""
        self.name = self.ops._assign(self, key, value).name

    # ------------------------------------------------------------ methods
    def sum(self, axis: Optional[int] = None) -> "GraphArray":
        x = self.ops.long(self) if self.dtype == BOOL else self
        return self.ops._reduce("ReduceSum", x, axis)

    def any(self, axis: Optional[int] = None) -> "GraphArray":
        return (self if self.dtype == BOOL else self != 0).sum(axis) > 0

    def all(self, axis: Optional[int] = None) -> "GraphArray":
        return (~self if self.dtype == BOOL else self == 0).sum(axis) == 0

    def max(self, axis: Optional[int] = None) -> "GraphArray":
        return self.ops._reduce("ReduceMax", self, axis)

    def cumsum(self, axis: int) -> "GraphArray":
        x = self.ops.long(self) if self.dtype == BOOL else self
        return self.ops._node("CumSum", [x, self.ops.constant(axis)], x.dtype, x._dims)

    def argmax(self, axis: int) -> "GraphArray":
        axis = axis % self.ndim
        return self.ops._node("ArgMax", [self], INT, self._dims[:axis] + self._dims[axis + 1:], axis=axis,
                              keepdims=0)

    def clip(self, min: Any = None, max: Any = None) -> "GraphArray":
        out = self if min is None else self.ops._binary("Max", self, min)
        return out if max is None else self.ops._binary("Min", out, max)

    def reshape(self, *shape: Any) -> "GraphArray":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        dims: List[Dim] = [None if _static(d) == -1 else d if isinstance(d, GraphArray) else int(d) for d in shape]
        free = [i for i, d in enumerate(dims) if d is None]  # the -1
        sizes = [_static(d) for d in self._dims]
        given = [d for d in dims if d is not None]
        if len(free) == 1 and None not in sizes and all(isinstance(d, int) for d in given) and int(np.prod(given)):
            dims[free[0]] = int(np.prod(sizes)) // int(np.prod(given))
        loose = bool(free)  # -1 and a dimension 0 cannot go together with allowzero
        return self.ops._node("Reshape", [self, self.ops._shape_tensor(shape)], self.dtype, dims,
                              allowzero=0 if loose else 1)


class GraphOps:
    """:class:`~fairseq_insertion.loop.Ops` that builds ONNX nodes into the graph builder ``g``.

    :meth:`input` declares a graph input (dimensions named by strings are symbolic; one name, one dimension),
    :meth:`output` a graph output; :attr:`inputs` and :attr:`outputs` are their value infos, for ``g.model``."""

    def __init__(self, g: Any):
        self.g = g
        self.inputs: List[ValueInfoProto] = []
        self.outputs: List[ValueInfoProto] = []
        self._constants: Dict[Tuple[str, Tuple[int, ...], bytes], str] = {}
        self._named: Dict[str, GraphArray] = {}

    # ------------------------------------------------------------ graph plumbing
    def input(self, name: str, dtype: Any, dims: Sequence[Union[int, str]]) -> GraphArray:
        """A graph input of this dtype; a dimension is an int (static) or a name (symbolic)."""
        dtype = np.dtype(dtype)
        self.inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), list(dims)))
        x = GraphArray(self, name, dtype, [None] * len(dims))
        for i, d in enumerate(dims):
            if isinstance(d, str):
                if d not in self._named:
                    self._named[d] = self._dim_of(x, i)
                x._dims[i] = self._named[d]
            else:
                x._dims[i] = int(d)
        return x

    def output(self, name: str, x: Any) -> None:
        """``x`` (a graph value or a Python scalar) as the graph output ``name``."""
        x = self._array(x, None)
        self.g.output("Identity", name, x.name)
        dims = [d if isinstance(d, int) else None for d in x._dims]
        self.outputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), dims))

    def constant(self, value: Any, dtype: Any = None) -> GraphArray:
        """A constant (one initializer per distinct value)."""
        array = np.asarray(value, dtype=dtype)
        if array.dtype.kind in "iu":
            array = array.astype(INT)
        elif array.dtype.kind == "f":
            array = array.astype(FLOAT)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self.g.const(array, "value")
        return GraphArray(self, self._constants[key], array.dtype, array.shape)

    def _node(self, op: str, inputs: Sequence[Any], dtype: Any, dims: Sequence[Dim], **attrs: Any) -> GraphArray:
        names = [x if isinstance(x, str) else x.name for x in inputs]
        return GraphArray(self, self.g.op(op, *names, **attrs), dtype, dims)

    def _dim_of(self, x: GraphArray, axis: int) -> GraphArray:
        """(): dimension ``axis`` of ``x``, read from the graph."""
        size = self._node("Shape", [x], INT, [1], start=axis, end=axis + 1)  # (1,)
        return self._node("Squeeze", [size, self.constant([0])], INT, [])

    def _shape_tensor(self, dims: Sequence[Any]) -> GraphArray:
        """(len(dims),) int64 from ints and symbolic scalars."""
        if all(_static(d) is not None for d in dims):
            return self.constant([int(d) for d in dims])
        parts = [self._node("Unsqueeze", [self.long(d), self.constant([0])], INT, [1]) if isinstance(d, GraphArray)
                 else self.constant([int(d)]) for d in dims]
        return self._node("Concat", parts, INT, [len(dims)], axis=0)

    def _array(self, x: Any, dtype: Any) -> GraphArray:
        """``x`` as a graph value of ``dtype`` (None: its own)."""
        if not isinstance(x, GraphArray):
            return self.constant(x, dtype)
        return x if dtype is None or x.dtype == np.dtype(dtype) else self.cast_to(x, dtype)

    def _common(self, *xs: Any) -> np.dtype:
        kind = max(_kind(x) for x in xs)
        same = [x.dtype for x in xs if isinstance(x, GraphArray) and _kind(x) == kind]
        return same[0] if same and all(d == same[0] for d in same) else (BOOL, INT, FLOAT)[kind]

    def _binary(self, op: str, a: Any, b: Any, dtype: Any = None) -> GraphArray:
        common = self._common(a, b)
        if common == BOOL and op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
            raise TypeError(f"{op} of booleans: the graph takes it of numbers only")
        a, b = self._array(a, common), self._array(b, common)
        return self._node(op, [a, b], common if dtype is None else dtype, _broadcast(a._dims, b._dims))

    def _logical(self, op: str, *xs: Any) -> GraphArray:
        if any(_kind(x) for x in xs):
            raise TypeError(f"{op}: the graph's bitwise operators take booleans only")
        arrays = [self._array(x, BOOL) for x in xs]
        return self._node(op, arrays, BOOL, _broadcast(*(x._dims for x in arrays)))

    def _reduce(self, op: str, x: GraphArray, axis: Optional[int]) -> GraphArray:
        if axis is None:
            return self._node(op, [x], x.dtype, [], keepdims=0)
        axis = axis % x.ndim
        dims = x._dims[:axis] + x._dims[axis + 1:]
        if op == "ReduceSum":  # opset 13: the axes an input; ReduceMax's an attribute until opset 18
            return self._node(op, [x, self.constant([axis])], x.dtype, dims, keepdims=0)
        return self._node(op, [x], x.dtype, dims, axes=[axis], keepdims=0)

    def _unsqueeze(self, x: GraphArray, axis: int) -> GraphArray:
        return self._node("Unsqueeze", [x, self.constant([axis])], x.dtype, x._dims[:axis] + [1] + x._dims[axis:])

    def _slice(self, x: GraphArray, axis: int, start: Any, stop: Any, step: Any = None) -> GraphArray:
        """x sliced on one axis, numpy's clamping."""
        start = 0 if start is None else start
        stop = _END if stop is None else stop
        step = 1 if step is None else step
        size = _static(x._dims[axis])
        bounds = [_static(v) for v in (start, stop, step)]
        dims = list(x._dims)
        dims[axis] = len(range(*slice(*bounds).indices(size))) if None not in bounds and size is not None else None
        parts = [self._shape_tensor([v]) for v in (start, stop)] + [self.constant([axis]), self._shape_tensor([step])]
        return self._node("Slice", [x] + parts, x.dtype, dims)

    # ------------------------------------------------------------ indexing
    def _index(self, x: GraphArray, key: Any) -> GraphArray:
        key = key if isinstance(key, tuple) else (key,)
        if len(key) == 1 and isinstance(key[0], GraphArray) and key[0].dtype == BOOL:  # x[mask]: row-major
            mask = key[0]
            where = self._node("Transpose", [self._node("NonZero", [mask], INT, [mask.ndim, None])], INT,
                               [None, mask.ndim])  # (N, r)
            return self._node("GatherND", [x, where], x.dtype, [None] + x._dims[mask.ndim:])
        axis = 0
        for k in key:
            if k is None:
                x = self._unsqueeze(x, axis)
                axis += 1
            elif isinstance(k, slice):
                if not (k.start is None and k.stop is None and k.step is None):
                    x = self._slice(x, axis, k.start, k.stop, k.step)
                axis += 1
            elif isinstance(k, (int, np.integer)):
                x = self._node("Gather", [x, self.constant(int(k))], x.dtype, x._dims[:axis] + x._dims[axis + 1:],
                               axis=axis)
            elif isinstance(k, GraphArray) and _kind(k) == 1:
                x = self._node("Gather", [x, k], x.dtype, x._dims[:axis] + k._dims + x._dims[axis + 1:], axis=axis)
                axis += k.ndim
            else:
                raise TypeError(f"index {k!r}: the graph takes None, slices, ints and one integer array an axis")
        return x

    def _assign(self, x: GraphArray, key: Any, value: Any) -> GraphArray:
        """A copy of x with ``x[key] = value``: full slices, then one int or slice (ascending bounds)."""
        key = key if isinstance(key, tuple) else (key,)
        axis = len(key) - 1
        if not all(isinstance(k, slice) and k.start is None and k.stop is None and k.step is None for k in key[:-1]):
            raise TypeError(f"assignment at {key!r}: the graph takes x[:, ..., i] or x[:, ..., a:b]")
        k = key[-1]
        value = self._array(value, x.dtype)
        if isinstance(k, (int, np.integer)):
            at = int(k)
            start, stop = at, (at + 1 if at != -1 else None)
            target = self._index(x, key)
            middle = self._unsqueeze(self._expand(value, target), axis)
        elif isinstance(k, slice) and k.step in (None, 1):
            start, stop = (0 if k.start is None else k.start), k.stop
            if stop is not None and _static(stop) is None or _static(start) is None:
                stop = None if stop is None else self._binary("Max", stop, start)  # an empty slice inserts nothing
            elif stop is not None and start >= 0 and stop >= 0:
                stop = max(start, stop)
            middle = self._expand(value, self._slice(x, axis, start, stop))
        else:
            raise TypeError(f"assignment at {key!r}: the graph takes x[:, ..., i] or x[:, ..., a:b]")
        parts = [self._slice(x, axis, 0, start), middle, self._slice(x, axis, stop, None)]
        return self._node("Concat", parts, x.dtype, x._dims, axis=axis)

    def _expand(self, value: GraphArray, like: GraphArray) -> GraphArray:
        """``value`` broadcast to ``like``'s shape."""
        return self._node("Expand", [value, self._node("Shape", [like], INT, [like.ndim])], value.dtype,
                          _broadcast(value._dims, like._dims))

    # ------------------------------------------------------------ loop.Ops
    def arange(self, n: Any, like: Any = None) -> GraphArray:
        if _static(n) is not None:
            return self.constant(np.arange(int(n)))
        return self._node("Range", [self.constant(0), self.long(n), self.constant(1)], INT, [n])

    def full(self, shape: Sequence[Any], value: Any, like: GraphArray) -> GraphArray:
        dims = [d if isinstance(d, GraphArray) else int(d) for d in shape]
        fill = numpy_helper.from_array(np.asarray([value], dtype=like.dtype), "value")
        return self._node("ConstantOfShape", [self._shape_tensor(dims)], like.dtype, dims, value=fill)

    def where(self, cond: GraphArray, a: Any, b: Any) -> GraphArray:
        common = self._common(a, b)
        cond, a, b = self._array(cond, BOOL), self._array(a, common), self._array(b, common)
        return self._node("Where", [cond, a, b], common, _broadcast(cond._dims, a._dims, b._dims))

    def concat(self, arrays: Sequence[GraphArray], axis: int) -> GraphArray:
        common = self._common(*arrays)
        arrays = [self._array(x, common) for x in arrays]
        axis = axis % arrays[0].ndim
        along = [x._dims[axis] for x in arrays]
        dims = [_same([x._dims[i] for x in arrays]) for i in range(arrays[0].ndim)]
        dims[axis] = sum(along) if all(isinstance(d, int) for d in along) else None
        return self._node("Concat", arrays, common, dims, axis=axis)

    def argsort(self, x: GraphArray, descending: bool = False) -> GraphArray:
        """Stable: TopK orders ties arbitrarily, so each value's dense rank among the row's (from a first, unstable
        TopK) and its index make a unique key, ordered by a second TopK."""
        if x.dtype == BOOL:
            x = self.long(x)
        axis = x.ndim - 1
        n = self._node("Shape", [x], INT, [1], start=axis)  # (1,)
        values, order = (GraphArray(self, name, dtype, x._dims) for name, dtype in zip(
            self.g.op("TopK", x.name, n.name, axis=axis, largest=int(descending), sorted=1, outputs=2), (x.dtype, INT)))
        previous = self.concat([self._slice(values, axis, 0, 1), self._slice(values, axis, 0, -1)], axis)
        rank = (values != previous).cumsum(axis)  # (..., S) dense rank of the sorted values
        rank = self._node("ScatterElements", [order, order, rank], INT, x._dims, axis=axis)  # at each position
        key = rank * self._node("Squeeze", [n, self.constant([0])], INT, []) + self.arange(x.shape[axis])
        _, stable = self.g.op("TopK", key.name, n.name, axis=axis, largest=0, sorted=1, outputs=2)
        return GraphArray(self, stable, INT, x._dims)

    def long(self, x: Any) -> GraphArray:
        return self.cast_to(x, INT)

    def cast(self, x: GraphArray, like: GraphArray) -> GraphArray:
        return self.cast_to(x, like.dtype)

    def cast_to(self, x: Any, dtype: Any) -> GraphArray:
        """``x`` as ``dtype``: a new array (the same value where the dtype is already that)."""
        dtype = np.dtype(dtype)
        if not isinstance(x, GraphArray):
            return self.constant(x, dtype)
        if x.dtype == dtype:
            return GraphArray(self, x.name, dtype, x._dims)
        return self._node("Cast", [x], dtype, x._dims, to=helper.np_dtype_to_tensor_dtype(dtype))

    def put(self, out: GraphArray, index: GraphArray, values: Any) -> GraphArray:
        """``out[r, index[r, j]] = values[r, j]``: ``out`` names the updated copy; returns it."""
        updates = self._expand(self._array(values, out.dtype), index)
        out.name = self._node("ScatterElements", [out, index, updates], out.dtype, out._dims, axis=1).name
        return out

    def gather(self, x: GraphArray, index: GraphArray) -> GraphArray:
        return self._node("GatherElements", [x, index], x.dtype, index._dims, axis=1)

    def masked_put(self, mask: GraphArray, values: GraphArray, fill: Any) -> GraphArray:
        flat = mask.reshape(-1)  # (A S,)
        at = self.where(flat, flat.cumsum(0), 0)  # (A S,) 1 + the value's index; 0: the fill
        table = self.concat([self.constant([fill], values.dtype), values], 0)  # (1 + N,)
        return self._node("Gather", [table, at], values.dtype, [None], axis=0).reshape(*mask.shape)

    def amax(self, x: GraphArray, axis: int) -> GraphArray:
        return self._reduce("ReduceMax", x, axis)

    def permute(self, x: GraphArray, dims: Tuple[int, ...]) -> GraphArray:
        return self._node("Transpose", [x], x.dtype, [x._dims[d] for d in dims], perm=list(dims))

    def asarray(self, x: Any, like: Any = None) -> GraphArray:
        return x if isinstance(x, GraphArray) else self.constant(x)

    def host(self, *scalars: Any) -> List[Any]:
        """The scalars themselves: they stay in the graph, symbolic."""
        return list(scalars)

    def might(self, cond: Any) -> bool:
        return True

    def searchsorted(self, sorted_: GraphArray, values: GraphArray) -> GraphArray:
        """By counting the smaller entries: (values' size x len(sorted_)) comparisons."""
        return (sorted_ < self._unsqueeze(self._array(values, None), values.ndim)).sum(-1)
