#!/usr/bin/env python3
"""Constrained decoding on Multi30k: draw reference constraints, decode with and
without them, report constraint usage rate, BLEU and iterations.

Run ``prepare.py`` first; ``--data`` is its output directory (``tok/``, ``raw/``,
``data-bin/``). Three sub-commands::

    # 1-2 reference n-grams per test sentence -> a --constraints-file (BPE'd like tok/test.tgt)
    python examples/multi30k/constraints.py draw --data work/data --out work/constraints.txt
    # usage rate of a fairseq-generate output
    python examples/multi30k/constraints.py usage --constraints work/constraints.txt --generate-output gen.out
    # everything: draw, decode without and with constraints, score; prints the README table rows
    python examples/multi30k/constraints.py run --data work/data --checkpoint work/bt/checkpoint_last.pt \\
        --out work/constraints --eos-penalty 2

Drawing rule (constraints from the reference, as Susanto et al. (2020) do; the
exact sampling is ours): per sentence, k ~ Uniform{1, 2} constraints, each an
n-gram of n ~ Uniform{1, .., --max-n} whole words (a word is a Moses token, all
its BPE pieces), the k n-grams non-overlapping and written in reference order,
separated by tabs (fewer when 20 draws find no free place; none for an empty
reference). Seeded (``--seed``), so the file is reproducible.

Usage rate: the fraction of constraints whose words (BPE removed) appear
contiguously in the hypothesis (BPE removed), over all constraints. ``run``
reports it for the unconstrained decode too (how often the model produces the
drawn n-grams by itself). Arguments ``run`` does not know go to both
fairseq-generate calls (``--eos-penalty 2 --batch-size 128 --decoding greedy``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, when run as a script
from examples.commands import generate_command  # noqa: E402
from examples.commands import run as run_command
from examples.generate_output import read_generate_output, read_reference, remove_bpe, score  # noqa: E402


def bpe_words(line: str) -> list[str]:
    """Group subword-nmt pieces into whole words: ``"a b@@ c"`` -> ``["a", "b@@ c"]``."""
    words: list[str] = []
    current: list[str] = []
    for piece in line.split():
        current.append(piece)
        if not piece.endswith("@@"):
            words.append(" ".join(current))
            current = []
    if current:
        words.append(" ".join(current))
    return words


def draw_line(reference: str, rng: random.Random, max_n: int = 3) -> list[str]:
    """1-2 non-overlapping n-grams of whole words of one BPE'd reference line, in order."""
    words = bpe_words(reference)
    if not words:
        return []
    k = rng.randint(1, 2)
    picks: list[tuple[int, int]] = []
    for _ in range(20):
        if len(picks) == k:
            break
        n = rng.randint(1, min(max_n, len(words)))
        start = rng.randint(0, len(words) - n)
        if all(start + n <= s or s + m <= start for s, m in picks):
            picks.append((start, n))
    return [" ".join(words[s: s + n]) for s, n in sorted(picks)]


def draw(references: list[str], seed: int = 1, max_n: int = 3) -> list[list[str]]:
    rng = random.Random(seed)
    return [draw_line(ref, rng, max_n) for ref in references]


def write_constraints(path: Path, constraints: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(cs) + "\n" for cs in constraints), encoding="utf-8")


def read_constraints(path: Path) -> list[list[str]]:
    return [[c for c in line.split("\t") if c.strip()] for line in read_reference(path)]


def usage(constraints: list[list[str]], hypotheses: dict[int, str]) -> dict[str, object]:
    """Usage rate: constraints found verbatim (whole words, contiguous) in their hypothesis."""
    total = used = 0
    missed: list[int] = []
    for i, cs in enumerate(constraints):
        hyp = f" {remove_bpe(hypotheses.get(i, ''))} "
        for c in cs:
            total += 1
            if f" {remove_bpe(c)} " in hyp:
                used += 1
            elif not missed or missed[-1] != i:
                missed.append(i)
    return {"constraints": total, "used": used, "usage_rate": used / total if total else 1.0,
            "sentences_with_constraints": sum(1 for cs in constraints if cs), "missed_ids": missed[:20]}


def generate(data: Path, checkpoint: Path, out: Path, extra: list[str]) -> Path:
    """fairseq-generate on the test set, its output in ``out``; ``extra``: further arguments, whose
    decoding flags (``--eos-penalty``, ``--decoding``, ``--batch-size``) override the defaults."""
    cmd = generate_command(data / "data-bin", checkpoint, "insertion", batch_size=None,
                           device="cpu" if "--cpu" in extra else "cuda",
                           max_len_b=200, extra=["--source-lang", "src", "--target-lang", "tgt", *extra])
    run_command(cmd, out.with_suffix(".log"), stdout=out)
    return out


def run(data: Path, checkpoint: Path, out: Path, lang: str, seed: int, max_n: int, extra: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cfile = out / "constraints.txt"
    constraints = draw(read_reference(data / "tok" / "test.tgt"), seed, max_n)
    write_constraints(cfile, constraints)
    refs = read_reference(data / "raw" / "test.tgt")
    rows = {}
    for name, flags in (("none", []), ("1-2 reference n-grams", ["--constraints-file", str(cfile)])):
        gen = read_generate_output(generate(data, checkpoint, out / f"{name.split()[0]}.out", [*flags, *extra]))
        rows[name] = {**score(gen, refs, lang), **usage(constraints, gen.hypotheses)}
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    return rows


def table(rows: dict) -> str:
    lines = ["| constraints | usage rate | BLEU | mean iterations | mean floor(log2 n)+1 |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        rate = f"{100 * r['usage_rate']:.1f}% ({r['used']}/{r['constraints']})" if r["constraints"] else "-"
        iters = f"{r['mean_iterations']:.2f}" if r["mean_iterations"] is not None else "-"
        lines.append(f"| {name} | {rate} | {r['bleu']:.2f} | {iters} | {r['mean_log2_bound']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("draw", help="write a constraints file for the test set")
    p.add_argument("--data", type=Path, required=True, help="prepare.py output directory")
    p.add_argument("--out", type=Path, required=True)
    for q in (p, r := sub.add_parser("run", help="draw, decode with and without constraints, score")):
        q.add_argument("--seed", type=int, default=1)
        q.add_argument("--max-n", type=int, default=3, help="longest constraint, in words (default 3)")
    r.add_argument("--data", type=Path, required=True, help="prepare.py output directory")
    r.add_argument("--checkpoint", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True, help="directory for the constraints file and outputs")
    r.add_argument("--lang", default="de", help="target language, for detokenisation (default de)")
    u = sub.add_parser("usage", help="usage rate of a fairseq-generate output")
    u.add_argument("--constraints", type=Path, required=True)
    u.add_argument("--generate-output", type=Path, required=True)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "draw":
        write_constraints(args.out, draw(read_reference(args.data / "tok" / "test.tgt"), args.seed, args.max_n))
    elif args.command == "usage":
        print(json.dumps(usage(read_constraints(args.constraints),
                               read_generate_output(args.generate_output).hypotheses), indent=2))
    else:  # further arguments go to fairseq-generate (e.g. --eos-penalty 2 --batch-size 128 --cpu)
        print(table(run(args.data, args.checkpoint, args.out, args.lang, args.seed, args.max_n, extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
