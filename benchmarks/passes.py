"""Where the runtime's time goes: the insertion model exported (fp32, int8) and decoded at each batch size,
timed (the median of ``--rounds``), then once more under onnxruntime's profiler (``Translator(profile=)``),
which slows a run: read its shares, not its milliseconds. Per precision and batch: the pass graph's node
count, kernel time by operator type, and the shares of a decode spent in the pass graph's runs (in its
kernels, and in onnxruntime between them), in the encoder's runs and outside onnxruntime (the numpy loop,
``fairseq_insertion/loop/``, and the runtime's Python). Writes OUT/passes.json and .md.

    python -m benchmarks.passes --insertion INS/checkpoint.pt --data-bin KIT/data-bin --out OUT \\
        [--eos-penalty 3.5] [--sentences 200] [--batches 1 128] [--precisions fp32 int8] [--label before]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from . import harness as H
from . import report as T

TOP = 14  # operators in the table
SUBGRAPHS = ("If",)  # nodes whose time holds their subgraphs' kernels (the slot rule's branches)


def graph_profile(events: list[dict]) -> dict:
    """One graph's runs (count, microseconds) and its kernels' microseconds by operator type and node. An ``If``
    node's time holds its subgraph's kernels, which the profiler lists too: it is left out (what it adds of
    its own counts as time between kernels)."""
    runs = [e["dur"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    kernels = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
               and e.get("args", {}).get("op_name") not in SUBGRAPHS]
    by_op = Counter()
    for e in kernels:
        by_op[e["args"]["op_name"]] += e["dur"]
    return {"runs": len(runs), "run_us": sum(runs), "kernel_us": sum(by_op.values()),
            "nodes": len({e["name"] for e in kernels}), "by_op": dict(by_op.most_common())}


def profiled(engine: H.Runtime, inputs: H.Inputs, batch: int, prefix: Path, threads: int) -> dict:
    """One decode under onnxruntime's profiler: the shares of its seconds."""
    from fairseq_insertion.runtime import Translator

    plain, engine.translator = engine.translator, Translator(engine.dir, intra_threads=threads, profile=str(prefix))
    try:  # every batch once, no burn-in: the profiler sees what the clock sees
        _, seconds, passes = H.decode(engine, inputs, H.schedule(inputs.sources, batch), burn_in=False)
        paths = engine.translator.end_profiling()
    finally:
        engine.translator = plain
    enc, dec = (graph_profile(json.loads(Path(paths[g]).read_text(encoding="utf-8"))) for g in ("encoder", "pass"))
    wall, ops = seconds * 1e6, dec["by_op"].items()
    share = lambda us: round(us / wall, 3)  # noqa: E731
    return {"seconds": round(seconds, 3), "passes": passes, "graph_runs": dec["runs"], "pass_graph_nodes": dec["nodes"],
            "share_pass_kernels": share(dec["kernel_us"]), "share_pass_between_kernels": share(dec["run_us"] -
                                                                                              dec["kernel_us"]),
            "share_encoder": share(enc["run_us"]),
            "share_outside_onnxruntime": share(wall - dec["run_us"] - enc["run_us"]),
            "pass_kernel_share_by_op": {op: round(us / max(dec["kernel_us"], 1), 3) for op, us in ops},
            "pass_kernel_us_per_pass_by_op": {op: round(us / max(passes, 1), 1) for op, us in ops}}


def measure(args: argparse.Namespace, results: dict) -> None:
    where = H.Where(args.data_bin, args.out)
    inputs = H.inputs(args.data_bin, "test", n=args.sentences)
    for precision in args.precisions:
        options = {"decoding": "parallel", "precision": precision, "eos_penalty": args.eos_penalty, **H.REPETITION}
        engine = H.Runtime(H.System(f"insertion_runtime_{precision}", args.insertion, "runtime", options), where)
        engine.load(args.threads)
        for batch in args.batches:
            timed = H.rounds({"runtime": engine}, inputs, batch, args.rounds)["runtime"]
            seconds = sorted(timed.seconds)[len(timed.seconds) // 2]
            prefix = args.out / "traces" / f"{args.label}_{precision}_batch{batch}"
            prefix.parent.mkdir(parents=True, exist_ok=True)
            results["rows"].append({
                "label": args.label, "precision": precision, "batch": batch,
                "seconds": round(seconds, 3), "seconds_by_round": [round(x, 3) for x in timed.seconds],
                "passes": timed.passes, "ms_per_pass": round(1000 * seconds / max(timed.passes, 1), 3),
                "passes_per_sentence": round(timed.passes / len(inputs.sources), 3),
                "mean_length": sum(len(o.tokens) for o in timed.outputs) / len(timed.outputs),
                "profiled": profiled(engine, inputs, batch, prefix, args.threads)})


def markdown(results: dict) -> str:
    C = T.Column
    rows = results["rows"]
    columns = [*T.keyed("label", "precision", "batch", "seconds", "ms_per_pass", "passes_per_sentence"),
               C("pass graph nodes", lambda r: r["profiled"]["pass_graph_nodes"]),
               *(C(title, lambda r, k=k: f"{100 * r['profiled'][k]:.0f}%") for title, k in (
                   ("pass kernels", "share_pass_kernels"), ("pass, between kernels", "share_pass_between_kernels"),
                   ("encoder", "share_encoder"), ("outside onnxruntime (numpy loop)", "share_outside_onnxruntime")))]
    ops = sorted({op for r in rows for op in r["profiled"]["pass_kernel_share_by_op"]},
                 key=lambda op: -max(r["profiled"]["pass_kernel_share_by_op"].get(op, 0) for r in rows))[:TOP]
    op_columns = [C("operator", lambda o: o["op"]), *(C(f"{r['precision']} b{r['batch']}",
                                                        lambda o, r=r: r["profiled"]["pass_kernel_us_per_pass_by_op"]
                                                        .get(o["op"]), 1) for r in rows)]
    version = results["versions"].get("onnxruntime")
    lines = [f"{results['machine']}; {results['sentences']} test sentences; onnxruntime {version}, "
             f"{results['engine_threads']} thread(s); seconds: the median of {results['rounds']} rounds without the "
             "profiler; shares: of one decode under it.", "", *T.table(columns, rows), "",
             "Pass-graph kernel microseconds per pass, by operator (the largest first):", "",
             *T.table(op_columns, [{"op": op} for op in ops])]
    return "\n".join(lines + T.notes(results)) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = T.parser("benchmarks.passes", __doc__, insertion=None, data_bin=None, eos_penalty=3.5, sentences=200,
                 batches=[1, 128], precisions=["fp32", "int8"], threads=1)
    p.add_argument("--label", default="now", help="the rows' label (the code measured)")
    return p


def run(args: argparse.Namespace) -> tuple:
    names = T.placeholders({"DATA-BIN": args.data_bin, "INS": args.insertion.parent, "OUT": args.out})
    results = {"engine_threads": args.threads, "rounds": args.rounds, "sentences": args.sentences, "rows": [],
               "notes": []}
    measure(args, results)
    return args.out / "passes.json", results, names


main = T.command(build_parser, markdown, run, ("out", "data_bin", "insertion"), ("onnxruntime", "numpy"))

if __name__ == "__main__":
    sys.exit(main())
