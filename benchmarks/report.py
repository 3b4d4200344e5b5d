"""The one report: targets (a ratio, inverse ratio or difference of two rows' numbers against a goal),
the run's record (machine, versions, command), markdown tables, and every path of this machine written
as its placeholder (REPO, DATA, OUT, KIT, ...) in the JSON and the table."""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from examples.commands import REPO
from examples.steps import run_info


@dataclass(frozen=True)
class Target:
    """``compute`` (ratio a / b, inverse_ratio b / a, difference a - b) of two rows' numbers (with ``*``: the
    best matching row) against ``goal`` (a number, one per device, or None: reported) in ``direction``."""
    metric: str
    a: str
    a_key: str
    b: str
    b_key: str
    compute: str = "ratio"
    goal: float | dict | None = None
    direction: str = "<="
    note: str = ""


def pick(rows: dict[str, dict], system: str, key: str) -> dict:
    if "*" not in system:
        return rows.get(system, {})
    return max((r for n, r in rows.items() if fnmatch.fnmatchcase(n, system) and r.get(key) is not None),
               key=lambda r: r[key], default={})


def compute(kind: str, a: float | None, b: float | None) -> float | None:
    if a is None or b is None or (kind != "difference" and not (a and b)):
        return None
    return round({"ratio": a / b, "inverse_ratio": b / a, "difference": a - b}[kind], 3)


def judged(metric: str, value: float | None, goal: float | None, direction: str, where: str = "",
           note: str = "", **extra) -> dict:
    """A target's row: its metric, goal text, value and whether it is met (None: not measured, or reported)."""
    shown = "|x| <=" if direction == "abs<=" else direction
    text = f"{shown} {goal:g}{where}" if goal is not None else "reported" + (f" ({note})" if note else "")
    met = None if value is None or goal is None else bool(
        {">=": value >= goal, "<=": value <= goal, "abs<=": abs(value) <= goal}[direction])
    return {"metric": metric, "target": text, "value": value, "met": met, **extra}


def evaluate(targets: Sequence[Target], rows: list[dict], device: str = "cpu") -> list[dict]:
    """Every target measured on ``rows`` (a goal per device: this device's)."""
    by_name, out = {r["name"]: r for r in rows}, []
    for t in targets:
        a, b = pick(by_name, t.a, t.a_key), pick(by_name, t.b, t.b_key)
        goal = t.goal.get(device) if isinstance(t.goal, dict) else t.goal
        where = f" ({ {'cpu': 'CPU', 'cuda': 'GPU'}.get(device, device)})" if isinstance(t.goal, dict) else ""
        out.append(judged(t.metric.replace("{a}", a.get("name", "none")), compute(t.compute, a.get(t.a_key),
                          b.get(t.b_key)), goal, t.direction, where, t.note))
    return out


def fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


class Column(NamedTuple):
    title: str
    value: Callable[[dict], object]  # the cell of a row
    digits: int = 2


def keyed(*keys: str) -> list[Column]:
    """Columns of the rows' own values, titled by their keys."""
    return [Column(k.replace("_", " "), lambda r, k=k: r.get(k)) for k in keys]


def table(columns: Sequence[Column], rows: list[dict]) -> list[str]:
    return ["| " + " | ".join(c.title for c in columns) + " |", "|" + " --- |" * len(columns),
            *("| " + " | ".join(fmt(c.value(r), c.digits) for c in columns) + " |" for r in rows)]


TARGET_COLUMNS = [Column("target", lambda t: t["metric"]), Column("goal", lambda t: t["target"]),
                  Column("measured", lambda t: t["value"], 3),
                  Column("rounds: lowest - highest", lambda t: (f"{min(t['by_round']):.3f} - {max(t['by_round']):.3f}"
                                                               if t.get("by_round") else "")),
                  Column("met", lambda t: "-" if t["met"] is None else ("yes" if t["met"] else "**no**"))]


def notes(results: dict) -> list[str]:
    return [line for note in results.get("notes", []) for line in ("", f"Note: {note}")]


def record(prog: str, argv: Sequence[str], device: str = "cpu", modules: Sequence[str] = ()) -> dict:
    """Where and when a run ran: machine, versions, date and command line (its paths made absolute: :func:`save`
    writes them as placeholders)."""
    info = run_info(device)
    for mod in modules:
        try:
            info["versions"][mod] = __import__(mod).__version__
        except Exception:  # reported, not fatal
            info["versions"][mod] = None
    words = [str(Path(w).resolve()) if not w.startswith("-") and Path(w).exists() else w for w in map(str, argv)]
    return {"machine": info["machine"], "device": device, "versions": info["versions"], "threads": info["threads"],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(["python", "-m", prog, *words])}


def placeholders(given: dict[str, Path | None]) -> dict[Path, str]:
    """This run's paths (absolute) by their placeholder, REPO added."""
    return {REPO: "REPO", **{p.resolve(): name for name, p in given.items() if p is not None}}


def portable(text: str, names: dict[Path, str]) -> str:
    """``text`` with every path of ``names`` written as its placeholder, the longest first."""
    for path, name in sorted(names.items(), key=lambda kv: -len(str(kv[0]))):
        text = text.replace(str(path), name)
    return text


def save(path: Path, results: dict, markdown: Callable[[dict], str], names: dict[Path, str] | None = None) -> str:
    """``results`` as JSON in ``path`` and its table beside it (``.md``), paths as placeholders; the table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(portable(json.dumps(results, default=str), names or {}))
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(text := markdown(results), encoding="utf-8")
    return text


FLAGS = {  # the comparisons' common flags, each given its default by the comparison (or keywords over these)
    "teacher": {"type": Path, "help": "the teacher checkpoint"},
    "insertion": {"type": Path, "help": "the insertion model's checkpoint (same dictionaries)"},
    "data_bin": {"type": Path, "help": "its data-bin, with the split decoded"},
    "ref": {"type": Path, "help": "the raw references (one line per test sentence)"},
    "lang": {"help": "the Moses detokeniser's language (default %(default)s; none: no detokeniser)"},
    "eos_penalty": {"type": float, "help": "the insertion model's EOS penalty (default %(default)s)"},
    "sentences": {"type": int, "help": "the first N test sentences (0: all; default %(default)s)"},
    "batches": {"type": int, "nargs": "+", "help": "batch sizes (default %(default)s)"},
    "precisions": {"nargs": "+", "choices": ("fp32", "int8"), "help": "the runtime's precisions (default %(default)s)"},
    "threads": {"type": int, "help": "the engines' threads (default %(default)s)"},
    "betas": {"type": float, "nargs": "+", "help": "EOS penalties tried (default %(default)s)"},
}


def flags(p: argparse.ArgumentParser, **given) -> argparse.ArgumentParser:
    """:data:`FLAGS` on ``p``, each by name with its default (a dict: keywords over the flag's own)."""
    for name, value in given.items():
        p.add_argument(f"--{name.replace('_', '-')}", **{**FLAGS[name], **(
            value if isinstance(value, dict) else {"default": value})})
    return p


def parser(prog: str, doc: str, **given) -> argparse.ArgumentParser:
    """A comparison's command line: ``--out``, ``--render``, ``--rounds`` and ``--profile`` to begin with, then
    the :data:`FLAGS` ``given``."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.splitlines()[0], epilog=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="where the results go")
    p.add_argument("--render", type=Path, metavar="JSON", help="write the table again from JSON, beside it")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds, the systems taking turns (default 3)")
    p.add_argument("--profile", action="store_true", help="also one decode of each under torch's profiler")
    return flags(p, **given)


def command(build: Callable[[], argparse.ArgumentParser], markdown: Callable[[dict], str], run: Callable,
            needed: Sequence[str], modules: Sequence[str] = ()) -> Callable[..., int]:
    """A comparison's ``main(argv)``: its run's :func:`record` (``--device``'s, the versions of ``modules``), then
    ``run(args)`` gives its results file, results and placeholders, written after the record with the table (the
    paths ``needed`` must exist); ``--render JSON``: the table again, beside it."""
    def main(argv: Sequence[str] | None = None) -> int:
        argv, parser = sys.argv[1:] if argv is None else list(argv), build()
        args = parser.parse_args(argv)
        args.lang = None if getattr(args, "lang", None) == "none" else getattr(args, "lang", None)
        for flag in () if args.render else needed:
            paths = getattr(args, flag) if isinstance(getattr(args, flag), list) else [getattr(args, flag)]
            if None in paths or (flag != "out" and not all(p.exists() for p in paths)):
                parser.exit(2, f"{parser.prog}: error: --{flag.replace('_', '-')} {paths[0] or ''}: not found\n")
        if args.render:
            path, results, names = args.render, json.loads(args.render.read_text()), {}
        else:
            ran = record(parser.prog.split()[-1], argv, getattr(args, "device", "cpu"), modules)
            path, results, names = run(args)
            results = {**ran, **results}
        print(save(path, results, markdown, names), end="")
        return 0
    return main
