"""From your fairseq Transformer to a scored, timed Insertion Transformer: distil, warm start,
fine-tune, choose the decoding on valid, and decode the test set beside the teacher.

    python -m examples.warm_start --teacher TEACHER.pt --data-bin DATA --valid-ref VALID.REF \\
        --test-ref TEST.REF --lang LANG --out OUT

``--data-bin`` is the teacher's fairseq-preprocess directory (any language pair: the one its files
name, or ``--source-lang``/``--target-lang``); ``--valid-ref`` and ``--test-ref`` the raw (untokenised)
references of its valid and test sets, one line per sentence; ``--lang`` the target language of the
Moses detokeniser (``none``: hypotheses are scored as printed after ``--post-process``). The size of
the insertion model (layers, dimension, heads, FFN, shared embeddings) is the teacher's, read from
its checkpoint. Steps, each printing the fairseq command it runs; a step whose output is in OUT is
reused:

1. distil: the teacher's beam-5 translations of the training set (``OUT/distilled``), of each
   sentence's five candidates the one nearest its reference (``--distill-select closest``; ``top``:
   the best), unless ``--distilled`` gives one binarised with the same dictionaries;
2. fine-tune (``--init-from-transformer``, slots started at the left neighbour) for ``--updates``,
   saving every ``--save-every`` updates (``OUT/train``);
3. average the last ``--average`` saved checkpoints (kept when better on valid);
4. on valid: the EOS penalty beta of parallel decoding; for the candidates (every beta of
   ``--candidates`` in one batch) the length penalty of the model's own score and of the
   teacher's (``--rerank-with``), BLEU and brevity penalty for each;
5. ``--continue-stages N``: N continuation stages, each ``--continue-updates`` updates from the previous
   stage's model with the optimizer, learning-rate schedule, data loader and meters reset (fairseq's
   ``--finetune-from-model``: a stage killed midway resumes from its own ``checkpoint_last.pt``), warmed
   up again to ``--continue-lr`` over ``--continue-warmup`` updates and decayed linearly to 0, on
   ``--continue-distilled`` (default: the distillation of step 1), seeds ``--continue-seeds``; each
   stage's beta is chosen on valid by the same rule and the stage scored on test at it.
   ``--continue-from CKPT`` starts the stages from an insertion checkpoint instead of steps 1-4's model;
6. on test, each timed alone at batch 128 and at batch 1: the teacher (greedy, beam 5), the
   insertion model (the last stage's; parallel, the chosen beta) and the reranked candidates; with
   ``--precisions``, the teacher (greedy) and the parallel model again at each ``--decode-precision``,
   both through the plugin's task, with the time ratios.

Writes OUT/results.json (the ``ar_*`` and ``insertion_*`` rows, the valid choices, each stage, the
precisions, commands and the machine) and prints its table.

The student tracks its teacher: the distillation and the warm start carry the teacher's quality into the
insertion model, and every ratio the recipe prints is against this teacher. Give it a Transformer trained to
the end: its learning rate annealed (a schedule that decays to 0, e.g. ``--lr-scheduler polynomial_decay
--end-learning-rate 0``, not an inverse square root that never does) and its valid BLEU flat over its last
stage (decode valid from its last two saved checkpoints; a gain of more than a few tenths says train on). On
Multi30k the kit's 1,800-update teacher (inverse square root) scores 34.73 on test; the same model annealed
for 1,800 more updates 37.67, and the insertion models distilled from it start 1.4 BLEU higher.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from . import steps
from .commands import RecipeError, Size, default_device, train_command
from .generate_output import ScoreError, read_reference

PAIR_FLAGS = ("source_lang", "target_lang")


def fine_tune_command(args: argparse.Namespace, size: Size, distilled: Path, save: Path) -> list[str]:
    """The settled fine-tuning recipe: the teacher's optimiser, a short warmup and a linear decay to 0."""
    return train_command(
        distilled, save, "insertion", size, updates=args.updates, device=args.device, lr=args.lr,
        warmup=args.warmup, linear_decay=True, dropout=args.dropout, label_smoothing=args.label_smoothing,
        clip_norm=None, extra=["--init-from-transformer", args.teacher, "--warm-start-slots", "left",
                               "--save-interval-updates", args.save_every, "--keep-interval-updates", "-1",
                               *args.lang_flags, *args.train_extra])


def continue_command(args: argparse.Namespace, size: Size, distilled: Path, save: Path, start: Path, seed: int
                     ) -> list[str]:
    """One continuation stage: ``start``'s weights trained ``--continue-updates`` more updates with a fresh
    optimizer, schedule (warmup to ``--continue-lr``, linear decay to 0), data loader and meters."""
    return train_command(
        distilled, save, "insertion", size, updates=args.continue_updates, device=args.device,
        lr=args.continue_lr, warmup=args.continue_warmup, linear_decay=True,
        dropout=args.dropout if args.continue_dropout is None else args.continue_dropout,
        label_smoothing=args.label_smoothing, clip_norm=None,
        extra=["--finetune-from-model", start, "--save-interval-updates", args.save_every,
               "--keep-interval-updates", "-1", "--num-workers", "0", *args.lang_flags, *args.train_extra,
               "--seed", seed])  # the stage's seed last: it wins over one in --train-extra


def stage_seeds(args: argparse.Namespace) -> list[int]:
    """Each continuation stage's seed: ``--continue-seeds`` (one for all, or one a stage), default 1."""
    seeds = args.continue_seeds or [1]
    if len(seeds) == 1:
        return seeds * args.continue_stages
    if len(seeds) != args.continue_stages:
        raise RecipeError(f"--continue-seeds: {len(seeds)} seeds for {args.continue_stages} stages (give one or "
                          f"{args.continue_stages})")
    return seeds


def continue_stages(args: argparse.Namespace, size: Size, distilled: Path, start: Path) -> tuple[Path, list[dict]]:
    """Run the continuation stages from ``start`` (each reused when its OUT/continueI/train.json is there):
    the last stage's checkpoint and, per stage, its training, valid BLEU by beta, chosen beta and test score."""
    stages = []
    for i, seed in enumerate(stage_seeds(args), 1):
        save = args.out / f"continue{i}"
        save.mkdir(parents=True, exist_ok=True)
        if not (save / "train.json").is_file():
            (save / "train.json").write_text(json.dumps(
                steps.train(continue_command(args, size, distilled, save, start, seed), save), indent=2))
        start = save / "checkpoint_last.pt"
        beta, sweep = steps.choose_eos_penalty(args.betas, lambda b, i=i, at=start: decode(
            args, at, f"continue{i}.beta{b:g}", eos_penalty=b)["bleu"])
        test = decode(args, start, f"continue{i}.beta{beta:g}", "test", eos_penalty=beta)
        stages.append({"stage": i, "seed": seed, "training": json.loads((save / "train.json").read_text()),
                       "valid_bleu_by_eos_penalty": sweep, "eos_penalty": beta, "test": summary(test)})
    return start, stages


def interval_checkpoints(save: Path) -> list[tuple[int, Path]]:
    """fairseq's ``checkpoint_<epoch>_<updates>.pt`` files, by updates."""
    found = [(int(m.group(1)), p) for p in save.glob("checkpoint_*_*.pt")
             if (m := re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", p.name))]
    return sorted(found)


def average(paths: list[Path], dest: Path) -> Path:
    """The element-wise mean of the checkpoints' model weights, saved with the last one's config."""
    import torch

    import fairseq_insertion  # noqa: F401  registers the safe globals for torch's weights_only loader

    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    merged = dict(states[-1])
    merged["model"] = {k: sum(s["model"][k].float() for s in states).div(len(states)).to(v.dtype)
                       for k, v in states[-1]["model"].items()}
    merged["last_optimizer_state"] = None
    torch.save(merged, dest)
    return dest


def decode(args: argparse.Namespace, checkpoint: Path, name: str, subset: str = "valid", model: str = "insertion",
           batch: int = 128, **kwargs) -> dict:
    """One decode of ``subset`` into OUT/decode/NAME, scored against its raw references."""
    out = args.out / "decode" / name / f"{subset}.batch{batch}.out"
    head = args.batch1_sentences if batch == 1 and subset == "test" else None
    return steps.decode(args.data_bin, checkpoint, out, args.references[subset], args.detok_lang, model, subset,
                        head, batch_size=batch, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                        device=args.device, post_process=args.post_process, repetition_rules=args.repetition_rules,
                        **{**kwargs, "extra": [*args.lang_flags, *kwargs.get("extra", [])]})


def summary(r: dict) -> dict:
    keys = ("bleu", "brevity_penalty", "mean_iterations", "mean_log2_bound", "iterations", "passes_per_batch",
            "forward_passes", "mean_length", "sentences")
    return {k: r[k] for k in keys if r.get(k) is not None}


def choose_checkpoint(args: argparse.Namespace, save: Path) -> tuple[Path, dict]:
    """The valid-BLEU curve (every saved checkpoint at ``--curve-beta``), the average of the last
    ``--average``, and the best of last/average by valid BLEU over the betas."""
    saved = interval_checkpoints(save)
    curve = {str(u): decode(args, p, f"curve{u}", eos_penalty=args.curve_beta)["bleu"] for u, p in saved}
    candidates = {"last": save / "checkpoint_last.pt"}
    if args.average > 1 and len(saved) >= args.average:
        candidates["average"] = average([p for _, p in saved[-args.average:]], save / "checkpoint_average.pt")
    chosen = {name: steps.choose_eos_penalty(args.betas, lambda b, n=name, p=path: decode(
        args, p, f"{n}.beta{b:g}", eos_penalty=b)["bleu"]) for name, path in candidates.items()}
    sweeps = {name: bleu for name, (_, bleu) in chosen.items()}
    best = max(sweeps, key=lambda n: max(sweeps[n].values()))
    return candidates[best], {"valid_bleu_by_update": curve, "curve_eos_penalty": args.curve_beta,
                              "valid_bleu_by_eos_penalty": sweeps, "checkpoint": best, "eos_penalty": chosen[best][0],
                              "averaged": [str(p) for _, p in saved[-args.average:]] if "average" in candidates
                              else []}


def choose_lenpen(args: argparse.Namespace, checkpoint: Path) -> dict:
    """BLEU and brevity penalty on valid of the candidates chosen by the model's own score and by
    the teacher's, for every length penalty; the best of each."""
    found: dict[str, dict] = {"model": {}, "rerank": {}}
    for lenpen in args.lenpens:
        for scorer in found:
            rerank = {"rerank_with": args.teacher} if scorer == "rerank" else {}
            r = decode(args, checkpoint, f"candidates.{scorer}.lenpen{lenpen:g}", eos_penalties=args.candidates,
                       extra=["--lenpen", f"{lenpen:g}"], **rerank)
            found[scorer][f"{lenpen:g}"] = {"bleu": r["bleu"], "brevity_penalty": r["brevity_penalty"]}
    best = {s: float(max(v, key=lambda k: v[k]["bleu"])) for s, v in found.items()}
    return {"valid_by_lenpen": found, "lenpen": best}


def test_systems(args: argparse.Namespace, checkpoint: Path, beta: float, lenpen: dict) -> dict:
    """Each system on test at batch 128 and batch 1, one decode at a time."""
    cand = {"eos_penalties": args.candidates}
    systems = {
        "ar_greedy": (args.teacher, "transformer", {"beam": 1}),
        "ar_beam5": (args.teacher, "transformer", {"beam": 5}),
        "insertion_warm_distilled_parallel": (checkpoint, "insertion", {"eos_penalty": beta}),
        "insertion_warm_distilled_parallel_candidates": (
            checkpoint, "insertion", {**cand, "extra": ["--lenpen", f"{lenpen['model']:g}"]}),
        "insertion_warm_distilled_parallel_rerank": (
            checkpoint, "insertion", {**cand, "rerank_with": args.teacher,
                                      "extra": ["--lenpen", f"{lenpen['rerank']:g}"]}),
    }
    rows = {}
    for name, (path, model, kwargs) in systems.items():
        full = decode(args, path, name, "test", model, 128, **kwargs)
        one = decode(args, path, name, "test", model, 1, **kwargs)
        rows[name] = {**summary(full), "decode_seconds_batch128": full["decode_seconds"],
                      "decode_seconds_batch1": one["decode_seconds"], "batch1_sentences": one["sentences"],
                      "command_batch128": full["command"]}
    return rows


def precision_speed(args: argparse.Namespace, checkpoint: Path, beta: float, precision: str) -> dict:
    """The teacher (greedy) and the parallel model at ``precision``, both through the plugin's task,
    at batch 128 then batch 1; batch-1 time and batch-128 throughput of the insertion model over the teacher's."""
    rows: dict[str, dict] = {}
    for name, path, model, kwargs in (("ar_greedy", args.teacher, "transformer", {"beam": 1}),
                                      ("insertion_parallel", checkpoint, "insertion", {"eos_penalty": beta})):
        for batch in (128, 1):
            r = decode(args, path, f"{precision}.{name}", "test", model, batch, precision=precision, **kwargs)
            rows.setdefault(name, {})[f"batch{batch}"] = {**summary(r), "decode_seconds": r["decode_seconds"],
                                                          "command": r["command"]}
    ar, ins = rows["ar_greedy"], rows["insertion_parallel"]
    return {"systems": rows, "ratios": {
        "batch1_time_ratio": ins["batch1"]["decode_seconds"] / ar["batch1"]["decode_seconds"],
        "batch128_throughput_ratio": ar["batch128"]["decode_seconds"] / ins["batch128"]["decode_seconds"]}}


def table(rows: dict, precisions: dict) -> str:
    lines = ["| system | test BLEU | BP | iterations / bound | batch 1 s | batch 128 s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        it = f"{r['mean_iterations']:.2f} / {r['mean_log2_bound']:.2f}" if r.get("mean_iterations") else ""
        lines.append(f"| {name} | {r['bleu']:.2f} | {r['brevity_penalty']:.3f} | {it} | "
                     f"{r['decode_seconds_batch1']:.1f} | {r['decode_seconds_batch128']:.1f} |")
    for precision, p in precisions.items():
        for name, r in p["systems"].items():
            b1, b128 = r["batch1"], r["batch128"]
            lines.append(f"| {name} ({precision}) | {b128['bleu']:.2f} | {b128['brevity_penalty']:.3f} | | "
                         f"{b1['decode_seconds']:.1f} | {b128['decode_seconds']:.1f} |")
        lines.append(f"| ratios ({precision}): batch-1 time {p['ratios']['batch1_time_ratio']:.3f}, batch-128 "
                     f"throughput {p['ratios']['batch128_throughput_ratio']:.3f} | | | | | |")
    return "\n".join(lines)


def stage_table(stages: list[dict]) -> str:
    lines = ["| stage | seed | updates | loss | valid BLEU by beta | beta | test BLEU | BP |", "| --- " * 8 + "|"]
    for s in stages:
        sweep = ", ".join(f"{b}: {v:.2f}" for b, v in s["valid_bleu_by_eos_penalty"].items())
        lines.append(f"| {s['stage']} | {s['seed']} | {s['training']['train_updates']} | "
                     f"{s['training'].get('last_loss') or float('nan'):.3f} | {sweep} | {s['eos_penalty']:g} | "
                     f"{s['test']['bleu']:.2f} | {s['test']['brevity_penalty']:.3f} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.warm_start", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--teacher", type=Path, required=True, help="a fairseq transformer checkpoint (its size is used)")
    p.add_argument("--data-bin", type=Path, required=True, help="the teacher's fairseq-preprocess directory")
    p.add_argument("--valid-ref", type=Path, required=True, help="raw references of the valid set, one per line")
    p.add_argument("--test-ref", type=Path, required=True, help="raw references of the test set, one per line")
    p.add_argument("--lang", required=True,
                   help="target language of the Moses detokeniser (e.g. de), or 'none' to score as printed")
    p.add_argument("--source-lang", default=None, help="source language in --data-bin (default: its one pair)")
    p.add_argument("--target-lang", default=None, help="target language in --data-bin (default: its one pair)")
    p.add_argument("--post-process", default="subword_nmt",
                   help="fairseq's --post-process for the outputs (default subword_nmt; e.g. sentencepiece)")
    p.add_argument("--distilled", type=Path, default=None,
                   help="an existing distillation (data-bin, same dictionaries); default: distil into OUT/distilled")
    p.add_argument("--distill-select", choices=steps.DISTILL_SELECT, default="closest",
                   help="the distilled target of each training sentence, of the teacher's beam-5 candidates: the "
                   "one nearest the reference by sentence BLEU (closest, the default) or the teacher's best (top); "
                   "on Multi30k en-de, continued models on closest scored 0.48 BLEU higher on test (mean of two "
                   "seeds; valid +0.05)")
    p.add_argument("--out", type=Path, required=True, help="work and results directory (finished steps are reused)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    g = p.add_argument_group("fine-tuning (the settled recipe)")
    g.add_argument("--updates", type=int, default=1800, help="fine-tuning updates (default 1800)")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    g.add_argument("--warmup", type=int, default=300, help="warmup updates (default 300)")
    g.add_argument("--dropout", type=float, default=0.3, help="default 0.3")
    g.add_argument("--label-smoothing", type=float, default=0.1, help="default 0.1")
    g.add_argument("--save-every", type=int, default=200, help="save a checkpoint every N updates (default 200)")
    g.add_argument("--average", type=int, default=5, help="average the last N saved checkpoints (1: off)")
    g.add_argument("--train-extra", nargs=argparse.REMAINDER, default=[],
                   help="further fairseq-train arguments (last on the command line)")
    g = p.add_argument_group("continuation stages (after fine-tuning, or from --continue-from)")
    g.add_argument("--continue-stages", type=int, default=0,
                   help="continuation stages after fine-tuning (default 0; the kit's best model: 3)")
    g.add_argument("--continue-from", type=Path, default=None,
                   help="an insertion checkpoint to start the stages from, instead of fine-tuning the teacher")
    g.add_argument("--continue-distilled", type=Path, default=None,
                   help="the stages' training data (data-bin, same dictionaries); default: the distillation")
    g.add_argument("--continue-updates", type=int, default=1800, help="updates a stage (default 1800)")
    g.add_argument("--continue-lr", type=float, default=5e-4, help="a stage's peak learning rate (default 5e-4)")
    g.add_argument("--continue-warmup", type=int, default=100, help="a stage's warmup updates (default 100)")
    g.add_argument("--continue-dropout", type=float, default=None, help="a stage's dropout (default: --dropout)")
    g.add_argument("--continue-seeds", type=int, nargs="+", default=None,
                   help="the stages' seeds: one for all or one a stage (default 1)")
    g = p.add_argument_group("decoding")
    g.add_argument("--betas", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0, 4.0],
                   help="EOS penalties tried on valid (parallel decoding)")
    g.add_argument("--curve-beta", type=float, default=2.0, help="EOS penalty of the valid-BLEU-by-update curve")
    g.add_argument("--candidates", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0, 4.0],
                   help="EOS penalties decoded together as candidates")
    g.add_argument("--lenpens", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5, 2.0],
                   help="length penalties (fairseq's --lenpen) tried on valid for the candidates' scores")
    g.add_argument("--precisions", nargs="*", default=[], choices=("fp32", "bf16", "int8"),
                   help="also time the teacher and the parallel model at each --decode-precision")
    g.add_argument("--batch1-sentences", type=int, default=None, help="time batch 1 on the first N test lines")
    g.add_argument("--no-repetition-rules", dest="repetition_rules", action="store_false",
                   help="decode without --block-neighbour-copies --no-repeat-ngram-size 3 (on by default here: "
                   "on Multi30k they gain about 0.5 BLEU on valid and bound the slowest sentences; turn them off "
                   "when outputs legitimately repeat a token next to itself)")
    g.add_argument("--max-len-a", type=float, default=1.2, help="longest output: a x source length + b (1.2)")
    g.add_argument("--max-len-b", type=int, default=10, help="see --max-len-a (10)")
    return p


def check_inputs(args: argparse.Namespace) -> None:
    """Every given path exists (raises RecipeError naming the flag)."""
    for flag in ("teacher", "data_bin", "valid_ref", "test_ref", "distilled", "continue_from", "continue_distilled"):
        path = getattr(args, flag)
        if path is not None and not path.exists():
            raise RecipeError(f"--{flag.replace('_', '-')} {path}: not found")
    if args.continue_stages < 0 or (args.continue_from is not None and args.continue_stages < 1):
        raise RecipeError(f"--continue-stages {args.continue_stages}: give at least 1"
                          + (" with --continue-from" if args.continue_from is not None else ""))
    stage_seeds(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.device = args.device or default_device()
    args.out = args.out.resolve()
    args.detok_lang = None if args.lang == "none" else args.lang
    args.lang_flags = [x for f in PAIR_FLAGS if getattr(args, f)
                       for x in (f"--{f.replace('_', '-')}", getattr(args, f))]
    try:
        check_inputs(args)
        args.references = {"valid": read_reference(args.valid_ref), "test": read_reference(args.test_ref)}
        size = Size.from_checkpoint(args.teacher)
        pair = steps.language_pair(args.data_bin, args.source_lang, args.target_lang)
        distilled, distillation = args.distilled, {}
        needs_distillation = args.continue_from is None or (args.continue_stages and args.continue_distilled is None)
        if distilled is None and needs_distillation:
            distilled = args.out / "distilled"
            marker = args.out / "distill.json"
            if not marker.is_file():
                result = steps.distill(args.data_bin, args.teacher, distilled, args.device,
                                       max_len_a=args.max_len_a, max_len_b=args.max_len_b, pair=pair,
                                       select=args.distill_select)
                marker.write_text(json.dumps(result, indent=2))
            distillation = json.loads(marker.read_text())
        if args.continue_from is None:
            save = args.out / "train"
            if not (save / "train.json").is_file():
                (save / "train.json").write_text(json.dumps(
                    steps.train(fine_tune_command(args, size, distilled, save), save), indent=2))
            training = json.loads((save / "train.json").read_text())
            checkpoint, valid = choose_checkpoint(args, save)
            beta = valid["eos_penalty"]
        else:
            checkpoint, valid, beta = args.continue_from, {}, None
            training = {"continued_from": str(args.continue_from), "train_updates": 0}
        stages: list[dict] = []
        if args.continue_stages:
            checkpoint, stages = continue_stages(args, size, args.continue_distilled or distilled, checkpoint)
            beta = stages[-1]["eos_penalty"]
        valid.update(choose_lenpen(args, checkpoint))
        rows = test_systems(args, checkpoint, beta, valid["lenpen"])
        precisions = {p: precision_speed(args, checkpoint, beta, p) for p in args.precisions}
    except (RecipeError, ScoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    updates = training["train_updates"] + sum(s["training"]["train_updates"] for s in stages)
    for name, row in rows.items():
        if name.startswith("insertion"):
            row["train_updates"] = updates
    results = {"arch": size.describe(), **steps.run_info(args.device), "teacher": str(args.teacher),
               "data_bin": str(args.data_bin), "distillation": distillation, "training": training, "valid": valid,
               "stages": stages, "eos_penalty": beta, "checkpoint": str(checkpoint), "systems": rows,
               "precisions": precisions}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    if stages:
        print(stage_table(stages))
    print(table(rows, precisions))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
