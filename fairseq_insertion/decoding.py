"""Insertion decoding on torch: torch's arrays for the loop (:data:`TORCH`) and the word edges kept at constraints
(paper: "Inference"). The loop itself lives in :mod:`fairseq_insertion.loop` (torch-free, shared with the deployment
runtime), every option and its default in :mod:`fairseq_insertion.config`."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import loop as L


# ---------------------------------------------------------------- torch's arrays for the loop
class TorchOps:
    """:class:`fairseq_insertion.loop.Ops` for torch tensors (the PyTorch generator), on their device."""

    def arange(self, n: int, like: Tensor) -> Tensor: return torch.arange(n, device=like.device)

    def full(self, shape, value, like: Tensor) -> Tensor:
        return torch.full(shape, value, dtype=like.dtype, device=like.device)

    def where(self, cond, a, b) -> Tensor: return torch.where(cond, a, b)
    def concat(self, arrays, axis: int) -> Tensor: return torch.cat(list(arrays), axis)

    def argsort(self, x: Tensor, descending: bool = False) -> Tensor:
        return x.argsort(dim=-1, descending=descending, stable=True)

    def long(self, x: Tensor) -> Tensor: return x.long()
    def cast(self, x: Tensor, like: Tensor) -> Tensor: return x.to(like.dtype)
    def put(self, out: Tensor, index: Tensor, values) -> Tensor: return out.scatter_(1, index, values)
    def gather(self, x: Tensor, index: Tensor) -> Tensor: return x.gather(1, index)

    def masked_put(self, mask: Tensor, values: Tensor, fill) -> Tensor:
        return torch.full(mask.shape, fill, dtype=values.dtype, device=values.device).masked_scatter(mask, values)

    def amax(self, x: Tensor, axis: int) -> Tensor: return x.amax(axis)
    def log(self, x: Tensor) -> Tensor: return x.log()
    def permute(self, x: Tensor, dims) -> Tensor: return x.permute(dims)
    def asarray(self, x, like: Tensor) -> Tensor: return torch.as_tensor(x, device=like.device)
    def host(self, *scalars: Tensor): return torch.stack(list(scalars)).tolist()
    def might(self, cond: Tensor) -> bool: return True  # knowing would cost a round trip to the device
    def searchsorted(self, sorted_: Tensor, values: Tensor) -> Tensor: return torch.searchsorted(sorted_, values)


TORCH = TorchOps()


# ---------------------------------------------------------------- word edges
class WordEdges(NamedTuple):
    """Which dictionary entries glue onto a neighbour in the post-processed text, so that a
    constraint can be kept whole words (the schemes: :func:`fairseq_insertion.loop.word_edge_table`;
    the rule: :func:`fairseq_insertion.loop.word_edge_bans`). Special symbols join nothing."""

    scheme: str
    joins_next: Tensor  # (V,) bool
    joins_prev: Tensor  # (V,) bool

    @property
    def active(self) -> bool:
        return self.scheme != "none"

    def to(self, device) -> "WordEdges":
        return self._replace(joins_next=self.joins_next.to(device), joins_prev=self.joins_prev.to(device))

    @classmethod
    def from_dictionary(cls, dictionary, scheme: Optional[str] = None) -> "WordEdges":
        """The word edges of a fairseq dictionary, by ``scheme`` (:data:`fairseq_insertion.loop.bans.WORD_SCHEMES`;
        None: the one most of its entries are marked for, :func:`fairseq_insertion.loop.word_edge_table`)."""
        scheme, nxt, prev = L.word_edge_table(list(dictionary.symbols), dictionary.nspecial, scheme)
        return cls(scheme=scheme, joins_next=torch.from_numpy(nxt), joins_prev=torch.from_numpy(prev))
