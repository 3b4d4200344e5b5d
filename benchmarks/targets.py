"""The performance targets, read from ``targets.json`` next to this file: each compares two
measurements of the system rows (see that file's ``about``), so a goal changes there, not here."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from pathlib import Path

TARGETS = Path(__file__).resolve().parent / "targets.json"
DEVICE_NAMES = {"cpu": "CPU", "cuda": "GPU"}


def load(path: Path = TARGETS) -> list[dict]:
    return json.loads(path.read_text())["targets"]


def pick(side: Mapping, by_name: Mapping[str, dict]) -> tuple[str | None, float | None]:
    """The system a side names (or the best of its pattern) and its value; (None, None) if absent."""
    if "best_of" in side:
        rows = [r for name, r in by_name.items()
                if fnmatch.fnmatchcase(name, side["best_of"]) and r.get(side["by"]) is not None]
        if not rows:
            return None, None
        row = max(rows, key=lambda r: r[side["by"]])
    else:
        row = by_name.get(side["system"])
        if row is None:
            return None, None
    return row["name"], row.get(side["key"])


def compute(kind: str, a: float | None, b: float | None) -> float | None:
    if kind == "difference":
        return None if a is None or b is None else round(a - b, 3)
    if not a or not b:
        return None
    return round(b / a if kind == "inverse_ratio" else a / b, 3)


def goal_of(target: Mapping, device: str) -> tuple[float | None, str]:
    """The goal for ``device`` and its text (">= 1.0 (CPU)", "reported (--extras)")."""
    goal = target.get("goal")
    if goal is None:
        note = target.get("note")
        return None, "reported" + (f" ({note})" if note else "")
    where = ""
    if isinstance(goal, Mapping):
        where = f" ({DEVICE_NAMES.get(device, device)})"
        goal = goal.get(device)
        if goal is None:
            return None, f"no goal on {device}"
    return float(goal), f"{target['direction']} {float(goal)}{where}"


def evaluate(rows: list[dict], device: str, targets: list[dict] | None = None) -> list[dict]:
    """Every target measured on ``rows``: metric, goal text, value and whether it is met
    (None: not measured, or reported only)."""
    by_name = {r["name"]: r for r in rows}
    out = []
    for target in load() if targets is None else targets:
        name_a, a = pick(target["a"], by_name)
        name_b, b = pick(target["b"], by_name)
        value = compute(target["compute"], a, b)
        goal, text = goal_of(target, device)
        met = None
        if value is not None and goal is not None:
            met = value >= goal if target["direction"] == ">=" else value <= goal
        metric = target["metric"].replace("{a}", name_a or "none").replace("{b}", name_b or "none")
        out.append({"metric": metric, "target": text, "value": value, "met": met})
    return out
