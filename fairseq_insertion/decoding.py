"""Insertion decoding: every option and its default (:class:`DecodingConfig`), the typed
state of the loop (:class:`Canvases`, :class:`SlotScores`, :class:`Insertions`) and the
step rules that choose a pass's insertions (paper: "Inference").

The command line (the ``insertion_translation`` task), the hub (keywords of
``translate``/``sample``/``generate``) and Python (:class:`~fairseq_insertion.generator.InsertionGenerator`)
all build one :class:`DecodingConfig`, so they decode the same way by default,
and each value is checked once, here, with an error naming the option.
No rule that makes some outputs impossible is on by default: the repetition
rules are asked for.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .canvas import InitialCanvas
from .precision import PRECISIONS

DECODINGS = ("parallel", "greedy")
CONSTRAINT_ORDERS = ("ordered", "unordered")

# fairseq's generation defaults (--max-len-a 0 --max-len-b 200) would let a model that never chooses
# end-of-slot insert up to 200 tokens; an insertion decode's length is tied to the source instead
# (Multi30k en-de, BPE: no training target exceeds 2 x source + 10)
FAIRSEQ_LENGTH_DEFAULTS = (0.0, 200)

# the command-line flag of each option (the hub and Python take the field name)
FLAGS = {
    "decoding": "--decoding", "eos_penalty": "--eos-penalty", "eos_penalties": "--eos-penalties",
    "max_len_a": "--max-len-a", "max_len_b": "--max-len-b", "max_iterations": "--max-iterations",
    "block_neighbour_copies": "--block-neighbour-copies", "no_repeat_ngram_size": "--no-repeat-ngram-size",
    "close_ended_slots": "--close-ended-slots", "constraint_order": "--constraints", "lenpen": "--lenpen",
    "retain_history": "--retain-iter-history", "precision": "--decode-precision", "rerank_with": "--rerank-with",
    "rerank_weight": "--rerank-weight", "unkpen": "--unkpen",
    "nbest": "--nbest", "beam": "--beam",  # fairseq's, checked by check_search_options
}


class DecodingError(ValueError):
    """A decoding option with a value that means nothing; the message names the option and the value."""

    def command_line(self) -> str:
        """The message as a command line says it: the flags without their hub keywords
        (``--max-len-b must be ...`` for ``--max-len-b (max_len_b=) must be ...``)."""
        return re.sub(r"(--[\w-]+) \(\w+=\)", r"\1", str(self))


@dataclass(frozen=True)
class DecodingConfig:
    """Every insertion decoding option, with its one default.

    decoding: ``parallel`` (every open slot whose best token is not end-of-slot
    receives it) or ``greedy`` (one insertion per step).
    eos_penalty: beta, subtracted from the end-of-slot/sequence log-probability.
    eos_penalties: several betas: every sentence is decoded under each in one
    batch and its candidates are returned best first (by the model's score or
    ``rerank_with``'s); empty: only ``eos_penalty``.
    max_len_a, max_len_b: a canvas never grows beyond ``max_len_a * source
    length + max_len_b`` tokens (nor the model's positions).
    max_iterations: a sentence stops after this many iterations (0: its length limit).
    block_neighbour_copies: a slot never inserts a copy of either neighbour.
    no_repeat_ngram_size: n >= 2: no insertion makes an n-gram of the canvas occur twice (0: off).
    close_ended_slots: a slot that chose end-of-slot stays closed (slot-finalization models).
    constraint_order: ``ordered`` (constraints kept in the given order) or
    ``unordered`` (placed in the order the unconstrained translation suggests).
    lenpen: hypothesis score = log-probability / (n + 1) ** lenpen (fairseq's ``--lenpen``).
    unkpen: subtracted from the unknown word's log-probability when choosing (fairseq's ``--unkpen``).
    retain_history: keep every intermediate canvas (``--retain-iter-history``).
    precision: ``fp32``, ``bf16`` or ``int8`` (CPU) for every model the decode uses.
    rerank_with: a fairseq transformer checkpoint that chooses among the candidates.
    rerank_weight: lambda: with ``rerank_with``, a candidate's score is the reranker's
    length-normalised log-probability + lambda x the model's own (normalised) score.
    """

    decoding: str = "parallel"
    eos_penalty: float = 0.0
    eos_penalties: Tuple[float, ...] = ()
    max_len_a: float = 2.0
    max_len_b: int = 10
    max_iterations: int = 0
    block_neighbour_copies: bool = False
    no_repeat_ngram_size: int = 0
    close_ended_slots: bool = False
    constraint_order: str = "ordered"
    lenpen: float = 1.0
    unkpen: float = 0.0
    retain_history: bool = False
    precision: str = "fp32"
    rerank_with: Optional[str] = None
    rerank_weight: float = 0.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "decoding", _choice(self, "decoding", DECODINGS))
        set_(self, "constraint_order", _choice(self, "constraint_order", CONSTRAINT_ORDERS))
        set_(self, "precision", _choice(self, "precision", PRECISIONS))
        set_(self, "eos_penalty", _number(self, "eos_penalty"))
        set_(self, "eos_penalties", _betas(self.eos_penalties))
        set_(self, "max_len_a", _number(self, "max_len_a", minimum=0.0))
        set_(self, "max_len_b", _integer(self, "max_len_b", minimum=0))
        set_(self, "max_iterations", _integer(self, "max_iterations", minimum=0))
        set_(self, "no_repeat_ngram_size", _integer(self, "no_repeat_ngram_size", minimum=0))
        set_(self, "lenpen", _number(self, "lenpen"))
        set_(self, "unkpen", _number(self, "unkpen"))
        set_(self, "rerank_weight", _number(self, "rerank_weight"))
        for name in ("block_neighbour_copies", "close_ended_slots", "retain_history"):
            set_(self, name, _flag(self, name))
        if self.no_repeat_ngram_size == 1:
            raise DecodingError(f"{_name('no_repeat_ngram_size')} must be 0 (off) or >= 2 (an n-gram of size 1 "
                                "would forbid every token already on the canvas), got 1")
        if self.rerank_with is not None:
            if not str(self.rerank_with).strip():
                raise DecodingError(f"{_name('rerank_with')} needs a checkpoint path, got {self.rerank_with!r}")
            if len(self.eos_penalties) < 2:
                raise DecodingError(f"{_name('rerank_with')} {self.rerank_with} chooses among candidates: give "
                                    f"several with {_name('eos_penalties')} (e.g. 0,1,2,3,4)")

    @property
    def betas(self) -> Tuple[float, ...]:
        """The EOS penalty of each candidate of a sentence (one when there are no candidates)."""
        return self.eos_penalties or (self.eos_penalty,)

    def replace(self, **changes: Any) -> "DecodingConfig":
        """A copy with ``changes`` (field names; an unknown one is an error naming it)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown insertion decoding option(s) {unknown}; the options are "
                            f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_options(cls, task_cfg: Any, gen_args: Any = None) -> "DecodingConfig":
        """The command line's (and the hub's) options: the ``insertion_translation`` task's
        fields and fairseq's generation options (``--max-len-a/b``, ``--no-repeat-ngram-size``,
        ``--lenpen``, ``--unkpen``, ``--constraints``, ``--retain-iter-history``). A generation option of the
        same name as a task field (a hub keyword, e.g. ``translate(s, eos_penalty=2)``) wins."""
        def get(name: str, default: Any = None) -> Any:
            value = getattr(gen_args, name, None) if gen_args is not None else None
            return value if value is not None else getattr(task_cfg, name, default)

        d = cls()
        max_len_a, max_len_b = get("max_len_a", d.max_len_a), get("max_len_b", d.max_len_b)
        if (_as_float(max_len_a), _as_float(max_len_b)) == FAIRSEQ_LENGTH_DEFAULTS:
            max_len_a, max_len_b = d.max_len_a, d.max_len_b
        return cls(
            decoding=str(get("decoding", d.decoding)),
            eos_penalty=get("eos_penalty", d.eos_penalty),
            eos_penalties=parse_betas(get("eos_penalties")),
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            max_iterations=get("max_iterations", d.max_iterations),
            block_neighbour_copies=get("block_neighbour_copies", d.block_neighbour_copies),
            no_repeat_ngram_size=get("no_repeat_ngram_size", d.no_repeat_ngram_size),
            close_ended_slots=get("close_ended_slots", d.close_ended_slots),
            constraint_order=str(get("constraints", None) or d.constraint_order),
            lenpen=get("lenpen", d.lenpen),
            unkpen=get("unkpen", d.unkpen),
            retain_history=get("retain_iter_history", d.retain_history),
            precision=str(get("decode_precision", d.precision)),
            rerank_with=get("rerank_with") or None,
            rerank_weight=get("rerank_weight", d.rerank_weight),
        )


def parse_betas(value: Any) -> Tuple[float, ...]:
    """``--eos-penalties 0,1,2`` (or a sequence of numbers): the betas; ``None`` or empty: none."""
    if value is None:
        return ()
    items = str(value).split(",") if isinstance(value, str) else list(value)
    if isinstance(value, str) and not value.strip():
        return ()
    try:
        return tuple(float(b) for b in items)
    except (TypeError, ValueError):
        raise DecodingError(f"{_name('eos_penalties')} takes comma-separated numbers, e.g. 0,1,2,3,4; "
                            f"got {value!r}") from None


def check_search_options(gen_args: Any) -> None:
    """fairseq's ``--nbest`` and ``--beam`` (hub: ``nbest=``, ``beam=``), read around the generator
    (how many hypotheses are printed; fairseq's search for an autoregressive model): integers >= 1."""
    for name in ("nbest", "beam"):
        if getattr(gen_args, name, None) is not None:
            _integer(gen_args, name, minimum=1)


def _name(field: str) -> str:
    return f"{FLAGS[field]} ({field}=)"


def _as_float(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _number(cfg: DecodingConfig, field: str, minimum: Optional[float] = None) -> float:
    value = getattr(cfg, field)
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x) or (minimum is not None and x < minimum):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise DecodingError(f"{_name(field)} must be a finite number{bound}, got {value!r}")
    return x


def _integer(cfg: Any, field: str, minimum: int) -> int:
    value = getattr(cfg, field)
    x = _as_float(value)
    if isinstance(value, bool) or not isinstance(x, float) or not math.isfinite(x) or x != int(x) or x < minimum:
        raise DecodingError(f"{_name(field)} must be an integer >= {minimum}, got {value!r}")
    return int(x)


def _flag(cfg: DecodingConfig, field: str) -> bool:
    value = getattr(cfg, field)
    if not isinstance(value, (bool, int)) or value not in (0, 1):
        raise DecodingError(f"{_name(field)} is true or false, got {value!r}")
    return bool(value)


def _choice(cfg: DecodingConfig, field: str, choices: Tuple[str, ...]) -> str:
    value = getattr(cfg, field)
    if str(value) not in choices:
        raise DecodingError(f"{_name(field)} must be one of {choices}, got {value!r}")
    return str(value)


def _betas(value: Any) -> Tuple[float, ...]:
    betas = parse_betas(value)
    if not all(math.isfinite(b) for b in betas):
        raise DecodingError(f"{_name('eos_penalties')} must be finite numbers, got {value!r}")
    return betas


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
    """Keep at most ``room`` insertions per row, the highest-scoring ones. (A, S)."""
    rank = score.masked_fill(~insert, float("-inf")).argsort(1, descending=True).argsort(1)
    return insert & (rank < room.unsqueeze(1))


def _one_hot_argmax(x: Tensor) -> Tensor:
    return torch.zeros_like(x, dtype=torch.bool).scatter_(1, x.argmax(1, keepdim=True), True)


def _widen(x: Tensor, width: int, value) -> Tensor:
    if x.size(1) >= width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.size(1)), value=value)
