"""Insertion decoding: the typed state of the loop (:class:`Canvases`, :class:`SlotScores`,
:class:`Insertions`), the word edges kept at constraints and the step rules that choose a
pass's insertions (paper: "Inference"). Every option and its default, :class:`DecodingConfig`,
lives in :mod:`fairseq_insertion.config` (torch-free, shared with the deployment runtime) and
is re-exported here.
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional

import torch
from torch import Tensor

from .canvas import InitialCanvas
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
# the subword schemes of fairseq's --post-process whose word edges the decoder keeps at constraints; the
# dictionary says which one it uses (WordEdges.from_dictionary)
WORD_SCHEMES = ("subword_nmt", "_EOW", "sentencepiece", "none")
SENTENCEPIECE_SPACE = "\u2581"


class WordEdges(NamedTuple):
    """Which dictionary entries glue onto a neighbour in the post-processed text, so that a
    constraint can be kept whole words (see :func:`canvas.word_edge_slots`).

    ``subword_nmt`` (``@@ ``): a piece ending in ``@@`` joins the next token. ``_EOW``: a
    piece not ending in ``_EOW`` joins the next token. ``sentencepiece`` (``▁`` starts a
    word): a piece without ``▁`` that holds a letter or digit joins the previous token
    (punctuation such as ``.`` after a word keeps the word whole). ``none``: every token
    is a word. Special symbols join nothing.
    """

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
        symbols = list(dictionary.symbols)
        words = symbols[dictionary.nspecial:]
        if scheme is None:
            marked = {"subword_nmt": sum(w.endswith("@@") for w in words),
                      "_EOW": sum(w.endswith("_EOW") for w in words),
                      "sentencepiece": sum(w.startswith(SENTENCEPIECE_SPACE) for w in words)}
            best = max(marked, key=marked.get)
            scheme = best if marked[best] else "none"
        if scheme not in WORD_SCHEMES:
            raise ValueError(f"word scheme must be one of {WORD_SCHEMES}, got {scheme!r}")
        special = [i < dictionary.nspecial for i in range(len(symbols))]
        if scheme == "subword_nmt":
            nxt = [w.endswith("@@") for w in symbols]
        elif scheme == "_EOW":
            nxt = [not w.endswith("_EOW") for w in symbols]
        else:
            nxt = [False] * len(symbols)
        prev = [scheme == "sentencepiece" and not w.startswith(SENTENCEPIECE_SPACE) and any(c.isalnum() for c in w)
                for w in symbols]
        keep = torch.tensor([not s for s in special], dtype=torch.bool)
        return cls(scheme=scheme, joins_next=torch.tensor(nxt, dtype=torch.bool) & keep,
                   joins_prev=torch.tensor(prev, dtype=torch.bool) & keep)


# ---------------------------------------------------------------- the state of the loop
class Canvases(NamedTuple):
    """The decoding state: one row per sentence (the active ones inside the loop). Built and
    changed by keyword only (``Canvases(rows=..., ...)``, ``state._replace(tokens=...)``)."""

    rows: Tensor  # (A,) index of each row in the batch
    tokens: Tensor  # (A, K) canvas tokens, pad after each length
    scores: Tensor  # (A, K) log p(c, l) of each inserted token when inserted; 0 for constraint tokens
    closed_before: Tensor  # (A, K) the slot just before token j is closed
    closed_end: Tensor  # (A,) the last slot is closed
    lengths: Tensor  # (A,)
    iterations: Tensor  # (A,) steps that inserted at least one token
    final_eos: Tensor  # (A,) the latest pass's end-of-slot decisions: sum of their log p(eos, l)
    max_len: Tensor  # (A,) length limit
    eos_penalty: Tensor  # (A,) beta of each row (several per sentence with eos_penalties)
    history: Optional[List[List[Dict]]] = None  # per batch row, every canvas it went through (retain_history)
    given: Optional[Tensor] = None  # (A, K) the constraint tokens, when their word edges are kept

    @classmethod
    def start(cls, init: InitialCanvas, max_len: Tensor, eos_penalty: Tensor, retain_history: bool,
              word_edges: bool = False) -> "Canvases":
        """The state before the first pass, from the initial canvas of every row; ``word_edges``:
        mark its tokens as given (:attr:`given`), for the word-edge rule."""
        B, K, device = init.tokens.size(0), init.tokens.size(1), init.tokens.device
        given = torch.arange(K, device=device).unsqueeze(0) < init.lengths.unsqueeze(1) if word_edges else None
        return cls(rows=torch.arange(B, device=device), tokens=init.tokens,
                   scores=torch.zeros(init.tokens.shape, device=device), closed_before=init.closed_before,
                   closed_end=init.closed_end, lengths=init.lengths.clone(),
                   iterations=torch.zeros(B, dtype=torch.long, device=device),
                   final_eos=torch.zeros(B, device=device), max_len=max_len, eos_penalty=eos_penalty,
                   history=[[] for _ in range(B)] if retain_history else None, given=given)

    def take(self, idx: Tensor) -> "Canvases":
        """The rows ``idx`` (N,) (the history is per batch row and stays shared)."""
        return self._replace(**{name: getattr(self, name).index_select(0, idx) for name in _ROW_FIELDS
                                if getattr(self, name) is not None})

    def trimmed(self, width: int) -> "Canvases":
        """The per-token tensors cut to ``width`` columns."""
        return self._replace(tokens=self.tokens[:, :width], scores=self.scores[:, :width],
                             closed_before=self.closed_before[:, :width],
                             given=None if self.given is None else self.given[:, :width])

    def widened(self, width: int, pad: int) -> "Canvases":
        """A copy whose per-token tensors are at least ``width`` wide (the result buffer)."""
        return self._replace(tokens=_widen(self.tokens, width, pad).clone(),
                             scores=_widen(self.scores, width, 0.0).clone(), lengths=self.lengths.clone(),
                             iterations=self.iterations.clone(), final_eos=self.final_eos.clone())

    def store(self, done: "Canvases") -> None:
        """Write the finished rows ``done`` into this result buffer at their batch rows."""
        W, r = done.tokens.size(1), done.rows
        self.tokens[r, :W] = done.tokens
        self.scores[r, :W] = done.scores
        self.lengths[r] = done.lengths
        self.iterations[r] = done.iterations
        self.final_eos[r] = done.final_eos


_ROW_FIELDS = tuple(f for f in Canvases._fields if f != "history")


class SlotScores(NamedTuple):
    """One pass's prediction for the slots of the active canvases, (A, S) each."""

    open: Tensor  # slots that may receive a token: real and not closed
    tokens: Tensor  # the best token of each open slot (eos elsewhere): bos/pad excluded, eos penalised
    log_probs: Tensor  # its log p(c | l) (the eos penalty included when eos wins)
    location: Tensor  # log p(l), -inf at padding slots
    final_eos: Tensor  # (A,) log-prob of this pass's end-of-slot decisions, sum of log p(eos, l), no penalty
    content: Optional[Tensor]  # (A, S, V) log p(c | l) of the open slots (-inf elsewhere); greedy sequence only


class Insertions(NamedTuple):
    """What one step inserts: ``tokens[l]`` (with score ``log_probs[l]``) into every slot l where ``mask``."""

    mask: Tensor  # (A, S)
    tokens: Tensor  # (A, S)
    log_probs: Tensor  # (A, S) log p(c | l)


# ---------------------------------------------------------------- the step rules
def parallel_step(p: SlotScores, room: Tensor, eos: int) -> Insertions:
    """Insert the best token into every open slot whose best is not end-of-slot,
    at most ``room`` (A,) per canvas (the highest-scoring ones)."""
    return Insertions(mask=_cap(p.open & p.tokens.ne(eos), p.log_probs, room), tokens=p.tokens,
                      log_probs=p.log_probs)


def greedy_slot_step(p: SlotScores, room: Tensor, eos: int) -> Insertions:
    """Slot finalization: the one (slot, token) with the best log p(c, l) among the
    slots whose best token is not end-of-slot."""
    ok = p.open & p.tokens.ne(eos)  # (A, S)
    joint = (p.log_probs + p.location).masked_fill(~ok, float("-inf"))
    return Insertions(mask=_one_hot_argmax(joint) & ok.any(1, keepdim=True), tokens=p.tokens,
                      log_probs=p.log_probs)


def greedy_sequence_step(p: SlotScores, room: Tensor, eos: int) -> Insertions:
    """Sequence finalization: the best (slot, token) over every open slot and the
    whole vocabulary; stop when it is end-of-sequence."""
    A, S, V = p.content.shape
    flat = (p.content + p.location.unsqueeze(-1)).flatten(1).argmax(1)  # (A,) over (l, c)
    slot, tok = flat.div(V, rounding_mode="floor"), flat.remainder(V)
    ok = tok.ne(eos) & p.open.gather(1, slot.unsqueeze(1)).squeeze(1)  # (A,)
    mask = torch.zeros_like(p.open).scatter_(1, slot.unsqueeze(1), ok.unsqueeze(1))
    log_prob = p.content.flatten(1).gather(1, flat.unsqueeze(1))  # (A, 1)
    return Insertions(mask=mask, tokens=tok.unsqueeze(1).expand(A, S), log_probs=log_prob.expand(A, S))


Step = Callable[[SlotScores, Tensor, int], Insertions]


def choose_step(decoding: str, termination: str) -> Step:
    """The decoding rule: parallel, or greedy with the model's training termination."""
    if decoding == "parallel":
        return parallel_step
    return greedy_slot_step if termination == "slot" else greedy_sequence_step


def _cap(insert: Tensor, score: Tensor, room: Tensor) -> Tensor:
    """Keep at most ``room`` insertions per row, the highest-scoring ones; of equal scores, the leftmost
    slots (a stable sort, as the runtime's). (A, S)."""
    order = score.masked_fill(~insert, float("-inf")).argsort(dim=1, descending=True, stable=True)  # (A, S)
    rank = order.argsort(dim=1, stable=True)
    return insert & (rank < room.unsqueeze(1))


def _one_hot_argmax(x: Tensor) -> Tensor:
    return torch.zeros_like(x, dtype=torch.bool).scatter_(1, x.argmax(1, keepdim=True), True)


def _widen(x: Tensor, width: int, value) -> Tensor:
    if x.size(1) >= width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.size(1)), value=value)
