"""Deployment engines side by side on the harness: the teacher through CTranslate2 (fp32, int8) and
fairseq's sequence generator, greedy; the insertion model through the plugin's runtime (fp32, int8 per-row
and int8 dynamic) and PyTorch generator, parallel (and greedy, for parity). Each engine at its best thread
count (the fewest seconds) against the others; identical hypotheses of the runtime and PyTorch, of CTranslate2
and fairseq, and of each engine at its smallest and largest batch. Writes OUT/engines.json, .md and OUT/hyps/.

    python -m benchmarks.engines --teacher KIT/checkpoint.pt --data-bin KIT/data-bin --insertion INS/checkpoint.pt \\
        --ref DATA/raw/test.tgt --out OUT [--eos-penalty 3] [--threads 1 2] [--batches 1 8 128] [--rounds 3] \
        [--shortlist TABLE/shortlist.npz]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

from sacrebleu.metrics import BLEU

from examples.generate_output import read_reference

from . import harness as H
from . import report as T


def systems(teacher: Path | None, insertion: Path | None, eos_penalty: float = 0.0,
            candidates: dict | None = None, shortlist: Path | None = None) -> dict[str, H.System]:
    """The engines compared, by name: the teacher's greedy decode and the insertion model's (the same options
    for the runtime and PyTorch: the recipes' repetition rules); with ``candidates`` (the runtime's options:
    ``eos_penalties``, ``lenpen``, ``rerank_weight``), also the runtime's candidates ordered by the teacher
    exported as its scorer, against the teacher's beam search (beam 5); ``shortlist``: also the insertion
    model's parallel decode with this lexical shortlist table (the runtime, exported with it, and PyTorch)."""
    S, rules, both = H.System, {"eos_penalty": eos_penalty, **H.REPETITION}, ("fp32", "int8")
    chosen = {**rules, **{k: v for k, v in (candidates or {}).items() if k != "scorer"},
              "scorer": str(teacher) if teacher and (candidates or {}).get("scorer", True) else None}
    found = [*(S(f"teacher_ctranslate2_{p}", teacher, "ctranslate2", {"precision": p}) for p in both),
             S("teacher_fairseq_fp32", teacher, "fairseq", {"beam": 1}),
             *(S(f"insertion_runtime_{p}", insertion, "runtime", {"decoding": "parallel", "precision": p, **rules})
               for p in both),
             S("insertion_runtime_int8_dynamic", insertion, "runtime", {"decoding": "parallel", "precision": "int8",
                                                                       "quantization": "dynamic", **rules}),
             S("insertion_pytorch_fp32", insertion, "fairseq", {"decoding": "parallel", **rules}),
             S("insertion_runtime_fp32_greedy", insertion, "runtime", {"decoding": "greedy", "precision": "fp32",
                                                                      **rules}),
             S("insertion_pytorch_fp32_greedy", insertion, "fairseq", {"decoding": "greedy", **rules}),
             # the encoder and one decoder step (pass): with the whole decode, the split of its time
             *(S(f"teacher_ctranslate2_{p}_first_step", teacher, "ctranslate2", {"precision": p, "max_steps": 1})
               for p in both),
             *(S(f"insertion_runtime_{p}_first_pass", insertion, "runtime", {"decoding": "parallel", "precision": p,
                                                                            **rules, "max_iterations": 1})
               for p in both)]
    if shortlist:
        listed = {"decoding": "parallel", **rules, "shortlist": str(shortlist)}
        found += [*(S(f"insertion_runtime_{p}_shortlist", insertion, "runtime", {"precision": p, **listed})
                    for p in both),
                  S("insertion_pytorch_fp32_shortlist", insertion, "fairseq", listed)]
    if candidates:
        found += [*(S(f"teacher_ctranslate2_{p}_beam5", teacher, "ctranslate2", {"precision": p, "beam": 5})
                    for p in both),
                  *(S(f"insertion_runtime_{p}_candidates", insertion, "runtime", {"decoding": "parallel",
                                                                                 "precision": p, **chosen})
                    for p in both)]
    return {s.name: s for s in found}


class Pair(NamedTuple):
    metric: str
    a: str
    b: str
    goal: float | None = None  # identical hypotheses (parity), BLEU difference (int8), seconds (speed at batch 1)
    goal_bleu: float | None = None


PARITY = [Pair("runtime fp32 = PyTorch, parallel", "insertion_runtime_fp32", "insertion_pytorch_fp32", 0.995, 0.05),
          Pair("runtime fp32 = PyTorch, greedy", "insertion_runtime_fp32_greedy", "insertion_pytorch_fp32_greedy",
               0.995, 0.05),
          Pair("runtime fp32 = PyTorch, parallel with the shortlist", "insertion_runtime_fp32_shortlist",
               "insertion_pytorch_fp32_shortlist", 0.995, 0.05),
          Pair("CTranslate2 fp32 = fairseq (teacher)", "teacher_ctranslate2_fp32", "teacher_fairseq_fp32"),
          Pair("the shortlist = none, runtime fp32", "insertion_runtime_fp32_shortlist", "insertion_runtime_fp32",
               0.95, 0.1),
          Pair("the shortlist = none, runtime int8", "insertion_runtime_int8_shortlist", "insertion_runtime_int8",
               0.95, 0.1)]
INT8 = [Pair("runtime int8 - fp32 BLEU, parallel", "insertion_runtime_int8", "insertion_runtime_fp32", 0.3),
        Pair("runtime int8 dynamic - fp32 BLEU, parallel", "insertion_runtime_int8_dynamic", "insertion_runtime_fp32",
             0.3),
        Pair("CTranslate2 int8 - fp32 BLEU (teacher)", "teacher_ctranslate2_int8", "teacher_ctranslate2_fp32")]
SPEED = [Pair("runtime / CTranslate2 seconds, fp32", "insertion_runtime_fp32", "teacher_ctranslate2_fp32", 1.0),
         Pair("runtime / CTranslate2 seconds, int8", "insertion_runtime_int8", "teacher_ctranslate2_int8", 1.0),
         Pair("runtime int8 dynamic / CTranslate2 seconds", "insertion_runtime_int8_dynamic",
              "teacher_ctranslate2_int8", 1.0),
         Pair("runtime int8 per-row / dynamic seconds", "insertion_runtime_int8", "insertion_runtime_int8_dynamic",
              1.05),
         Pair("runtime with the shortlist / CTranslate2 seconds, fp32", "insertion_runtime_fp32_shortlist",
              "teacher_ctranslate2_fp32", 1.0),
         Pair("runtime with the shortlist / CTranslate2 seconds, int8", "insertion_runtime_int8_shortlist",
              "teacher_ctranslate2_int8", 1.0),
         Pair("runtime with the shortlist / without seconds, fp32", "insertion_runtime_fp32_shortlist",
              "insertion_runtime_fp32", 1.0),
         Pair("runtime with the shortlist / without seconds, int8", "insertion_runtime_int8_shortlist",
              "insertion_runtime_int8", 1.0),
         Pair("runtime / fairseq teacher seconds, fp32", "insertion_runtime_fp32", "teacher_fairseq_fp32", 1.0),
         Pair("PyTorch insertion / fairseq teacher seconds, fp32", "insertion_pytorch_fp32", "teacher_fairseq_fp32",
              1.0),
         *(Pair(f"runtime / CTranslate2 seconds, the encoder and the first step, {p}",
                f"insertion_runtime_{p}_first_pass", f"teacher_ctranslate2_{p}_first_step") for p in ("fp32", "int8")),
         Pair("runtime candidates / CTranslate2 beam 5 seconds, fp32", "insertion_runtime_fp32_candidates",
              "teacher_ctranslate2_fp32_beam5", 1.0),
         Pair("runtime candidates / CTranslate2 beam 5 seconds, int8", "insertion_runtime_int8_candidates",
              "teacher_ctranslate2_int8_beam5", 1.0)]


def candidates(args: argparse.Namespace) -> dict | None:
    """The runtime's candidate options (``--candidates``), or None."""
    if not args.candidates:
        return None
    return {"eos_penalties": tuple(args.candidates), "first_insertions": args.first_insertions,
            "lenpen": args.rerank_lenpen, "rerank_weight": args.rerank_weight, "scorer": not args.no_scorer}


def decoding(options: dict) -> str:
    """How a row decodes: greedy, beam k, parallel, or parallel with its candidates ordered by the scorer."""
    if options.get("beam", 1) > 1:
        return f"beam {options['beam']}"
    if options.get("eos_penalties"):
        k = options.get("first_insertions", 1)
        return (f"parallel, {k * len(options['eos_penalties'])} candidates"
                f"{f' ({k} first insertions)' if k > 1 else ''}, {'teacher' if options.get('scorer') else 'model'}"
                "-ordered")
    first = ", the first step" if options.get("max_steps") == 1 or options.get("max_iterations") == 1 else ""
    return options.get("decoding", "greedy") + (", shortlist" if options.get("shortlist") else "") + first


def row_name(key: str, threads: int, batch: int) -> str:
    return f"{key}.threads{threads}.batch{batch}"


def measure(args: argparse.Namespace, where: H.Where, inputs: H.Inputs, results: dict) -> dict[str, list[str]]:
    """Every engine at every thread count and batch: the rows of ``results``; the hypotheses by row."""
    wanted = [s for k, s in systems(args.teacher, args.insertion, args.eos_penalty, candidates(args),
                                    args.shortlist).items() if k in args.engines]
    try:
        import ctranslate2  # noqa: F401  a benchmark dependency only
    except ImportError:
        results["notes"].append("ctranslate2 is not installed: its rows are left out")
        wanted = [s for s in wanted if s.engine != "ctranslate2"]
    engines, hyps = {s.name: H.ENGINES[s.engine](s, where) for s in wanted}, {}
    for threads in args.threads:
        for engine in engines.values():
            engine.load(threads)
        for batch in args.batches:
            for key, timed in H.rounds(engines, inputs, batch, args.rounds).items():
                s, name = engines[key].system, row_name(key, threads, batch)
                model = "teacher" if s.checkpoint == args.teacher else "insertion"
                hyps[name] = [" ".join(o.tokens) for o in timed.outputs]
                results["rows"].append({
                    "name": name, "engine_key": key, "model": model, "threads": threads, "batch": batch,
                    "engine": "pytorch" if model == "insertion" and s.engine == "fairseq" else s.engine,
                    "precision": " ".join(filter(None, (s.options.get("precision", "fp32"),
                                                        s.options.get("quantization")))),
                    "decoding": decoding(s.options),
                    **H.scored(timed, inputs.references, args.lang),
                    **({"profile": H.profiled(engines[key], inputs, batch)} if args.profile else {})})
    if args.raw_source and "insertion_runtime_fp32" in engines:
        results["raw_text"] = raw_text(args, engines["insertion_runtime_fp32"], hyps, inputs)
    return hyps


def raw_text(args: argparse.Namespace, engine: H.Engine, hyps: dict[str, list[str]], inputs: H.Inputs) -> dict:
    """``translate_text`` on the raw test lines (prepared as the data-bin was: Moses, ``--bpe-codes``) against
    the runtime's decode of the data-bin's pieces: identical detokenised outputs and both BLEUs."""
    from fairseq_insertion.preprocess import Preprocessing, detokenize

    settings = Preprocessing(source_lang="en", target_lang=args.lang or "de",
                             bpe_codes=str(args.bpe_codes) if args.bpe_codes else None)
    lines = read_reference(args.raw_source)[:len(inputs.sources)]
    batch, threads = max(args.batches), args.threads[-1]
    got = engine.translator.translate_text(lines, max_batch_size=batch, preprocessing=settings, **engine.options)
    pieces = [detokenize(h.split(), settings) for h in hyps[row_name("insertion_runtime_fp32", threads, batch)]]
    bleu = lambda outs: round(BLEU().corpus_score(outs, [inputs.references]).score, 2)  # noqa: E731
    return {"batch": batch, "threads": threads, **H.agreement(got, pieces), "bleu_raw_text": bleu(got),
            "bleu_data_bin": bleu(pieces), "mean_length": sum(len(x.split()) for x in got) / max(len(got), 1)}


def best_rows(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """(engine key, batch) -> its row at the thread count with the fewest seconds, in the rows' order."""
    best: dict[tuple[str, int], dict] = {}
    for r in sorted(rows, key=lambda r: r["seconds"]):
        best.setdefault((r["engine_key"], r["batch"]), r)
    return {(r["engine_key"], r["batch"]): best[r["engine_key"], r["batch"]] for r in rows}


def compare(results: dict, hyps: dict[str, list[str]]) -> None:
    """Parity, int8 and speed comparisons and batch agreement, into ``results``."""
    rows, best = {r["name"]: r for r in results["rows"]}, best_rows(results["rows"])
    settings = sorted({(r["threads"], r["batch"]) for r in results["rows"]})
    same = lambda a, b: sum(x == y for x, y in zip(hyps[a], hyps[b], strict=True))  # noqa: E731
    pairs = lambda p: [(t, n, row_name(p.a, t, n), row_name(p.b, t, n)) for t, n in settings  # noqa: E731
                       if row_name(p.a, t, n) in rows and row_name(p.b, t, n) in rows]
    parity, targets = [], []
    for p in PARITY:
        mine = [{"comparison": p.metric, "threads": t, "batch": n, "identical": same(a, b), "sentences": len(hyps[a]),
                 "bleu_a": rows[a]["bleu"], "bleu_b": rows[b]["bleu"]} for t, n, a, b in pairs(p)]
        if mine:
            targets.append(T.judged(f"{p.metric}: identical hypotheses (worst of {len(mine)} thread/batch settings)",
                                    min(m["identical"] / m["sentences"] for m in mine), p.goal, ">="))
            targets.append(T.judged(f"{p.metric}: |BLEU difference| (largest)",
                                    max(abs(m["bleu_a"] - m["bleu_b"]) for m in mine), p.goal_bleu, "<="))
        parity += mine
    for p in INT8:
        gaps = [rows[a]["bleu"] - rows[b]["bleu"] for _, _, a, b in pairs(p)]
        if gaps:
            targets.append(T.judged(f"{p.metric} (largest |difference|)", max(gaps, key=abs), p.goal, "abs<="))
    for p in SPEED:
        for n in sorted({n for _, n in settings}):
            if (p.a, n) in best and (p.b, n) in best:
                ra, rb = best[p.a, n], best[p.b, n]
                targets.append(T.judged(f"{p.metric}, batch {n} (each at its best threads: {ra['threads']} / "
                                        f"{rb['threads']})", ra["seconds"] / rb["seconds"], p.goal if n == 1 else None,
                                        "<=", by_round=[x / y for x, y in zip(ra["seconds_by_round"],
                                                                              rb["seconds_by_round"])]))
    lo, hi = min(n for _, n in settings), max(n for _, n in settings)
    agreement = [{"engine_key": k, "threads": t, "batches": [lo, hi], "identical": same(row_name(k, t, lo),
                  row_name(k, t, hi)), "sentences": len(hyps[row_name(k, t, lo)])}
                 for k in dict.fromkeys(r["engine_key"] for r in results["rows"]) for t in results["thread_counts"]
                 if lo < hi and row_name(k, t, lo) in hyps and row_name(k, t, hi) in hyps]
    best_threads = [{"engine_key": k, "batch": n, "threads": r["threads"], "seconds": r["seconds"]}
                    for (k, n), r in best.items()]
    raw = results.get("raw_text")
    if raw:
        gap = round(raw["bleu_raw_text"] - raw["bleu_data_bin"], 2)
        targets += [T.judged("translate_text on raw lines = the data-bin path (identical outputs)", raw["rate"], 0.999,
                             ">="), T.judged("translate_text BLEU - the data-bin path's", gap, 0.05, "abs<=")]
    results.update(best_threads=best_threads, parity=parity, batch_agreement=agreement, targets=targets)


TEACHER_GREEDY = ("teacher_fairseq_fp32", "teacher_ctranslate2_fp32")  # the anchor of the BLEU ratios, the first found
TEACHER_BEAM = ("teacher_ctranslate2_fp32_beam5",)


def teacher_ratios(rows: list[dict]) -> list["T.Column"]:
    """The columns of each row's BLEU over the teacher's in the same run, greedy and (when it ran) beam 5: the
    run's ``--teacher`` is the anchor (the kit's annealed teacher for the project's figures)."""
    columns = []
    for title, keys in (("x teacher greedy", TEACHER_GREEDY), ("x teacher beam 5", TEACHER_BEAM)):
        anchor = next((r["bleu"] for key in keys for r in rows if r["engine_key"] == key and r["bleu"]), None)
        if anchor:
            columns.append(T.Column(title, lambda r, a=anchor: round(r["bleu"] / a, 3), 3))
    return columns


def markdown(results: dict) -> str:
    """One row per engine and batch (seconds at every thread count, the rest at the best; BLEU also over the
    teacher's), the targets, the parity and the batch agreement."""
    by_name, rounds, C = {r["name"]: r for r in results["rows"]}, results.get("rounds", 1), T.Column
    seconds = [C(f"s, {t} thread{'s' if t > 1 else ''}", lambda r, t=t: by_name.get(
        row_name(r["engine_key"], t, r["batch"]), {}).get("seconds")) for t in results["thread_counts"]]
    columns = [*T.keyed("engine", "model", "precision", "decoding", "batch", "bleu"),
               *teacher_ratios(results["rows"]), *seconds,
               C("best threads", lambda r: r["threads"]), *T.keyed("ms_per_pass", "passes_per_sentence",
                                                                  "mean_iterations")]
    identical = C("identical", lambda p: f"{p['identical']} of {p['sentences']}")
    lines = [f"{results['machine']}; {results['sentences']} sentences of {results['test_set']}; insertion EOS "
             f"penalty {results['eos_penalty']:g}; seconds: the median of {rounds} rounds, the engines taking turns.",
             "", *T.table(columns, list(best_rows(results["rows"]).values())), "",
             *T.table(T.TARGET_COLUMNS, results["targets"]), "",
             *T.table([*T.keyed("comparison", "threads", "batch"), identical,
                       C("BLEU a / b", lambda p: f"{p['bleu_a']:.2f} / {p['bleu_b']:.2f}")], results["parity"]), "",
             *T.table([*T.keyed("engine_key", "threads"), C("batch a / b", lambda a: "{} / {}".format(*a["batches"])),
                       identical], results["batch_agreement"])]
    if results.get("raw_text"):
        lines += ["", "Raw text: `translate_text` on the raw test lines (Moses and BPE as the data-bin was prepared) "
                  "against the runtime fp32's decode of the data-bin's pieces, both detokenised.", "",
                  *T.table([*T.keyed("batch", "threads"), identical, *T.keyed("bleu_raw_text", "bleu_data_bin",
                                                                              "mean_length")], [results["raw_text"]])]
    return "\n".join(lines + T.notes(results)) + "\n"


def build_parser() -> argparse.ArgumentParser:
    threads = {"nargs": "+", "default": [1, 2], "help": "thread counts (default %(default)s)"}
    p = T.parser("benchmarks.engines", __doc__, teacher=None, data_bin=None, insertion=None, ref=None, lang="de",
                 eos_penalty=3.0, threads=threads, batches=[1, 8, 128], sentences=0)
    p.add_argument("--raw-source", type=Path, help="the raw test sources (DATA/raw/test.src): a row of "
                   "translate_text on them against the data-bin path, with --bpe-codes")
    p.add_argument("--bpe-codes", type=Path, help="the data-bin's subword-nmt codes (KIT/bpe.codes; none: no BPE)")
    p.add_argument("--candidates", type=float, nargs="*", default=[], metavar="BETA",
                   help="the runtime's candidates: their EOS penalties, ordered by the teacher (exported as the "
                   "scorer); rows against CTranslate2's beam 5")
    p.add_argument("--first-insertions", type=int, default=1, help="with --candidates: decode each from its K "
                   "best first insertions too (K x the candidates)")
    p.add_argument("--rerank-lenpen", type=float, default=1.0, help="with --candidates: the length normalisation")
    p.add_argument("--no-scorer", action="store_true", help="with --candidates: ordered by the model's score (no "
                   "teacher exported)")
    p.add_argument("--rerank-weight", type=float, default=0.0, help="with --candidates: lambda, the model's weight")
    p.add_argument("--shortlist", type=Path, help="a lexical shortlist table (python -m fairseq_insertion.shortlist): "
                   "rows of the insertion model's parallel decode with it (the runtime, exported with it, and PyTorch)")
    names = list(systems(None, None, candidates={"eos_penalties": (1.0, 2.0)}, shortlist=Path("table")))
    p.add_argument("--engines", nargs="+", choices=names, default=[n for n in names if not n.endswith(("beam5",
                   "candidates", "first_step", "first_pass"))], help="default all but the candidates', beam and "
                   "first-step rows (name them; the candidates' with --candidates); the shortlist's rows need "
                   "--shortlist")
    return p


def run(args: argparse.Namespace) -> tuple:
    names = T.placeholders({"DATA-BIN": args.data_bin, "KIT": args.teacher.parent,
                            "INS": args.insertion.parent, "DATA": args.ref.parent, "OUT": args.out,
                            **({"CODES": args.bpe_codes.parent} if args.bpe_codes and args.bpe_codes.parent.resolve()
                               != args.teacher.parent.resolve() else {}),
                            **({"TABLE": args.shortlist.parent} if args.shortlist else {})})
    inputs = H.inputs(args.data_bin, "test", args.ref, args.sentences)
    results = {"thread_counts": args.threads, "batches": sorted(set(args.batches)), "rounds": args.rounds,
               "test_set": f"{args.ref.name} (test split of the data-bin)", "sentences": len(inputs.sources),
               "eos_penalty": args.eos_penalty, "candidates": candidates(args), "rows": [], "notes": [],
               "shortlist": args.shortlist and args.shortlist.name}
    args.batches = results["batches"]
    hyps = measure(args, H.Where(args.data_bin, args.out), inputs, results)
    compare(results, hyps)
    (args.out / "hyps").mkdir(parents=True, exist_ok=True)
    for name, lines in hyps.items():
        (args.out / "hyps" / f"{name}.txt").write_text("".join(f"{h}\n" for h in lines), encoding="utf-8")
    return args.out / "engines.json", results, names


main = T.command(build_parser, markdown, run, ("out", "teacher", "data_bin", "insertion", "ref"),
                   ("ctranslate2", "onnxruntime", "numpy"))

if __name__ == "__main__":
    sys.exit(main())
