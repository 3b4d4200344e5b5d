"""Benchmark: the plugin side by side with fairseq's Transformer and its NAT insertion model.

From the repository root:

    python -m benchmarks.run --out OUT --raw-dir RAW                   # full mode
    python -m benchmarks.run --out OUT --raw-dir RAW --quick           # a tiny model: proves the pipeline
    python -m benchmarks.run --out OUT --render                        # ratios, targets and table from the JSON
    python -m benchmarks.run --out OUT --teacher AR.pt --distilled DISTILLED_BIN   # reuse a teacher + its data

Every system is trained and decoded on the same prepared Multi30k en->de data, at the same size and
for the same updates, raw and teacher-distilled. The phases run in order (trainings on the raw data,
the distillation, trainings on the distilled data, EOS sweeps on valid: ``--jobs`` steps at a time;
then the timed decodes, one at a time); each step writes its output file in OUT and a step whose file
is there is not run again. Writes ``OUT/results.json``, ``OUT/results.md`` and ``OUT/iterations.png``
(``benchmarks/README.md`` says what they hold).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fnmatch
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from examples.commands import REPO, Size, default_device, fairseq_cli, train_command
from examples.generate_output import detokenized, read_generate_output, read_reference
from examples.multi30k import recipe as R
from examples.multi30k.prepare import prepare
from examples.steps import choose_eos_penalty, plot_iterations, run_info

from .checks import CheckError, check_distilled, check_teacher
from .prestart import Prestarted

# ---------------------------------------------------------------- what is compared
# training run: model, recipe.train keyword arguments, further fairseq-train flags, warm start from the teacher
RUNS: dict[str, tuple[str, dict, tuple[str, ...], bool]] = {
    "ar": ("transformer", {}, (), False),
    "nat": ("fairseq_nat", {}, (), False),
    "binary_tree": ("insertion", {"order": "binary_tree"}, (), False),
    "uniform": ("insertion", {"order": "uniform"}, (), False),
    # the paper trains left-to-right with sequence finalization (end-of-sequence in the last slot)
    "left_to_right": ("insertion", {"order": "left_to_right", "termination": "sequence"}, (), False),
}
# system: training run, decoding keyword arguments, EOS penalty swept on valid
SYSTEMS: dict[str, tuple[str, dict, bool]] = {
    "ar_greedy": ("ar", {"beam": 1}, False),
    "ar_beam5": ("ar", {"beam": 5}, False),
    "fairseq_nat_insertion": ("nat", {}, True),
    "insertion_binary_tree_parallel": ("binary_tree", {"decoding": "parallel"}, True),
    "insertion_binary_tree_greedy": ("binary_tree", {"decoding": "greedy"}, True),
    "insertion_uniform_parallel": ("uniform", {"decoding": "parallel"}, True),
    "insertion_left_to_right_greedy": ("left_to_right", {"decoding": "greedy"}, True),
}
# --extras (timed at batch 128 only): a warm start from the teacher, two canvases per sentence, and the
# candidates (EOS penalties 0-4 in one batch) chosen by the model's own score or by the teacher (rerank)
EXTRA_RUNS = {"binary_tree_distilled_warm_start": ("insertion", {"order": "binary_tree"}, (), True),
              "binary_tree_distilled_k2": ("insertion", {"order": "binary_tree"}, ("--canvases-per-sentence", "2"),
                                           False)}
CANDIDATES = {"decoding": "parallel", "eos_penalties": (0.0, 1.0, 2.0, 3.0, 4.0)}
EXTRA_SYSTEMS = {
    "insertion_binary_tree_parallel_distilled_warm_start": (
        "binary_tree_distilled_warm_start", {"decoding": "parallel"}, True),
    "insertion_binary_tree_parallel_distilled_k2": ("binary_tree_distilled_k2", {"decoding": "parallel"}, True),
    "insertion_binary_tree_parallel_distilled_candidates": ("binary_tree_distilled", CANDIDATES, False),
    "insertion_binary_tree_parallel_distilled_rerank": ("binary_tree_distilled", CANDIDATES, False),
}
# --peers: fairseq's other non-autoregressive models, on the distilled data (timed at batch 1 and 128):
# mask-predict (CMLM) at 1, 4 and 10 iterations and with 3 length candidates, the Levenshtein Transformer
PEER_RUNS = {"cmlm_distilled": ("fairseq_cmlm", {}, (), False),
             "levenshtein_distilled": ("fairseq_levenshtein", {}, (), False)}
PEER_SYSTEMS = {
    **{f"fairseq_cmlm_{t}_distilled": ("cmlm_distilled", {"iterations": t}, False) for t in (1, 4, 10)},
    "fairseq_cmlm_10_beam3_distilled": ("cmlm_distilled", {"iterations": 10, "length_beam": 3}, False),
    "fairseq_levenshtein_distilled": ("levenshtein_distilled", {"iterations": 10}, False),
}
# --peers-table: the default-size table beside fairseq's other non-autoregressive models on a teacher kit
# (--teacher, --distilled, --warm-model), each cold model trained with the same flags (the teacher's budget and
# schedule: --updates, --warmup, --dropout, --clip-norm): the kit's teacher (greedy, beam 5) and warm-started
# insertion model decoded as they are, the teacher's recipe trained again for its training speed, and on a GPU
# the plugin trained and decoded with --fp16
GIVEN_RUNS = {"teacher": ("transformer", {}, (), False), "warm_model": ("insertion", {}, (), False)}  # not trained
TABLE_RUNS = {"teacher_recipe": ("transformer", {}, (), False),
              "binary_tree_fp16_distilled": ("insertion", {"order": "binary_tree"}, ("--fp16",), False)}
TABLE_SYSTEMS = {
    "teacher_greedy": ("teacher", {"beam": 1}, False),
    "teacher_beam5": ("teacher", {"beam": 5}, False),
    "insertion_binary_tree_parallel_fp16_distilled": (
        "binary_tree_fp16_distilled", {"decoding": "parallel", "extra": ("--fp16",)}, True),
    "insertion_warm_parallel_distilled": ("warm_model", {"decoding": "parallel"}, True),
}
# the table's rows in order; the timed decodes run in DECODE_ORDER (the baseline first, then by what the table
# needs most), so that a run cut short by --deadline leaves the most useful rows
PEERS_TABLE = ["teacher_greedy", "teacher_beam5", *PEER_SYSTEMS, "fairseq_nat_insertion_distilled",
               "insertion_binary_tree_parallel_distilled", "insertion_binary_tree_parallel_fp16_distilled",
               "insertion_warm_parallel_distilled"]
DECODE_ORDER = ["teacher_greedy", "insertion_warm_parallel_distilled", "insertion_binary_tree_parallel_distilled",
                "fairseq_cmlm_10_distilled", "fairseq_levenshtein_distilled", "fairseq_nat_insertion_distilled",
                "fairseq_cmlm_4_distilled", "fairseq_cmlm_1_distilled", "fairseq_cmlm_10_beam3_distilled",
                "teacher_beam5", "insertion_binary_tree_parallel_fp16_distilled"]
ALL_RUNS = {**{n + s: v for s in ("", "_distilled") for n, v in RUNS.items()}, **EXTRA_RUNS, **PEER_RUNS,
            **GIVEN_RUNS, **TABLE_RUNS}
ALL_SYSTEMS: dict[str, tuple[str, dict, bool]] = {
    **{n + s: (r + s, d, w) for s in ("", "_distilled") for n, (r, d, w) in SYSTEMS.items()},
    **EXTRA_SYSTEMS, **PEER_SYSTEMS, **TABLE_SYSTEMS}


def on_distilled(run: str) -> bool:
    return run.endswith("_distilled") or run in EXTRA_RUNS or run == "warm_model"


# target: metric, compute (ratio a / b, inverse_ratio b / a, difference a - b), a and b as (system, row key)
# (a system with '*' is the best-by-key row of the systems it matches), goal (a number, {device: number},
# None: reported), direction, note
TARGETS = [
    ("training target tokens/s, plugin / AR transformer", "ratio",
     ("insertion_binary_tree_parallel", "train_target_tokens_per_s"), ("ar_greedy", "train_target_tokens_per_s"),
     None, "", ""),
    ("training target tokens/s, plugin / fairseq built-in insertion_transformer", "ratio",
     ("insertion_binary_tree_parallel", "train_target_tokens_per_s"),
     ("fairseq_nat_insertion", "train_target_tokens_per_s"), None, "", ""),
    ("decode time at batch 1, plugin parallel / AR greedy (distilled)", "ratio",
     ("insertion_binary_tree_parallel_distilled", "decode_seconds_batch1"),
     ("ar_greedy_distilled", "decode_seconds_batch1"), {"cpu": 0.5, "cuda": 0.35}, "<=", ""),
    ("decode throughput at batch 128, plugin parallel / AR greedy (distilled)", "inverse_ratio",
     ("insertion_binary_tree_parallel_distilled", "decode_seconds_batch128"),
     ("ar_greedy_distilled", "decode_seconds_batch128"), {"cpu": 1.0, "cuda": 2.0}, ">=", ""),
    ("decode throughput at batch 128, plugin parallel / fairseq built-in insertion_transformer (distilled)",
     "inverse_ratio", ("insertion_binary_tree_parallel_distilled", "decode_seconds_batch128"),
     ("fairseq_nat_insertion_distilled", "decode_seconds_batch128"), 1.5, ">=", ""),
    ("test BLEU, best plugin parallel system ({a}) / AR greedy", "ratio", ("insertion_*parallel*", "bleu"),
     ("ar_greedy", "bleu"), 0.8, ">=", ""),
    ("test BLEU, best reranked plugin system ({a}) / AR greedy", "ratio", ("insertion_*rerank*", "bleu"),
     ("ar_greedy", "bleu"), 0.95, ">=", ""),
    ("mean parallel iterations - mean floor(log2 n)+1 (binary tree, distilled)", "difference",
     ("insertion_binary_tree_parallel_distilled", "mean_iterations"),
     ("insertion_binary_tree_parallel_distilled", "mean_log2_bound"), 1.0, "<=", ""),
    ("test BLEU, warm start from the teacher / cold start (binary tree parallel, distilled, same updates)", "ratio",
     ("insertion_binary_tree_parallel_distilled_warm_start", "bleu"),
     ("insertion_binary_tree_parallel_distilled", "bleu"), None, "", "--extras"),
]
# --deadline: a step of these kinds starts only with this many seconds left; a training only with MIN_TRAIN_S
# left in --train-box, and fairseq's --stop-time-hours leaves TRAIN_START_S for its start-up (its clock starts
# once the model and data are loaded)
MIN_LEFT_S = {"sweep": 30.0, "test128": 20.0, "test1": 20.0, "baseline128": 20.0, "baseline1": 20.0}
MIN_TRAIN_S, TRAIN_START_S = 60.0, 30.0
# flag: (full mode, --quick) default
DEFAULTS = {"layers": (3, 2), "dim": (256, 64), "heads": (4, 4), "ffn": (1024, 256), "updates": (1800, 30),
            "max_tokens": (4096, 1024), "betas": ([float(b) for b in range(8)], [0.0]), "max_len_a": (1.2, 0.0),
            "max_len_b": (10, 20), "bpe_merges": (8000, 1000), "train_lines": (None, 2000),
            "test_lines": (None, 48), "batch1_sentences": (None, 16)}


@dataclass(frozen=True)
class Setup:
    """The run's settings, fixed once the arguments are read."""

    out: Path
    data: Path
    device: str
    size: Size
    updates: int
    max_tokens: int
    betas: tuple[float, ...]
    max_len_a: float
    max_len_b: int
    batch1: int  # batch-1 timing on the first ``batch1`` test sentences
    tau: float = 1.0
    jobs: int = 1
    repeat: int = 1
    teacher: Path | None = None  # --teacher instead of OUT/ar's
    distilled: Path | None = None  # --distilled instead of OUT/data-bin-distilled
    warm_model: Path | None = None  # --warm-model: a trained insertion model, decoded as it is
    schedule: tuple[tuple[str, float | None], ...] = ()  # train_command keywords (warmup, dropout, clip_norm)
    deadline: float | None = None  # time.time() after which no step starts (--deadline)
    train_until: float | None = None  # time.time() by which trainings stop (--train-box)
    prestart: bool = False  # timed decodes in processes started ahead (benchmarks/prestart.py)

    @property
    def teacher_checkpoint(self) -> Path:
        return self.teacher or self.out / "ar" / "checkpoint_last.pt"

    def checkpoint(self, run: str) -> Path:
        """The checkpoint a run's systems decode: the given one, or the training's last."""
        given = {"teacher": self.teacher, "warm_model": self.warm_model}
        if run in given:
            if given[run] is None:
                raise ValueError(f"--{run.replace('_', '-')} is needed for the systems of {run!r}")
            return given[run]
        return self.out / run / "checkpoint_last.pt"

    @property
    def distilled_bin(self) -> Path:
        return self.distilled or self.out / "data-bin-distilled"

    def decode_args(self) -> dict:
        return {"max_len_a": self.max_len_a, "max_len_b": self.max_len_b, "device": self.device}


# ------------------------------------------------------------------------- steps
Step = tuple[str, Path, Callable[[], dict], tuple[str, ...]]  # name, output file, the step, the steps it needs


def cached(path: Path, step: Callable[[], dict]) -> dict:
    """A finished step's output file: read when present, else ``step()`` written to it."""
    if path.is_file():
        return json.loads(path.read_text())
    result = step()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def train(setup: Setup, name: str) -> dict:
    model, options, flags, warm = ALL_RUNS[name]
    save = setup.out / name
    for stale in save.glob("checkpoint*.pt"):  # fairseq would resume from an unfinished run's checkpoint
        stale.unlink()
    options = {**options, **({"tau": setup.tau} if options.get("order") == "binary_tree" else {}),
               **dict(setup.schedule)}
    extra = [*flags, *(["--init-from-transformer", str(setup.teacher_checkpoint)] if warm else [])]
    if setup.train_until is not None:  # fairseq stops (and saves) once its training time passes the box
        extra += ["--stop-time-hours", f"{max(setup.train_until - time.time() - TRAIN_START_S, 1.0) / 3600:.6f}"]
    data = setup.distilled_bin if on_distilled(name) else R.data_bin(setup.data)
    result = R.train(data, save, model=model, size=setup.size, updates=setup.updates, device=setup.device,
                     max_tokens=setup.max_tokens, extra=extra, **options)
    return {**result, "finished": result.get("train_updates") == setup.updates,
            "machine": run_info(setup.device)["machine"]}


def sweep(setup: Setup, system: str) -> dict:
    run, decoding, _ = ALL_SYSTEMS[system]

    def bleu(beta: float) -> float:
        out = setup.out / "decode" / system / f"valid.beta{beta:g}.out"
        return R.decode(setup.data, setup.checkpoint(run), ALL_RUNS[run][0], out, subset="valid",
                        eos_penalty=beta, batch_size=128, **setup.decode_args(), **decoding)["bleu"]

    best, by_beta = choose_eos_penalty(setup.betas, bleu)
    return {"eos_penalty": best, "valid_bleu_by_eos_penalty": by_beta}


def timed_decode(setup: Setup, system: str, batch: int, beta: float, out: Path | None = None,
                 launcher: Callable[..., int] | None = None, sitting: dict | None = None) -> dict:
    """The test set at ``batch`` (its first ``setup.batch1`` sentences at batch 1), ``setup.repeat``
    times: BLEU and iterations, and the median of fairseq's generation seconds. ``sitting``: the machine
    and the teacher's greedy times of this sitting, recorded with the result."""
    run, decoding, _ = ALL_SYSTEMS[system]
    model = ALL_RUNS[run][0]
    beta = 0.0 if model == "transformer" else beta
    rerank = {"rerank_with": setup.teacher_checkpoint} if system.endswith("_rerank") else {}
    out = out or setup.out / "decode" / system / f"test.batch{batch}.out"
    runs = [R.decode(setup.data, setup.checkpoint(run), model, out, eos_penalty=beta, batch_size=batch,
                     head=setup.batch1 if batch == 1 else None, launcher=launcher, **setup.decode_args(), **decoding,
                     **rerank) for _ in range(setup.repeat)]
    seconds = [r["decode_seconds"] for r in runs]
    baseline = {}
    if sitting is not None:  # the sitting's teacher greedy decode is its own baseline
        base = statistics.median(seconds) if system == "teacher_greedy" else sitting.get(
            f"teacher_greedy_seconds_batch{batch}")
        baseline = {"machine": sitting["machine"], "sitting": sitting["id"], "baseline_seconds": base}
    return {**runs[-1], "eos_penalty": beta, "decode_seconds": statistics.median(seconds),
            **({"decode_seconds_runs": seconds} if len(runs) > 1 else {}), **baseline}


def probe_label_tau(setup: Setup) -> dict:
    """fairseq's own insertion_transformer with --label-tau: run 1 update and report the outcome."""
    save = setup.out / "nat_label_tau_probe"
    cmd = train_command(R.data_bin(setup.data), save, "fairseq_nat", setup.size, updates=1, device=setup.device,
                        extra=["--label-tau", "1", "--no-save"])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return {"note": "fairseq's insertion_transformer trained with --label-tau 1 for 1 update without error."}
    errors = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "Error" in ln]
    return {"note": f"fairseq's insertion_transformer with --label-tau 1 fails (exit {proc.returncode}: "
                    f"{errors[-1].strip() if errors else 'see log'}); its systems train without --label-tau."}


# ------------------------------------------------------------------------- report
def pick(rows: dict[str, dict], system: str, key: str) -> dict:
    """The row of ``system``, or the best row by ``key`` among the systems the pattern matches."""
    if "*" not in system:
        return rows.get(system, {})
    found = [r for n, r in rows.items() if fnmatch.fnmatchcase(n, system) and r.get(key) is not None]
    return max(found, key=lambda r: r[key]) if found else {}


def compute(kind: str, a: float | None, b: float | None) -> float | None:
    if kind == "difference":
        return None if a is None or b is None else round(a - b, 3)
    if not a or not b:
        return None
    return round(b / a if kind == "inverse_ratio" else a / b, 3)


def evaluate_targets(rows: list[dict], device: str) -> list[dict]:
    """Every target measured on ``rows``: metric, goal text, value and whether it is met (None: not
    measured, or reported only)."""
    by_name, out = {r["name"]: r for r in rows}, []
    for metric, kind, (sa, ka), (sb, kb), goal, direction, note in TARGETS:
        a, b = pick(by_name, sa, ka), pick(by_name, sb, kb)
        value = compute(kind, a.get(ka), b.get(kb))
        if isinstance(goal, dict):
            goal, where = goal.get(device), f" ({ {'cpu': 'CPU', 'cuda': 'GPU'}.get(device, device)})"
            text = f"{direction} {float(goal)}{where}" if goal is not None else f"no goal on {device}"
        else:
            text = f"{direction} {float(goal)}" if goal is not None else "reported" + (f" ({note})" if note else "")
        met = None if value is None or goal is None else (value >= goal if direction == ">=" else value <= goal)
        out.append({"metric": metric.replace("{a}", a.get("name", "none")), "target": text, "value": value,
                    "met": met})
    return out


RATIOS = (("decode_seconds_batch1", "decode_time_ratio_batch1_vs_", "ratio"),
          ("decode_seconds_batch128", "decode_throughput_ratio_batch128_vs_", "inverse_ratio"),
          ("train_target_tokens_per_s", "train_speed_ratio_vs_", "ratio"))


def add_ratios(results: dict) -> None:
    """Ratios against the baselines trained on the same data in this run, and the targets."""
    by_name = {r["name"]: r for r in results["systems"]}
    for row in results["systems"]:
        suffix = "_distilled" if row["data"] == "distilled" else ""
        for peer, tag in (("ar_greedy", "ar_greedy"), ("fairseq_nat_insertion", "fairseq_nat")):
            other = by_name.get(peer + suffix, {})
            for key, prefix, kind in RATIOS:
                row[prefix + tag] = compute(kind, row.get(key), other.get(key))
    if results.get("mode") == "peers-table":  # against the teacher's greedy decode of each decode's own sitting
        speed = results.get("trainings", {}).get("teacher_recipe", {}).get("train_target_tokens_per_s")
        for row in results["systems"]:
            row["decode_time_ratio_batch1_vs_teacher_greedy"] = compute(
                "ratio", row.get("decode_seconds_batch1"), row.get("baseline_seconds_batch1"))
            row["decode_throughput_ratio_batch128_vs_teacher_greedy"] = compute(
                "inverse_ratio", row.get("decode_seconds_batch128"), row.get("baseline_seconds_batch128"))
            row["train_speed_ratio_vs_teacher"] = compute("ratio", row.get("train_target_tokens_per_s"), speed)
    results["targets"] = evaluate_targets(results["systems"], results["device"])


def fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def peers_markdown(results: dict) -> str:
    """The --peers-table table: every ratio against the teacher's greedy decode timed in the same sitting."""
    lines = [
        f"Machine: {results['machine']} ({results['device']}); every cold model {results['updates']} updates "
        f"({results.get('schedule_text', '')}); {results['arch']}; test set {results['test_set']}, detokenised "
        f"sacreBLEU; batch-1 timing on the first {results['batch1_sentences']} test sentences.", "",
        "| system | BLEU | BP | iterations | EOS pen. | batch 1 s | time vs teacher greedy | batch 128 s "
        "| throughput vs teacher greedy | train tgt tok/s | vs teacher | updates |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["systems"]:
        updates = r.get("train_updates")
        lines.append(
            f"| {r['name']} | {fmt(r['bleu'])} | {fmt(r.get('brevity_penalty'), 3)} | {fmt(r['mean_iterations'])} "
            f"| {fmt(r['eos_penalty'], 0)} | {fmt(r['decode_seconds_batch1'])} "
            f"| {fmt(r.get('decode_time_ratio_batch1_vs_teacher_greedy'))} | {fmt(r['decode_seconds_batch128'])} "
            f"| {fmt(r.get('decode_throughput_ratio_batch128_vs_teacher_greedy'))} "
            f"| {fmt(r['train_target_tokens_per_s'], 0)} | {fmt(r.get('train_speed_ratio_vs_teacher'))} "
            f"| {fmt(updates)}{'' if r.get('train_finished', True) else ' (stopped)'} |")
    borrowed = [f"{r['name']} ({r['train_speed_from']})" for r in results["systems"]
                if r.get("train_speed_from") not in (None, "teacher_recipe")]
    if borrowed:
        lines += ["", "Training speed measured on another run of the same model and loss: " + ", ".join(borrowed)
                  + "; the teacher's rows: its recipe trained again beside the others (teacher_recipe)."]
    check = results.get("fp16_check")
    if check:
        lines += ["", "fp16 (--fp16 in training and decoding) against fp32: " + ", ".join(
            f"{k} {fmt(v, 3) if isinstance(v, float) else v}" for k, v in check.items())]
    lines += [line for note in results.get("notes", []) for line in ("", f"Note: {note}")]
    for kind in ("failed", "pending"):
        if results.get(kind):
            lines += ["", f"{kind.capitalize()} steps: " + "; ".join(
                f"{k}: {v.splitlines()[0]}" for k, v in results[kind].items())]
    return "\n".join(lines) + "\n"


def markdown(results: dict) -> str:
    if results.get("mode") == "peers-table":
        return peers_markdown(results)
    lines = [
        f"Machine: {results['machine']} ({results['device']}); {results['updates']} updates per system; "
        f"{results['arch']}; max tokens {results['max_tokens']}; test set {results['test_set']}; "
        f"batch-1 timing on the first {results['batch1_sentences']} test sentences.", "",
        "| system | data | BLEU | EOS pen. | iterations | floor(log2 n)+1 | decode s, batch 1 | time vs AR greedy "
        "| decode s, batch 128 | throughput vs AR greedy | train tgt tok/s | vs AR |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["systems"]:
        lines.append(
            f"| {r['name']} | {r['data']} | {fmt(r['bleu'])} | {fmt(r['eos_penalty'], 0)} "
            f"| {fmt(r['mean_iterations'])} | {fmt(r['mean_log2_bound'])} | {fmt(r['decode_seconds_batch1'])} "
            f"| {fmt(r['decode_time_ratio_batch1_vs_ar_greedy'])} | {fmt(r['decode_seconds_batch128'])} "
            f"| {fmt(r['decode_throughput_ratio_batch128_vs_ar_greedy'])} "
            f"| {fmt(r['train_target_tokens_per_s'], 0)} | {fmt(r['train_speed_ratio_vs_ar_greedy'])} |")
    if results.get("targets"):
        lines += ["", "| performance target | goal | measured | met |", "| --- | --- | --- | --- |"]
        for t in results["targets"]:
            met = "-" if t["target"].startswith("reported") else (
                "not measured" if t["met"] is None else ("yes" if t["met"] else "**no**"))
            lines.append(f"| {t['metric']} | {t['target']} | {fmt(t['value'], 3)} | {met} |")
    lines += [line for note in results.get("notes", []) for line in ("", f"Note: {note}")]
    if results.get("failed"):
        lines += ["", "Failed steps: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in results["failed"].items())]
    return "\n".join(lines) + "\n"


def save(out: Path, results: dict, placeholders: dict[str, str] | None = None) -> None:
    """``results.json`` and ``results.md``, with every path of ``placeholders`` (path -> name) written as its
    name (the longest first)."""
    add_ratios(results)
    text, table = json.dumps(results, indent=2) + "\n", markdown(results)
    for path, name in sorted((placeholders or {}).items(), key=lambda kv: -len(kv[0])):
        text, table = text.replace(path, name), table.replace(path, name)
    (out / "results.json").write_text(text)
    (out / "results.md").write_text(table)


def placeholders(setup: Setup) -> dict[str, str]:
    """This run's paths and their names in a --peers-table results.json: REPO, OUT, DATA, KIT (the teacher's
    directory), INSERTION_KIT (the warm model's), FAIRSEQ (where the fairseq-* commands are) and PYTHON."""
    names = {REPO: "REPO", setup.out: "OUT", setup.data: "DATA", Path(sys.executable): "PYTHON"}
    cli = fairseq_cli("train")
    if len(cli) == 1:  # a fairseq-train script, not python -m fairseq_cli.train
        names[Path(cli[0]).parent] = "FAIRSEQ"
    for given, name in ((setup.teacher, "KIT"), (setup.warm_model, "INSERTION_KIT")):
        if given is not None:
            names[given.parent] = name
    return {str(path): name for path, name in names.items() if str(path) not in ("/", ".")}


def paired_bootstrap(hyps_a: list[str], hyps_b: list[str], refs: list[str], samples: int = 1000,
                     seed: int = 1) -> tuple[float, float, float]:
    """BLEU(a) - BLEU(b) on the whole set, and its 95% interval over ``samples`` paired bootstrap resamples
    of the sentences (sacreBLEU's sufficient statistics, summed per resample)."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    stats = [np.array(bleu._extract_corpus_statistics(h, [refs]), dtype=np.int64) for h in (hyps_a, hyps_b)]

    def score(s: np.ndarray) -> float:
        return bleu._compute_score_from_stats([int(x) for x in s.sum(0)]).score

    rng = np.random.default_rng(seed)
    diffs = sorted(score(stats[0][i]) - score(stats[1][i])
                   for i in (rng.integers(0, len(refs), len(refs)) for _ in range(samples)))
    return score(stats[0]) - score(stats[1]), diffs[int(0.025 * samples)], diffs[int(0.975 * samples) - 1]


@functools.lru_cache(maxsize=None)
def given_checkpoint(path: Path | None) -> dict:
    """A given checkpoint's path and the updates its training recorded."""
    if path is None or not path.is_file():
        return {}
    import torch

    import examples.multi30k.fairseq_safe_load  # noqa: F401  argparse.Namespace on torch's safe list

    history = torch.load(path, map_location="cpu", weights_only=True).get("optimizer_history") or [{}]
    return {"checkpoint": str(path), "train_updates": history[-1].get("num_updates"), "finished": True}


# ------------------------------------------------------------------------- the run
class Run:
    """One benchmark run: its settings, the steps done, failed and left for a later run (``--deadline``),
    and ``results.json``."""

    def __init__(self, setup: Setup, systems: list[str], results: dict):
        self.setup, self.systems, self.results, self.started = setup, systems, results, time.time()
        self.done: dict[str, dict] = {}
        self.results.setdefault("pending", {})
        self.machine = results["machine"]

    def time_left(self) -> float:
        return float("inf") if self.setup.deadline is None else self.setup.deadline - time.time()

    def step(self, key: str, path: Path, fn: Callable[[], dict], needs: tuple[str, ...] = ()) -> None:
        """Run one step (or read its finished output); a failure is recorded and the run goes on. A step
        that cannot finish before the deadline (or the training box) is left pending for a later run."""
        if any(n in self.results["failed"] for n in needs):
            self.results["failed"][key] = "skipped: a step it needs failed"
            return
        if any(n in self.results["pending"] for n in needs):
            self.results["pending"][key] = "waits for " + ", ".join(n for n in needs if n in self.results["pending"])
            return
        if not path.is_file():
            kind, s = key.split(":")[0], self.setup
            if kind in ("train", "probe") and s.train_until is not None and s.train_until - time.time() < MIN_TRAIN_S:
                self.results["pending"][key] = "not started: no training time left (--train-box)"
                return
            if self.time_left() < MIN_LEFT_S.get(kind, 0.0):
                self.results["pending"][key] = "not started: too close to --deadline"
                return
        print(f"[bench] {key}", file=sys.stderr, flush=True)
        try:
            self.done[key] = cached(path, fn)
        except Exception as exc:  # a failed step is recorded, the rest goes on
            self.results["failed"][key] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()

    def phase(self, groups: list[list[Step]], jobs: int) -> None:
        """``jobs`` groups of steps at a time, the steps of a group one after the other."""
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(lambda group: [self.step(*step) for step in group], groups))
        self.write()

    def training(self, run: str) -> dict:
        """What the row of a system trained by ``run`` reports of its training. The given teacher: its recipe
        trained again here (``teacher_recipe``) for the speed; the given warm model: the command in the
        ``results.json`` beside it, and the cold plugin's speed (the same model and loss; the warm start
        changes only the first weights)."""
        if run == "teacher":
            recipe = self.done.get("train:teacher_recipe", {})
            return {"command": recipe.get("command"), "train_target_tokens_per_s": recipe.get(
                "train_target_tokens_per_s"), "train_speed_from": "teacher_recipe" if recipe else None,
                    **given_checkpoint(self.setup.teacher)}
        if run == "warm_model":
            given = self.setup.warm_model
            recorded = given.parent / "results.json" if given else None
            command = None
            if recorded is not None and recorded.is_file():
                command = (json.loads(recorded.read_text()).get("training") or {}).get("command")
            speed = self.done.get("train:binary_tree_distilled", {}).get("train_target_tokens_per_s")
            return {"command": command, "train_target_tokens_per_s": speed,
                    "train_speed_from": "binary_tree_distilled" if speed else None, **given_checkpoint(given)}
        return self.done.get(f"train:{run}", {})

    def row(self, name: str) -> dict:
        run, _, _ = ALL_SYSTEMS[name]
        t128, t1 = self.done.get(f"test128:{name}", {}), self.done.get(f"test1:{name}", {})
        trained = self.training(run)
        row = {"name": name, "data": "distilled" if "_distilled" in name else "raw", "bleu": t128.get("bleu"),
               "bleu_signature": t128.get("signature"), "brevity_penalty": t128.get("brevity_penalty"),
               "mean_iterations": t128.get("mean_iterations"),
               "mean_log2_bound": t128.get("mean_log2_bound"), "mean_length": t128.get("mean_length"),
               "eos_penalty": t128.get("eos_penalty"),
               "valid_bleu_by_eos_penalty": self.done.get(f"sweep:{name}", {}).get("valid_bleu_by_eos_penalty"),
               "decode_seconds_batch1": t1.get("decode_seconds"), "decode_seconds_batch128": t128.get("decode_seconds"),
               "train_target_tokens_per_s": trained.get("train_target_tokens_per_s"),
               "command": t128.get("command"), "command_batch1": t1.get("command"),
               "train_command": trained.get("command")}
        for key in ("train_updates", "finished", "losses_finite", "checkpoint", "train_speed_from"):
            if trained.get(key) is not None:
                row["train_finished" if key == "finished" else key] = trained[key]
        for batch, t in ((1, t1), (128, t128)):
            if "decode_seconds_runs" in t:
                row[f"decode_seconds_batch{batch}_runs"] = t["decode_seconds_runs"]
            if "baseline_seconds" in t:  # the teacher's greedy decode timed in the same sitting, same machine
                row[f"baseline_seconds_batch{batch}"] = t["baseline_seconds"]
                row[f"machine_batch{batch}"], row[f"sitting_batch{batch}"] = t["machine"], t["sitting"]
        return row

    def write(self) -> None:
        self.results["trainings"] = {k[6:]: v for k, v in self.done.items() if k.startswith("train:")}
        if "distill" in self.done:
            self.results["distillation"] = self.done["distill"]
        probe = self.done.get("probe:label_tau", {}).get("note")
        if probe and probe not in self.results["notes"]:
            self.results["notes"].append(probe)
        self.results["systems"] = [self.row(n) for n in self.systems]
        table = self.results.get("mode") == "peers-table"
        save(self.setup.out, self.results, placeholders(self.setup) if table else None)

    def start_sitting(self, todo: set[str], launcher: Callable[..., int] | None) -> dict:
        """The teacher's greedy decode at batch 128 and 1, timed now: the denominators of the time ratios
        of every decode of this sitting (the teacher_greedy row's own decodes when they are still to do)."""
        s = self.setup
        sitting = {"id": datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
                   "machine": self.machine}
        for batch in (128, 1):
            key = f"test{batch}:teacher_greedy"
            if key not in todo:
                key = f"baseline{batch}:{sitting['id']}"
            path = s.out / "decode" / ("teacher_greedy" if key.startswith("test") else "baseline") / (
                f"test.batch{batch}.json" if key.startswith("test") else f"{sitting['id']}.batch{batch}.json")
            self.step(key, path, lambda b=batch, p=path: timed_decode(
                s, "teacher_greedy", b, 0.0, out=p.with_suffix(".out"), launcher=launcher, sitting=sitting))
            if key in self.done:
                sitting[f"teacher_greedy_seconds_batch{batch}"] = self.done[key]["decode_seconds"]
        self.results.setdefault("sittings", []).append(sitting)
        return sitting

    def fp16_check(self) -> dict | None:
        """--fp16 against fp32 (the cold plugin): the fp16 training's losses, and the test BLEU difference with
        its paired bootstrap 95% interval."""
        fp16, fp32 = "insertion_binary_tree_parallel_fp16_distilled", "insertion_binary_tree_parallel_distilled"
        trained = self.done.get("train:binary_tree_fp16_distilled")
        if fp16 not in self.systems or not trained:
            return None
        check = {k: trained.get(k) for k in ("losses_finite", "last_loss", "gradient_overflows", "min_loss_scale")}
        outs = [self.setup.out / "decode" / n / "test.batch128.out" for n in (fp16, fp32)]
        if all(f"test128:{n}" in self.done for n in (fp16, fp32)):
            refs = read_reference(self.setup.data / "raw" / "test.tgt")
            hyps = [detokenized(read_generate_output(o), "de") for o in outs]
            diff, low, high = paired_bootstrap(hyps[0], hyps[1], refs)
            check.update({"bleu_fp16_minus_fp32": round(diff, 3), "bootstrap_95": [round(low, 3), round(high, 3)],
                          "within_noise": low <= 0.0 <= high})
        return check

    def all(self) -> int:
        s, out = self.setup, self.setup.out
        runs = [r for r in dict.fromkeys(ALL_SYSTEMS[n][0] for n in self.systems) if r not in GIVEN_RUNS]
        if "teacher_greedy" in self.systems:
            runs.insert(0, "teacher_recipe")  # the teacher's training speed, its recipe trained here again
        distilled = [r for r in runs if on_distilled(r)]
        needs_teacher = bool(distilled) or any(n.endswith("_rerank") for n in self.systems)
        if s.teacher is None and needs_teacher and "ar" not in runs:
            runs.insert(0, "ar")
        train_step = lambda r: (f"train:{r}", out / r / "train.json", lambda: train(s, r),  # noqa: E731
                                ("distill",) if r in distilled and s.distilled is None else ())
        distill = [("distill", s.distilled_bin / "distill.json", lambda: R.distill(
            s.data, s.teacher_checkpoint, s.device, out=s.distilled_bin, max_len_a=s.max_len_a,
            max_len_b=s.max_len_b), () if s.teacher else ("train:ar",))] if distilled and s.distilled is None else []
        probe = [[("probe:label_tau", out / "nat_label_tau_probe" / "probe.json", lambda: probe_label_tau(s))]] if any(
            ALL_RUNS[r][0] == "fairseq_nat" for r in runs) else []
        if distill:
            # the distillation follows the teacher's training in its worker, beside the other raw trainings
            raw = [[train_step(r), *(distill if r == "ar" else [])] for r in runs if r not in distilled]
            self.phase(probe + raw + ([distill] if "ar" not in runs else []), s.jobs)
            self.phase([[train_step(r)] for r in runs if r in distilled], s.jobs)
        else:  # every training side by side
            self.phase(probe + [[train_step(r)] for r in runs], s.jobs)
        swept = [n for n in self.systems if ALL_SYSTEMS[n][2] and len(s.betas) > 1]
        train_needs = lambda n: () if ALL_SYSTEMS[n][0] in GIVEN_RUNS else (f"train:{ALL_SYSTEMS[n][0]}",)  # noqa: E731
        self.phase([[(f"sweep:{n}", out / "decode" / n / "sweep.json", lambda n=n: sweep(s, n), train_needs(n))]
                    for n in swept], s.jobs)
        if "teacher_greedy" in self.systems:
            timed = [n for n in DECODE_ORDER if n in self.systems] + [n for n in self.systems if n not in DECODE_ORDER]
        else:
            timed = sorted(self.systems, key=lambda n: "_distilled" not in n)  # the targets' rows first
        batches = {n: (128, 1) if n not in EXTRA_SYSTEMS else (128,) for n in timed}
        todo = {f"test{b}:{n}" for n in timed for b in batches[n]
                if not (out / "decode" / n / f"test.batch{b}.json").is_file()}
        with (Prestarted() if s.prestart else contextlib.nullcontext()) as launcher:
            sitting = None
            if todo and "teacher_greedy" in self.systems and self.time_left() >= MIN_LEFT_S["test128"]:
                sitting = self.start_sitting(todo, launcher)
            for n in timed:
                # a swept system's best beta (the one beta when not swept); fairseq's own 0 for the others
                beta = self.done.get(f"sweep:{n}", {}).get("eos_penalty", s.betas[0] if ALL_SYSTEMS[n][2] else 0.0)
                needs = (*train_needs(n), *((f"sweep:{n}",) if n in swept else ()))
                for batch in batches[n]:
                    if sitting is not None and n == "teacher_greedy" and f"test{batch}:{n}" in self.done:
                        continue  # decoded as the sitting's baseline
                    self.phase([[(f"test{batch}:{n}", out / "decode" / n / f"test.batch{batch}.json",
                                  lambda n=n, b=batch, beta=beta: timed_decode(s, n, b, beta, launcher=launcher,
                                                                               sitting=sitting), needs)]], 1)
        check = self.fp16_check()
        if check:
            self.results["fp16_check"] = check
        plotted = [r for r in self.results["systems"] if r["bleu"] is not None
                   and r["name"].startswith(("insertion_binary_tree_parallel", "insertion_warm_parallel"))]
        if plotted:
            best = max(plotted, key=lambda r: r["bleu"])
            try:
                plot_iterations(out / "decode" / best["name"] / "test.batch128.out", out / "iterations.png",
                                title=f"{best['name']} (test_2016_flickr, {s.updates} updates)")
                self.results["plot"] = str(out / "iterations.png")
            except ImportError as exc:  # matplotlib is optional
                self.results["notes"].append(f"no iterations plot: {exc}")
        self.results["wall_seconds"] = round(time.time() - self.started, 1)
        self.write()
        print(markdown(self.results))
        return 1 if self.results["failed"] else 0


# ------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", type=Path, required=True, help="work and results directory (finished steps are reused)")
    p.add_argument("--quick", action="store_true", help="a tiny model, 2,000 training lines, 48 test lines, 30 updates")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--jobs", type=int, default=1, help="steps of one phase at a time (timed decodes always alone)")
    p.add_argument("--systems", nargs="+", default=None, help=f"only these systems (default: all): {list(ALL_SYSTEMS)}")
    p.add_argument("--extras", action="store_true", help="also the warm start, two canvases per sentence, candidates")
    p.add_argument("--peers", action="store_true",
                   help="also fairseq's mask-predict (CMLM) and Levenshtein Transformer, on the distilled data")
    p.add_argument("--peers-table", action="store_true",
                   help="only the table beside fairseq's non-autoregressive models on a teacher kit (needs --teacher "
                        "and --distilled; --warm-model adds the warm-started plugin): the teacher greedy and beam 5, "
                        "CMLM, Levenshtein, fairseq's NAT insertion model, the plugin cold (and with --fp16 on a GPU)")
    p.add_argument("--warm-model", type=Path, default=None,
                   help="a trained insertion checkpoint (the warm-start recipe's), decoded as it is; a results.json "
                        "beside it gives its training command")
    p.add_argument("--warmup", type=int, default=None, help="warmup updates of every training (default 400)")
    p.add_argument("--dropout", type=float, default=None, help="dropout of every training (default 0.1)")
    p.add_argument("--clip-norm", type=float, default=None, help="gradient clipping of every training, 0: none "
                                                                 "(default 1.0)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from now after which no step starts (a later run into OUT goes on)")
    p.add_argument("--train-box", type=float, default=None,
                   help="seconds from now by which every training stops (fairseq's --stop-time-hours; the updates "
                        "reached are recorded); 0: no new training")
    p.add_argument("--prestart", action="store_true",
                   help="timed decodes in processes that imported torch and fairseq while the previous one ran")
    p.add_argument("--note", action="append", default=[], help="a note for results.json and the table (repeatable)")
    p.add_argument("--render", action="store_true", help="only the ratios, targets and OUT/results.md again")
    p.add_argument("--raw-dir", type=Path, default=None, help="raw Multi30k files (default: download them)")
    p.add_argument("--data", type=Path, default=None, help="a prepare.py --out directory (default OUT/data)")
    p.add_argument("--teacher", type=Path, default=None,
                   help="a fairseq transformer checkpoint to distil with and warm-start from, instead of OUT/ar")
    p.add_argument("--distilled", type=Path, default=None,
                   help="a distilled data-bin (the data's dictionaries) for the *_distilled systems")
    p.add_argument("--tau", type=float, default=1.0, help="binary tree temperature (default 1.0)")
    p.add_argument("--repeat", type=int, default=1, help="run each timed decode N times, report the median")
    for flag, (full, quick) in DEFAULTS.items():
        kind = float if flag in ("betas", "max_len_a") else int
        p.add_argument(f"--{flag.replace('_', '-')}", type=kind, nargs="+" if flag == "betas" else None,
                       help=f"default {'all' if full is None else full}; --quick {quick}")
    return p


def check_given(setup: Setup) -> None:
    """``--distilled`` and ``--teacher`` must fit the prepared data (raises CheckError naming the file)."""
    if setup.distilled:
        check_distilled(R.data_bin(setup.data), setup.distilled)
    if setup.teacher:
        check_teacher(setup.teacher, R.data_bin(setup.data))
    if setup.warm_model:
        check_teacher(setup.warm_model, R.data_bin(setup.data))


PRESTART_NOTE = ("Timed decodes ran in processes that had imported torch and fairseq while the previous decode ran "
                 "(benchmarks/prestart.py); the seconds are fairseq-generate's own, which exclude start-up either way.")


def schedule_text(setup: Setup) -> str:
    """The training flags every model shares, as the table states them."""
    s = {"warmup": 400, "dropout": 0.1, "clip_norm": 1.0, **dict(setup.schedule)}
    clip = "no clipping" if s["clip_norm"] is None else f"clip norm {s['clip_norm']:g}"
    return (f"adam, lr 1e-3, inverse_sqrt, warmup {s['warmup']}, dropout {s['dropout']:g}, label smoothing 0.1, "
            f"max tokens {setup.max_tokens}, {clip}; each model's own loss")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.render:
        results = json.loads((out / "results.json").read_text())
        save(out, results)
        print(markdown(results))
        return 0
    systems = [n for n in ALL_SYSTEMS if (args.extras or n not in EXTRA_SYSTEMS)
               and (args.peers or n not in PEER_SYSTEMS) and n not in TABLE_SYSTEMS
               and (not args.systems or n in args.systems)]
    device = args.device or default_device()
    notes = list(args.note)
    if args.peers_table:
        if args.teacher is None or args.distilled is None:
            parser.error("--peers-table needs --teacher and --distilled (a teacher kit)")
        systems = [n for n in PEERS_TABLE if (not args.systems or n in args.systems)
                   and (args.warm_model or ALL_SYSTEMS[n][0] != "warm_model")]
        if device != "cuda" and "insertion_binary_tree_parallel_fp16_distilled" in systems:
            systems.remove("insertion_binary_tree_parallel_fp16_distilled")
            notes.append("no --fp16 system: fairseq's --fp16 training needs CUDA")
    unknown = sorted(set(args.systems or ()) - set(ALL_SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {list(ALL_SYSTEMS)}")
    for name, (full, quick) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    out.mkdir(parents=True, exist_ok=True)
    data = args.data.resolve() if args.data else out / "data"
    if not (data / "data-bin" / "dict.src.txt").is_file():
        prepare(data, args.raw_dir.resolve() if args.raw_dir else None, "en", "de", bpe_merges=args.bpe_merges,
                  train_lines=args.train_lines, test_lines=args.test_lines, workers=2)
    n_test = len(read_reference(data / "raw" / "test.tgt"))
    schedule = tuple((k, v) for k, v in (("warmup", args.warmup), ("dropout", args.dropout),
                                          ("clip_norm", None if args.clip_norm == 0 else args.clip_norm))
                     if v is not None or (k == "clip_norm" and args.clip_norm == 0))
    now = time.time()
    setup = Setup(out, data, device, Size(args.layers, args.dim, args.heads, args.ffn),
                  args.updates, args.max_tokens, tuple(args.betas), args.max_len_a, args.max_len_b,
                  min(n_test, args.batch1_sentences or n_test), args.tau, max(1, args.jobs), max(1, args.repeat),
                  *(p.resolve() if p else None for p in (args.teacher, args.distilled, args.warm_model)),
                  schedule=schedule, deadline=None if args.deadline is None else now + args.deadline,
                  train_until=None if args.train_box is None else now + args.train_box, prestart=args.prestart)
    try:
        check_given(setup)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = run_info(setup.device)
    results = {
        "machine": info["machine"], "device": setup.device, "updates": setup.updates,
        "arch": setup.size.describe(), "max_tokens": setup.max_tokens, "max_len_a": setup.max_len_a,
        "max_len_b": setup.max_len_b,
        "test_set": "test_2016_flickr" + (f" (first {n_test} lines)" if args.quick or args.test_lines else ""),
        "test_sentences": n_test, "data": str(data), "batch1_sentences": setup.batch1,
        "mode": "quick" if args.quick else "full", "jobs": setup.jobs, "versions": info["versions"],
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, "-m", "benchmarks.run", *argv]),
        **({"teacher": str(setup.teacher)} if setup.teacher else {}),
        **({"distilled_data": str(setup.distilled)} if setup.distilled else {}),
        **({"mode": "peers-table", "schedule_text": schedule_text(setup)} if args.peers_table else {}),
        **({"warm_model": str(setup.warm_model)} if setup.warm_model else {}),
        "notes": notes + ([PRESTART_NOTE] if setup.prestart else []),
        "trainings": {}, "systems": [], "failed": {},
    }
    return Run(setup, systems, results).all()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
