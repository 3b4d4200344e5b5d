"""Terminology constraints on the harness: the plugin against fairseq's lexically constrained beam search
on the teacher. 1-2 reference n-grams of 1-3 whole words per sentence (``constraints.py draw``, seed 1).
Systems: the teacher greedy, beam 5, and constrained at beam 5 and the smallest beam fairseq accepts
(outputs up to 2 x source + 50); per insertion model, parallel and candidates reranked by the teacher
(settings best on valid), without and with constraints, and the constrained parallel decode through the
plugin's runtime (the model exported, fp32 and int8), with how many of its hypotheses equal the PyTorch
generator's. ``--constrained-only``: the constrained systems alone; ``--candidates`` with no value: no
reranked systems. Every engine at ``--threads``. Writes OUT/constrained.json and .md.

    python -m benchmarks.constrained --teacher KIT/checkpoint.pt --data-bin KIT/data-bin --refs DATA/raw \\
        --insertion INS/checkpoint.pt [...] --out OUT [--quality-only]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from examples.generate_output import read_reference
from examples.multi30k.constraints import draw, usage

from . import harness as H
from . import report as T

BEAM, PROBE_LINES = 5, 32  # fairseq's constrained beam search as its documentation runs it; the probe's lines
ROOM = {"max_len_a": 2.0, "max_len_b": 50}  # the teacher's constrained beam search needs room


def inputs(args: argparse.Namespace, split: str, constrained: bool) -> H.Inputs:
    targets = [" ".join(p) for p in H.pieces(args.data_bin, split, 1)]
    return H.inputs(args.data_bin, split, args.refs / f"{split}.tgt")._replace(
        constraints=draw(targets, args.seed, 3) if constrained else None)


def teacher(name: str, args: argparse.Namespace, beam: int, constrained: bool) -> H.System:
    ordered = {"constraints": "ordered"} if constrained else {}
    return H.System(name, args.teacher, options={"beam": beam, **ROOM, **ordered})


def probe(args: argparse.Namespace, where: H.Where, test: H.Inputs) -> dict:
    """The smallest beam (1-5) fairseq's constrained beam search decodes the first test lines with."""
    failed = {}
    for beam in range(1, BEAM + 1):
        try:
            H.bleu(teacher("probe", args, beam, True), where, test.head(PROBE_LINES), "de", PROBE_LINES)
            return {"smallest_beam": beam, "failed_beams": failed, "lines": PROBE_LINES}
        except Exception as exc:  # fairseq's own failure: recorded, the next beam tried
            failed[str(beam)] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return {"smallest_beam": None, "failed_beams": failed, "lines": PROBE_LINES}


def insertion_systems(args: argparse.Namespace, where: H.Where, checkpoint: Path) -> list[tuple[H.System, dict]]:
    """One model's parallel and reranked systems, without and with constraints, chosen on valid; its
    constrained parallel decode through the runtime (fp32, int8)."""
    out, name = [], checkpoint.parent.name
    for constrained in (True,) if args.constrained_only else (False, True):
        tag, valid = "_constrained" if constrained else "", inputs(args, "valid", constrained)
        options = {"decoding": "parallel", **H.REPETITION, **({"constraints": "ordered"} if constrained else {})}
        chosen, by_beta = H.swept(H.System(f"{name}_parallel{tag}", checkpoint, options=options,
                                           sweep=tuple(args.betas)), where, valid, "de")
        out.append((chosen, {"valid_bleu": by_beta}))
        if constrained:
            out += [(H.System(f"{name}_runtime_{p}{tag}", checkpoint, "runtime", {**chosen.options, "precision": p}),
                     {"as": chosen.name}) for p in ("fp32", "int8")]
        reranked = {(c, lp): H.System(f"{name}_rerank{tag}", checkpoint, options={
            **options, "eos_penalties": c, "rerank_with": str(args.teacher), "lenpen": lp})
            for c in args.candidates for lp in args.lenpens}
        grid = {k: H.bleu(s, where, valid, "de") for k, s in reranked.items()}
        if grid:
            out.append((reranked[max(grid, key=grid.get)], {"valid_bleu": {
                f"{','.join(f'{b:g}' for b in c)} lenpen {lp:g}": v for (c, lp), v in grid.items()}}))
    return out


def measure(args: argparse.Namespace, where: H.Where, results: dict) -> None:
    test = {c: inputs(args, "test", c) for c in (False, True)}
    results["beam_probe"] = found = probe(args, where, test[True])
    beams = dict.fromkeys([BEAM, *([found["smallest_beam"]] if found["smallest_beam"] else [])])
    systems = [] if args.constrained_only else [(teacher("ar_greedy", args, 1, False), None),
                                                (teacher(f"ar_beam{BEAM}", args, BEAM, False), None)]
    systems += [(teacher(f"ar_beam{b}_constrained", args, b, True), None) for b in beams]
    for checkpoint in args.insertion:
        systems += insertion_systems(args, where, checkpoint)
    rows = {s.name: {"name": s.name, "model": "transformer" if s.checkpoint == args.teacher else "insertion",
                     "constrained": "constraints" in s.options, "settings": s.options, "chosen_on_valid": chosen}
            for s, chosen in systems}
    hyps, engines = {}, {s.name: H.ENGINES[s.engine](s, where) for s, _ in systems}
    for engine in engines.values():
        engine.load(args.threads)
    for batch in (128, 1):
        for constrained in (False, True):
            some = {n: e for n, e in engines.items() if rows[n]["constrained"] == constrained}
            if not some:
                continue
            for name, timed in H.rounds(some, test[constrained], batch, args.rounds).items():
                r, hyps[name, batch] = H.scored(timed, test[True].references, "de"), [
                    " ".join(o.tokens) for o in timed.outputs]
                if batch == 128:
                    rows[name].update(r, **usage(test[True].constraints, dict(enumerate(hyps[name, batch]))))
                rows[name][f"decode_seconds_batch{batch}"] = None if args.quality_only else r["seconds"]
                if args.profile:
                    rows[name][f"profile_batch{batch}"] = H.profiled(engines[name], test[constrained], batch)
    for r in rows.values():
        same, n = sum(map(str.__eq__, hyps[r["name"], 1], hyps[r["name"], 128])), len(hyps[r["name"], 128])
        r["same_outputs_batch1_batch128"] = {"same": same, "sentences": n, "all_same": same == n}
    results["systems"] = list(rows.values())
    results["parity"] = [  # the runtime's hypotheses against the PyTorch generator's, the same options
        {"a": s.name, "b": chosen["as"], "batch": batch, "mean_length": sum(len(h.split()) for h in hyps[s.name, batch])
         / max(len(hyps[s.name, batch]), 1), **H.agreement(hyps[s.name, batch], hyps[chosen["as"], batch])}
        for s, chosen in systems if s.engine == "runtime" for batch in (1, 128)]


def add_targets(results: dict) -> None:
    """Batch-1 time against the teacher's constrained beam 5, and the targets."""
    base = next((r for r in results["systems"] if r["name"] == f"ar_beam{BEAM}_constrained"), {})
    for r in results["systems"]:
        r["batch1_time_vs_ar_beam5_constrained"] = T.compute("ratio", r["decode_seconds_batch1"],
                                                             base.get("decode_seconds_batch1"))
    plugin = [r for r in results["systems"] if r["model"] == "insertion" and r["constrained"]]
    whole = min((r["usage_rate"] for r in plugin if r.get("usage_rate") is not None), default=None)
    targets = [T.judged("constraints found as whole words, every constrained plugin system", whole, 1.0, ">=")]
    fp32 = {r["name"] for r in results["systems"] if r["settings"].get("precision") == "fp32"}
    targets += [T.judged(f"{p['a']} = {p['b']}, batch {p['batch']} (identical hypotheses)", p["rate"],
                         0.995 if p["a"] in fp32 else None, ">=", note="int8 against fp32")
                for p in results.get("parity", [])]
    for limit in (0.5, 0.25, 0.1):
        fast = [r for r in plugin if (r["batch1_time_vs_ar_beam5_constrained"] or limit + 1) <= limit]
        best = max(fast, key=lambda r: r["bleu"], default=None)
        value = T.compute("difference", best and best["bleu"], base.get("bleu"))
        targets.append(T.judged(f"best constrained plugin BLEU at <= {limit}x the batch-1 time of fairseq's "
                                f"constrained beam {BEAM}, minus its BLEU" + (f" ({best['name']})" if best else ""),
                                value, 0.0, ">="))
    results["targets"] = targets


def markdown(results: dict) -> str:
    C, probe = T.Column, results["beam_probe"]
    columns = [C("system", lambda r: r["name"]), C("constraints", lambda r: "yes" if r["constrained"] else "no"),
               C("BLEU", lambda r: r["bleu"]), C("whole words", lambda r: f"{100 * r['usage_rate']:.1f}% "
                                                 f"({r['used']:,})" if r.get("usage_rate") is not None else None),
               C("batch 1 s", lambda r: r["decode_seconds_batch1"], 1),
               C(f"vs AR beam {BEAM} constrained", lambda r: r["batch1_time_vs_ar_beam5_constrained"]),
               C("batch 128 s", lambda r: r["decode_seconds_batch128"], 1),
               C("same outputs at batch 1 and 128", lambda r: "{same:,} / {sentences:,}".format(
                   **r["same_outputs_batch1_batch128"])),
               C("settings", lambda r: ", ".join(f"{k} {v}" for k, v in r["settings"].items() if k not in (
                   "rerank_with", *H.REPETITION, *ROOM)))]
    lines = [f"Machine: {results['machine']}; {results['sentences']} test sentences; batch 1 and 128; every engine at "
             f"{results.get('engine_threads', 'the default number of')} thread(s)."
             + (" Not timed (--quality-only): the seconds are left out." if results["quality_only"] else ""), "",
             *T.table(columns, results["systems"]), "", *T.table(T.TARGET_COLUMNS, results["targets"]), "",
             f"fairseq's constrained beam search: smallest beam accepted {probe['smallest_beam']} (tried on the first "
             f"{probe['lines']} test lines); " + ("; ".join(f"beam {b}: {e}" for b, e in probe["failed_beams"].items())
                                                   or "no failures")]
    return "\n".join(lines + T.notes(results)) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = T.parser("benchmarks.constrained", __doc__, threads=1, betas=[2.0, 3.0, 4.0, 5.0], teacher={
        "help": "the fairseq Transformer (constrained beam search, the reranker)"}, data_bin={
        "help": "the teacher's data-bin (dictionaries, valid and test)"})
    p.add_argument("--refs", type=Path, help="the raw references: REFS/valid.tgt and REFS/test.tgt")
    p.add_argument("--insertion", type=Path, nargs="+", help="insertion checkpoints (rows named by their directory)")
    p.add_argument("--quality-only", action="store_true", help="no seconds (one round)")
    p.add_argument("--candidates", nargs="*", default=["2,3,4", "1,2,3,4,5", "0,1,2,3,4,5,6"],
                   help="candidate EOS penalty sets tried for the reranked decode (none: no reranked systems)")
    p.add_argument("--constrained-only", action="store_true", help="the constrained systems alone")
    p.add_argument("--lenpens", type=float, nargs="+", default=[1.0, 2.0], help="--lenpen values tried")
    p.add_argument("--seed", type=int, default=1, help="constraint drawing seed (default 1)")
    return p


def run(args: argparse.Namespace) -> tuple:
    args.candidates = [tuple(float(b) for b in c.split(",")) for c in args.candidates]
    args.rounds = 1 if args.quality_only else args.rounds
    names = T.placeholders({"KIT": args.teacher.parent, "DATA": args.refs, "OUT": args.out, "DATA-BIN": args.data_bin,
                            **{f"INS{i}": c.parent for i, c in enumerate(args.insertion, 1)}})
    results = {"quality_only": args.quality_only, "engine_threads": args.threads,
               "sentences": len(read_reference(args.refs / "test.tgt")), "seed": args.seed, "notes": []}
    measure(args, H.Where(args.data_bin, args.out), results)
    add_targets(results)
    return args.out / "constrained.json", results, names


main = T.command(build_parser, markdown, run, ("out", "teacher", "data_bin", "refs", "insertion"))

if __name__ == "__main__":
    sys.exit(main())
