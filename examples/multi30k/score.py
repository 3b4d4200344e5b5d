#!/usr/bin/env python3
"""Score a fairseq-generate output file with detokenised sacreBLEU.

Example::

    fairseq-generate data/multi30k_en_de/data-bin --gen-subset test --path ckpt.pt \
        --post-process subword_nmt --print-step > gen.out
    python examples/multi30k/score.py --generate-output gen.out \
        --reference data/multi30k_en_de/raw/test.tgt --lang de --json scores.json

Reading and scoring are ``examples/generate_output.py``'s: sacreBLEU on the ``H-`` text, BPE
removed and Moses-detokenised, against the raw references; mean iterations from the ``I-`` lines
(``--print-step``); n from the ``P-`` lines less ``--p-specials`` (else the ``H-`` words) and the mean
of floor(log2 n)+1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, when run as a script
from examples.generate_output import ScoreError, read_generate_output, read_reference, score  # noqa: E402


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
        if not args.generate_output.is_file():
            raise ScoreError(f"no such file: {args.generate_output}")
        gen = read_generate_output(args.generate_output)
        if not gen.hypotheses:
            raise ScoreError(f"no H- lines found in {args.generate_output}")
        try:
            references = read_reference(args.reference)
        except UnicodeDecodeError:  # read as the plugin reads input: U+FFFD, a warning naming each line
            from fairseq_insertion.fairseq_fixes import read_text_lines

            references = read_text_lines(str(args.reference), "--reference")
        result = score(gen, references, args.lang, args.p_specials)
    except ScoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    if args.json is not None:  # first, so that a closed stdout (score.py ... | head -1) cannot stop it
        _write_json(args.json, result)
    try:
        _report(result)
    except BrokenPipeError:  # the reader left: the JSON is written; nothing more to say (Python's advice:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # stdout to devnull, no error at exit)
    return 0


def _report(result: dict) -> None:
    print(f"{result['bleu_str']}")
    print(f"signature: {result['signature']}")
    print(f"sentences: {result['sentences']}")
    if result["mean_iterations"] is not None:
        print(f"mean iterations: {result['mean_iterations']:.3f}")
    print(
        f"mean floor(log2 n)+1 (n from {result['length_source']}- lines): {result['mean_log2_bound']:.3f}"
    )
    sys.stdout.flush()


def _write_json(path: Path, result: dict) -> None:
    keys = ("bleu", "signature", "sentences", "mean_iterations", "mean_log2_bound")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: result[k] for k in keys}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
