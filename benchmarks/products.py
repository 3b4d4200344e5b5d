"""Which products int8 pays for: each product by a weight matrix of the pass graph, alone, in fp32 and in the
export's per-row int8 (:func:`fairseq_insertion.quantization.per_row`: the row's quantization included), at the
numbers of rows a pass feeds it (``--rows``: about 10 at batch 1, 1,000 at batch 128 for the default size). The
products and their weights are the insertion model's fp32 pass graph's; the fused self-attention's q, k and v are
one product three times as wide in fp32 (as its ``Attention`` computes them) and three products of one quantized
input in int8 (as the export writes them); a product of a ReLU's output keeps its ReLU. The precisions take turns
for ``--rounds`` rounds of ``--repeats`` runs (microseconds: the median round's mean). Writes OUT/products.json
and .md.

    python -m benchmarks.products --insertion INS/checkpoint.pt --data-bin KIT/data-bin --out OUT \\
        [--rows 10 1000] [--rounds 5] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from typing import NamedTuple

import numpy as np

from . import report as T


class Product(NamedTuple):
    """One kind of product in the pass graph: its weight (K, N), how many a pass runs, how many products of one
    input the export writes for it (3: the self-attention's q, k and v) and whether its input is a ReLU's output."""

    weight: np.ndarray
    count: int
    parts: int
    relu: bool


def pass_products(graph) -> list[Product]:
    """The products by a weight matrix of an fp32 pass graph, one per (shape, parts, ReLU input), in graph order."""
    from onnx import numpy_helper

    weights = {w.name: w for w in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    found: dict[tuple, Product] = {}
    counts: Counter = Counter()
    for node in graph.node:
        w = weights.get(node.input[1]) if len(node.input) > 1 else None
        if w is None or len(w.dims) != 2 or min(w.dims) < 2 or node.op_type not in ("MatMul", "Attention"):
            continue
        parts = 3 if node.op_type == "Attention" else 1
        relu = getattr(producer.get(node.input[0]), "op_type", None) == "Relu"
        key = (tuple(w.dims), parts, relu)
        counts[key] += 1
        found.setdefault(key, Product(numpy_helper.to_array(w), 0, parts, relu))
    return [p._replace(count=counts[key]) for key, p in found.items()]


def product_models(product: Product) -> dict:
    """The product alone as two graphs of one input x (M, K): ``fp32`` and ``int8`` (per-row)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fairseq_insertion.export import IR_VERSION, OPSET, per_row

    w, K = product.weight, product.weight.shape[0]
    C = w.shape[1] // product.parts

    def model(split: bool) -> "onnx.ModelProto":
        nodes, inits, x = [], [], "x"
        if product.relu:
            nodes.append(helper.make_node("Relu", ["x"], ["relu"]))
            x = "relu"
        parts = [w[:, i * C:(i + 1) * C] for i in range(product.parts)] if split else [w]
        for i, part in enumerate(parts):
            inits.append(numpy_helper.from_array(np.ascontiguousarray(part), f"w{i}"))
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        graph = helper.make_graph(nodes, "product", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])],
                                  [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["M", part.shape[1]])
                                   for i, part in enumerate(parts)], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)])
        m.ir_version = IR_VERSION
        return m

    int8 = model(split=True)
    per_row(int8)
    onnx.checker.check_model(int8)
    return {"fp32": model(split=False), "int8": int8}


def timed(sessions: dict, x: np.ndarray, rounds: int, repeats: int) -> tuple[dict, dict]:
    """Microseconds a run of each session (the median round's mean, the sessions taking turns), and each round's."""
    feeds = {"x": x}
    for s in sessions.values():  # burn-in
        for _ in range(max(repeats // 10, 1)):
            s.run(None, feeds)
    by_round = {name: [] for name in sessions}
    for r in range(rounds):
        for name in (list(sessions) if r % 2 == 0 else list(sessions)[::-1]):
            run, start = sessions[name].run, time.perf_counter()
            for _ in range(repeats):
                run(None, feeds)
            by_round[name].append(1e6 * (time.perf_counter() - start) / repeats)
    return {name: statistics.median(us) for name, us in by_round.items()}, by_round


def measure(args: argparse.Namespace, results: dict) -> None:
    import onnx
    import onnxruntime as ort

    from fairseq_insertion.config import DecodingConfig
    from fairseq_insertion.export import export
    from fairseq_insertion.runtime import UNFUSED

    export_dir = args.out / "export"
    export(args.insertion, args.data_bin, export_dir, config=DecodingConfig())
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    gen = np.random.default_rng(0)
    for product in pass_products(onnx.load(str(export_dir / "pass.onnx")).graph):
        models = product_models(product)
        sessions = {name: ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                               disabled_optimizers=list(UNFUSED)) for name, m in models.items()}
        K, N = product.weight.shape
        for rows in args.rows:
            x = gen.normal(size=(rows, K)).astype(np.float32)
            exact = np.concatenate(sessions["fp32"].run(None, {"x": x}), -1)  # (rows, N)
            approx = np.concatenate(sessions["int8"].run(None, {"x": x}), -1)
            us, by_round = timed(sessions, x, args.rounds, args.repeats)
            results["rows"].append({
                "shape": f"{K} x {N}", "parts": product.parts, "relu_input": product.relu, "per_pass": product.count,
                "rows": rows, "fp32_us": round(us["fp32"], 2), "int8_us": round(us["int8"], 2),
                "int8_over_fp32": round(us["int8"] / us["fp32"], 3),
                "us_by_round": {k: [round(v, 2) for v in vs] for k, vs in by_round.items()},
                "int8_relative_error": float(np.linalg.norm(approx - exact) / max(np.linalg.norm(exact), 1e-30))})


def markdown(results: dict) -> str:
    C = T.Column
    columns = [C("product (K x N)", lambda r: r["shape"] + (" (q, k, v: 3 in int8)" if r["parts"] == 3 else "")
                 + (", of a ReLU's output" if r["relu_input"] else "")),
               *T.keyed("per_pass", "rows", "fp32_us", "int8_us", "int8_over_fp32"),
               C("int8 error (relative)", lambda r: f"{r['int8_relative_error']:.4f}")]
    lines = [f"{results['machine']}; onnxruntime {results['versions'].get('onnxruntime')}, {results['engine_threads']} "
             f"thread(s); microseconds a run: the median of {results['rounds']} rounds of {results['repeats']} runs, "
             "the precisions taking turns.", "", *T.table(columns, results["rows"])]
    return "\n".join(lines + T.notes(results)) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = T.parser("benchmarks.products", __doc__, insertion=None, data_bin=None, threads=1)
    p.set_defaults(rounds=5)
    p.add_argument("--rows", type=int, nargs="+", default=[10, 1000],
                   help="rows a product takes (default: 10, a pass's canvas positions at batch 1, and 1000, at 128)")
    p.add_argument("--repeats", type=int, default=200, help="runs a round (default 200)")
    return p


def run(args: argparse.Namespace) -> tuple:
    names = T.placeholders({"DATA-BIN": args.data_bin, "INS": args.insertion.parent, "OUT": args.out})
    results = {"engine_threads": args.threads, "rounds": args.rounds, "repeats": args.repeats, "rows": [],
               "notes": []}
    measure(args, results)
    return args.out / "products.json", results, names


main = T.command(build_parser, markdown, run, ("out", "data_bin", "insertion"), ("onnxruntime", "numpy"))

if __name__ == "__main__":
    sys.exit(main())
