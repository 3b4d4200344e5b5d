"""What the benchmark compares: the training runs and the decoded systems, as tables.

A *training run* is one ``fairseq-train`` (model, data, flags); a *system* is one way of
decoding a run (decoding flags, and whether its EOS penalty is chosen on valid). Every run
exists twice, on the raw and on the teacher-distilled data (name suffix ``_distilled``).
Change a comparison here; nothing else in the benchmark names a system.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DISTILLED = "_distilled"
TEACHER_RUN = "ar"  # the training run whose checkpoint is the distillation teacher


@dataclass(frozen=True)
class Training:
    """One training run: ``model`` is recipe.train's ``model`` (insertion, transformer,
    fairseq_nat), ``options`` its keyword arguments (order, termination), ``flags`` further
    fairseq-train arguments."""

    name: str
    model: str
    distilled: bool
    options: Mapping[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    warm_start: bool = False  # --init-from-transformer from the teacher


@dataclass(frozen=True)
class System:
    """One decoded system: ``decoding`` holds recipe.decode's keyword arguments (decoding, beam)."""

    name: str
    training: str
    decoding: Mapping[str, object] = field(default_factory=dict)
    sweep_eos: bool = False  # EOS penalty chosen on valid (insertion and NAT systems)
    time_batch1: bool = True  # the --extras are there for their BLEU: timed at batch 128 only
    rerank: bool = False  # choose among the candidates (decoding["eos_penalties"]) with the teacher

    @property
    def data(self) -> str:
        return "distilled" if DISTILLED in self.name else "raw"


# training run: model, recipe.train keyword arguments
_RUNS: tuple[tuple[str, str, dict], ...] = (
    ("ar", "transformer", {}),
    ("nat", "fairseq_nat", {}),
    ("binary_tree", "insertion", {"order": "binary_tree"}),
    ("uniform", "insertion", {"order": "uniform"}),
    # the paper trains left-to-right with sequence finalization (end-of-sequence in the last slot)
    ("left_to_right", "insertion", {"order": "left_to_right", "termination": "sequence"}),
)

# system: training run, decoding keyword arguments, EOS penalty swept on valid
_SYSTEMS: tuple[tuple[str, str, dict, bool], ...] = (
    ("ar_greedy", "ar", {"beam": 1}, False),
    ("ar_beam5", "ar", {"beam": 5}, False),
    ("fairseq_nat_insertion", "nat", {}, True),
    ("insertion_binary_tree_parallel", "binary_tree", {"decoding": "parallel"}, True),
    ("insertion_binary_tree_greedy", "binary_tree", {"decoding": "greedy"}, True),
    ("insertion_uniform_parallel", "uniform", {"decoding": "parallel"}, True),
    ("insertion_left_to_right_greedy", "left_to_right", {"decoding": "greedy"}, True),
)

TRAININGS: dict[str, Training] = {
    name + suffix: Training(name + suffix, model, bool(suffix), options)
    for suffix in ("", DISTILLED) for name, model, options in _RUNS
}
SYSTEMS: dict[str, System] = {
    name + suffix: System(name + suffix, run + suffix, decoding, swept)
    for suffix in ("", DISTILLED) for name, run, decoding, swept in _SYSTEMS
}

# --extras: a warm start from the teacher, two canvases per sentence, candidates and reranking
CANDIDATE_BETAS = (0.0, 1.0, 2.0, 3.0, 4.0)
EXTRA_TRAININGS: dict[str, Training] = {
    "binary_tree_distilled_warm_start": Training(
        "binary_tree_distilled_warm_start", "insertion", True, {"order": "binary_tree"}, warm_start=True),
    "binary_tree_distilled_k2": Training(
        "binary_tree_distilled_k2", "insertion", True, {"order": "binary_tree"}, ("--canvases-per-sentence", "2")),
}
EXTRA_SYSTEMS: dict[str, System] = {
    "insertion_binary_tree_parallel_distilled_warm_start": System(
        "insertion_binary_tree_parallel_distilled_warm_start", "binary_tree_distilled_warm_start",
        {"decoding": "parallel"}, True, time_batch1=False),
    "insertion_binary_tree_parallel_distilled_k2": System(
        "insertion_binary_tree_parallel_distilled_k2", "binary_tree_distilled_k2",
        {"decoding": "parallel"}, True, time_batch1=False),
    # candidate decoding: every sentence under EOS penalties 0-4 in one batch, the model's own best
    # (length-normalised score) or the teacher's (rerank); no sweep: the candidates replace it
    "insertion_binary_tree_parallel_distilled_candidates": System(
        "insertion_binary_tree_parallel_distilled_candidates", "binary_tree_distilled",
        {"decoding": "parallel", "eos_penalties": CANDIDATE_BETAS}),
    "insertion_binary_tree_parallel_distilled_rerank": System(
        "insertion_binary_tree_parallel_distilled_rerank", "binary_tree_distilled",
        {"decoding": "parallel", "eos_penalties": CANDIDATE_BETAS}, rerank=True),
}


def select(names: list[str] | None, extras: bool,
           train_teacher: bool = True) -> tuple[dict[str, System], dict[str, Training]]:
    """The systems to run (all, or ``names``) and every training they need, in table order:
    with ``train_teacher``, the teacher's too when a distilled run or a warm start needs it.
    Raises ``ValueError`` naming the unknown systems."""
    systems = {**SYSTEMS, **(EXTRA_SYSTEMS if extras else {})}
    trainings = {**TRAININGS, **(EXTRA_TRAININGS if extras else {})}
    if names:
        unknown = sorted(set(names) - systems.keys())
        if unknown:
            raise ValueError(f"unknown systems {unknown}; choose from {sorted(systems)}")
        systems = {k: v for k, v in systems.items() if k in names}
    needed = {s.training for s in systems.values()}
    if train_teacher and (any(trainings[t].distilled or trainings[t].warm_start for t in needed)
                          or any(s.rerank for s in systems.values())):
        needed.add(TEACHER_RUN)
    return systems, {k: v for k, v in trainings.items() if k in needed}


def table_position(name: str) -> int:
    """Where a system's row stands in results.json: table order, unknown names last."""
    names = [*SYSTEMS, *EXTRA_SYSTEMS]
    return names.index(name) if name in names else len(names)


def timing_order(systems: Mapping[str, System]) -> list[System]:
    """Distilled systems first: their timings are the ones the targets compare."""
    return sorted(systems.values(), key=lambda s: s.data != "distilled")
