"""BLEU against milliseconds a sentence, from ``python -m benchmarks.engines`` results files.

    python -m benchmarks.speed_plot --png docs/speed_bleu.png \
        benchmarks/results/engines_cpu_d256_chain4_groups_sitting1.json \
        benchmarks/results/engines_cpu_d256_chain4_groups_sitting2.json

One point an engine, precision and batch size (the files' rows of the same name: their BLEU, and their times a
sentence as a range over the files, the point at the mean); printed as a table too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ENGINES = {"ctranslate2": "Transformer on CTranslate2 (greedy)", "runtime": "insertion on the runtime (parallel)"}
COLOURS = {"fp32": "#1f77b4", "int8": "#d62728"}


def points(files: Sequence[Path]) -> List[Dict]:
    """One point a row name found in every file: engine, precision, batch, BLEU, ms a sentence (each file's)."""
    rows: Dict[str, List[Dict]] = {}
    for path in files:
        for row in json.loads(Path(path).read_text())["rows"]:
            rows.setdefault(row["name"], []).append(row)
    out = []
    for name, found in rows.items():
        if len(found) != len(files):
            continue
        first = found[0]
        out.append({"name": name, "engine": first["engine"], "precision": first["precision"], "batch": first["batch"],
                    "bleu": round(first["bleu"], 2),
                    "ms": [round(1000 * r["seconds"] / r["sentences"], 2) for r in found]})
    if not out:
        raise SystemExit(f"{', '.join(map(str, files))}: no row found in every file")
    return sorted(out, key=lambda p: (p["engine"], p["precision"], p["batch"]))


def draw(found: List[Dict], png: Path, title: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.2), dpi=120)
    for p in found:
        ms = sum(p["ms"]) / len(p["ms"])
        filled = p["batch"] > 1
        marker = "o" if p["engine"] == "runtime" else "s"
        ax.errorbar(ms, p["bleu"], xerr=[[ms - min(p["ms"])], [max(p["ms"]) - ms]], fmt=marker, ms=8,
                    color=COLOURS.get(p["precision"], "k"), mfc=COLOURS.get(p["precision"], "k") if filled else "white",
                    capsize=3)
        ax.annotate(f"{p['precision']}, batch {p['batch']}", (ms, p["bleu"]), textcoords="offset points",
                    xytext=(6, 6), fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}" if f"{x:g}"[0] in "235" else ""))
    ax.margins(x=0.12, y=0.12)
    ax.set_xlabel("ms a sentence (log scale; lower is faster)")
    ax.set_ylabel("BLEU, test_2016_flickr")
    ax.set_title(title, fontsize=10)
    handles = [plt.Line2D([], [], marker="o" if e == "runtime" else "s", ls="", color="grey", label=label)
               for e, label in ENGINES.items()]
    handles += [plt.Line2D([], [], marker="o", ls="", color=c, label=p) for p, c in COLOURS.items()]
    handles += [plt.Line2D([], [], marker="o", ls="", color="grey", mfc="white", label="batch 1"),
                plt.Line2D([], [], marker="o", ls="", color="grey", label="batch 128")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed_plot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", type=Path, help="benchmarks.engines results files (.json)")
    p.add_argument("--png", type=Path, required=True)
    args = p.parse_args(argv)
    found = points(args.results)
    machine = json.loads(args.results[0].read_text()).get("machine", "")
    draw(found, args.png, f"{machine}, 1 thread")
    for point in found:
        print(f"{point['name']}\tBLEU {point['bleu']}\tms a sentence {' / '.join(map(str, point['ms']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
