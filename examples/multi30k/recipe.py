#!/usr/bin/env python3
"""The Multi30k recipe: train, distill, evaluate and plot, one sub-command each.

Run ``prepare.py`` first; every sub-command takes its output directory as ``--data``.
Run it as a module from the repository root (``python -m examples.multi30k.recipe``): it imports
``score.py`` as its package sibling, and the benchmark imports it as ``examples.multi30k.recipe``.
Each step prints the fairseq command it runs, so any step can be repeated by hand::

    python examples/multi30k/prepare.py --out work/data --raw-dir ../shared/data/multi30k
    # a fairseq autoregressive transformer of the same size (the distillation teacher)
    python -m examples.multi30k.recipe train --data work/data --model transformer --save-dir work/ar
    # distillation: beam-5 translations of the training set, binarised with the same dictionary
    python -m examples.multi30k.recipe distill --data work/data --teacher work/ar/checkpoint_last.pt
    # an Insertion Transformer on the distilled data (any order x termination)
    python -m examples.multi30k.recipe train --data work/data --distilled --order binary_tree --tau 1 \\
        --termination slot --save-dir work/bt
    # EOS penalty swept on valid, best one applied to test; detokenised sacreBLEU
    python -m examples.multi30k.recipe evaluate --data work/data --checkpoint work/bt/checkpoint_last.pt \\
        --decoding parallel --betas 0 1 2 3 4 5 6 7 --out work/bt/eval
    python -m examples.multi30k.recipe plot --generate-output work/bt/eval/test.out --png work/bt/iterations.png

``--device cuda`` (default: cuda when torch sees a GPU, else cpu) and ``--updates``
apply to every step. The benchmark (``python -m benchmarks.run``) is built from these functions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .score import parse_generate_output, read_reference, score

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PLUGIN = REPO / "fairseq_insertion"
SAFE_LOAD = HERE / "fairseq_safe_load"  # plain fairseq checkpoints under torch's weights_only loader

ORDERS = ("binary_tree", "uniform", "left_to_right")
TERMINATIONS = ("slot", "sequence")
MODELS = ("insertion", "transformer", "fairseq_nat")


class RecipeError(RuntimeError):
    """A user-facing error of the recipe (bad input, a failed fairseq command)."""


# ------------------------------------------------------------------ commands
def fairseq_cli(name: str) -> list[str]:
    """``fairseq-<name>`` next to the running interpreter, on PATH, or ``python -m fairseq_cli.<name>``."""
    local = Path(sys.executable).parent / f"fairseq-{name}"
    if local.is_file():
        return [str(local)]
    found = shutil.which(f"fairseq-{name}")
    return [found] if found else [sys.executable, "-m", f"fairseq_cli.{name}"]


@dataclass
class Size:
    """Encoder/decoder sizes shared by every system of a comparison (shared embeddings)."""

    layers: int = 3
    dim: int = 256
    heads: int = 4
    ffn: int = 1024

    def args(self) -> list[str]:
        return [
            "--encoder-layers", str(self.layers), "--decoder-layers", str(self.layers),
            "--encoder-embed-dim", str(self.dim), "--decoder-embed-dim", str(self.dim),
            "--encoder-ffn-embed-dim", str(self.ffn), "--decoder-ffn-embed-dim", str(self.ffn),
            "--encoder-attention-heads", str(self.heads), "--decoder-attention-heads", str(self.heads),
            "--share-all-embeddings",
        ]  # fmt: skip

    def describe(self) -> str:
        return f"{self.layers}+{self.layers} layers, d={self.dim}, {self.heads} heads, FFN {self.ffn}"


def device_args(device: str) -> list[str]:
    return ["--cpu"] if device == "cpu" else []


def default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def data_bin(data: Path, distilled: bool = False) -> Path:
    return data / ("data-bin-distilled" if distilled else "data-bin")


def train_command(
    data_dir: Path,
    save_dir: Path,
    model: str = "insertion",
    size: Size | None = None,
    updates: int = 1800,
    device: str = "cpu",
    order: str = "binary_tree",
    tau: float = 1.0,
    termination: str = "slot",
    max_tokens: int = 4096,
    seed: int = 1,
    warmup: int = 400,
    arch: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """One ``fairseq-train`` command; the optimiser and batch are identical for every model.
    ``arch``: a registered arch name, whose own sizes then replace ``size``."""
    size = size or Size()
    default_arch = {"insertion": "insertion_transformer", "transformer": "transformer",
                    "fairseq_nat": "insertion_transformer"}.get(model)
    sizes = size.args() if arch is None else ["--share-all-embeddings"]
    common = [
        str(data_dir), "--save-dir", str(save_dir), "--arch", arch or default_arch, *sizes,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(warmup), "--warmup-init-lr", "1e-7", "--clip-norm", "1.0", "--dropout", "0.1",
        "--weight-decay", "0.0001", "--label-smoothing", "0.1", "--max-tokens", str(max_tokens),
        "--max-update", str(updates), "--seed", str(seed), "--no-epoch-checkpoints", "--disable-validation",
        "--log-format", "json", "--log-interval", "50", *device_args(device),
    ]  # fmt: skip
    if model == "insertion":
        specific = [
            "--user-dir", str(PLUGIN), "--task", "insertion_translation",
            "--criterion", "insertion_loss", "--order", order, "--tau", str(tau), "--termination", termination,
        ]  # fmt: skip
    elif model == "transformer":
        specific = ["--task", "translation", "--criterion", "label_smoothed_cross_entropy"]
    elif model == "fairseq_nat":
        # fairseq's own NAT insertion_transformer (no --user-dir: the plugin would replace it);
        # its --label-tau crashes on current torch, so it trains with its default (uniform) targets
        specific = [
            "--task", "translation_lev", "--noise", "random_delete",
            "--criterion", "nat_loss", "--ddp-backend", "legacy_ddp",
        ]  # fmt: skip
    else:
        raise RecipeError(f"--model must be one of {MODELS}, got {model!r}")
    return [*fairseq_cli("train"), *specific, *common, *extra]


def generate_command(
    data_dir: Path,
    checkpoint: Path,
    model: str,
    subset: str = "test",
    decoding: str = "parallel",
    beam: int = 1,
    eos_penalty: float = 0.0,
    batch_size: int = 128,
    device: str = "cpu",
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    eos_penalties: Sequence[float] = (),
    rerank_with: Path | None = None,
    precision: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """One ``fairseq-generate`` command (outputs of at most ``max_len_a`` x source length +
    ``max_len_b`` tokens, the same limit for every model). Insertion models only:
    ``eos_penalties`` decodes every sentence under each (candidates), ``rerank_with`` chooses
    among them with that transformer checkpoint. ``precision``: the plugin's ``--decode-precision``
    (fp32, bf16, int8), for a transformer too (then decoded through the plugin's task, with
    fairseq's own generator). ``extra``: further fairseq-generate arguments."""
    cmd = [
        *fairseq_cli("generate"), str(data_dir), "--path", str(checkpoint), "--gen-subset", subset,
        "--batch-size", str(batch_size), "--required-batch-size-multiple", "1", "--post-process", "subword_nmt",
        "--max-len-a", f"{max_len_a:g}", "--max-len-b", str(max_len_b), *device_args(device),
    ]  # fmt: skip
    if model != "transformer":  # I- lines: decoding iterations (fairseq's sequence generator has none)
        cmd.append("--print-step")
    if model == "insertion":
        cmd += ["--user-dir", str(PLUGIN), "--task", "insertion_translation", "--decoding", decoding,
                "--eos-penalty", str(eos_penalty)]
        if eos_penalties:
            cmd += ["--eos-penalties", ",".join(f"{b:g}" for b in eos_penalties)]
        if rerank_with is not None:
            cmd += ["--rerank-with", str(rerank_with)]
    elif model == "transformer" and precision is not None:
        cmd += ["--user-dir", str(PLUGIN), "--task", "insertion_translation", "--beam", str(beam)]
    elif model == "transformer":
        cmd += ["--user-dir", str(SAFE_LOAD), "--task", "translation", "--beam", str(beam)]
    elif model == "fairseq_nat":
        cmd += ["--user-dir", str(SAFE_LOAD), "--task", "translation_lev", "--iter-decode-max-iter", "10",
                "--iter-decode-eos-penalty", str(eos_penalty), "--beam", "1"]
    else:
        raise RecipeError(f"unknown model {model!r}")
    if precision is not None:
        if model not in ("insertion", "transformer"):
            raise RecipeError(f"precision: insertion and transformer models only, not {model!r}")
        cmd += ["--decode-precision", precision]
    return cmd + [str(x) for x in extra]


def run(cmd: Sequence[str], log: Path, stdout: Path | None = None) -> float:
    """Run ``cmd`` with its output in ``log`` (stdout in ``stdout`` when given); return wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with log.open("w") as err, (stdout.open("w") if stdout else log.open("a")) as out:
        rc = subprocess.run(list(cmd), stdout=out, stderr=err, check=False).returncode
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise RecipeError(f"command failed (exit {rc}); log {log}:\n{tail}")
    return time.perf_counter() - start


# ------------------------------------------------------------------ training
def train(data_dir: Path, save_dir: Path, **kwargs) -> dict:
    """Train one model on a binarised ``data_dir``; returns the command and its training
    speed (target tokens/s)."""
    cmd = train_command(data_dir, save_dir, **kwargs)
    log = save_dir / "train.log"
    wall = run(cmd, log)
    if not (save_dir / "checkpoint_last.pt").is_file():
        raise RecipeError(f"training wrote no {save_dir / 'checkpoint_last.pt'}; log {log}")
    return {"command": shlex.join(cmd), "wall_seconds": wall, **training_speed(log)}


def training_speed(log: Path) -> dict:
    """Target tokens per second over the whole run, from fairseq's json epoch summaries:
    sum of target tokens (wpb x updates) over sum of training wall time."""
    tokens = wall = 0.0
    last = None
    for line in log.read_text(errors="replace").splitlines():
        if "{" not in line or '"train_wps"' not in line:
            continue
        stats = json.loads(line[line.index("{"):])
        updates = float(stats["train_num_updates"]) - (float(last["train_num_updates"]) if last else 0.0)
        tokens += float(stats["train_wpb"]) * updates
        wall += updates * float(stats["train_wpb"]) / max(float(stats["train_wps"]), 1e-9)
        last = stats
    if not wall:
        raise RecipeError(f"no training summary (train_wps) in {log}")
    return {"train_target_tokens_per_s": tokens / wall, "train_target_tokens": tokens,
            "train_updates": int(float(last["train_num_updates"]))}


# -------------------------------------------------------------- distillation
def distill(data: Path, teacher: Path, device: str = "cpu", beam: int = 5, max_tokens: int = 8192,
            out: Path | None = None, max_len_a: float = 1.2, max_len_b: int = 10) -> dict:
    """Sequence-level knowledge distillation (paper: "Knowledge Distillation"): the teacher's
    beam-``beam`` translations of the training set replace its targets; valid and test keep
    their references; the dictionary is the original one. Writes ``out`` (default
    ``DATA/data-bin-distilled``) and its work files beside it."""
    out = out or data_bin(data, True)
    work = out.parent / (out.name + ".work")
    gen_out = work / "train.generate"
    cmd = [
        *fairseq_cli("generate"), str(data_bin(data)), "--path", str(teacher), "--gen-subset", "train",
        "--user-dir", str(SAFE_LOAD), "--task", "translation", "--beam", str(beam), "--max-tokens", str(max_tokens),
        "--required-batch-size-multiple", "1", "--skip-invalid-size-inputs-valid-test",
        "--max-len-a", f"{max_len_a:g}", "--max-len-b", str(max_len_b),
        *device_args(device),
    ]  # fmt: skip
    wall = run(cmd, work / "train.generate.log", stdout=gen_out)
    hyps: dict[int, str] = {}
    for line in gen_out.read_text(encoding="utf-8").splitlines():
        if line.startswith("H-"):
            parts = line.split("\t")  # H-id, score, BPE text (no --post-process: BPE is kept)
            hyps.setdefault(int(parts[0][2:]), parts[2] if len(parts) > 2 else "")
    src = (data / "tok" / "train.src").read_text(encoding="utf-8").splitlines()
    ref = (data / "tok" / "train.tgt").read_text(encoding="utf-8").splitlines()
    # a sentence the teacher could not translate (skipped as too long) keeps its reference
    missing = [i for i in range(len(src)) if i not in hyps]
    if missing:
        print(f"distill: {len(missing)} training sentences kept their reference (teacher skipped them)",
              file=sys.stderr)
    tgt = [hyps.get(i, ref[i]) for i in range(len(src))]
    (work / "train.src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (work / "train.tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    pre = [
        *fairseq_cli("preprocess"), "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", str(work / "train"), "--validpref", str(data / "tok" / "valid"),
        "--testpref", str(data / "tok" / "test"), "--destdir", str(out),
        "--srcdict", str(data_bin(data) / "dict.src.txt"), "--tgtdict", str(data_bin(data) / "dict.tgt.txt"),
        "--workers", "2",
    ]  # fmt: skip
    run(pre, work / "preprocess.log")
    return {"command": shlex.join(cmd), "preprocess": shlex.join(pre), "decode_seconds": wall,
            "sentences": len(src), "kept_reference": len(missing)}


# ----------------------------------------------------------------- decoding
TIME_RE = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s")
PASSES_RE = re.compile(r"batched forward passes (\d+) \(([\d.]+) per batch")  # the plugin's summary line


def head_bin(data: Path, n: int) -> Path:
    """A data directory whose test split is the first ``n`` test sentences (same dictionary)."""
    dest = data / f"data-bin-test-head{n}"
    if (dest / "test.src-tgt.tgt.bin").is_file():
        return dest
    work = data / "tok" / f"test-head{n}"
    for side in ("src", "tgt"):
        lines = (data / "tok" / f"test.{side}").read_text(encoding="utf-8").splitlines()[:n]
        Path(f"{work}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cmd = [
        *fairseq_cli("preprocess"), "--source-lang", "src", "--target-lang", "tgt", "--testpref", str(work),
        "--destdir", str(dest), "--srcdict", str(data_bin(data) / "dict.src.txt"),
        "--tgtdict", str(data_bin(data) / "dict.tgt.txt"),
    ]  # fmt: skip
    run(cmd, data / f"preprocess-test-head{n}.log")
    return dest


def decode(data: Path, checkpoint: Path, model: str, out: Path, subset: str = "test", lang: str = "de",
           head: int | None = None, **kwargs) -> dict:
    """Translate ``subset`` (only its first ``head`` sentences when given) and score it against
    the raw references. Returns BLEU, iterations and fairseq's generation time."""
    refs = read_reference(data / "raw" / f"{subset}.tgt")
    data_dir = data_bin(data)
    if head is not None and head < len(refs):
        if subset != "test":
            raise RecipeError("head: test subset only")
        data_dir, refs = head_bin(data, head), refs[:head]
    cmd = generate_command(data_dir, checkpoint, model, subset=subset, **kwargs)
    run(cmd, out.with_suffix(".log"), stdout=out)
    gen = parse_generate_output(out)
    # P- lines: one score per output token plus </s>; fairseq's NAT models also score <s>
    specials = 2 if model == "fairseq_nat" else 1
    result = score(gen, refs, lang, p_specials=specials)
    if model == "transformer":  # one token per step: iterations = output length
        lengths = {i: max(0, n - 1) for i, n in gen.positional_scores.items()}
        result["mean_iterations"] = sum(lengths.values()) / max(len(lengths), 1)
    result["mean_length"] = sum(max(0, n - specials) for n in gen.positional_scores.values()) / max(len(refs), 1)
    text = out.with_suffix(".log").read_text(errors="replace") + out.read_text(errors="replace")
    passes = PASSES_RE.search(text)
    if passes:
        result["forward_passes"], result["passes_per_batch"] = int(passes.group(1)), float(passes.group(2))
    match = TIME_RE.search(text)
    if match is None:
        raise RecipeError(f"no 'Translated ... sentences' line from fairseq-generate in {out}")
    sentences, per_second = int(match.group(1).replace(",", "")), float(match.group(4))
    # seconds = sentences / (sentences/s): more digits than the printed "in X.Xs"
    result["decode_seconds"] = sentences / per_second if per_second > 0 else float(match.group(3))
    result["command"] = shlex.join(cmd)
    return result


def evaluate(data: Path, checkpoint: Path, model: str, out: Path, betas: Sequence[float] = (0.0,),
             **kwargs) -> dict:
    """EOS penalty (paper sweeps 0-7) chosen by BLEU on valid, then applied to test."""
    sweep = {}
    best = float(betas[0])
    if len(betas) > 1:
        for beta in betas:
            r = decode(data, checkpoint, model, out / f"valid.beta{beta:g}.out", subset="valid",
                       eos_penalty=float(beta), **kwargs)
            sweep[f"{beta:g}"] = r["bleu"]
        best = float(max(betas, key=lambda b: sweep[f"{b:g}"]))
    test = decode(data, checkpoint, model, out / "test.out", eos_penalty=best, **kwargs)
    return {**test, "eos_penalty": best, "valid_bleu_by_eos_penalty": sweep}


# --------------------------------------------------------------------- plot
def plot_iterations(generate_output: Path, png: Path, title: str = "") -> dict:
    """Decoding iterations against output length n per sentence, with the lines n and
    floor(log2 n)+1 (the paper's iterations-vs-length figure)."""
    import logging

    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt

    gen = parse_generate_output(generate_output)
    if not gen.iterations:
        raise RecipeError(f"{generate_output} has no I- lines (run fairseq-generate with --print-step)")
    ids = sorted(gen.iterations)
    n = [max(0, gen.positional_scores[i] - 1) for i in ids]
    it = [gen.iterations[i] for i in ids]
    top = max(n + [1])
    grid = list(range(1, top + 1))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.scatter(n, it, s=8, alpha=0.35, label="sentences")
    ax.plot(grid, grid, "k--", lw=1, label="n (left to right)")
    ax.step(grid, [g.bit_length() for g in grid], "r-", where="post", lw=1.2, label="floor(log2 n)+1")
    ax.set_xlabel("output length n (subword tokens)")
    ax.set_ylabel("decoding iterations")
    ax.set_ylim(0, max(it + [1]) + 2)
    ax.set_title(title or generate_output.name, fontsize=8)
    ax.legend(loc="upper left")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    over = sum(i - x.bit_length() for i, x in zip(it, n)) / len(ids)
    return {"png": str(png), "sentences": len(ids), "mean_iterations_minus_bound": over}


# ---------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="step", required=True)

    def common(p, data: bool = True):
        if data:
            p.add_argument("--data", type=Path, required=True, help="prepare.py's --out directory")
        p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")

    t = sub.add_parser("train", help="train one model")
    common(t)
    t.add_argument("--model", choices=MODELS, default="insertion")
    t.add_argument("--save-dir", type=Path, required=True)
    t.add_argument("--distilled", action="store_true", help="train on distill's output")
    t.add_argument("--order", choices=ORDERS, default="binary_tree")
    t.add_argument("--tau", type=float, default=1.0)
    t.add_argument("--termination", choices=TERMINATIONS, default="slot")
    t.add_argument("--updates", type=int, default=1800)
    t.add_argument("--arch", default=None,
                   help="a registered arch instead of the size flags (e.g. insertion_transformer_small)")
    t.add_argument("--layers", type=int, default=3)
    t.add_argument("--dim", type=int, default=256)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--ffn", type=int, default=1024)
    t.add_argument("--max-tokens", type=int, default=4096)
    t.add_argument("extra", nargs="*", help="further fairseq-train arguments (after --)")

    d = sub.add_parser("distill", help="decode the training set with a teacher and binarise it")
    common(d)
    d.add_argument("--teacher", type=Path, required=True, help="a fairseq transformer checkpoint")
    d.add_argument("--beam", type=int, default=5)

    e = sub.add_parser("evaluate", help="EOS-penalty sweep on valid, test BLEU with the best")
    common(e)
    e.add_argument("--checkpoint", type=Path, required=True)
    e.add_argument("--model", choices=MODELS, default="insertion")
    e.add_argument("--decoding", choices=("parallel", "greedy"), default="parallel")
    e.add_argument("--beam", type=int, default=1, help="transformer only")
    e.add_argument("--betas", type=float, nargs="+", default=[0.0])
    e.add_argument("--batch-size", type=int, default=128)
    e.add_argument("--lang", default="de")
    e.add_argument("--out", type=Path, required=True)

    p = sub.add_parser("plot", help="iterations against output length (PNG)")
    p.add_argument("--generate-output", type=Path, required=True, help="fairseq-generate output with --print-step")
    p.add_argument("--png", type=Path, required=True)
    p.add_argument("--title", default="")

    args = parser.parse_args(argv)
    device = getattr(args, "device", None) or default_device()
    try:
        if args.step == "train":
            extra = list(args.extra)
            size = Size(args.layers, args.dim, args.heads, args.ffn)
            result = train(data_bin(args.data, args.distilled), args.save_dir, model=args.model, size=size,
                           updates=args.updates, device=device, order=args.order, tau=args.tau,
                           termination=args.termination, max_tokens=args.max_tokens, arch=args.arch, extra=extra)
        elif args.step == "distill":
            result = distill(args.data, args.teacher, device, args.beam)
        elif args.step == "evaluate":
            result = evaluate(args.data, args.checkpoint, args.model, args.out, args.betas,
                              decoding=args.decoding, beam=args.beam, batch_size=args.batch_size,
                              device=device, lang=args.lang)
        else:
            result = plot_iterations(args.generate_output, args.png, args.title)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
