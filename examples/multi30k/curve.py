"""Valid BLEU against insertion updates, stage by stage, from the stages' results files.

    python -m examples.multi30k.curve --results benchmarks/results --png docs/stages_valid_bleu.png [--chain 3600 5400]

Reads ``chain{CHAIN}_stage*_seed*.json`` (each stage's valid BLEU at the EOS penalty its rule chose, from its
``scores`` or its ``valid_by_beta``; a stage 1 without a file of its own from the second stage's ``stage1``
record), draws one point a run (trained on a CPU or a GPU, by its
``training_machine``) and the teachers' greedy valid BLEU as lines, and prints the points.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

STAGE = re.compile(r"chain\d+_stage(\d+)_seed(\d+)(_gpu)?\.json$")
UPDATES_A_STAGE = 1800


def points(results: Path, chain: str = "3600") -> list[dict]:
    """One point a scored stage run: stage, seed, insertion updates, valid BLEU at its rule's beta, device."""
    found = []
    for path in sorted(results.glob(f"chain{chain}_stage*_seed*.json")):
        match = STAGE.search(path.name)
        data = json.loads(path.read_text())
        beta = data.get("eos_penalty_by_rule")
        valid = [r["bleu"] for r in data.get("scores", []) if r["subset"] == "valid" and r["beta"] == beta]
        if beta is not None and f"{beta:g}" in data.get("valid_by_beta", {}):
            valid.append(data["valid_by_beta"][f"{beta:g}"])
        if not match or not valid:
            continue
        stage = int(match.group(1))
        device = "gpu" if "GPU" in str(data.get("training_machine", "")).upper().replace("H200", "GPU") else "cpu"
        found.append({"stage": stage, "seed": int(match.group(2)), "updates": stage * UPDATES_A_STAGE,
                      "valid": valid[0], "device": device, "file": path.name, "chain": chain})
        if stage == 2 and "stage1" in data and not any(q["stage"] == 1 for q in found):
            first = data["stage1"]
            found.append({"stage": 1, "seed": first["seed"], "updates": UPDATES_A_STAGE, "valid": first["valid"],
                          "device": "cpu", "file": path.name, "chain": chain})
    return sorted(found, key=lambda p: (p["updates"], p["device"], p["seed"]))


def plot(found: list[dict], png: Path, teachers: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for chain in dict.fromkeys(p["chain"] for p in found):
        for device, marker in (("cpu", "o"), ("gpu", "s")):
            mine = [p for p in found if p["device"] == device and p["chain"] == chain]
            if mine:
                ax.scatter([p["updates"] for p in mine], [p["valid"] for p in mine], marker=marker,
                           label=f"chain from the {int(chain):,}-update teacher, trained on {device.upper()}")
    for name, bleu in teachers.items():
        ax.axhline(bleu, linestyle="--", linewidth=1, color="grey")
        ax.annotate(name, (UPDATES_A_STAGE * 0.9, bleu), va="bottom", fontsize=8)
    ax.set_xlabel("insertion updates (1,800 a stage)")
    ax.set_ylabel("valid BLEU (Multi30k en-de, the rule's beta)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.multi30k.curve", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True, help="the folder of the results files")
    p.add_argument("--png", type=Path, required=True)
    p.add_argument("--chain", nargs="+", default=["3600"], help="the chains' results files: "
                   "chain{CHAIN}_stage*_seed*.json, one colour a chain")
    p.add_argument("--teacher", nargs=2, action="append", metavar=("NAME", "BLEU"), default=[],
                   help="a teacher's greedy valid BLEU drawn as a line (repeatable)")
    args = p.parse_args(argv)
    found = [q for chain in args.chain for q in points(args.results, chain)]
    if not found:
        print(f"error: {args.results}: no scored chain{'/'.join(args.chain)}_stage*_seed*.json", file=sys.stderr)
        return 1
    plot(found, args.png, {name: float(bleu) for name, bleu in args.teacher})
    for q in found:
        print(f"chain {q['chain']} stage {q['stage']} seed {q['seed']} ({q['device']}): {q['updates']} updates, "
              f"valid {q['valid']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
