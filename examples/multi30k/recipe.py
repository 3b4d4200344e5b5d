#!/usr/bin/env python3
"""The Multi30k recipe: train, distill, evaluate and plot, one sub-command each.

Run ``prepare.py`` first; every sub-command takes its output directory as ``--data``.
Run it as a module from the repository root (``python -m examples.multi30k.recipe``). The fairseq
commands come from ``examples/commands.py``, the steps from ``examples/steps.py`` (any data-bin);
this file adds the layout ``prepare.py`` writes. Each step prints the fairseq command it runs, so any
step can be repeated by hand::

    python examples/multi30k/prepare.py --out work/data --raw-dir RAW
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
apply to every step. ``python -m examples.multi30k.systems`` trains every model the benchmark measures
with these functions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import steps
from ..commands import MODELS, RecipeError, Size, default_device, train_command
from ..generate_output import read_reference
from ..steps import plot_iterations

ORDERS = ("binary_tree", "uniform", "left_to_right")
TERMINATIONS = ("slot", "sequence")
PAIR = ("src", "tgt")  # prepare.py's language names in data-bin


def data_bin(data: Path, distilled: bool = False) -> Path:
    return data / ("data-bin-distilled" if distilled else "data-bin")


def train(data_dir: Path, save_dir: Path, **kwargs) -> dict:
    """Train one model on a binarised ``data_dir`` (``commands.train_command``'s keyword arguments);
    returns the command and its training speed (target tokens/s)."""
    return steps.train(train_command(data_dir, save_dir, **kwargs), save_dir)


def distill(data: Path, teacher: Path, device: str = "cpu", beam: int = 5, out: Path | None = None,
            max_len_a: float = 1.2, max_len_b: int = 10) -> dict:
    """The teacher's beam-``beam`` translations of the training set, binarised with the same
    dictionary into ``out`` (default ``DATA/data-bin-distilled``)."""
    return steps.distill(data_bin(data), teacher, out or data_bin(data, True), device=device, beam=beam,
                         max_len_a=max_len_a, max_len_b=max_len_b, pair=PAIR)


def decode(data: Path, checkpoint: Path, model: str, out: Path, subset: str = "test", lang: str = "de",
           head: int | None = None, **kwargs) -> dict:
    """Translate ``subset`` (its first ``head`` sentences when given) and score it against the raw
    references ``DATA/raw/<subset>.tgt``: BLEU, iterations and fairseq's generation seconds."""
    refs = read_reference(data / "raw" / f"{subset}.tgt")
    return steps.decode(data_bin(data), checkpoint, out, refs, lang, model, subset, head, **kwargs)


def evaluate(data: Path, checkpoint: Path, model: str, out: Path, betas: Sequence[float] = (0.0,),
             **kwargs) -> dict:
    """EOS penalty (paper sweeps 0-7) chosen by BLEU on valid, then applied to test."""
    best, sweep = float(betas[0]), {}
    if len(betas) > 1:
        best, sweep = steps.choose_eos_penalty(betas, lambda b: decode(
            data, checkpoint, model, out / f"valid.beta{b:g}.out", subset="valid", eos_penalty=b, **kwargs)["bleu"])
    test = decode(data, checkpoint, model, out / "test.out", eos_penalty=best, **kwargs)
    return {**test, "eos_penalty": best, "valid_bleu_by_eos_penalty": sweep}


# ---------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["all"]:  # raw text to the scored, exported insertion model: examples/multi30k/pipeline.py
        from . import pipeline

        return pipeline.main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("all", help="raw text to the scored, exported insertion model (python -m "
                   "examples.multi30k.recipe all --help)", add_help=False)

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
