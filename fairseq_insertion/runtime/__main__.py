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
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, TextIO, Tuple

import numpy as np

from .. import preprocess as P
from ..config import CONSTRAINT_ORDERS, DecodingConfig, DecodingError, add_runtime_arguments
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


def batches(lines: Iterable[str], size: int) -> Iterator[Tuple[int, List[str]]]:
    """(number of the first line, counted from 1; up to ``size`` lines), as the lines are read."""
    lines = iter(lines)
    first = 1
    while batch := list(itertools.islice(lines, size)):
        yield first, batch
        first += len(batch)


def text_pipeline(args: argparse.Namespace, translator: Translator) -> Text:
    """How lines become pieces and pieces lines: with ``--tokenizer``, the export's preprocessing changed by the
    options given (its subword model read and checked against the target vocabulary now)."""
    settings = P.from_arguments(args, translator.preprocessing, str(translator.model_dir / SETTINGS))
    if settings is not None:
        P.load(settings)
        P.check_vocabulary(settings, translator.words(), "the export's target vocabulary")
        return Text(lambda line: P.prepare_line(line, settings).split(), lambda pieces: P.detokenize(pieces, settings),
                    lambda c: P.prepare_constraint(c, settings).split())
    if args.post_process == "subword_nmt":
        return Text(str.split, lambda pieces: (" ".join(pieces) + " ").replace("@@ ", "").rstrip(), str.split)
    return Text(str.split, " ".join, str.split)


def translate(args: argparse.Namespace, out: TextIO) -> int:
    """Translate the input batch by batch, writing and flushing each batch's lines."""
    options = {k: getattr(args, k) for k in RUNTIME_OPTIONS if getattr(args, k) is not None}
    translator = Translator(args.model_dir, intra_threads=args.threads)
    opts = translator.options(**options)
    text = text_pipeline(args, translator)
    name = "standard input" if args.input == "-" else args.input
    with contextlib.nullcontext(sys.stdin.buffer) if args.input == "-" else open(args.input, "rb") as stream:
        for first, lines in batches(read_lines(stream, name), args.batch_size):
            out.write("".join(f"{line}\n" for line in translate_lines(translator, opts, lines, first, name, text,
                                                                     args.constraint_order is not None)))
            out.flush()
    return 0


def translate_lines(translator: Translator, opts: DecodingConfig, lines: List[str], first: int, name: str,
                    text: Text, constraints: bool = False) -> List[str]:
    """The output line of each input line (``constraints``: its source, then its constraints after tabs); an empty
    one, with a warning, for a line that is empty or longer than the model's source positions."""
    ids: Dict[int, np.ndarray] = {}
    given: Dict[int, List[List[str]]] = {}
    for number, line in enumerate(lines, first):
        fields = line.split("\t") if constraints else [line]
        pieces = text.encode(fields[0])
        source = translator.encode(pieces)
        given[number] = [c for c in map(text.constraint, fields[1:]) if c]
        if not pieces and not given[number]:
            logger.warning("%s line %d: empty; its translation is empty", name, number)
        elif len(source) > translator.max_source_positions:
            logger.warning("%s line %d: %d source tokens with the end-of-sentence marker, over the model's %d; "
                           "its translation is empty", name, number, len(source), translator.max_source_positions)
        else:
            ids[number] = source
    targeted = None
    if constraints:
        targeted = translator.encode_constraints([given[n] for n in ids], len(ids), [f"{name} line {n}" for n in ids])
    results = translator.translate_ids(list(ids.values()), len(ids), opts, targeted)
    targets = {number: text.decode([translator.target_symbols[t] for t in candidates[0].ids.tolist()])
               for number, candidates in zip(ids, results)}
    return [targets.get(number, "") for number in range(first, first + len(lines))]


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
        problem = run(args)
    if problem is None:
        return 0
    print(f"{PROG} {args.command}: error: {problem}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> Optional[str]:
    """Translate; what stopped it, if anything (a closed output is no error)."""
    try:
        translate(args, sys.stdout)
    except BrokenPipeError:  # the reader went away: the rest to os.devnull, so that Python's flush at exit raises
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing (Python's recipe for SIGPIPE)
    except DecodingError as exc:
        return exc.command_line()
    except InsertionError as exc:  # the runtime's and the preprocessing's refusals
        return str(exc)
    except OSError as exc:
        return f"{exc.filename or 'standard output'}: {exc.strerror}"
    return None


if __name__ == "__main__":
    sys.exit(main())
