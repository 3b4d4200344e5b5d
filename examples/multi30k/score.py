#!/usr/bin/env python3
"""Score a fairseq-generate output file with detokenised sacreBLEU.

Example::

    fairseq-generate data/multi30k_en_de/data-bin --gen-subset test --path ckpt.pt \
        --post-process subword_nmt --print-step > gen.out
    python examples/multi30k/score.py --generate-output gen.out \
        --reference data/multi30k_en_de/raw/test.tgt --lang de --json scores.json

Only ``H-``, ``P-`` and ``I-`` lines are read (the first of each per sentence id,
i.e. the best hypothesis under ``--nbest``); everything else is ignored.

* Hypothesis: the ``H-`` text, with any remaining ``@@ `` BPE markers removed,
  detokenised with ``sacremoses.MosesDetokenizer(lang)``. ``D-`` lines are ignored.
* Iterations: per sentence, from the ``I-`` lines (written by ``--print-step``);
  reported only if present.
* Length n of each hypothesis: the number of ``P-`` scores minus ``--p-specials``
  (default 1, the final ``</s>``) when ``P-`` lines exist, otherwise the number of
  whitespace tokens of the BPE-removed ``H-`` text. The reported log2 bound is the
  mean of ``floor(log2 n) + 1`` (0 when n = 0), the number of parallel insertion
  steps a balanced-binary-tree Insertion Transformer needs for n tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sacrebleu.metrics import BLEU
from sacremoses import MosesDetokenizer

LINE_RE = re.compile(r"^([HPI])-(\d+)\t(.*)$")


class ScoreError(RuntimeError):
    """A user-facing scoring error."""


@dataclass
class GenerateOutput:
    """The parts of a fairseq-generate output that scoring needs, keyed by sentence id."""

    hypotheses: dict[int, str] = field(default_factory=dict)
    positional_scores: dict[int, int] = field(
        default_factory=dict
    )  # number of P scores
    iterations: dict[int, int] = field(default_factory=dict)


def remove_bpe(text: str) -> str:
    """Remove subword-nmt ``@@ `` continuation markers (idempotent)."""
    return (text + " ").replace("@@ ", "").rstrip()


def parse_generate_output(path: Path) -> GenerateOutput:
    """Parse H-/P-/I- lines of a fairseq-generate output file."""
    out = GenerateOutput()
    with path.open(encoding="utf-8") as handle:
        for lineno, raw in enumerate(handle, 1):
            match = LINE_RE.match(raw.rstrip("\r\n"))
            if match is None:
                continue
            kind, sid, rest = match.group(1), int(match.group(2)), match.group(3)
            if kind == "H":
                parts = rest.split("\t", 1)  # score \t text (text may be empty)
                if sid not in out.hypotheses:
                    out.hypotheses[sid] = remove_bpe(parts[1] if len(parts) > 1 else "")
            elif kind == "P":
                if sid not in out.positional_scores:
                    out.positional_scores[sid] = len(rest.split())
            elif sid not in out.iterations:
                try:
                    out.iterations[sid] = int(rest.strip())
                except ValueError as exc:
                    raise ScoreError(
                        f"{path}:{lineno}: bad iteration count {rest!r}"
                    ) from exc
    return out


def read_reference(path: Path) -> list[str]:
    """Read reference lines (raw, untokenised)."""
    with path.open(encoding="utf-8", newline="\n") as handle:
        return [line.rstrip("\r\n") for line in handle]


def log2_bound(n: int) -> int:
    """``floor(log2 n) + 1`` for n > 0, else 0."""
    return n.bit_length()  # equals floor(log2 n) + 1 for n >= 1


def _format_ids(ids: list[int], limit: int = 20) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f", ... ({len(ids)} in total)" if len(ids) > limit else "")


def score(
    gen: GenerateOutput, references: list[str], lang: str, p_specials: int = 1
) -> dict[str, object]:
    """Compute detokenised corpus BLEU and iteration statistics."""
    expected = set(range(len(references)))
    missing = sorted(expected - gen.hypotheses.keys())
    extra = sorted(gen.hypotheses.keys() - expected)
    if missing or extra:
        msg = f"{len(gen.hypotheses)} hypotheses but {len(references)} reference lines"
        if missing:
            msg += f"; missing hypothesis ids: {_format_ids(missing)}"
        if extra:
            msg += f"; hypothesis ids beyond the reference: {_format_ids(extra)}"
        raise ScoreError(msg)

    ids = sorted(gen.hypotheses)
    detok = MosesDetokenizer(lang=lang)
    hyps = [detok.detokenize(gen.hypotheses[i].split(), unescape=False) for i in ids]
    bleu = BLEU()
    result = bleu.corpus_score(hyps, [references])

    lengths = [
        max(0, gen.positional_scores[i] - p_specials)
        if i in gen.positional_scores
        else len(gen.hypotheses[i].split())
        for i in ids
    ]
    mean_iterations, over_bound = None, None
    if gen.iterations:
        if gen.iterations.keys() != set(ids):
            lacking = sorted(set(ids) - gen.iterations.keys())
            raise ScoreError(
                f"I- lines present but missing for ids: {_format_ids(lacking)}"
            )
        mean_iterations = sum(gen.iterations[i] for i in ids) / len(ids)
        over_bound = iteration_distribution([gen.iterations[i] for i in ids], lengths)
    return {
        "bleu": result.score,
        "bleu_str": str(result),
        "signature": str(bleu.get_signature()),
        "sentences": len(ids),
        "mean_iterations": mean_iterations,
        "mean_log2_bound": sum(log2_bound(n) for n in lengths) / len(ids)
        if ids
        else 0.0,
        "length_source": "P" if gen.positional_scores else "H",
        "brevity_penalty": result.bp,
        "iterations": over_bound,
    }


def iteration_distribution(iterations: list[int], lengths: list[int]) -> dict[str, float]:
    """Per-sentence decoding iterations against floor(log2 n)+1: mean, 99th percentile and max
    of the iterations, the mean excess over the bound, and how many sentences take more than
    twice their bound, and more than twice their bound + 2."""
    bounds = [log2_bound(n) for n in lengths]
    ordered = sorted(iterations)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0
    return {
        "mean": sum(iterations) / max(len(iterations), 1),
        "p99": p99,
        "max": max(iterations, default=0),
        "mean_over_bound": sum(i - b for i, b in zip(iterations, bounds)) / max(len(iterations), 1),
        "over_2x_bound": sum(i > 2 * b for i, b in zip(iterations, bounds)),
        "over_2x_bound_plus_2": sum(i > 2 * b + 2 for i, b in zip(iterations, bounds)),
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--generate-output",
        type=Path,
        required=True,
        help="fairseq-generate output file",
    )
    parser.add_argument(
        "--reference", type=Path, required=True, help="raw (untokenised) reference file"
    )
    parser.add_argument(
        "--lang", required=True, help="target language for the Moses detokeniser"
    )
    parser.add_argument(
        "--json", type=Path, help="also write the scores to this JSON file"
    )
    parser.add_argument(
        "--p-specials",
        type=int,
        default=1,
        help="special tokens included in each P- line (default 1: </s>); n = #P scores - this",
    )
    args = parser.parse_args(argv)

    try:
        for path in (args.generate_output, args.reference):
            if not path.is_file():
                raise ScoreError(f"no such file: {path}")
        gen = parse_generate_output(args.generate_output)
        if not gen.hypotheses:
            raise ScoreError(f"no H- lines found in {args.generate_output}")
        result = score(gen, read_reference(args.reference), args.lang, args.p_specials)
    except ScoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    print(f"{result['bleu_str']}")
    print(f"signature: {result['signature']}")
    print(f"sentences: {result['sentences']}")
    if result["mean_iterations"] is not None:
        print(f"mean iterations: {result['mean_iterations']:.3f}")
    print(
        f"mean floor(log2 n)+1 (n from {result['length_source']}- lines): {result['mean_log2_bound']:.3f}"
    )
    if args.json is not None:
        payload = {
            k: result[k]
            for k in (
                "bleu",
                "signature",
                "sentences",
                "mean_iterations",
                "mean_log2_bound",
            )
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
