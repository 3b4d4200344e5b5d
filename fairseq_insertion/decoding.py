"""Insertion decoding on torch: the word edges kept at constraints (paper: "Inference"). The loop
itself, the decode driver, its typed state (:class:`Canvases`, :class:`SlotScores`,
:class:`Insertions`) and the step rules live in :mod:`fairseq_insertion.loop`
(torch-free, shared with the deployment runtime), every option and its default,
:class:`DecodingConfig`, in :mod:`fairseq_insertion.config` (re-exported here).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import loop as L
from .config import (  # noqa: F401  re-exported: decoding's options live in config.py
    CONSTRAINT_ORDERS,
    DECODINGS,
    FAIRSEQ_LENGTH_DEFAULTS,
    FLAGS,
    PRECISIONS,
    DecodingConfig,
    DecodingError,
    check_search_options,
    parse_betas,
)

# ---------------------------------------------------------------- word edges
WORD_SCHEMES = L.WORD_SCHEMES  # the subword schemes whose word edges the decoder keeps at constraints


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

    @property
    def joins_next_any(self) -> bool:
        return self.scheme in ("subword_nmt", "_EOW")

    @property
    def joins_prev_any(self) -> bool:
        return self.scheme == "sentencepiece"

    def to(self, device) -> "WordEdges":
        return self._replace(joins_next=self.joins_next.to(device), joins_prev=self.joins_prev.to(device))

    @classmethod
    def from_dictionary(cls, dictionary, scheme: Optional[str] = None) -> "WordEdges":
        """The word edges of a fairseq dictionary. ``scheme``: one of :data:`WORD_SCHEMES`, or
        None: the one most of the dictionary's entries are marked for (``@@`` at the end,
        ``_EOW`` at the end, ``▁`` at the start; ``none`` when no entry is marked)."""
        scheme, nxt, prev = L.word_edge_table(list(dictionary.symbols), dictionary.nspecial, scheme)
        return cls(scheme=scheme, joins_next=torch.from_numpy(nxt), joins_prev=torch.from_numpy(prev))
