"""Score one insertion checkpoint as the results files do: parallel decoding at each EOS penalty on valid
and test, and the first insertions chosen by a teacher on test.

    python -m examples.score_model --checkpoint CKPT --data-bin DATA --valid-ref VALID.REF \\
        --test-ref TEST.REF --lang LANG --out OUT [--betas 3 3.5 4] \\
        [--first-insertions 2:0.25 5:0.5 --rerank-with TEACHER.pt --lenpen 2]

Every decode is fairseq-generate at batch 128 with the repetition rules (``examples/commands.py``),
detokenised sacreBLEU against the raw references. ``--first-insertions K:W`` decodes each test sentence
from its K best first insertions and lets ``--rerank-with`` choose with ``--rerank-weight`` W, at the EOS
penalty the recipes' rule picks on valid (``examples.steps.choose_eos_penalty``). Writes OUT/scores.json
(``scores``: subset, beta, BLEU, brevity penalty, iterations; ``first_insertions``; the chosen beta and
each command) and prints a table; a decode whose output is in OUT is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import steps
from .commands import RecipeError
from .generate_output import ScoreError, read_reference


def first_insertions(value: str) -> tuple[int, float]:
    """``K:W``: K first insertions, the teacher's rerank weight W."""
    try:
        k, w = value.split(":")
        return int(k), float(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give K:WEIGHT, e.g. 5:0.5") from None


def row(subset: str, beta: float, r: dict) -> dict:
    it = r.get("iterations") or {}
    return {"subset": subset, "beta": beta, "bleu": round(r["bleu"], 2), "brevity_penalty": r["brevity_penalty"],
            "length_ratio": r["length_ratio"], "mean_length": r["mean_length"], "mean_iterations": r["mean_iterations"],
            "mean_log2_bound": r["mean_log2_bound"], "over_2x_bound_plus_2": it.get("over_2x_bound_plus_2"),
            "mean_over_bound": it.get("mean_over_bound"), "sig": r["signature"], "command": r["command"]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.score_model", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--checkpoint", type=Path, required=True, help="an insertion model's checkpoint")
    p.add_argument("--data-bin", type=Path, required=True, help="its fairseq-preprocess directory (valid, test)")
    p.add_argument("--valid-ref", type=Path, required=True, help="raw references of the valid set")
    p.add_argument("--test-ref", type=Path, required=True, help="raw references of the test set")
    p.add_argument("--lang", required=True, help="target language of the Moses detokeniser, or 'none'")
    p.add_argument("--out", type=Path, required=True, help="outputs and scores.json")
    p.add_argument("--betas", type=float, nargs="+", default=[3.0, 3.5, 4.0], help="EOS penalties (3 3.5 4)")
    p.add_argument("--first-insertions", type=first_insertions, nargs="*", default=[],
                   help="K:WEIGHT pairs: K first insertions reranked by --rerank-with at weight WEIGHT")
    p.add_argument("--rerank-with", type=Path, default=None, help="the teacher (a fairseq Transformer)")
    p.add_argument("--lenpen", type=float, default=2.0, help="length penalty of the candidates (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for flag in ("checkpoint", "data_bin", "valid_ref", "test_ref", "rerank_with"):
            path = getattr(args, flag)
            if path is not None and not path.exists():
                raise RecipeError(f"--{flag.replace('_', '-')} {path}: not found")
        if args.first_insertions and args.rerank_with is None:
            raise RecipeError("--first-insertions needs --rerank-with (the teacher that chooses)")
        refs = {s: read_reference(p) for s, p in (("valid", args.valid_ref), ("test", args.test_ref))}
        lang = None if args.lang == "none" else args.lang

        def decode(subset: str, name: str, beta: float, **kwargs) -> dict:
            return steps.decode(args.data_bin, args.checkpoint, args.out / name / f"{subset}.out", refs[subset], lang,
                                "insertion", subset, eos_penalty=beta, device=args.device, max_len_a=1.2,
                                max_len_b=10, **kwargs)

        scores = [row(s, b, decode(s, f"beta{b:g}", b)) for s in ("valid", "test") for b in args.betas]
        beta, _ = steps.choose_eos_penalty(args.betas, {r["beta"]: r["bleu"] for r in scores
                                                        if r["subset"] == "valid"}.__getitem__)
        firsts = []
        for k, weight in args.first_insertions:
            extra = ["--first-insertions", str(k), "--lenpen", f"{args.lenpen:g}", "--rerank-weight", f"{weight:g}"]
            r = decode("test", f"first{k}.w{weight:g}.beta{beta:g}", beta, rerank_with=args.rerank_with, extra=extra)
            firsts.append({**row("test", beta, r), "first_insertions": k, "rerank_weight": weight,
                           "lenpen": args.lenpen})
    except (RecipeError, ScoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    result = {"checkpoint": str(args.checkpoint), "eos_penalty": beta, "scores": scores, "first_insertions": firsts,
              **steps.run_info(args.device)}
    (args.out / "scores.json").write_text(json.dumps(result, indent=1))
    print("| subset | beta | BLEU | BP | length ratio | iterations over bound | first insertions |")
    print("| --- " * 7 + "|")
    for r in scores + firsts:
        print(f"| {r['subset']} | {r['beta']:g} | {r['bleu']:.2f} | {r['brevity_penalty']:.3f} | "
              f"{r['length_ratio']:.3f} | {r['mean_over_bound'] or 0:+.2f} | {r.get('first_insertions', '')} |")
    print(f"beta by the rule on valid: {beta:g}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
