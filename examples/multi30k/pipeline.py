"""From raw Multi30k text to the headline insertion model, in one command.

    python -m examples.multi30k.recipe all --out OUT [--raw-dir RAW] [--from-teacher CKPT] [--device cuda]

Steps, each skipped when its output is in OUT (a killed run started again goes on from the first step not
finished; a training killed midway resumes from its own ``checkpoint_last.pt``):

1. ``data``: ``prepare.py`` (Moses tokenisation, joint BPE, ``fairseq-preprocess`` with one dictionary) into
   OUT/data; with ``--spm N``, a joint SentencePiece model of N pieces on the raw text instead of Moses and BPE;
2. ``teacher``: a fairseq Transformer (the teacher, the model the insertion model learns from) trained in two
   parts: ``--teacher-updates`` updates of an inverse-square-root schedule, then ``--anneal-updates`` more
   with the learning rate warmed up again over 100 updates and decayed linearly to 0 (annealed).
   ``--from-teacher CKPT`` skips this step and uses your own Transformer, trained on OUT/data's dictionaries;
3. ``insertion``: ``examples.warm_start`` with the teacher: its distillation (of its five beam-5 candidates for
   each training sentence, the one closest to the reference replaces the target), the insertion model
   initialised from the teacher's weights and trained ``--stage-updates`` updates, then ``--stages`` - 1
   further stages of as many updates each (the optimizer and schedule restarted), the EOS penalty (beta)
   of each stage chosen on valid (the smallest within 0.1 BLEU of the best), valid and test scored (BLEU against
   the references) beside the teacher's greedy and beam-5 translations;
4. ``closure``: a slot-closure head for the last stage's model (``examples.train_closure``: fewer vocabulary rows
   scored, its threshold chosen on valid; kept only when one keeps valid within 0.1 BLEU and 97% of its outputs);
5. ``export``: that model for the runtime (``fairseq_insertion.export``, ONNX, with the
   tokeniser and BPE record), checked by translating the first raw test sentences with it;
6. ``report``: OUT/report.md and OUT/report.json: BLEU and its ratio to the teacher, iterations against
   floor(log2 n)+1, each training's seconds per update, every command.

Progress: each step prints its name, the commands it runs and the log each writes (``tail -f`` it);
fairseq's own log gives a training's rate. The defaults are the recipe of the published results
(docs/results.md); the size flags (``--train-lines``, ``--layers``, ...) make a quick trial. A second run
into the same OUT must give the same flags (OUT/recipe.json records them).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .. import steps, warm_start
from ..commands import PLUGIN, RecipeError, Size, default_device, run, train_command
from ..generate_output import read_reference
from .prepare import PrepareError, prepare

PAIR = ("src", "tgt")
STEPS = ("data", "teacher", "insertion", "closure", "export", "report")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.multi30k.recipe all", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", type=Path, required=True, help="work and results directory (finished steps are kept)")
    p.add_argument("--raw-dir", type=Path, default=None, help="raw Multi30k *.gz files (default: download)")
    p.add_argument("--src", default="en", help="source language (default en)")
    p.add_argument("--tgt", default="de", help="target language (default de)")
    p.add_argument("--from-teacher", type=Path, default=None,
                   help="your own fairseq Transformer, trained on OUT/data/data-bin's dictionaries: no teacher step")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    g = p.add_argument_group("sizes (default: the published 3+3 layers, d=256)")
    g.add_argument("--train-lines", type=int, default=None, help="use the first N training lines")
    g.add_argument("--test-lines", type=int, default=None, help="use the first N valid and test lines")
    g.add_argument("--bpe-merges", type=int, default=8000, help="joint BPE merges (default 8000)")
    g.add_argument("--spm", type=int, default=None, metavar="VOCAB_SIZE",
                   help="a joint SentencePiece model of VOCAB_SIZE pieces on the raw text instead of Moses and BPE")
    g.add_argument("--layers", type=int, default=3, help="encoder and decoder layers (default 3)")
    g.add_argument("--dim", type=int, default=256, help="model dimension (default 256)")
    g.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    g.add_argument("--ffn", type=int, default=1024, help="feed-forward dimension (default 1024)")
    g.add_argument("--max-tokens", type=int, default=4096, help="tokens a batch (default 4096)")
    g = p.add_argument_group("schedule (default: the published one)")
    g.add_argument("--teacher-updates", type=int, default=1800, help="teacher, inverse square root (1800)")
    g.add_argument("--anneal-updates", type=int, default=1800, help="teacher, decayed to 0 after them (1800)")
    g.add_argument("--stage-updates", type=int, default=1800, help="updates an insertion stage (1800)")
    g.add_argument("--stages", type=int, default=4, help="insertion stages, the first from the teacher (4)")
    g.add_argument("--seeds", type=int, nargs="+", default=[13, 15, 16, 17], help="one seed a stage")
    g.add_argument("--betas", type=float, nargs="+", default=[2.0, 2.5, 3.0, 3.5, 4.0],
                   help="EOS penalties tried on valid (2 2.5 3 3.5 4)")
    g.add_argument("--check-lines", type=int, default=20, help="raw test lines the exported model translates (20)")
    return p


def check(args: argparse.Namespace) -> None:
    """Bad flags, named, before any work."""
    for name in ("teacher_updates", "anneal_updates", "stage_updates", "stages", "layers", "dim", "heads", "ffn",
                 "max_tokens", "check_lines", "train_lines", "test_lines", "bpe_merges", "spm"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise RecipeError(f"--{name.replace('_', '-')} {value}: give a positive number")
    if len(args.seeds) != args.stages:
        raise RecipeError(f"--seeds: {len(args.seeds)} seeds for {args.stages} stages (give one a stage)")
    if args.from_teacher is not None and not args.from_teacher.is_file():
        raise RecipeError(f"--from-teacher {args.from_teacher}: not found")
    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        raise RecipeError(f"the export step needs {' and '.join(missing)}: pip install -e \".[deploy]\"")


# the flags that decide what the steps make: a later run into the same OUT must give the same ones
RECORDED = ("src", "tgt", "train_lines", "test_lines", "bpe_merges", "spm", "from_teacher", "layers", "dim", "heads",
            "ffn", "max_tokens", "teacher_updates", "anneal_updates", "stage_updates", "stages", "seeds", "betas")


def same_flags(args: argparse.Namespace) -> None:
    """Record the flags in OUT/recipe.json; refuse a run whose flags differ from the recorded ones (its finished
    steps would be kept as they are), naming each."""
    record = args.out / "recipe.json"
    flags = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k in RECORDED}
    if record.is_file():
        before = json.loads(record.read_text())
        changed = [f"--{k.replace('_', '-')} {before.get(k)} -> {v}" for k, v in flags.items() if before.get(k) != v]
        if changed:
            raise RecipeError(f"{args.out} was made with other flags ({'; '.join(changed)}): give a new --out")
    else:
        record.write_text(json.dumps(flags, indent=2))


def step(name: str, done: Path, log: dict) -> bool:
    """Print the step's header; True when it is to run (its output ``done`` is not there)."""
    i = STEPS.index(name) + 1
    if done.exists():
        print(f"[{i}/{len(STEPS)}] {name}: done before ({done}), kept", file=sys.stderr, flush=True)
        return False
    print(f"[{i}/{len(STEPS)}] {name}: running", file=sys.stderr, flush=True)
    log.setdefault("started", {})[name] = time.time()
    return True


_UPDATES = re.compile(r'"num_updates": "(\d+)"')
_MAX_UPDATE = re.compile(r"max_update'?[:=] ?(\d+)")
_WALL = re.compile(r'"wall": "(\d+)"')


def training_progress(log: Path) -> str | None:
    """A fairseq-train log's progress in one line (update U of M, minutes left at its rate so far), or None
    before its first logged update."""
    text = log.read_text(errors="replace")
    total, updates, walls = _MAX_UPDATE.search(text), _UPDATES.findall(text), _WALL.findall(text)
    if total is None or not updates or int(updates[-1]) == 0:
        return None
    done, total_updates = int(updates[-1]), int(total.group(1))
    left = f", about {float(walls[-1]) / done * (total_updates - done) / 60:.0f} min left" if walls else ""
    return f"{log.parent.parent.name}/{log.parent.name}: update {done} of {total_updates}{left}"


@contextlib.contextmanager
def progress(out: Path, interval: float = 60.0) -> Iterator[None]:
    """While the block runs, every ``interval`` seconds: the progress of the training log under ``out``
    written last (when it changed since the last report)."""
    stop = threading.Event()

    def watch() -> None:
        last = None
        while not stop.wait(interval):
            logs = sorted(out.glob("**/train.log"), key=lambda p: p.stat().st_mtime)
            line = training_progress(logs[-1]) if logs else None
            if line and line != last:
                print(f"  {line}", file=sys.stderr, flush=True)
                last = line

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def data_step(args: argparse.Namespace, data: Path, log: dict) -> None:
    if step("data", data / "data-bin" / "dict.src.txt", log):
        try:
            prepare(data, args.raw_dir, src=args.src, tgt=args.tgt, bpe_merges=args.bpe_merges,
                    train_lines=args.train_lines, test_lines=args.test_lines, spm=args.spm)
        except PrepareError as exc:
            raise RecipeError(str(exc)) from exc


def teacher_step(args: argparse.Namespace, data_bin: Path) -> tuple[Path, list[dict]]:
    """The teacher's checkpoint and its trainings (none with --from-teacher)."""
    if args.from_teacher is not None:
        step("teacher", args.from_teacher, {})
        return args.from_teacher, []
    size = Size(args.layers, args.dim, args.heads, args.ffn)
    common = dict(model="transformer", size=size, device=args.device, max_tokens=args.max_tokens, dropout=0.3,
                  label_smoothing=0.1, clip_norm=None)
    first, annealed = args.out / "teacher" / "inverse_sqrt", args.out / "teacher" / "annealed"
    parts = [
        (first, train_command(data_bin, first, updates=args.teacher_updates, seed=1, lr=1e-3, warmup=500,
                              extra=["--user-dir", str(PLUGIN), "--save-interval-updates", "300",
                                     "--keep-interval-updates", "1"], **common)),
        (annealed, train_command(data_bin, annealed, updates=args.anneal_updates, seed=12, lr=5e-4, warmup=100,
                                 linear_decay=True, **common,
                                 extra=["--user-dir", str(PLUGIN), "--save-interval-updates", "300",
                                        "--keep-interval-updates", "1",
                                        "--finetune-from-model", first / "checkpoint_last.pt"])),
    ]
    trainings = []
    for i, (save, cmd) in enumerate(parts):
        marker = save / "train.json"
        if step("teacher", marker, {}):
            print(f"  {'first part' if i == 0 else 'annealed part'}: log {save / 'train.log'}", file=sys.stderr)
            save.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps(steps.train(cmd, save), indent=2))
        trainings.append(json.loads(marker.read_text()))
    return annealed / "checkpoint_last.pt", trainings


def scoring(args: argparse.Namespace) -> tuple[str | None, str]:
    """How outputs become text for BLEU: (the Moses detokeniser's language, None for none; fairseq's
    ``--post-process``): BPE joins undone and Moses-detokenised, or with ``--spm`` SentencePiece's alone."""
    return (None, "sentencepiece") if args.spm else (args.tgt, "subword_nmt")


def insertion_step(args: argparse.Namespace, data: Path, teacher: Path) -> dict:
    out = args.out / "insertion"
    if step("insertion", out / "results.json", {}):
        argv = ["--teacher", str(teacher), "--data-bin", str(data / "data-bin"),
                "--valid-ref", str(data / "raw" / "valid.tgt"), "--test-ref", str(data / "raw" / "test.tgt"),
                "--lang", scoring(args)[0] or "none", "--post-process", scoring(args)[1], "--out", str(out),
                "--device", args.device,
                "--updates", str(args.stage_updates), "--lr", "1e-3", "--warmup", str(min(300, args.stage_updates)),
                "--save-every", "300", "--average", "1", "--betas", *map(str, args.betas),
                "--curve-beta", str(args.betas[0]), "--candidates", *map(str, args.betas), "--lenpens", "2",
                "--batch1-sentences", "100", "--distill-select", "closest",
                *(["--continue-stages", str(args.stages - 1), "--continue-updates", str(args.stage_updates),
                   "--continue-lr", "5e-4", "--continue-warmup", str(min(100, args.stage_updates)),
                   "--continue-seeds", *map(str, args.seeds[1:])] if args.stages > 1 else []),
                "--train-extra", "--seed", str(args.seeds[0]), "--max-tokens", str(args.max_tokens)]
        print(f"  python -m examples.warm_start {shlex.join(argv)}", file=sys.stderr, flush=True)
        if warm_start.main(argv) != 0:
            raise RecipeError(f"the insertion step failed; its work is in {out}")
    return json.loads((out / "results.json").read_text())


def closure_step(args: argparse.Namespace, data: Path, results: dict) -> dict:
    """The last stage's model with a slot-closure head (``checkpoint``), or without one (``checkpoint`` the model's
    own, ``kept`` false) when no threshold qualifies; made again when the model changed."""
    marker, model = args.out / "closure.json", Path(results["checkpoint"])
    made = json.loads(marker.read_text()) if marker.is_file() else {}
    if made.get("model_mtime_ns") != model.stat().st_mtime_ns:
        marker.unlink(missing_ok=True)
    if step("closure", marker, {}):
        out, summary = args.out / "closure" / "checkpoint.pt", args.out / "closure" / "summary.json"
        cmd = [sys.executable, "-m", "examples.train_closure", "--path", str(model), "--data", str(data / "data-bin"),
               "--out", str(out), "--eos-penalty", f"{results['eos_penalty']:g}", "--block-neighbour-copies",
               "--no-repeat-ngram-size", "3", "--post-process", scoring(args)[1], "--summary", str(summary)]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        run(cmd, args.out / "closure.log", codes=(0, 3))  # 3: no threshold qualified, no head written
        kept = out.is_file()
        if not kept:
            print(f"  no threshold kept valid's BLEU and outputs: the model is exported without a head "
                  f"({args.out / 'closure.log'})", file=sys.stderr, flush=True)
        marker.write_text(json.dumps({"command": shlex.join(cmd), "kept": kept,
                                      "checkpoint": str(out if kept else model),
                                      "model_mtime_ns": model.stat().st_mtime_ns,
                                      **json.loads(summary.read_text())}, indent=2))
    return json.loads(marker.read_text())


def export_step(args: argparse.Namespace, data: Path, results: dict, closure: dict) -> dict:
    out = args.out / "export"
    marker = args.out / "export.json"
    if marker.is_file() and json.loads(marker.read_text()).get("path") != closure["checkpoint"]:
        marker.unlink()  # made from another model
    if step("export", marker, {}):
        cmd = [sys.executable, "-m", "fairseq_insertion.export", "--path", closure["checkpoint"], "--data",
               str(data / "data-bin"), "--out", str(out), "--eos-penalty", f"{results['eos_penalty']:g}",
               "--block-neighbour-copies", "--no-repeat-ngram-size", "3"]
        wall = run(cmd, args.out / "export.log")
        lines = read_reference(data / "raw" / "test.src")[:args.check_lines]
        source = args.out / "export.check.src"
        source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        translate = [sys.executable, "-m", "fairseq_insertion.runtime", "translate", str(out), "--tokenizer",
                     "none" if args.spm else "moses"]
        run(translate, args.out / "export.check.log", stdout=args.out / "export.check.out", stdin=source)
        outputs = (args.out / "export.check.out").read_text(encoding="utf-8").splitlines()
        if len(outputs) != len(lines):
            raise RecipeError(f"the exported model translated {len(outputs)} of {len(lines)} lines; "
                              f"see {args.out / 'export.check.log'}")
        marker.write_text(json.dumps({"command": shlex.join(cmd), "path": closure["checkpoint"], "seconds": wall,
                                      "check_command": shlex.join(
            translate), "check_lines": len(lines), "first_translation": outputs[0] if outputs else ""}, indent=2))
    return json.loads(marker.read_text())


def per_update(training: dict) -> dict:
    """A training's time: its updates at fairseq's logged speed (target tokens over target tokens a second), which
    a training resumed after an interruption keeps (its wall seconds are the last run's)."""
    updates = training.get("train_updates") or 0
    speed = training.get("train_target_tokens_per_s")
    seconds = training["train_target_tokens"] / speed if speed else training["wall_seconds"]
    return {"updates": updates, "seconds": round(seconds, 1), "wall_seconds": round(training["wall_seconds"], 1),
            "seconds_per_update": round(seconds / updates, 3) if updates else None,
            "target_tokens_per_s": round(training.get("train_target_tokens_per_s", 0.0), 1),
            "command": training["command"]}


def teacher_valid(args: argparse.Namespace, data: Path, teacher: Path) -> float:
    """The teacher's greedy BLEU on valid (kept in OUT/teacher_valid.json)."""
    marker = args.out / "teacher_valid.json"
    if not marker.is_file():
        lang, post_process = scoring(args)
        r = steps.decode(data / "data-bin", teacher, args.out / "decode" / "teacher.valid.out",
                         read_reference(data / "raw" / "valid.tgt"), lang, "transformer", "valid", beam=1,
                         device=args.device, post_process=post_process)
        marker.write_text(json.dumps({"bleu": r["bleu"], "command": r["command"]}, indent=2))
    return json.loads(marker.read_text())["bleu"]


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def report(args: argparse.Namespace, teacher_trainings: list[dict], results: dict, closure: dict, export: dict,
           valid_greedy: float) -> dict:
    systems = results["systems"]
    greedy, beam = systems["ar_greedy"], systems["ar_beam5"]
    insertion = systems["insertion_warm_distilled_parallel"]
    reranked = systems["insertion_warm_distilled_parallel_rerank"]
    stages = results.get("stages") or []
    trainings = [("teacher, inverse square root", t) for t in teacher_trainings[:1]] + [
        ("teacher, annealed", t) for t in teacher_trainings[1:]] + [
        ("insertion stage 1 (from the teacher)", results["training"])] + [
        (f"insertion stage {s['stage'] + 1}", s["training"]) for s in stages]
    rows = {
        "teacher_greedy": {"test_bleu": greedy["bleu"]},
        "teacher_beam5": {"test_bleu": beam["bleu"]},
        "teacher_greedy_valid": {"valid_bleu": valid_greedy},
        "insertion_parallel": {
            "test_bleu": insertion["bleu"], "x_teacher_greedy": ratio(insertion["bleu"], greedy["bleu"]),
            "eos_penalty": results["eos_penalty"],
            "mean_iterations": insertion.get("mean_iterations"), "mean_log2_bound": insertion.get("mean_log2_bound")},
        "insertion_candidates_reranked": {"test_bleu": reranked["bleu"],
                                          "x_teacher_beam5": ratio(reranked["bleu"], beam["bleu"])},
    }
    first = results.get("valid") or {}
    sweep = (first.get("valid_bleu_by_eos_penalty") or {}).get(first.get("checkpoint", "last"), {})
    valid = [{"stage": 1, "eos_penalty": first["eos_penalty"], "valid_bleu": sweep[f"{first['eos_penalty']:g}"],
              "test_bleu": None}] if sweep else []
    valid += [{"stage": s["stage"] + 1, "eos_penalty": s["eos_penalty"],
              "valid_bleu": s["valid_bleu_by_eos_penalty"][f"{s['eos_penalty']:g}"], "test_bleu": s["test"]["bleu"]}
              for s in stages]
    last_valid = valid[-1]["valid_bleu"] if valid else None
    rows["insertion_parallel"].update(valid_bleu=last_valid,
                                      x_teacher_greedy_valid=ratio(last_valid or 0, valid_greedy))
    out = {**steps.run_info(args.device),
           "command": shlex.join([sys.executable, "-m", "examples.multi30k.recipe", "all", *args.argv]),
           "arch": results["arch"], "results": rows, "stages": valid,
           "trainings": [{"what": what, **per_update(t)} for what, t in trainings],
           "closure": closure, "export": export, "insertion_results": str(args.out / "insertion" / "results.json")}
    (args.out / "report.json").write_text(json.dumps(out, indent=2))
    md = ["# From raw text to the insertion model", "", f"Machine: {out['machine']}; {out['arch']}.", "",
          "| system | test BLEU | ratio | iterations (floor(log2 n)+1) |", "| --- | --- | --- | --- |",
          f"| teacher, greedy | {greedy['bleu']:.2f} | 1.000 | |",
          f"| teacher, beam 5 | {beam['bleu']:.2f} | | |",
          f"| insertion, one parallel decode, beta {results['eos_penalty']:g} | {insertion['bleu']:.2f} | "
          f"{rows['insertion_parallel']['x_teacher_greedy']} x greedy | "
          f"{insertion.get('mean_iterations', 0):.2f} ({insertion.get('mean_log2_bound', 0):.2f}) |",
          f"| insertion, candidates chosen by the teacher | {reranked['bleu']:.2f} | "
          f"{rows['insertion_candidates_reranked']['x_teacher_beam5']} x beam 5 | |", "",
          "| stage | beta | valid BLEU | test BLEU |", "| --- | --- | --- | --- |",
          *[f"| {v['stage']} | {v['eos_penalty']:g} | {v['valid_bleu']:.2f} | "
            f"{'' if v['test_bleu'] is None else format(v['test_bleu'], '.2f')} |" for v in valid],
          f"| teacher, greedy | | {valid_greedy:.2f} | {greedy['bleu']:.2f} |",
          "", "| training | updates | seconds | seconds per update |", "| --- | --- | --- | --- |",
          *[f"| {t['what']} | {t['updates']} | {t['seconds']} | {t['seconds_per_update']} |"
            for t in out["trainings"]],
          "", closure_line(closure),
          "", "Commands:", "", "```", *[t["command"] for t in out["trainings"]], closure["command"], export["command"],
          "```", ""]
    (args.out / "report.md").write_text("\n".join(md))
    return out


def closure_line(closure: dict) -> str:
    """The report's sentence on the slot-closure head: its threshold and what it changed on valid."""
    sweep = {s["threshold"]: s for s in closure.get("sweep", [])}
    if not closure["kept"] or closure["threshold"] not in sweep:
        return "Slot-closure head: none (no threshold kept valid within 0.1 BLEU and 97% of its outputs)."
    s = sweep[closure["threshold"]]
    return (f"Slot-closure head: threshold {closure['threshold']}; on valid, BLEU {s['valid_bleu']:.2f} "
            f"(without it {closure['valid_bleu_plain']:.2f}, tokenised), {s['outputs_equal']:.1%} of the outputs "
            f"unchanged, {s['vocabulary_rows_per_token']:.2f} vocabulary rows scored per output token.")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # the report's command
    args.device = args.device or default_device()
    args.out = args.out.resolve()
    data = args.out / "data"
    try:
        check(args)
        args.out.mkdir(parents=True, exist_ok=True)
        same_flags(args)
    except (RecipeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with progress(args.out):
        return run_steps(args, data)


def run_steps(args: argparse.Namespace, data: Path) -> int:
    try:
        data_step(args, data, {})
        teacher, trainings = teacher_step(args, data / "data-bin")
        results = insertion_step(args, data, teacher)
        closure = closure_step(args, data, results)
        export = export_step(args, data, results, closure)
        print(f"[{len(STEPS)}/{len(STEPS)}] report", file=sys.stderr, flush=True)
        out = report(args, trainings, results, closure, export, teacher_valid(args, data, teacher))
    except (RecipeError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print((args.out / "report.md").read_text())
    print(f"report: {args.out / 'report.md'} and report.json; {out['insertion_results']}")
    return 0
