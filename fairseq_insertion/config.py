"""Every insertion decoding option and its one default (:class:`DecodingConfig`), each value checked once, here,
with an error naming the option. The command line, the hub, Python and the deployment runtime all build one, so they
decode the same way by default (docs/design.md). Standard library only: the runtime uses it without torch."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Tuple

from .errors import InsertionError


class Precision(NamedTuple):
    """A precision a model decodes in, where it is offered and what depends on it."""

    name: str
    torch: bool = False  # a choice of --decode-precision
    exported: bool = False  # an export's model.precision
    scheme: Optional[str] = None  # export --int8's name for it
    unfused: Tuple[str, ...] = ()  # onnxruntime optimizations its sessions disable


# onnxruntime's fused SkipLayerNormalization (a residual Add with the LayerNormalization after it) runs slower in
# these graphs than the two nodes apart, with the same outputs; an export of onnxruntime's dynamic quantization keeps
# it: its rounding moves with the fusion, and it is exported and checked with it
_SKIP_LAYER_NORM = ("SkipLayerNormFusion",)
PRECISIONS = {p.name: p for p in (
    Precision("fp32", torch=True, exported=True, unfused=_SKIP_LAYER_NORM),
    Precision("bf16", torch=True),  # every floating-point parameter cast; scores and softmaxes stay fp32
    Precision("int8", torch=True),  # torch's dynamic quantization of every nn.Linear (CPU only)
    # each position's own activation scale: the outputs the same at every batch size
    Precision("int8-per-row", exported=True, scheme="per-row", unfused=_SKIP_LAYER_NORM),
    Precision("int8-dynamic", exported=True, scheme="dynamic"),  # one activation range over the whole batch
)}
INT8_SCHEMES = {p.scheme: p for p in PRECISIONS.values() if p.scheme}  # export --int8's choices


def offered(where: str) -> Tuple[str, ...]:
    """The names of the precisions offered ``where``: ``"torch"`` (``--decode-precision``) or ``"exported"``."""
    return tuple(name for name, p in PRECISIONS.items() if getattr(p, where))


# how a model was trained to end a sentence (slot or sequence finalization); greedy decoding stops the same way
TERMINATIONS = ("slot", "sequence")

DECODINGS = ("parallel", "greedy")
CONSTRAINT_ORDERS = ("ordered", "unordered")

# fairseq's generation defaults (--max-len-a 0 --max-len-b 200) would let a model that never chooses
# end-of-slot insert up to 200 tokens; an insertion decode's length is tied to the source instead
# (Multi30k en-de, BPE: no training target exceeds 2 x source + 10)
FAIRSEQ_LENGTH_DEFAULTS = (0.0, 200)
LENGTH_DEFAULTS = (2.0, 10)  # max_len_a, max_len_b

RUNTIME = "runtime"  # an option of a single decode: the deployment runtime (fairseq_insertion.runtime) takes it
INSERTION = "insertion"  # an option fairseq's own generator (an autoregressive model through the task) does not read
TASK = "task"  # a flag of the insertion_translation task; the others are fairseq's own generation options


Check = Callable[[Any, str], Any]  # (the config, a field's name) -> its value normalised, or DecodingError


def _option(default: Any, flag: str, *scopes: str, help: str = "", choices: Tuple[str, ...] = (),
            check: Optional[Check] = None, arg: Optional[str] = None, read: Callable[[Any], Any] = lambda v: v) -> Any:
    """A field of :class:`DecodingConfig` with its flag, scopes, help, ``check`` (``choices`` alone: one of them), its
    name in fairseq's parsed options (``arg``) and how :meth:`~DecodingConfig.from_options` reads it (``read``)."""
    if check is None and choices:
        check = functools.partial(_choice, choices=choices)
    return dataclasses.field(default=default, metadata={"flag": flag, "scopes": scopes, "help": help,
                                                        "choices": choices, "check": check, "arg": arg,
                                                        "read": read})


def _name(field: str) -> str:
    return f"{FLAGS[field]} ({field}=)"


def _as_float(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _number(cfg: Any, field: str, minimum: Optional[float] = None) -> float:
    value = getattr(cfg, field)
    x = _as_float(value)
    if (isinstance(value, bool) or not isinstance(x, float) or not math.isfinite(x)
            or (minimum is not None and x < minimum)):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise DecodingError(f"{_name(field)} must be a finite number{bound}, got {value!r}")
    return x


def _integer(cfg: Any, field: str, minimum: int) -> int:
    value = getattr(cfg, field)
    x = _as_float(value)
    if isinstance(value, bool) or not isinstance(x, float) or not math.isfinite(x) or x != int(x) or x < minimum:
        raise DecodingError(f"{_name(field)} must be an integer >= {minimum}, got {value!r}")
    return int(x)


def _flag(cfg: Any, field: str) -> bool:
    value = getattr(cfg, field)
    if not isinstance(value, (bool, int)) or value not in (0, 1):
        raise DecodingError(f"{_name(field)} is true or false, got {value!r}")
    return bool(value)


def _choice(cfg: Any, field: str, choices: Tuple[str, ...]) -> str:
    value = getattr(cfg, field)
    if str(value) not in choices:
        raise DecodingError(f"{_name(field)} must be one of {choices}, got {value!r}")
    return str(value)


def _betas(cfg: Any, field: str) -> Tuple[float, ...]:
    value = getattr(cfg, field)
    betas = parse_betas(value)
    if not all(math.isfinite(b) for b in betas):
        raise DecodingError(f"{_name(field)} must be finite numbers, got {value!r}")
    return betas


def _path(value: Any) -> Any:
    """A path option as fairseq's parsed options hold it: unset (None or empty) is None."""
    return value or None


_at_least_0, _at_least_1 = functools.partial(_integer, minimum=0), functools.partial(_integer, minimum=1)


class DecodingError(InsertionError):
    """A decoding option with a value that means nothing; the message names the option and the value."""

    def command_line(self) -> str:
        """The message with the flags alone (``--max-len-b must be ...``)."""
        return re.sub(r"(--[\w-]+) \(\w+=\)", r"\1", str(self))

    def keyed(self, prefix: str = "") -> str:
        """The message with each option by its field name after ``prefix`` (``decoding.max_len_b must be ...``)."""
        return re.sub(r"--[\w-]+ \((\w+)=\)", lambda m: prefix + m.group(1), str(self))


def parse_betas(value: Any) -> Tuple[float, ...]:
    """``--eos-penalties 0,1,2`` (or a sequence of numbers): the betas; ``None`` or empty: none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(float(b) for b in items)
    except (TypeError, ValueError):
        raise DecodingError(f"{_name('eos_penalties')} takes comma-separated numbers, e.g. 0,1,2,3,4; "
                            f"got {value!r}") from None


@dataclass(frozen=True)
class DecodingConfig:
    """Every insertion decoding option, with its one default; a field with ``help`` is the task's own flag, the
    others fairseq's (max_len_a/b, no_repeat_ngram_size, constraints, lenpen, unkpen, ...): docs/decoding.md."""

    decoding: str = _option(
        "parallel", "--decoding", RUNTIME, INSERTION, TASK, choices=DECODINGS,
        help="parallel: insert into every slot whose argmax is not end-of-slot; greedy: one insertion per step "
        "(paper: Inference)")
    eos_penalty: float = _option(
        0.0, "--eos-penalty", RUNTIME, INSERTION, TASK, check=_number,
        help="beta, subtracted from the end-of-slot/sequence log-probability when decoding (choose it on valid: "
        "the best beta depends on the model)")
    eos_penalties: Tuple[float, ...] = _option(
        (), "--eos-penalties", RUNTIME, INSERTION, TASK, check=_betas, read=parse_betas,
        help="comma-separated betas, e.g. 0,1,2,3,4: decode every sentence under each in one batch and output "
        "its candidates best first (--nbest k prints k), by the model's length-normalised score or "
        "--rerank-with's; replaces --eos-penalty")
    first_insertions: int = _option(
        1, "--first-insertions", RUNTIME, INSERTION, TASK, check=_at_least_1,
        help="K > 1: also decode every sentence from each of its K best first insertions (the empty canvas's "
        "best tokens, end and unk excluded): K x the --eos-penalties candidates, in one batch, chosen among "
        "as --eos-penalties' (unconstrained decoding only)")
    max_len_a: float = _option(LENGTH_DEFAULTS[0], "--max-len-a", RUNTIME,
                               check=functools.partial(_number, minimum=0.0))
    max_len_b: int = _option(LENGTH_DEFAULTS[1], "--max-len-b", RUNTIME, check=_at_least_0)
    max_iterations: int = _option(
        0, "--max-iterations", RUNTIME, INSERTION, TASK, check=_at_least_0,
        help="stop a sentence after this many insertion iterations (0: its length limit, min(max_len_a * "
        "src_len + max_len_b, max target positions - 2); fairseq's defaults 0 and 200 become "
        f"{LENGTH_DEFAULTS[0]:g} x src_len + {LENGTH_DEFAULTS[1]})")
    block_neighbour_copies: bool = _option(
        False, "--block-neighbour-copies", RUNTIME, INSERTION, TASK, check=_flag,
        help="a slot never inserts a copy of either neighbour token (parallel decoding of an undertrained model "
        "otherwise grows runs like 'vor vor vor ...'); fairseq's --no-repeat-ngram-size N adds an n-gram rule. "
        "Both off by default: some outputs legitimately repeat a token")
    no_repeat_ngram_size: int = _option(0, "--no-repeat-ngram-size", RUNTIME, check=_at_least_0)
    close_ended_slots: bool = _option(
        False, "--close-ended-slots", RUNTIME, INSERTION, TASK, check=_flag,
        help="a slot whose best token is end-of-slot stays closed for the rest of the decode, so later passes "
        "score only the open slots (models trained with slot finalization; can change the output)")
    max_per_pass: int = _option(
        0, "--max-per-pass", RUNTIME, INSERTION, TASK, check=_at_least_0,
        help="parallel decoding inserts at most this many tokens a pass into each sentence, its highest-scoring "
        "slots (0: no cap): between parallel (every slot) and greedy (one) in passes and quality")
    no_unk: bool = _option(
        False, "--no-unk", RUNTIME, INSERTION, TASK, check=_flag,
        help="never insert the unknown word <unk> (a slot takes its next best token); unlike --unkpen, the export "
        "and the runtime carry it")
    constraint_order: str = _option("ordered", "--constraints", RUNTIME, choices=CONSTRAINT_ORDERS, arg="constraints")
    lenpen: float = _option(1.0, "--lenpen", RUNTIME, check=_number)
    unkpen: float = _option(0.0, "--unkpen", check=_number)
    retain_history: bool = _option(False, "--retain-iter-history", check=_flag, arg="retain_iter_history")
    precision: str = _option(
        "fp32", "--decode-precision", TASK, choices=offered("torch"), arg="decode_precision",
        help="convert the models for decoding: bf16 (bfloat16 weights and activations; CPUs with "
        "AVX512-BF16/AMX, GPUs with bf16), int8 (CPU: dynamic quantization of the linear layers); the same "
        "conversion applies to --rerank-with's model and to an autoregressive transformer decoded through this "
        "task (fairseq's beam search), so speeds compare like with like")
    rerank_with: Optional[str] = _option(
        None, "--rerank-with", INSERTION, TASK, read=_path,
        help="a fairseq transformer checkpoint trained on the same dictionaries (e.g. the distillation teacher): "
        "choose among the --eos-penalties candidates by its length-normalised log p(y | x), one teacher-forced "
        "batch per batch of sentences")
    rerank_weight: float = _option(
        0.0, "--rerank-weight", RUNTIME, TASK, check=_number,
        help="lambda: with --rerank-with, a candidate's score is the reranker's length-normalised log-probability "
        "+ lambda x the insertion model's own score (choose it on valid)")
    shortlist: Optional[str] = _option(
        None, "--shortlist", INSERTION, TASK, read=_path,
        help="a lexical shortlist table (python -m fairseq_insertion.shortlist): each sentence's slots choose among "
        "the table's frequent target words, its source words' translations, the specials and its constraints' "
        "tokens only, normalised over that list; the runtime takes it from the export (export --shortlist)")

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        for f in dataclasses.fields(self):
            if f.metadata["check"] is not None:
                set_(self, f.name, f.metadata["check"](self, f.name))
        if self.no_repeat_ngram_size == 1:
            raise DecodingError(f"{_name('no_repeat_ngram_size')} must be 0 (off) or >= 2 (an n-gram of size 1 "
                                "would forbid every token already on the canvas), got 1")
        if self.shortlist is not None and not str(self.shortlist).strip():
            raise DecodingError(f"{_name('shortlist')} needs a table's path, got {self.shortlist!r}")
        if self.rerank_with is not None:
            if not str(self.rerank_with).strip():
                raise DecodingError(f"{_name('rerank_with')} needs a checkpoint path, got {self.rerank_with!r}")
            if self.candidates < 2:
                raise DecodingError(f"{_name('rerank_with')} {self.rerank_with} chooses among candidates: give "
                                    f"several with {_name('eos_penalties')} (e.g. 0,1,2,3,4) or "
                                    f"{_name('first_insertions')}")

    @property
    def betas(self) -> Tuple[float, ...]:
        """The EOS penalty of each candidate of a sentence (one when there are no candidates)."""
        return self.eos_penalties or (self.eos_penalty,)

    @property
    def candidates(self) -> int:
        """How many candidates each sentence's decode makes: first insertions x EOS penalties."""
        return self.first_insertions * len(self.betas)

    def replace(self, **changes: Any) -> "DecodingConfig":
        """A copy with ``changes`` (field names; an unknown one is an error naming it)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown insertion decoding option(s) {unknown}; the options are "
                            f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_options(cls, task_cfg: Any, gen_args: Any = None) -> "DecodingConfig":
        """The task's fields and fairseq's generation options; a generation option of the same name as a task field
        (a hub keyword, e.g. ``translate(s, eos_penalty=2)``) wins."""
        def get(name: str, default: Any = None) -> Any:
            value = getattr(gen_args, name, None) if gen_args is not None else None
            return value if value is not None else getattr(task_cfg, name, default)

        d = cls()
        values = {f.name: f.metadata["read"](get(f.metadata["arg"] or f.name, getattr(d, f.name)))
                  for f in dataclasses.fields(cls)}
        if (_as_float(values["max_len_a"]), _as_float(values["max_len_b"])) == FAIRSEQ_LENGTH_DEFAULTS:
            values.update(max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        return cls(**values)


_FIELDS = dataclasses.fields(DecodingConfig)
# the options a call of the deployment runtime takes (candidates and the rerank weight among them); the scorer and
# the shortlist are files of the export, constraints an argument of the call, precision the export's
RUNTIME_OPTIONS = tuple(f.name for f in _FIELDS if RUNTIME in f.metadata["scopes"])
# the options fairseq's own generator does not read
INSERTION_ONLY = tuple(f.name for f in _FIELDS if INSERTION in f.metadata["scopes"])
# the options the insertion_translation task adds to fairseq's command lines (its config's fields)
TASK_OPTIONS = tuple(f.name for f in _FIELDS if TASK in f.metadata["scopes"])
# the command-line flag of each option, and of fairseq's two that check_search_options checks
FLAGS = {**{f.name: f.metadata["flag"] for f in _FIELDS}, "nbest": "--nbest", "beam": "--beam"}


def add_runtime_arguments(group: Any) -> None:
    """``RUNTIME_OPTIONS`` as flags on an argparse parser or group, None when not given (on/off: also ``--no-``)."""
    defaults = DecodingConfig()
    for name in RUNTIME_OPTIONS:
        if name == "constraint_order":  # the order of the constraints a command reads: its own --constraints
            continue
        default = getattr(defaults, name)
        if isinstance(default, bool):
            group.add_argument(FLAGS[name], dest=name, action=argparse.BooleanOptionalAction, default=None)
        elif isinstance(default, tuple):
            group.add_argument(FLAGS[name], dest=name, type=parse_betas, default=None, metavar="B,B,...")
        else:
            group.add_argument(FLAGS[name], dest=name, type=type(default), default=None, metavar=name.upper())


def check_search_options(gen_args: Any) -> None:
    """fairseq's ``--nbest`` and ``--beam`` (hub: ``nbest=``, ``beam=``): integers >= 1."""
    for name in ("nbest", "beam"):
        if getattr(gen_args, name, None) is not None:
            _integer(gen_args, name, minimum=1)
