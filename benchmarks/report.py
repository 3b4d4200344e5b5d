"""From ``results.json`` to what people read: the ratios between rows, the targets, the
markdown table and the iterations plot. Nothing here runs fairseq."""

from __future__ import annotations

import json
from pathlib import Path

from examples.multi30k.recipe import plot_iterations

from . import targets as T

# (row key, ratio key prefix, inverse: a throughput from seconds)
RATIOS = (
    ("decode_seconds_batch1", "decode_time_ratio_batch1_vs_", False),
    ("decode_seconds_batch128", "decode_throughput_ratio_batch128_vs_", True),
    ("train_target_tokens_per_s", "train_speed_ratio_vs_", False),
)
PEERS = (("ar_greedy", "ar_greedy"), ("fairseq_nat_insertion", "fairseq_nat"))  # (system, ratio key tag)


def add_ratios(results: dict) -> None:
    """Ratios against the baselines trained on the same data in this run, and the targets."""
    rows = results["systems"]
    by_name = {r["name"]: r for r in rows}
    for row in rows:
        suffix = "_distilled" if row["data"] == "distilled" else ""
        for peer, tag in PEERS:
            other = by_name.get(peer + suffix, {})
            for key, prefix, inverse in RATIOS:
                row[prefix + tag] = T.between("inverse_ratio" if inverse else "ratio", key, row, other)
    timing_runs = results.get("timing_runs") or [results]
    results["targets"] = T.evaluate(rows, timing_runs[-1]["device"])  # the goals of the latest timings' device


def save(out: Path, results: dict) -> None:
    """``OUT/results.json`` and its table ``OUT/results.md``."""
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))


def fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def system_lines(results: dict) -> list[str]:
    lines = [
        "| system | data | BLEU | EOS pen. | iterations | floor(log2 n)+1 | decode s, batch 1 | time vs AR greedy "
        "| decode s, batch 128 | throughput vs AR greedy | train tgt tok/s | vs AR |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["systems"]:
        lines.append(
            f"| {r['name']} | {r['data']} | {fmt(r['bleu'])} | {fmt(r['eos_penalty'], 0)} "
            f"| {fmt(r['mean_iterations'])} | {fmt(r['mean_log2_bound'])} | {fmt(r['decode_seconds_batch1'])} "
            f"| {fmt(r['decode_time_ratio_batch1_vs_ar_greedy'])} | {fmt(r['decode_seconds_batch128'])} "
            f"| {fmt(r['decode_throughput_ratio_batch128_vs_ar_greedy'])} "
            f"| {fmt(r['train_target_tokens_per_s'], 0)} | {fmt(r['train_speed_ratio_vs_ar_greedy'])} |"
        )
    return lines


def target_lines(results: dict) -> list[str]:
    if not results.get("targets"):
        return []
    lines = ["", "| target (issue \"Performance\") | goal | measured | met |", "| --- | --- | --- | --- |"]
    for t in results["targets"]:
        met = "not measured" if t["met"] is None else ("yes" if t["met"] else "**no**")
        if t["target"].startswith("reported"):
            met = "-"
        lines.append(f"| {t['metric']} | {t['target']} | {fmt(t['value'], 3)} | {met} |")
    return lines


def provenance(results: dict) -> list[str]:
    """Notes on rows measured elsewhere than the run's machine (a resumed run)."""
    by_machine: dict[str, list[str]] = {}
    for r in results["systems"]:
        if r.get("machine") not in (None, results["machine"]):
            by_machine.setdefault(r["machine"], []).append(r["name"])
    notes = [f"measured on {m}: {', '.join(names)}." for m, names in by_machine.items()]
    for t in results.get("timing_runs", []):
        notes.append(f"decode times re-measured (--time-only, median of {t['repeat']}) on {t['machine']} "
                     f"({t['device']}), {t['started']}: {', '.join(t['systems']) or 'no system'}.")
    return notes


def markdown(results: dict) -> str:
    lines = [
        f"Machine: {results['machine']} ({results['device']}); {results['updates']} updates per system; "
        f"{results['arch']}; max tokens {results['max_tokens']}; test set {results['test_set']}; "
        f"batch-1 timing on the first {results['batch1_sentences']} test sentences.",
        "",
        *system_lines(results),
        *target_lines(results),
    ]
    for note in results.get("notes", []) + provenance(results):
        lines += ["", f"Note: {note}"]
    if results.get("failed"):
        lines += ["", "Failed steps: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in results["failed"].items())]
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> str | None:
    """Iterations against length for the best-scoring binary-tree parallel system."""
    rows = [r for r in results["systems"] if r["name"].startswith("insertion_binary_tree_parallel")
            and r["bleu"] is not None]
    if not rows:
        return None
    best = max(rows, key=lambda r: r["bleu"])
    gen = out / "decode" / best["name"] / "test.batch128.out"
    title = f"{best['name']} (test_2016_flickr, {results['updates']} updates)"
    plot_iterations(gen, out / "iterations.png", title=title)
    return str(out / "iterations.png")
