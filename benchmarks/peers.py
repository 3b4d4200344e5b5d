"""The plugin beside fairseq's models on Multi30k en->de, on the harness: each system decodes a model of
the systems recipe (``python -m examples.multi30k.systems``) or a given kit's. Swept systems take the EOS
penalty of ``--betas`` best on valid; the test set is timed at batch 128 (its first ``--batch1-sentences``
at batch 1), the systems taking turns. Ratios: against AR greedy and fairseq's NAT model on the same data
(``--set table``: the kit's teacher greedy; training speed: its recipe's, MODELS/ar). Writes OUT/results.*.

    python -m benchmarks.peers --models MODELS --data DATA --out OUT [--set main extras peers table] \\
        [--teacher KIT/checkpoint.pt] [--warm-model INS/checkpoint.pt] [--betas 0 1 2 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from examples.generate_output import read_reference
from examples.multi30k.systems import TRAININGS

from . import harness as H
from . import report as T

S, SWEPT, SPEED = H.System, (0.0,), "train_target_tokens_per_s"  # SWEPT: chosen on valid from --betas


def ins(name: str, model: str, decoding: str = "parallel", sweep: tuple = SWEPT, **options) -> H.System:
    """An insertion system: the model a training of the recipe made (or a kit's: teacher, warm_model)."""
    return S(name, Path(model), options={"decoding": decoding, **H.REPETITION, **options}, sweep=sweep)


NAT10 = {"iter_decode_max_iter": 9}  # fairseq's refinement: at most 10 passes
CANDIDATES = {"eos_penalties": (0.0, 1.0, 2.0, 3.0, 4.0), "sweep": ()}
MAIN = [S("ar_greedy", Path("ar"), options={"beam": 1}), S("ar_beam5", Path("ar"), options={"beam": 5}),
        S("fairseq_nat_insertion", Path("nat"), options=NAT10, sweep=SWEPT),
        ins("insertion_binary_tree_parallel", "binary_tree"),
        ins("insertion_binary_tree_greedy", "binary_tree", "greedy"),
        ins("insertion_uniform_parallel", "uniform"), ins("insertion_left_to_right_greedy", "left_to_right", "greedy")]
SETS = {
    "main": [*MAIN, *(replace(s, name=f"{s.name}_distilled", checkpoint=Path(f"{s.checkpoint}_distilled"))
                      for s in MAIN)],
    "extras": [ins("insertion_binary_tree_parallel_distilled_warm_start", "binary_tree_distilled_warm_start"),
               ins("insertion_binary_tree_parallel_distilled_k2", "binary_tree_distilled_k2"),
               ins("insertion_binary_tree_parallel_distilled_candidates", "binary_tree_distilled", **CANDIDATES),
               ins("insertion_binary_tree_parallel_distilled_rerank", "binary_tree_distilled", **CANDIDATES,
                   rerank_with=Path("teacher"))],
    "peers": [*(S(f"fairseq_cmlm_{t}_distilled", Path("cmlm_distilled"), options={"iter_decode_max_iter": t - 1})
                for t in (1, 4, 10)),
              S("fairseq_cmlm_10_beam3_distilled", Path("cmlm_distilled"),
                options={"iter_decode_max_iter": 9, "iter_decode_with_beam": 3}),
              S("fairseq_levenshtein_distilled", Path("levenshtein_distilled"), options=NAT10)],
    "table": [S("teacher_greedy", Path("teacher"), options={"beam": 1}),
              S("teacher_beam5", Path("teacher"), options={"beam": 5}),
              S("fairseq_nat_insertion_distilled", Path("nat_distilled"), options=NAT10, sweep=SWEPT),
              ins("insertion_binary_tree_parallel_distilled", "binary_tree_distilled"),
              ins("insertion_binary_tree_parallel_fp16_distilled", "binary_tree_fp16_distilled", half=True),
              ins("insertion_warm_parallel_distilled", "warm_model")]}
GIVEN = {"teacher": False, "warm_model": True}  # a kit's models (not trained here): on distilled data or not
SPEED_FROM = {"teacher": "ar", "warm_model": "binary_tree_distilled"}  # the same recipe or model and loss
BT, AR, NAT = "insertion_binary_tree_parallel_distilled", "ar_greedy_distilled", "fairseq_nat_insertion_distilled"
Tg, B1, B128 = T.Target, "decode_seconds_batch1", "decode_seconds_batch128"
TARGETS = [
    Tg("training target tokens/s, plugin / AR transformer", "insertion_binary_tree_parallel", SPEED,
       "ar_greedy", SPEED),
    Tg("training target tokens/s, plugin / fairseq built-in insertion_transformer", "insertion_binary_tree_parallel",
       SPEED, "fairseq_nat_insertion", SPEED),
    Tg("decode time at batch 1, plugin parallel / AR greedy (distilled)", BT, B1, AR, B1,
       goal={"cpu": 0.5, "cuda": 0.35}),
    Tg("decode throughput at batch 128, plugin parallel / AR greedy (distilled)", BT, B128, AR, B128,
       compute="inverse_ratio", goal={"cpu": 1.0, "cuda": 2.0}, direction=">="),
    Tg("decode throughput at batch 128, plugin parallel / fairseq built-in insertion_transformer (distilled)",
       BT, B128, NAT, B128, compute="inverse_ratio", goal=1.5, direction=">="),
    Tg("test BLEU, best plugin parallel system ({a}) / AR greedy", "insertion_*parallel*", "bleu",
       "ar_greedy", "bleu", goal=0.8, direction=">="),
    Tg("test BLEU, best reranked plugin system ({a}) / AR greedy", "insertion_*rerank*", "bleu",
       "ar_greedy", "bleu", goal=0.95, direction=">="),
    Tg("mean parallel iterations - mean floor(log2 n)+1 (binary tree, distilled)", BT, "mean_iterations",
       BT, "mean_log2_bound", compute="difference", goal=1.0),
    Tg("test BLEU, warm start from the teacher / cold start (binary tree parallel, distilled, same updates)",
       "insertion_binary_tree_parallel_distilled_warm_start", "bleu", BT, "bleu", note="--set extras")]


def resolve(s: H.System, args: argparse.Namespace) -> H.System:
    """A system's checkpoint (a training's last, or the kit's), its sweep and its reranker."""
    path = lambda name: getattr(args, name) if name in GIVEN else args.models / name / "checkpoint_last.pt"  # noqa: E731
    rerank = {"rerank_with": str(path(str(s.options["rerank_with"])))} if "rerank_with" in s.options else {}
    return replace(s, checkpoint=path(str(s.checkpoint)), options={**s.options, **rerank},
                   sweep=tuple(args.betas) if s.sweep else ())


def measure(systems: list[H.System], args: argparse.Namespace, where: H.Where) -> list[dict]:
    """Every system swept on valid, then timed at batch 128 and 1, taking turns: its row."""
    valid, test = (H.inputs(where.data_bin, split, args.data / "raw" / f"{split}.tgt") for split in ("valid", "test"))
    rows, engines = {}, {}
    for s in systems:
        if not (found := resolve(s, args)).checkpoint or not found.checkpoint.is_file():
            args.note.append(f"{s.name}: no checkpoint {found.checkpoint} (yet)")
            continue
        chosen, by_beta = H.swept(found, where, valid, "de")
        name = str(s.checkpoint)  # the recipe's record of its training (a kit's model: its recipe's, here)
        record = args.models / SPEED_FROM.get(name, name) / "train.json"
        trained = json.loads(record.read_text()) if record.is_file() else {}
        distilled = GIVEN[name] if name in GIVEN else TRAININGS[name].distilled
        rows[s.name] = {"name": s.name, "data": "distilled" if distilled else "raw", "options": chosen.options,
                        "eos_penalty": chosen.options.get("eos_penalty", 0.0), "valid_bleu_by_eos_penalty": by_beta,
                        "checkpoint": str(chosen.checkpoint), SPEED: trained.get(SPEED),
                        "train_updates": trained.get("train_updates"), "train_command": trained.get("command")}
        engines[s.name] = H.ENGINES[chosen.engine](chosen, where)
        engines[s.name].load(args.threads)
    for batch, inputs in ((128, test), (1, test.head(args.batch1_sentences))):
        for name, timed in H.rounds(engines, inputs, batch, args.rounds).items():
            r = H.scored(timed, inputs.references, "de")
            kept = ("bleu", "signature", "brevity_penalty", "mean_length", "mean_log2_bound", "mean_iterations",
                    "passes_per_sentence") if batch == 128 else ()
            rows[name].update({f"decode_seconds_batch{batch}": r["seconds"], **{k: r[k] for k in kept},
                               f"decode_seconds_batch{batch}_by_round": r["seconds_by_round"]})
            if rows[name]["mean_iterations"] is None:  # one token per step: iterations = output length
                rows[name]["mean_iterations"] = r["mean_length"]
            if args.profile:
                rows[name][f"profile_batch{batch}"] = H.profiled(engines[name], inputs, batch)
    return list(rows.values())


def add_ratios(results: dict) -> None:
    """Ratios against the baselines on the same data (the table: the teacher's greedy decode), the targets."""
    by_name = {r["name"]: r for r in results["systems"]}
    table = "table" in results["sets"]
    for row in results["systems"]:
        tag = "_distilled" if row["data"] == "distilled" else ""
        against = {"teacher_greedy": "teacher_greedy"} if table else {"ar_greedy": "ar_greedy" + tag,
                                                                       "fairseq_nat": "fairseq_nat_insertion" + tag}
        for label, other in against.items():
            b = by_name.get(other, {})
            row[f"decode_time_ratio_batch1_vs_{label}"] = T.compute("ratio", row.get(B1), b.get(B1))
            row[f"decode_throughput_ratio_batch128_vs_{label}"] = T.compute("inverse_ratio", row.get(B128), b.get(B128))
            row[f"train_speed_ratio_vs_{label}"] = T.compute("ratio", row.get(SPEED), b.get(SPEED))
    results["targets"] = [] if table else T.evaluate(TARGETS, results["systems"], results["device"])


def markdown(results: dict) -> str:
    base = "teacher_greedy" if "table" in results["sets"] else "ar_greedy"
    k = lambda title, key, digits=2: T.Column(title, lambda r: r.get(key), digits)  # noqa: E731
    columns = [k("system", "name"), k("data", "data"), k("BLEU", "bleu"), k("BP", "brevity_penalty", 3),
               k("EOS pen.", "eos_penalty", 0), k("iterations", "mean_iterations"),
               k("floor(log2 n)+1", "mean_log2_bound"), k("batch 1 s", B1),
               k(f"time vs {base}", f"decode_time_ratio_batch1_vs_{base}"), k("batch 128 s", B128),
               k(f"throughput vs {base}", f"decode_throughput_ratio_batch128_vs_{base}"),
               k("train tgt tok/s", SPEED, 0), k(f"vs {base}", f"train_speed_ratio_vs_{base}"),
               k("updates", "train_updates")]
    lines = [f"Machine: {results['machine']} ({results['device']}); test set {results['test_set']}, detokenised "
             f"sacreBLEU; batch 1 on the first {results['batch1_sentences']} sentences; seconds: the median of "
             f"{results['rounds']} rounds, the systems taking turns.", "", *T.table(columns, results["systems"]),
             *(["", *T.table(T.TARGET_COLUMNS, results["targets"])] if results["targets"] else [])]
    return "\n".join(lines + T.notes(results)) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = T.parser("benchmarks.peers", __doc__)
    p.add_argument("--models", type=Path, help="the systems recipe's --out (one directory per model)")
    p.add_argument("--data", type=Path, help="prepare.py's --out (data-bin, raw references)")
    p.add_argument("--set", nargs="+", choices=list(SETS), default=["main"], dest="sets", help="default main")
    p.add_argument("--systems", nargs="+", help="only these systems of the sets")
    T.flags(p, teacher={"help": "the kit's teacher (--set table; the reranker)"}, betas=[0.0, 1.0, 2.0, 3.0], threads=2)
    p.add_argument("--warm-model", type=Path, help="the kit's warm-started insertion model (--set table)")
    p.add_argument("--batch1-sentences", type=int, default=100, help="batch 1 on the first N test sentences")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    p.add_argument("--note", action="append", default=[], help="a note for the results (repeatable)")
    return p


def run(args: argparse.Namespace) -> tuple:
    systems = list({s.name: s for name in args.sets for s in SETS[name] if (not args.systems or s.name in args.systems)
                    and (args.device == "cuda" or not s.options.get("half"))}.values())  # fp16 needs CUDA
    names = T.placeholders({"MODELS": args.models, "DATA": args.data, "OUT": args.out, "KIT": args.teacher and
                            args.teacher.parent, "INS": args.warm_model and args.warm_model.parent})
    args.teacher = args.teacher or args.models / "ar" / "checkpoint_last.pt"
    where = H.Where(args.data / "data-bin", args.out, device=args.device)
    results = {"device": args.device, "sets": args.sets, "rounds": args.rounds,  # the device: its targets' goals
               "test_set": f"DATA/raw/test.tgt ({len(read_reference(args.data / 'raw' / 'test.tgt'))} lines)",
               "batch1_sentences": args.batch1_sentences, "notes": args.note,
               "systems": measure(systems, args, where)}
    add_ratios(results)
    return args.out / "results.json", results, names


main = T.command(build_parser, markdown, run, ("models", "data", "out"))

if __name__ == "__main__":
    sys.exit(main())
