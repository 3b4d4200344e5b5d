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


# run by ``python -c`` in a variant's checkout (its fairseq_insertion and harness first on the path): export once,
# decode, print the seconds, write the hypotheses. argv: out name precision batch options eos_penalty sentences
# insertion data_bin
WORKER = """
import json, sys, time
from pathlib import Path
from benchmarks import harness as H
from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import export
from fairseq_insertion.runtime import Translator

out, name, precision, batch, options, beta, n, insertion, data_bin = sys.argv[1:]
out, batch, insertion, data_bin = Path(out), int(batch), Path(insertion), Path(data_bin)
options = {**json.loads(options), "eos_penalty": float(beta)}
model = out / "exports" / name / precision
if not (model / "settings.json").is_file():
    export(insertion, data_bin, model, int8=precision == "int8", config=DecodingConfig(**options))
sources = H.pieces(data_bin, "test", 0, int(n))
translator = Translator(model, intra_threads=1)
batches = H.schedule(sources, batch)
translator.translate_batch([sources[i] for i in batches[0]], max_batch_size=batch, **options)  # burn-in
hyps = [""] * len(sources)
start = time.perf_counter()
for idx in batches:
    for i, r in zip(idx, translator.translate_batch([sources[i] for i in idx], max_batch_size=batch, **options)):
        hyps[i] = " ".join(r.hypotheses[0])
seconds = time.perf_counter() - start
(out / "hyps").mkdir(parents=True, exist_ok=True)
(out / "hyps" / f"{name}_{precision}_batch{batch}.txt").write_text("".join(h + "\\n" for h in hyps), encoding="utf-8")
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


def bleu(path: Path, references: list[str], lang: str | None) -> float:
    lines = path.read_text(encoding="utf-8").splitlines()
    return round(score(GenerateOutput(hypotheses=dict(enumerate(lines))), references[:len(lines)], lang)["bleu"], 2)


def measure(args: argparse.Namespace, results: dict) -> None:
    references = read_reference(args.ref)
    a, b = results["variants"]
    for precision in args.precisions:
        for batch in args.batches:
            seconds = {v["name"]: [] for v in results["variants"]}
            for _ in range(args.rounds):
                for v in results["variants"]:
                    seconds[v["name"]].append(run_variant(args, v, precision, batch))
            hyps = {v["name"]: args.out / "hyps" / f"{v['name']}_{precision}_batch{batch}.txt"
                    for v in results["variants"]}
            lines = {k: p.read_text(encoding="utf-8").splitlines() for k, p in hyps.items()}
            same = sum(map(str.__eq__, lines[a["name"]], lines[b["name"]]))
            med = {k: statistics.median(s) for k, s in seconds.items()}
            results["rows"].append({
                "precision": precision, "batch": batch, "seconds": med, "seconds_by_round": seconds,
                "ratio": round(med[b["name"]] / med[a["name"]], 3),
                "ratio_by_round": [round(y / x, 3) for x, y in zip(seconds[a["name"]], seconds[b["name"]])],
                "bleu": {k: bleu(p, references, args.lang) for k, p in hyps.items()},
                "identical": same, "sentences": len(lines[a["name"]]),
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
