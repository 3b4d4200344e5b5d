"""A speed lever's row: the runtime as two variants (a checkout of the code, and decoding options) decode the same
sentences, each run in its own process from its checkout (so code before and after a change can be compared),
the variants taking turns (A, B, A, B) for ``--rounds`` rounds at every precision and batch; seconds: the median.
Beside the seconds: each variant's BLEU (detokenised sacreBLEU) and how many of B's hypotheses equal A's.
Writes OUT/checkouts.json and .md.

    python -m benchmarks.checkouts --variant before=BEFORE --variant after=AFTER[:close_ended_slots=true] \\
        --insertion INS/checkpoint.pt --data-bin KIT/data-bin --ref DATA/raw/test.tgt --out OUT \\
        [--eos-penalty 3.5] [--sentences 300] [--batches 1 128] [--precisions fp32 int8] [--rounds 3]

BEFORE and AFTER are checkouts of this repository (``git worktree add BEFORE COMMIT``); every variant exports
the model with its own checkout's code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from examples.generate_output import GenerateOutput, read_reference, score

from . import report as T

OPTIONS = {"decoding": "parallel", "block_neighbour_copies": True, "no_repeat_ngram_size": 3}


def parse_variant(text: str) -> dict:
    """NAME=CHECKOUT[:key=value,...] -> its name, checkout and options (values read as JSON, else strings)."""
    name, _, rest = text.partition("=")
    checkout, _, extra = rest.partition(":")
    options = {}
    for item in filter(None, extra.split(",")):
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return {"name": name, "checkout": str(Path(checkout).resolve()), "options": options}


# run by ``python -c`` in a variant's checkout (its fairseq_insertion and harness first on the path): the runtime
# engine of its harness exports the model and decodes it once, after a burn-in batch (the export's own length
# limits, 2 x source + 10); prints the seconds, writes the hypotheses. argv: out name precision batch options
# eos_penalty sentences insertion data_bin
WORKER = """
import json, sys
from pathlib import Path
from benchmarks import harness as H

out, name, precision, batch, options, beta, n, insertion, data_bin = sys.argv[1:]
out, data_bin, name = Path(out), Path(data_bin), f"{name}_{precision}"
options = {**json.loads(options), "eos_penalty": float(beta), "precision": precision}
engine = H.ENGINES["runtime"](H.System(name, Path(insertion), "runtime", options), H.Where(data_bin, out, (2.0, 10)))
engine.load(1)
inputs = H.Inputs(H.pieces(data_bin, "test", 0, int(n)), [])
outputs, seconds, _ = H.decode(engine, inputs, H.schedule(inputs.sources, int(batch)))
(out / "hyps").mkdir(parents=True, exist_ok=True)
hyps = "".join(" ".join(o.tokens) + "\\n" for o in outputs)
(out / "hyps" / f"{name}_batch{batch}.txt").write_text(hyps, encoding="utf-8")
print(json.dumps({"seconds": seconds}))
"""


def run_variant(args: argparse.Namespace, variant: dict, precision: str, batch: int) -> float:
    options = {**OPTIONS, **variant["options"]}
    argv = [str(args.out.resolve()), variant["name"], precision, str(batch), json.dumps(options), str(args.eos_penalty),
            str(args.sentences), str(args.insertion.resolve()), str(args.data_bin.resolve())]
    env = {**os.environ, "PYTHONPATH": variant["checkout"]}
    proc = subprocess.run([sys.executable, "-c", WORKER, *argv], cwd=variant["checkout"], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"variant {variant['name']}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def bleu(lines: list[str], references: list[str], lang: str | None) -> float:
    return round(score(GenerateOutput(hypotheses=dict(enumerate(lines))), references[:len(lines)], lang)["bleu"], 2)


def measure(args: argparse.Namespace, results: dict) -> None:
    references, (a, b) = read_reference(args.ref), (v["name"] for v in results["variants"])
    for precision in args.precisions:
        for batch in args.batches:
            seconds = {v["name"]: [] for v in results["variants"]}
            for _ in range(args.rounds):
                for v in results["variants"]:
                    seconds[v["name"]].append(run_variant(args, v, precision, batch))
            lines = {k: (args.out / "hyps" / f"{k}_{precision}_batch{batch}.txt").read_text(encoding="utf-8")
                     .splitlines() for k in seconds}
            med = {k: statistics.median(s) for k, s in seconds.items()}
            results["rows"].append({
                "precision": precision, "batch": batch, "seconds": med, "seconds_by_round": seconds,
                "ratio": round(med[b] / med[a], 3),
                "ratio_by_round": [round(y / x, 3) for x, y in zip(seconds[a], seconds[b])],
                "bleu": {k: bleu(v, references, args.lang) for k, v in lines.items()},
                "identical": sum(map(str.__eq__, lines[a], lines[b])), "sentences": len(lines[a]),
                "mean_length": {k: sum(len(x.split()) for x in v) / max(len(v), 1) for k, v in lines.items()}})


def markdown(results: dict) -> str:
    a, b = (v["name"] for v in results["variants"])
    C = T.Column
    columns = [*T.keyed("precision", "batch"), C(f"{a} s", lambda r: r["seconds"][a], 3),
               C(f"{b} s", lambda r: r["seconds"][b], 3), C(f"{b} / {a}", lambda r: r["ratio"], 3),
               C("rounds", lambda r: ", ".join(f"{x:.2f}" for x in r["ratio_by_round"])),
               C(f"BLEU {a} / {b}", lambda r: f"{r['bleu'][a]:.2f} / {r['bleu'][b]:.2f}"),
               C("identical", lambda r: f"{r['identical']} of {r['sentences']}")]
    variants = "; ".join(f"{v['name']}: {v['checkout']}" + (f" with {v['options']}" if v["options"] else "")
                         for v in results["variants"])
    lines = [f"{results['machine']}; {results['sentences']} test sentences; the runtime at 1 thread, each decode in "
             f"its own process, the variants taking turns for {results['rounds']} rounds (seconds: the median). "
             f"{variants}.", "", *T.table(columns, results["rows"])]
    return "\n".join(lines + T.notes(results)) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = T.parser("benchmarks.checkouts", __doc__)
    p.add_argument("--variant", action="append", default=[], help="NAME=CHECKOUT[:key=value,...], twice")
    return T.flags(p, insertion=None, data_bin=None, ref=None, lang="de", eos_penalty=3.5, sentences=300,
                   batches=[1, 128], precisions=["fp32", "int8"])


def run(args: argparse.Namespace) -> tuple:
    variants = [parse_variant(v) for v in args.variant]
    if len(variants) != 2:
        raise SystemExit(f"{build_parser().prog}: error: give --variant twice (got {len(variants)})")
    checkouts = {v["checkout"]: v["name"].upper() for v in reversed(variants)}  # one name a checkout: the first's
    names = T.placeholders({"DATA-BIN": args.data_bin, "INS": args.insertion.parent, "OUT": args.out,
                            "DATA": args.ref.parent, **{name: Path(c) for c, name in checkouts.items()}})
    results = {"rounds": args.rounds, "sentences": args.sentences, "variants": variants, "rows": [], "notes": []}
    measure(args, results)
    results["sentences"] = results["rows"][0]["sentences"] if results["rows"] else 0  # 0 given: every one
    return args.out / "checkouts.json", results, names


main = T.command(build_parser, markdown, run, ("out", "data_bin", "insertion", "ref"),
                   ("onnxruntime",))

if __name__ == "__main__":
    sys.exit(main())
