"""From your fairseq Transformer to an Insertion Transformer: warm start, fine-tune on the
teacher's distillation, choose the decoding on valid, and score the test set beside the teacher.

    python -m benchmarks.from_teacher --teacher TEACHER.pt --data PREPARED --distilled DISTILLED_BIN --out OUT

``--data`` is ``examples/multi30k/prepare.py``'s output (its ``data-bin`` must be the teacher's
data, its ``raw`` the references); ``--distilled`` the teacher's distillation of the training set,
binarised with the same dictionary (``recipe.py distill`` makes one). Steps, each printing the
fairseq command it runs:

1. fine-tune (``--init-from-transformer``, slots started at the left neighbour) for ``--updates``,
   saving every ``--save-every`` updates; a finished OUT/train is reused;
2. average the last ``--average`` saved checkpoints (kept when better on valid);
3. on valid: the EOS penalty beta of parallel decoding; for the candidates (every beta of
   ``--candidates`` in one batch) the length penalty of the model's own score and of the
   teacher's (``--rerank-with``), BLEU and brevity penalty for each;
4. on test, each timed alone at batch 128 and at batch 1: the teacher (greedy, beam 5), the
   insertion model (parallel, the chosen beta) and the reranked candidates.

Writes OUT/results.json (the ``ar_*`` and ``insertion_*`` rows, the valid choices, commands and the
machine) and prints its table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path

import torch

from examples.multi30k import recipe as R

from .checks import missing_input
from .machine import run_info

KIT = Path(__file__).resolve().parent.parent.parent / "shared" / "models" / "multi30k-en-de-transformer-d256"


def train_command(args: argparse.Namespace, save: Path) -> list[str]:
    """The settled fine-tuning recipe: the teacher's optimiser, a short warmup and a linear decay to 0."""
    size = R.Size(args.layers, args.dim, args.heads, args.ffn)
    return [
        *R.fairseq_cli("train"), str(args.distilled), "--user-dir", str(R.PLUGIN), "--task", "insertion_translation",
        "--criterion", "insertion_loss", "--order", "binary_tree", "--tau", "1", "--termination", "slot",
        "--arch", "insertion_transformer", *size.args(), "--init-from-transformer", str(args.teacher),
        "--warm-start-slots", "left", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", str(args.lr),
        "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(args.warmup),
        "--total-num-update", str(args.updates), "--end-learning-rate", "0", "--power", "1",
        "--dropout", str(args.dropout), "--weight-decay", "0.0001", "--label-smoothing", str(args.label_smoothing),
        "--max-tokens", "4096", "--max-update", str(args.updates), "--seed", "1", *R.device_args(args.device),
        "--disable-validation", "--save-dir", str(save), "--save-interval-updates", str(args.save_every),
        "--keep-interval-updates", "-1", "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "50",
        *args.train_extra,
    ]  # fmt: skip


def interval_checkpoints(save: Path) -> list[tuple[int, Path]]:
    """fairseq's ``checkpoint_<epoch>_<updates>.pt`` files, by updates."""
    found = []
    for path in save.glob("checkpoint_*_*.pt"):
        match = re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def average(paths: list[Path], dest: Path) -> Path:
    """The element-wise mean of the checkpoints' model weights, saved with the last one's config."""
    import fairseq_insertion  # noqa: F401  registers the safe globals for torch's weights_only loader

    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    merged = dict(states[-1])
    merged["model"] = {k: sum(s["model"][k].float() for s in states).div(len(states)).to(v.dtype)
                       for k, v in states[-1]["model"].items()}
    merged["last_optimizer_state"] = None
    torch.save(merged, dest)
    return dest


def limits(args: argparse.Namespace) -> dict:
    return {"max_len_a": args.max_len_a, "max_len_b": args.max_len_b, "device": args.device}


def decode(args: argparse.Namespace, checkpoint: Path, name: str, subset: str = "valid", model: str = "insertion",
           batch: int = 128, **kwargs) -> dict:
    out = args.out / "decode" / name / f"{subset}.batch{batch}.out"
    head = args.batch1_sentences if batch == 1 and subset == "test" else None
    return R.decode(args.data, checkpoint, model, out, subset=subset, batch_size=batch, head=head, **limits(args),
                    **kwargs)


def summary(r: dict) -> dict:
    keys = ("bleu", "brevity_penalty", "mean_iterations", "mean_log2_bound", "iterations", "passes_per_batch",
            "mean_length")
    return {k: r[k] for k in keys if r.get(k) is not None}


def choose_checkpoint(args: argparse.Namespace, save: Path) -> tuple[Path, dict]:
    """The valid-BLEU curve (every saved checkpoint at ``--curve-beta``), the average of the last
    ``--average``, and the best of last/average by valid BLEU over the betas."""
    saved = interval_checkpoints(save)
    curve = {str(u): decode(args, p, f"curve{u}", eos_penalty=args.curve_beta)["bleu"] for u, p in saved}
    candidates = {"last": save / "checkpoint_last.pt"}
    if args.average > 1 and len(saved) >= args.average:
        candidates["average"] = average([p for _, p in saved[-args.average:]], save / "checkpoint_average.pt")
    sweeps = {name: {f"{b:g}": decode(args, path, f"{name}.beta{b:g}", eos_penalty=b)["bleu"] for b in args.betas}
              for name, path in candidates.items()}
    best = max(sweeps, key=lambda n: max(sweeps[n].values()))
    beta = max(args.betas, key=lambda b: sweeps[best][f"{b:g}"])
    return candidates[best], {"valid_bleu_by_update": curve, "curve_eos_penalty": args.curve_beta,
                              "valid_bleu_by_eos_penalty": sweeps, "checkpoint": best, "eos_penalty": beta,
                              "averaged": [str(p) for _, p in saved[-args.average:]] if "average" in candidates
                              else []}


def choose_lenpen(args: argparse.Namespace, checkpoint: Path) -> dict:
    """BLEU and brevity penalty on valid of the candidates chosen by the model's own score and by
    the teacher's, for every length penalty; the best of each."""
    found: dict[str, dict] = {"model": {}, "rerank": {}}
    for lenpen in args.lenpens:
        for scorer in found:
            rerank = {"rerank_with": args.teacher} if scorer == "rerank" else {}
            r = decode(args, checkpoint, f"candidates.{scorer}.lenpen{lenpen:g}", eos_penalties=args.candidates,
                       extra=["--lenpen", f"{lenpen:g}"], **rerank)
            found[scorer][f"{lenpen:g}"] = {"bleu": r["bleu"], "brevity_penalty": r["brevity_penalty"]}
    best = {s: float(max(v, key=lambda k: v[k]["bleu"])) for s, v in found.items()}
    return {"valid_by_lenpen": found, "lenpen": best}


def test_systems(args: argparse.Namespace, checkpoint: Path, beta: float, lenpen: dict) -> dict:
    """Each system on test at batch 128 and batch 1, one decode at a time."""
    cand = {"eos_penalties": args.candidates}
    systems = {
        "ar_greedy": (args.teacher, "transformer", {"beam": 1}),
        "ar_beam5": (args.teacher, "transformer", {"beam": 5}),
        "insertion_warm_distilled_parallel": (checkpoint, "insertion", {"eos_penalty": beta}),
        "insertion_warm_distilled_parallel_candidates": (
            checkpoint, "insertion", {**cand, "extra": ["--lenpen", f"{lenpen['model']:g}"]}),
        "insertion_warm_distilled_parallel_rerank": (
            checkpoint, "insertion", {**cand, "rerank_with": args.teacher,
                                      "extra": ["--lenpen", f"{lenpen['rerank']:g}"]}),
    }
    rows = {}
    for name, (path, model, kwargs) in systems.items():
        full = decode(args, path, name, "test", model, 128, **kwargs)
        one = decode(args, path, name, "test", model, 1, **kwargs)
        rows[name] = {**summary(full), "decode_seconds_batch128": full["decode_seconds"],
                      "decode_seconds_batch1": one["decode_seconds"], "batch1_sentences": one["sentences"],
                      "command_batch128": full["command"]}
    return rows


def table(rows: dict) -> str:
    lines = ["| system | test BLEU | BP | iterations / bound | batch 1 s | batch 128 s |", "| --- | --- | --- | --- | "
             "--- | --- |"]
    for name, r in rows.items():
        it = f"{r['mean_iterations']:.2f} / {r['mean_log2_bound']:.2f}" if r.get("mean_iterations") else ""
        lines.append(f"| {name} | {r['bleu']:.2f} | {r['brevity_penalty']:.3f} | {it} | "
                     f"{r['decode_seconds_batch1']:.1f} | {r['decode_seconds_batch128']:.1f} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.from_teacher", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--teacher", type=Path, default=KIT / "checkpoint.pt", help="a fairseq transformer checkpoint")
    p.add_argument("--data", type=Path, required=True, help="prepare.py's --out (data-bin, raw references)")
    p.add_argument("--distilled", type=Path, default=KIT / "distilled" / "data-bin",
                   help="the distilled training data-bin (same dictionary)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    g = p.add_argument_group("fine-tuning (the settled recipe)")
    g.add_argument("--updates", type=int, default=1800)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--warmup", type=int, default=300)
    g.add_argument("--dropout", type=float, default=0.3)
    g.add_argument("--label-smoothing", type=float, default=0.1)
    g.add_argument("--save-every", type=int, default=200, help="save a checkpoint every N updates")
    g.add_argument("--average", type=int, default=5, help="average the last N saved checkpoints (1: off)")
    g.add_argument("--layers", type=int, default=3)
    g.add_argument("--dim", type=int, default=256)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--ffn", type=int, default=1024)
    g.add_argument("--train-extra", nargs=argparse.REMAINDER, default=[],
                   help="further fairseq-train arguments (last on the command line)")
    g = p.add_argument_group("decoding")
    g.add_argument("--betas", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0, 4.0],
                   help="EOS penalties tried on valid (parallel decoding)")
    g.add_argument("--curve-beta", type=float, default=2.0, help="EOS penalty of the valid-BLEU-by-update curve")
    g.add_argument("--candidates", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0, 4.0],
                   help="EOS penalties decoded together as candidates")
    g.add_argument("--lenpens", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5, 2.0],
                   help="length penalties (fairseq's --lenpen) tried on valid for the candidates' scores")
    g.add_argument("--batch1-sentences", type=int, default=None, help="time batch 1 on the first N test lines")
    g.add_argument("--max-len-a", type=float, default=1.2)
    g.add_argument("--max-len-b", type=int, default=10)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.device = args.device or R.default_device()
    args.out = args.out.resolve()
    error = missing_input((("--teacher", args.teacher), ("--data", args.data / "data-bin"),
                           ("--distilled", args.distilled)))
    if error:
        print(error, file=sys.stderr)
        return 1
    save = args.out / "train"
    cmd = train_command(args, save)
    try:
        if not (save / "train.json").is_file():
            result = {"command": shlex.join(cmd), "wall_seconds": R.run(cmd, save / "train.log")}
            result.update(R.training_speed(save / "train.log"))
            (save / "train.json").write_text(json.dumps(result, indent=2))
        training = json.loads((save / "train.json").read_text())
        checkpoint, valid = choose_checkpoint(args, save)
        valid.update(choose_lenpen(args, checkpoint))
        rows = test_systems(args, checkpoint, valid["eos_penalty"], valid["lenpen"])
    except R.RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, row in rows.items():
        if name.startswith("insertion"):
            row["train_updates"] = training["train_updates"]
    size = R.Size(args.layers, args.dim, args.heads, args.ffn)
    results = {"arch": size.describe(), **run_info(args.device), "teacher": str(args.teacher),
               "training": training, "valid": valid, "systems": rows}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(table(rows))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
