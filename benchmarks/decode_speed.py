"""Decoding speed of an insertion model against its autoregressive teacher, like with like:
both decoded by ``fairseq-generate`` through the plugin's task at the same ``--decode-precision``
(the teacher with fairseq's own greedy search), one decode at a time, at batch 128 (the whole
test set) and batch 1.

    python -m benchmarks.decode_speed --insertion CKPT --teacher TEACHER.pt --data PREPARED --out OUT \\
        --eos-penalty 3 --precisions fp32 int8 bf16

``--data`` is ``examples/multi30k/prepare.py``'s output (``data-bin`` with the teacher's dictionary,
``raw`` references). Times are fairseq-generate's own (``Translated ... sentences in X s``: the
decoding steps, not the model loading). For each precision it reports BLEU and:

* ``batch1_time_ratio``: insertion seconds / AR seconds at batch 1 (lower is better);
* ``batch128_throughput_ratio``: AR seconds / insertion seconds at batch 128 (higher is better).

Writes OUT/results.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from examples.multi30k import recipe as R

from .checks import missing_input
from .machine import run_info

KIT = Path(__file__).resolve().parent.parent.parent / "shared" / "models" / "multi30k-en-de-transformer-d256"
KEYS = ("bleu", "brevity_penalty", "mean_iterations", "mean_log2_bound", "passes_per_batch", "forward_passes",
        "mean_length", "sentences")


def systems(args: argparse.Namespace) -> dict[str, tuple[Path, str, dict]]:
    return {
        "ar_greedy": (args.teacher, "transformer", {"beam": 1}),
        "insertion_parallel": (args.insertion, "insertion", {"eos_penalty": args.eos_penalty,
                                                             "extra": args.insertion_extra}),
    }


def measure(args: argparse.Namespace, precision: str) -> dict:
    """Every system at batch 128 then batch 1, at ``precision``; the ratios."""
    rows: dict[str, dict] = {}
    for name, (path, model, kwargs) in systems(args).items():
        for batch in args.batch_sizes:
            out = args.out / precision / f"{name}.batch{batch}.out"
            head = args.batch1_sentences if batch == 1 else None
            r = R.decode(args.data, path, model, out, subset="test", batch_size=batch, head=head,
                         max_len_a=args.max_len_a, max_len_b=args.max_len_b, device=args.device,
                         precision=precision, **{**kwargs, "extra": [*kwargs.get("extra", []), *args.extra]})
            rows.setdefault(name, {})[f"batch{batch}"] = {
                **{k: r[k] for k in KEYS if r.get(k) is not None}, "decode_seconds": r["decode_seconds"],
                "command": r["command"]}
    ar, ins = rows["ar_greedy"], rows["insertion_parallel"]
    ratios = {}
    for batch in args.batch_sizes:
        a, i = ar[f"batch{batch}"]["decode_seconds"], ins[f"batch{batch}"]["decode_seconds"]
        if batch == 1:
            ratios["batch1_time_ratio"] = i / a
        else:
            ratios[f"batch{batch}_throughput_ratio"] = a / i
    return {"systems": rows, "ratios": ratios}


def table(results: dict) -> str:
    lines = ["| precision | system | test BLEU | batch 1 s | batch 128 s | batch-1 time ratio | batch-128 "
             "throughput ratio |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for precision, res in results.items():
        for name, row in res["systems"].items():
            b1, b128 = row.get("batch1", {}), row.get("batch128", {})
            bleu = b128.get("bleu", b1.get("bleu"))
            ratio = res["ratios"] if name.startswith("insertion") else {}
            lines.append(
                f"| {precision} | {name} | {bleu:.2f} | {b1.get('decode_seconds', float('nan')):.2f} | "
                f"{b128.get('decode_seconds', float('nan')):.2f} | {ratio.get('batch1_time_ratio', '')!s:.5} | "
                f"{ratio.get('batch128_throughput_ratio', '')!s:.5} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_speed", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--insertion", type=Path, required=True, help="an insertion_transformer checkpoint")
    p.add_argument("--teacher", type=Path, default=KIT / "checkpoint.pt", help="its fairseq transformer teacher")
    p.add_argument("--data", type=Path, required=True, help="prepare.py's --out (data-bin, raw references)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8", "bf16"],
                   help="--decode-precision values, each applied to both models")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 1])
    p.add_argument("--batch1-sentences", type=int, default=None, help="time batch 1 on the first N test lines")
    p.add_argument("--eos-penalty", type=float, default=3.0, help="the insertion model's beta")
    p.add_argument("--max-len-a", type=float, default=1.2)
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--insertion-extra", nargs="*", default=[], help="further fairseq-generate arguments for the "
                   "insertion model (e.g. --compile)")
    p.add_argument("--extra", nargs="*", default=[], help="further fairseq-generate arguments for both (e.g. --fp16)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.device = args.device or R.default_device()
    args.out = args.out.resolve()
    error = missing_input((("--insertion", args.insertion), ("--teacher", args.teacher),
                           ("--data", args.data / "data-bin")))
    if error:
        print(error, file=sys.stderr)
        return 1
    results = {}
    try:
        for precision in args.precisions:
            results[precision] = measure(args, precision)
            (args.out / "results.partial.json").write_text(json.dumps(results, indent=2))
    except R.RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = {**run_info(args.device), "device": args.device, "insertion": str(args.insertion),
               "teacher": str(args.teacher), "eos_penalty": args.eos_penalty, "results": results}
    (args.out / "results.json").write_text(json.dumps(summary, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
