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


def pick(side: Mapping, by_name: Mapping[str, dict]) -> dict:
    """The row a side names (or the best of its pattern); empty if there is none."""
    if "best_of" not in side:
        return by_name.get(side["system"], {})
    rows = [r for name, r in by_name.items()
            if fnmatch.fnmatchcase(name, side["best_of"]) and r.get(side["by"]) is not None]
    return max(rows, key=lambda r: r[side["by"]]) if rows else {}


def comparable(key: str, a: Mapping, b: Mapping) -> bool:
    """Decode seconds compare only between rows timed on the same machine (where rows say)."""
    if not key.startswith("decode_seconds"):
        return True
    on_a, on_b = (r.get("timing_machine") or r.get("machine") for r in (a, b))
    return on_a is None or on_b is None or on_a == on_b


def between(kind: str, key: str, a: Mapping, b: Mapping, key_b: str | None = None) -> float | None:
    """``compute`` on ``a[key]`` and ``b[key_b or key]``; None for rows timed on different machines."""
    return compute(kind, a.get(key), b.get(key_b or key)) if comparable(key, a, b) else None


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
        a, b = pick(target["a"], by_name), pick(target["b"], by_name)
        value = between(target["compute"], target["a"]["key"], a, b, target["b"]["key"])
        goal, text = goal_of(target, device)
        met = None
        if value is not None and goal is not None:
            met = value >= goal if target["direction"] == ">=" else value <= goal
        metric = target["metric"].replace("{a}", a.get("name", "none")).replace("{b}", b.get("name", "none"))
        out.append({"metric": metric, "target": text, "value": value, "met": met})
    return out
