"""The arrays of a backend: the :class:`Ops` the loop needs beyond what numpy arrays and torch tensors share, and
numpy's (:data:`NUMPY`; torch's is ``fairseq_insertion.decoding.TORCH``)."""

from __future__ import annotations

from typing import Any, List, Protocol, Sequence, Tuple

import numpy as np

Array = Any  # a numpy array or a torch tensor: one backend's arrays
NEG_INF = float("-inf")


class Ops(Protocol):
    """The array operations the loop needs beyond what numpy and torch spell alike."""

    def arange(self, n: int, like: Array) -> Array: ...

    def full(self, shape: Tuple[int, ...], value: Any, like: Array) -> Array:
        """``value`` everywhere, of ``like``'s type and place."""

    def where(self, cond: Array, a: Any, b: Any) -> Array: ...
    def concat(self, arrays: Sequence[Array], axis: int) -> Array: ...

    def argsort(self, x: Array, descending: bool = False) -> Array:
        """Along the last axis, stable: equal values keep their order (the leftmost first)."""

    def long(self, x: Array) -> Array: ...
    def cast(self, x: Array, like: Array) -> Array: ...

    def put(self, out: Array, index: Array, values: Any) -> Array:
        """``out[r, index[r, j]] = values[r, j]`` (or a scalar), in place; returns ``out``."""

    def gather(self, x: Array, index: Array) -> Array:
        """``x[r, index[r, j]]``."""

    def masked_put(self, mask: Array, values: Array, fill: Any) -> Array:
        """(A, S) ``fill`` with ``values`` (N,) written at ``mask``, row-major."""

    def amax(self, x: Array, axis: int) -> Array: ...
    def log(self, x: Array) -> Array: ...
    def permute(self, x: Array, dims: Tuple[int, ...]) -> Array: ...

    def asarray(self, x: np.ndarray, like: Array) -> Array:
        """A numpy array as one of this backend's, beside ``like``."""

    def host(self, *scalars: Array) -> List[int]:
        """Scalars as Python ints, in one round trip."""

    def might(self, cond: Array) -> bool:
        """False only where ``cond`` is known to hold nowhere without a round trip to a device."""

    def searchsorted(self, sorted_: Array, values: Array) -> Array:
        """Where each of ``values`` would go in the ascending 1-D ``sorted_`` (the leftmost place)."""


class NumpyOps:
    """:class:`Ops` for numpy (the deployment runtime)."""

    def arange(self, n: int, like: Array) -> Array: return np.arange(n)
    def full(self, shape, value, like): return np.full(shape, value, dtype=like.dtype)
    def where(self, cond, a, b): return np.where(cond, a, b)
    def concat(self, arrays, axis): return np.concatenate(arrays, axis)
    def argsort(self, x, descending=False): return np.argsort(-x if descending else x, axis=-1, kind="stable")
    def long(self, x): return x.astype(np.int64)
    def cast(self, x, like): return x.astype(like.dtype, copy=False)

    def put(self, out, index, values):
        out[np.arange(out.shape[0])[:, None], index] = values
        return out

    def gather(self, x, index): return np.take_along_axis(x, index, 1)

    def masked_put(self, mask, values, fill):
        if values.size == mask.size:  # every slot open: no scatter
            return values.reshape(mask.shape)
        out = np.full(mask.shape, fill, dtype=values.dtype)
        out[mask] = values
        return out

    def amax(self, x, axis): return x.max(axis)
    def log(self, x): return np.log(x)
    def permute(self, x, dims): return x.transpose(dims)
    def asarray(self, x, like): return x
    def host(self, *scalars): return [int(s) for s in scalars]
    def might(self, cond): return bool(cond.any())
    def searchsorted(self, sorted_, values): return np.searchsorted(sorted_, values)


NUMPY = NumpyOps()
