#!/usr/bin/env python3
"""Side-by-side benchmark on Multi30k en-de: this plugin against fairseq's autoregressive
``transformer`` and fairseq's built-in NAT ``insertion_transformer``, all trained on the
same data, at the same size, for the same number of updates, in one run.

    python benchmarks/run.py --out bench --raw-dir ../shared/data/multi30k            # full mode
    python benchmarks/run.py --out bench-quick --raw-dir ../shared/data/multi30k --quick

Writes ``OUT/results.json``, ``OUT/results.md`` (the table) and ``OUT/iterations.png``.
Every figure comes from a fairseq command recorded next to it:

* BLEU: detokenised sacreBLEU on test_2016_flickr (``examples/multi30k/score.py``), with the
  EOS penalty chosen on valid for the insertion and NAT systems (``--betas``).
* decode seconds: fairseq-generate's own generation time ("Translated N sentences ... in"),
  which excludes start-up and model loading, for the whole test set at batch 128 and for its
  first ``--batch1-sentences`` sentences at batch 1. These timing runs run one at a time, with
  nothing else on the machine; training and the EOS sweeps may run ``--jobs`` at a time.
* training target tokens/s: from fairseq's own per-epoch summaries (wpb x updates / time).
  With ``--jobs`` > 1 trainings share the machine, so only the timings of the decode runs
  are clean; run with ``--jobs 1`` for clean training speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "multi30k"))

import recipe as R  # noqa: E402
from prepare import prepare  # noqa: E402

# training runs: name -> (model, recipe.train keyword arguments, distilled)
TRAININGS: dict[str, tuple[str, dict, bool]] = {}
for _suffix, _distilled in (("", False), ("_distilled", True)):
    TRAININGS.update({
        f"ar{_suffix}": ("transformer", {}, _distilled),
        f"nat{_suffix}": ("fairseq_nat", {}, _distilled),
        f"binary_tree{_suffix}": ("insertion", {"order": "binary_tree"}, _distilled),
        f"uniform{_suffix}": ("insertion", {"order": "uniform"}, _distilled),
        # the paper trains left-to-right with sequence finalization (end-of-sequence in the last slot)
        f"left_to_right{_suffix}": ("insertion", {"order": "left_to_right", "termination": "sequence"}, _distilled),
    })

# systems: name -> (training run, decode keyword arguments, EOS penalty swept)
SYSTEMS: dict[str, tuple[str, dict, bool]] = {}
for _suffix in ("", "_distilled"):
    SYSTEMS.update({
        f"ar_greedy{_suffix}": (f"ar{_suffix}", {"beam": 1}, False),
        f"ar_beam5{_suffix}": (f"ar{_suffix}", {"beam": 5}, False),
        f"fairseq_nat_insertion{_suffix}": (f"nat{_suffix}", {}, True),
        f"insertion_binary_tree_parallel{_suffix}": (f"binary_tree{_suffix}", {"decoding": "parallel"}, True),
        f"insertion_binary_tree_greedy{_suffix}": (f"binary_tree{_suffix}", {"decoding": "greedy"}, True),
        f"insertion_uniform_parallel{_suffix}": (f"uniform{_suffix}", {"decoding": "parallel"}, True),
        f"insertion_left_to_right_greedy{_suffix}": (f"left_to_right{_suffix}", {"decoding": "greedy"}, True),
    })

# optional extra trainings (issue "Performance"): warm start from the teacher, K canvases
EXTRA_TRAININGS: dict[str, tuple[str, dict, bool]] = {
    "binary_tree_distilled_warm_start": ("insertion", {"order": "binary_tree"}, True),
    "binary_tree_distilled_k2": ("insertion", {"order": "binary_tree"}, True),
}
EXTRA_SYSTEMS: dict[str, tuple[str, dict, bool]] = {
    "insertion_binary_tree_parallel_distilled_warm_start": (
        "binary_tree_distilled_warm_start", {"decoding": "parallel"}, True),
    "insertion_binary_tree_parallel_distilled_k2": ("binary_tree_distilled_k2", {"decoding": "parallel"}, True),
}


@dataclass
class Job:
    """One step of the benchmark; ``exclusive`` jobs run alone (the timed decodes)."""

    name: str
    fn: Callable[[], dict]
    deps: tuple[str, ...] = ()
    exclusive: bool = False
    first: bool = False  # start before the other ready jobs (the distillation unblocks many)
    result: dict = field(default_factory=dict)


class Scheduler:
    """Runs jobs when their dependencies are done: up to ``jobs`` shared ones at a time,
    then the exclusive ones one by one with the machine to themselves."""

    def __init__(self, jobs: int, on_done: Callable[[Job], None]):
        self.jobs, self.on_done = max(1, jobs), on_done
        self.pending: dict[str, Job] = {}
        self.done: dict[str, Job] = {}
        self.failed: dict[str, str] = {}
        self.lock = threading.Lock()

    def add(self, job: Job) -> None:
        self.pending[job.name] = job

    def _ready(self, job: Job) -> bool:
        return all(d in self.done for d in job.deps)

    def _blocked(self, job: Job) -> bool:
        return any(d in self.failed for d in job.deps)

    def _call(self, job: Job) -> dict:
        print(f"[bench] start {job.name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        job.result = job.fn() or {}
        print(f"[bench] done  {job.name} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        return job.result

    def run(self) -> None:
        running: dict[Future, Job] = {}
        with ThreadPoolExecutor(self.jobs) as pool:
            while self.pending or running:
                for job in [j for j in self.pending.values() if self._blocked(j)]:
                    del self.pending[job.name]
                    self.failed[job.name] = "skipped: a step it needs failed"
                shared = sorted((j for j in self.pending.values() if not j.exclusive and self._ready(j)),
                                key=lambda j: not j.first)
                while shared and len(running) < self.jobs:
                    job = shared.pop(0)
                    del self.pending[job.name]
                    running[pool.submit(self._call, job)] = job
                if not running:
                    exclusive = [j for j in self.pending.values() if j.exclusive and self._ready(j)]
                    if not exclusive:
                        if self.pending:  # unreachable dependencies
                            for name in list(self.pending):
                                self.failed[name] = "skipped: dependencies never ran"
                            self.pending.clear()
                        break
                    job = exclusive[0]
                    del self.pending[job.name]
                    running[pool.submit(self._call, job)] = job
                    wait(list(running))  # alone on the machine
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in finished:
                    job = running.pop(fut)
                    try:
                        fut.result()
                        self.done[job.name] = job
                    except Exception as exc:  # a failed step is recorded, the rest goes on
                        self.failed[job.name] = f"{type(exc).__name__}: {exc}"
                        print(f"[bench] FAILED {job.name}: {exc}", file=sys.stderr, flush=True)
                        traceback.print_exc()
                    self.on_done(job)


# ---------------------------------------------------------------------------
def machine_info(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    desc = f"{cpu}, {os.cpu_count()} cores"
    if device == "cuda":
        import torch

        desc = f"{torch.cuda.get_device_name(0)}; {desc}"
    return desc


def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "fairseq", "sacrebleu"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover - reported, not fatal
            out[mod] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="work and results directory")
    parser.add_argument("--raw-dir", type=Path, default=None,
                        help="raw Multi30k files (default: download from the multi30k/dataset repository)")
    parser.add_argument("--data", type=Path, default=None, help="an already prepared directory (prepare.py --out)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model, 2,000 training lines, 48 test lines, 30 updates: proves the pipeline")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    parser.add_argument("--updates", type=int, default=None, help="training updates per system (default 1800)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--dim", type=int, default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--ffn", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None, help="training batch size in tokens (default 4096)")
    parser.add_argument("--tau", type=float, default=1.0, help="binary tree temperature")
    parser.add_argument("--betas", type=float, nargs="+", default=None,
                        help="EOS penalties tried on valid (default 0-7 in steps of 1; quick: 0)")
    parser.add_argument("--batch1-sentences", type=int, default=None,
                        help="time batch-1 decoding on the first N test sentences (default: all)")
    parser.add_argument("--max-len-a", type=float, default=None,
                        help="longest output = a x source length + b, for every system and the distillation "
                             "(fairseq's --max-len-a/--max-len-b; default a=1.2, b=10; quick a=0, b=20)")
    parser.add_argument("--max-len-b", type=int, default=None)
    parser.add_argument("--train-lines", type=int, default=None)
    parser.add_argument("--test-lines", type=int, default=None)
    parser.add_argument("--bpe-merges", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=1, help="trainings and EOS sweeps run this many at a time")
    parser.add_argument("--systems", nargs="+", default=None, help="only these systems (default: all)")
    parser.add_argument("--extras", action="store_true",
                        help="also warm start from the teacher and --canvases-per-sentence 2 (distilled)")
    parser.add_argument("--render", action="store_true",
                        help="only recompute the ratios, targets and OUT/results.md from OUT/results.json")
    args = parser.parse_args(argv)
    if args.render:
        path = args.out / "results.json"
        results = json.loads(path.read_text())
        add_ratios(results)
        path.write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "results.md").write_text(markdown(results))
        print(markdown(results))
        return 0

    quick = args.quick

    def pick(value, full, fast):
        return value if value is not None else (fast if quick else full)

    size = R.Size(pick(args.layers, 3, 2), pick(args.dim, 256, 64), pick(args.heads, 4, 4), pick(args.ffn, 1024, 256))
    updates = pick(args.updates, 1800, 30)
    max_tokens = pick(args.max_tokens, 4096, 1024)
    betas = pick(args.betas, [float(b) for b in range(8)], [0.0])
    max_len_a, max_len_b = pick(args.max_len_a, 1.2, 0.0), pick(args.max_len_b, 10, 20)
    device = args.device or R.default_device()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    data = args.data.resolve() if args.data else out / "data"
    if not (data / "data-bin" / "dict.src.txt").is_file():
        prepare(data, args.raw_dir.resolve() if args.raw_dir else None, "en", "de",
                bpe_merges=pick(args.bpe_merges, 8000, 1000), train_lines=pick(args.train_lines, None, 2000),
                test_lines=pick(args.test_lines, None, 48), workers=2)
    n_test = len(R.read_reference(data / "raw" / "test.tgt"))
    batch1 = min(pick(args.batch1_sentences, n_test, 16), n_test)

    trainings = dict(TRAININGS)
    systems = dict(SYSTEMS)
    if args.extras:
        trainings.update(EXTRA_TRAININGS)
        systems.update(EXTRA_SYSTEMS)
    if args.systems:
        unknown = sorted(set(args.systems) - systems.keys())
        if unknown:
            parser.error(f"unknown systems {unknown}; choose from {sorted(systems)}")
        systems = {k: v for k, v in systems.items() if k in args.systems}
    needed = {run for run, _, _ in systems.values()}
    if any(trainings[t][2] for t in needed):
        needed.add("ar")  # the distillation teacher
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))

    results: dict = {
        "machine": machine_info(device),
        "device": device,
        "updates": updates,
        "arch": size.describe() + ", shared embeddings",
        "max_tokens": max_tokens,
        "max_len_a": max_len_a,
        "max_len_b": max_len_b,
        "test_set": "test_2016_flickr" + (f" (first {n_test} lines)" if quick or args.test_lines else ""),
        "test_sentences": n_test,
        "batch1_sentences": batch1,
        "mode": "quick" if quick else "full",
        "jobs": args.jobs,
        "versions": versions(),
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "notes": [],
        "trainings": {},
        "systems": [],
        "failed": {},
    }
    lock = threading.Lock()

    def train_job(name: str) -> Callable[[], dict]:
        model, kwargs, distilled = trainings[name]
        extra: list[str] = []
        if name.endswith("_warm_start"):
            extra = ["--init-from-transformer", str(out / "ar" / "checkpoint_last.pt")]
        if name.endswith("_k2"):
            extra = ["--canvases-per-sentence", "2"]
        save = out / name
        kw = dict(kwargs)
        if kw.get("order") == "binary_tree":
            kw["tau"] = args.tau

        def fn() -> dict:
            marker = save / "train.json"
            if marker.is_file() and (save / "checkpoint_last.pt").is_file():
                return json.loads(marker.read_text())  # finished by an earlier run of this benchmark
            if save.exists():  # fairseq would resume from a stale checkpoint_last.pt
                for f in save.glob("checkpoint*.pt"):
                    f.unlink()
            env_threads(threads)
            data_dir = out / "data-bin-distilled" if distilled else R.data_bin(data)
            r = R.train(data_dir, save, model=model, size=size, updates=updates, device=device,
                        max_tokens=max_tokens, extra=extra, **kw)
            marker.write_text(json.dumps(r, indent=2))
            return r

        return fn

    def decode_kwargs(system: str) -> tuple[str, str, dict]:
        run, kwargs, _ = systems[system]
        return run, trainings[run][0], dict(kwargs)

    sched = Scheduler(args.jobs, lambda job: None)
    for name in sorted(needed, key=lambda n: (trainings[n][2], n)):
        deps = ("distill",) if trainings[name][2] else ()
        if name.endswith("_warm_start"):
            deps = deps + ("train:ar",)
        sched.add(Job(f"train:{name}", train_job(name), deps))

    def distill_job() -> dict:
        marker = out / "data-bin-distilled" / "distill.json"
        if marker.is_file():
            return json.loads(marker.read_text())
        env_threads(threads)
        r = R.distill(data, out / "ar" / "checkpoint_last.pt", device=device, out=out / "data-bin-distilled",
                      max_len_a=max_len_a, max_len_b=max_len_b)
        marker.write_text(json.dumps(r, indent=2))
        return r

    if any(trainings[t][2] for t in needed):
        sched.add(Job("distill", distill_job, ("train:ar",), first=True))

    def sweep_job(system: str) -> Callable[[], dict]:
        run, model, kwargs = decode_kwargs(system)

        def fn() -> dict:
            env_threads(threads)
            bleu = {}
            for beta in betas:
                r = R.decode(data, out / run / "checkpoint_last.pt", model, out / "decode" / system /
                             f"valid.beta{beta:g}.out", subset="valid", eos_penalty=beta, batch_size=128,
                             device=device, max_len_a=max_len_a, max_len_b=max_len_b, **kwargs)
                bleu[f"{beta:g}"] = r["bleu"]
            best = max(betas, key=lambda b: bleu[f"{b:g}"])
            return {"eos_penalty": best, "valid_bleu_by_eos_penalty": bleu}

        return fn

    def test_job(system: str, batch: int) -> Callable[[], dict]:
        run, model, kwargs = decode_kwargs(system)
        swept = systems[system][2] and len(betas) > 1

        def fn() -> dict:
            env_threads(os.cpu_count() or 1)
            beta = sched.done[f"sweep:{system}"].result["eos_penalty"] if swept else betas[0]
            if model == "transformer":
                beta = 0.0
            r = R.decode(data, out / run / "checkpoint_last.pt", model,
                         out / "decode" / system / f"test.batch{batch}.out", eos_penalty=beta,
                         batch_size=batch, device=device, head=batch1 if batch == 1 else None,
                         max_len_a=max_len_a, max_len_b=max_len_b, **kwargs)
            return {**r, "eos_penalty": beta}

        return fn

    # distilled systems first: their timings are the ones the targets compare
    for system, (run, _, swept) in sorted(systems.items(), key=lambda kv: "_distilled" not in kv[0]):
        deps = (f"train:{run}",)
        if swept and len(betas) > 1:
            sched.add(Job(f"sweep:{system}", sweep_job(system), deps))
            deps = deps + (f"sweep:{system}",)
        sched.add(Job(f"test128:{system}", test_job(system, 128), deps, exclusive=True))
        if system not in EXTRA_SYSTEMS:  # the extras are there for their BLEU
            sched.add(Job(f"test1:{system}", test_job(system, 1), deps, exclusive=True))

    def write(job: Job | None = None) -> None:
        with lock:
            collect(results, sched, systems, betas)
            results["wall_seconds"] = round(time.time() - started, 1)
            (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
            (out / "results.md").write_text(markdown(results))

    sched.on_done = write
    if "fairseq_nat_insertion" in systems or "fairseq_nat_insertion_distilled" in systems:
        results["notes"].append(probe_label_tau(data, out, size, device))
    sched.run()
    write()
    plotted = plot(results, out)
    if plotted:
        results["plot"] = plotted
        write()
    print((out / "results.md").read_text())
    return 1 if sched.failed else 0


def env_threads(n: int) -> None:
    """Threads for the fairseq commands a job starts (set per job thread's commands via the
    environment: every job of one kind uses the same value, so the race is harmless)."""
    os.environ["OMP_NUM_THREADS"] = str(n)


def collect(results: dict, sched: Scheduler, systems: dict, betas: list[float]) -> None:
    """Fill ``results`` from the finished jobs (called after every job)."""
    done = sched.done
    results["trainings"] = {n[6:]: j.result for n, j in done.items() if n.startswith("train:")}
    if "distill" in done:
        results["distillation"] = done["distill"].result
    results["failed"] = dict(sched.failed)
    rows = []
    for system, (run, _, _) in systems.items():
        train = done.get(f"train:{run}")
        t128, t1 = done.get(f"test128:{system}"), done.get(f"test1:{system}")
        sweep = done.get(f"sweep:{system}")
        r128 = t128.result if t128 else {}
        row = {
            "name": system,
            "data": "distilled" if "_distilled" in system else "raw",
            "bleu": r128.get("bleu"),
            "bleu_signature": r128.get("signature"),
            "mean_iterations": r128.get("mean_iterations"),
            "mean_log2_bound": r128.get("mean_log2_bound"),
            "mean_length": r128.get("mean_length"),
            "eos_penalty": r128.get("eos_penalty"),
            "valid_bleu_by_eos_penalty": sweep.result.get("valid_bleu_by_eos_penalty") if sweep else None,
            "decode_seconds_batch1": t1.result.get("decode_seconds") if t1 else None,
            "decode_seconds_batch128": r128.get("decode_seconds"),
            "train_target_tokens_per_s": train.result.get("train_target_tokens_per_s") if train else None,
            "command": r128.get("command"),
            "command_batch1": t1.result.get("command") if t1 else None,
            "train_command": train.result.get("command") if train else None,
        }
        rows.append(row)
    results["systems"] = rows
    add_ratios(results)


def add_ratios(results: dict) -> None:
    """Ratios against the baselines trained on the same data in this run, and the targets."""
    rows = results["systems"]
    by_name = {r["name"]: r for r in rows}
    for row in rows:
        suffix = "_distilled" if row["data"] == "distilled" else ""
        for peer, tag in (("ar_greedy", "ar_greedy"), ("fairseq_nat_insertion", "fairseq_nat")):
            other = by_name.get(peer + suffix, {})
            for key, ratio, inverse in (
                ("decode_seconds_batch1", f"decode_time_ratio_batch1_vs_{tag}", False),
                ("decode_seconds_batch128", f"decode_throughput_ratio_batch128_vs_{tag}", True),
                ("train_target_tokens_per_s", f"train_speed_ratio_vs_{tag}", False),
            ):
                a, b = row.get(key), other.get(key)
                row[ratio] = None if not a or not b else round((b / a) if inverse else (a / b), 3)
    results["systems"] = rows
    results["targets"] = targets(by_name, results["device"])


def targets(by_name: dict, device: str) -> list[dict]:
    """The performance targets (issue "Performance"), each from two rows of this run."""
    def get(name, key):
        return by_name.get(name, {}).get(key)

    def ratio(a, b, inverse=False):
        return None if not a or not b else round((b / a) if inverse else (a / b), 3)

    bt, btd = "insertion_binary_tree_parallel", "insertion_binary_tree_parallel_distilled"
    rows = [
        ("training target tokens/s, plugin / AR transformer", ">= 1.0", 1.0, True,
         ratio(get(bt, "train_target_tokens_per_s"), get("ar_greedy", "train_target_tokens_per_s"))),
        ("training target tokens/s, plugin / fairseq built-in insertion_transformer", ">= 1.2", 1.2, True,
         ratio(get(bt, "train_target_tokens_per_s"), get("fairseq_nat_insertion", "train_target_tokens_per_s"))),
        (f"decode time at batch 1 ({device}), plugin parallel / AR greedy (distilled)",
         "<= 0.4 (CPU)", 0.4, False,
         ratio(get(btd, "decode_seconds_batch1"), get("ar_greedy_distilled", "decode_seconds_batch1"))),
        ("decode throughput at batch 128, plugin parallel / AR greedy (distilled)",
         ">= 3.0 (GPU)" if device == "cuda" else ">= 1.0 (CPU)", 3.0 if device == "cuda" else 1.0, True,
         ratio(get(btd, "decode_seconds_batch128"), get("ar_greedy_distilled", "decode_seconds_batch128"), True)),
        ("decode throughput at batch 128, plugin parallel / fairseq built-in (distilled)", ">= 1.5", 1.5, True,
         ratio(get(btd, "decode_seconds_batch128"), get("fairseq_nat_insertion_distilled", "decode_seconds_batch128"),
               True)),
        ("mean parallel iterations - mean floor(log2 n)+1 (binary tree, distilled)", "<= 0.3", 0.3, False,
         None if get(btd, "mean_iterations") is None
         else round(get(btd, "mean_iterations") - get(btd, "mean_log2_bound"), 3)),
        ("test BLEU, plugin binary tree parallel / AR greedy (both distilled, same updates)", ">= 1.0", 1.0, True,
         ratio(get(btd, "bleu"), get("ar_greedy_distilled", "bleu"))),
        ("the same at equal training wall-clock time (not measured by this benchmark: every system trains the "
         "same number of updates)", ">= 1.0", 1.0, True, None),
        ("test BLEU, warm start from the teacher / cold start (binary tree parallel, distilled, same updates)",
         "reported (--extras)", 0.0, True, ratio(get(btd + "_warm_start", "bleu"), get(btd, "bleu"))),
    ]
    return [{"metric": m, "target": t, "value": v,
             "met": None if v is None else (v >= x if higher else v <= x)} for m, t, x, higher, v in rows]


def markdown(results: dict) -> str:
    def f(x, nd=2):
        return "n/a" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    lines = [
        f"Machine: {results['machine']} ({results['device']}); {results['updates']} updates per system; "
        f"{results['arch']}; max tokens {results['max_tokens']}; test set {results['test_set']}; "
        f"batch-1 timing on the first {results['batch1_sentences']} test sentences.",
        "",
        "| system | data | BLEU | EOS pen. | iterations | floor(log2 n)+1 | decode s, batch 1 | time vs AR greedy "
        "| decode s, batch 128 | throughput vs AR greedy | train tgt tok/s | vs AR |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["systems"]:
        lines.append(
            f"| {r['name']} | {r['data']} | {f(r['bleu'])} | {f(r['eos_penalty'], 0)} | {f(r['mean_iterations'])} "
            f"| {f(r['mean_log2_bound'])} | {f(r['decode_seconds_batch1'])} "
            f"| {f(r['decode_time_ratio_batch1_vs_ar_greedy'])} | {f(r['decode_seconds_batch128'])} "
            f"| {f(r['decode_throughput_ratio_batch128_vs_ar_greedy'])} | {f(r['train_target_tokens_per_s'], 0)} "
            f"| {f(r['train_speed_ratio_vs_ar_greedy'])} |"
        )
    if results.get("targets"):
        lines += ["", "| target (issue \"Performance\") | goal | measured | met |", "| --- | --- | --- | --- |"]
        for t in results["targets"]:
            met = "not measured" if t["met"] is None else ("yes" if t["met"] else "**no**")
            if t["target"].startswith("reported"):
                met = "-"
            lines.append(f"| {t['metric']} | {t['target']} | {f(t['value'], 3)} | {met} |")
    for note in results.get("notes", []):
        lines += ["", f"Note: {note}"]
    if results.get("failed"):
        lines += ["", "Failed steps: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in results["failed"].items())]
    return "\n".join(lines) + "\n"


def probe_label_tau(data: Path, out: Path, size: R.Size, device: str) -> str:
    """fairseq's own insertion_transformer with --label-tau: run 1 update and report the outcome."""
    save = out / "nat_label_tau_probe"
    for f in save.glob("checkpoint*.pt"):
        f.unlink()
    cmd = R.train_command(R.data_bin(data), save, "fairseq_nat", size, updates=1, device=device,
                          extra=["--label-tau", "1", "--no-save"])
    save.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (save / "train.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode == 0:
        return "fairseq's insertion_transformer trained with --label-tau 1 for 1 update without error."
    errors = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "Error" in ln]
    return (f"fairseq's insertion_transformer with --label-tau 1 fails (exit {proc.returncode}: "
            f"{errors[-1].strip() if errors else 'see log'}); its systems train without --label-tau.")


def plot(results: dict, out: Path) -> str | None:
    """Iterations against length for the best-scoring binary-tree parallel system."""
    rows = [r for r in results["systems"] if r["name"].startswith("insertion_binary_tree_parallel")
            and r["bleu"] is not None]
    if not rows:
        return None
    best = max(rows, key=lambda r: r["bleu"])
    gen = out / "decode" / best["name"] / "test.batch128.out"
    R.plot_iterations(gen, out / "iterations.png",
                      title=f"{best['name']} (test_2016_flickr, {results['updates']} updates)")
    return str(out / "iterations.png")


if __name__ == "__main__":
    sys.exit(main())
