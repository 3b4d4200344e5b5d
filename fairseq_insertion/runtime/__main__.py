"""Translate with an exported insertion model, one output line per input line, in order.

    python -m fairseq_insertion.runtime translate DIR [--input FILE] [--batch-size N] [--threads N] \\
        [--tokenizer moses|none [--bpe-codes CODES --source-lang SRC --target-lang TGT ...]] [decoding options]

Input lines are the model's subword pieces, or raw text with ``--tokenizer`` (prepared as the export's
preprocessing record says, each setting changed by the options given); ``--constraints`` reads
fairseq-interactive's ``source<TAB>constraint...`` lines. The input is read as UTF-8 (an invalid byte is a
U+FFFD and a warning) and translated --batch-size lines at a time, each batch flushed before the next is
read; a line that cannot be translated gives an empty output line and a warning naming it. The decoding
options default to the export's (each on/off option has a ``--no-`` form). Errors are one line on standard
error, exit status 2. docs/deploy.md has the flags.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import logging
import os
import sys
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, TextIO

import numpy as np

from .. import preprocess as P
from ..config import CONSTRAINT_ORDERS, DecodingError, add_runtime_arguments
from ..errors import InsertionError
from ..export_format import SETTINGS
from . import RUNTIME_OPTIONS, Translator

logger = logging.getLogger("fairseq_insertion.runtime")
PROG = "python -m fairseq_insertion.runtime"


class Text(NamedTuple):
    """How a line's source and constraints become pieces, and target pieces an output line."""

    encode: Callable[[str], List[str]]
    decode: Callable[[List[str]], str]
    constraint: Callable[[str], List[str]]


def read_lines(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """UTF-8 lines without their line ends, a leading byte-order mark skipped; an invalid byte is a U+FFFD, warned."""
    for i, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            logger.warning("%s line %d: not valid UTF-8; invalid bytes read as U+FFFD", name, i)
        yield (text[1:] if i == 1 and text.startswith("\ufeff") else text).rstrip("\r\n")


def translate(args: argparse.Namespace, out: TextIO) -> None:
    """Translate the input batch by batch, writing and flushing each batch's lines. With ``--tokenizer``, lines become
    pieces and pieces lines by the export's preprocessing changed by the options given (its subword model read and
    checked against the target vocabulary now)."""
    options = {k: getattr(args, k) for k in RUNTIME_OPTIONS if getattr(args, k) is not None}
    translator = Translator(args.model_dir, intra_threads=args.threads)
    opts = translator.options(**options)
    settings = P.from_arguments(args, translator.preprocessing, str(translator.model_dir / SETTINGS))
    if settings is not None:
        P.load(settings)
        P.check_vocabulary(settings, translator.words(), "the export's target vocabulary")
        text = Text(lambda line: P.prepare_line(line, settings).split(), lambda pieces: P.detokenize(pieces, settings),
                    lambda c: P.prepare_constraint(c, settings).split())
    elif args.post_process == "subword_nmt":
        text = Text(str.split, lambda pieces: (" ".join(pieces) + " ").replace("@@ ", "").rstrip(), str.split)
    else:
        text = Text(str.split, " ".join, str.split)
    name, constraints = "standard input" if args.input == "-" else args.input, args.constraint_order is not None
    with contextlib.nullcontext(sys.stdin.buffer) if args.input == "-" else open(args.input, "rb") as stream:
        lines, first = read_lines(stream, name), 1  # first: the number of the batch's first line, from 1
        while batch := list(itertools.islice(lines, args.batch_size)):  # as the lines are read
            # each line: its source (--constraints: then its constraints after tabs); empty or over-long: "", warned
            ids: Dict[int, np.ndarray] = {}
            given: Dict[int, List[List[str]]] = {}
            for number, line in enumerate(batch, first):
                fields = line.split("\t") if constraints else [line]
                pieces = text.encode(fields[0])
                source = translator.encode(pieces)
                given[number] = [c for c in map(text.constraint, fields[1:]) if c]
                if not pieces and not given[number]:
                    logger.warning("%s line %d: empty; its translation is empty", name, number)
                elif len(source) > translator.max_source_positions:
                    logger.warning("%s line %d: %d source tokens with the end-of-sentence marker, over the model's "
                                   "%d; its translation is empty", name, number, len(source),
                                   translator.max_source_positions)
                else:
                    ids[number] = source
            targeted = translator.encode_constraints([given[n] for n in ids], len(ids),
                                                     [f"{name} line {n}" for n in ids]) if constraints else None
            results = translator.translate_ids(list(ids.values()), len(ids), opts, targeted)
            targets = {number: text.decode([translator.target_symbols[t] for t in candidates[0].ids.tolist()])
                       for number, candidates in zip(ids, results)}
            out.write("".join(f"{targets.get(number, '')}\n" for number in range(first, first + len(batch))))
            out.flush()
            first += len(batch)


def check_arguments(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with a combination of arguments, if anything."""
    if args.tokenizer is None:
        try:
            P.from_arguments(args, None, "")  # an option of raw text without --tokenizer
        except P.PreprocessError as exc:
            return str(exc)
    if args.tokenizer is not None and args.post_process != "none":
        return (f"--post-process applies to subword pieces out; with --tokenizer {args.tokenizer} the output is "
                "detokenised text")
    if args.batch_size < 1:
        return f"--batch-size must be >= 1, got {args.batch_size}"
    if args.threads < 0:
        return f"--threads must be >= 0 (0: all cores), got {args.threads}"
    return None


def utf8(stream: TextIO) -> None:
    """Write UTF-8 whatever the locale (a stream that is not a text file is left as it is)."""
    if isinstance(stream, io.TextIOWrapper):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace" if stream is sys.stderr else "strict")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line: ``PROG translate: error: ...``, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("translate", help="translate lines with an exported model")
    t.add_argument("model_dir", help="the directory python -m fairseq_insertion.export wrote")
    t.add_argument("--input", default="-", help="input file (default: standard input)")
    t.add_argument("--batch-size", type=int, default=32, help="sentences decoded together (default 32)")
    t.add_argument("--threads", type=int, default=1, help="threads per pass (0: all cores; default 1)")
    P.add_arguments(t.add_argument_group("raw text in and out"), "the export's record")
    t.add_argument("--post-process", choices=("none", "subword_nmt"), default="none",
                   help="subword_nmt: undo the @@ joins of the output pieces (default: none)")
    t.add_argument("--constraints", nargs="?", const="ordered", choices=CONSTRAINT_ORDERS, dest="constraint_order",
                   help="each line is its source, then its hard constraints after tabs (fairseq-interactive's "
                        "format), kept in the given order (ordered, the default) or in the order the unconstrained "
                        "translation suggests (unordered)")
    add_runtime_arguments(t.add_argument_group("decoding (default: the export's; --no-X switches X off)"))
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    utf8(sys.stderr)
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    args = build_parser().parse_args(argv)
    problem = check_arguments(args)
    if problem is None:
        utf8(sys.stdout)
        try:
            translate(args, sys.stdout)
        except BrokenPipeError:  # a closed output is no error: the rest to os.devnull, so that Python's flush at
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # exit raises nothing (its SIGPIPE recipe)
        except DecodingError as exc:
            problem = exc.command_line()
        except InsertionError as exc:  # the runtime's and the preprocessing's refusals
            problem = str(exc)
        except OSError as exc:
            problem = f"{exc.filename or 'standard output'}: {exc.strerror}"
    if problem is None:
        return 0
    print(f"{PROG} {args.command}: error: {problem}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
