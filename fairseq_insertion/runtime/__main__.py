"""Translate with an exported insertion model, one output line per input line, in order.

    python -m fairseq_insertion.runtime translate DIR [--input FILE] [--batch-size N] [--threads N] \\
        [--tokenizer moses --bpe-codes CODES --source-lang SRC --target-lang TGT] [decoding options]

Input lines are the model's subword pieces (BPE'd text), output lines the same; with
``--post-process subword_nmt`` the ``@@`` joins are undone. With ``--tokenizer moses --bpe-codes
CODES`` the input is raw text (Moses-tokenised, then BPE'd with subword-nmt) and the output is
detokenised text. An empty line, or one the model cannot take, gives an empty output line (and
a warning naming the line on standard error). The decoding options default to the export's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, List, Optional, Sequence, TextIO

from ..config import FLAGS, DecodingConfig, DecodingError
from . import RUNTIME_OPTIONS, Translator, TranslatorError

logger = logging.getLogger("fairseq_insertion.runtime")
PROG = "python -m fairseq_insertion.runtime"


def read_lines(stream, name: str) -> List[str]:
    """UTF-8 lines without their line ends; an invalid byte becomes U+FFFD, with a warning naming the line."""
    lines = []
    for i, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            logger.warning("%s line %d: not valid UTF-8; invalid bytes read as U+FFFD", name, i)
        lines.append(text.rstrip("\r\n"))
    return lines


def text_pipeline(args: argparse.Namespace) -> tuple[Callable[[str], List[str]], Callable[[List[str]], str]]:
    """How a line becomes source pieces, and target pieces an output line."""
    if args.tokenizer == "moses":
        from sacremoses import MosesDetokenizer, MosesTokenizer
        from subword_nmt.apply_bpe import BPE

        with open(args.bpe_codes, encoding="utf-8") as codes:
            bpe = BPE(codes, separator="@@")
        tok, detok = MosesTokenizer(args.source_lang), MosesDetokenizer(args.target_lang)

        def encode(line: str) -> List[str]:  # fairseq's moses tokenizer and subword_nmt bpe
            words = tok.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=False)
            return bpe.process_line(words).split()

        def decode(pieces: List[str]) -> str:
            return detok.detokenize((" ".join(pieces) + " ").replace("@@ ", "").split())

        return encode, decode
    if args.post_process == "subword_nmt":
        return str.split, lambda pieces: (" ".join(pieces) + " ").replace("@@ ", "").rstrip()
    return str.split, " ".join


def translate(args: argparse.Namespace, out: TextIO) -> int:
    options = {k: getattr(args, k) for k in RUNTIME_OPTIONS if getattr(args, k) is not None}
    translator = Translator(args.model_dir, intra_threads=args.threads)
    opts = translator.options(**options)
    encode, decode = text_pipeline(args)
    if args.input == "-":
        lines = read_lines(sys.stdin.buffer, "standard input")
    else:
        with open(args.input, "rb") as handle:
            lines = read_lines(handle, args.input)
    ids = [translator.encode(encode(line)) for line in lines]
    for i, line in enumerate(lines, 1):
        if not line.strip():
            logger.warning("input line %d: empty; its translation is empty", i)
    results = translator.translate_ids(ids, args.batch_size, opts)
    for target, _, _ in results:
        out.write(decode([translator.target_symbols[t] for t in target.tolist()]) + "\n")
    out.flush()
    return 0


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line: ``PROG translate: error: ...``, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = p.translate_parser = sub.add_parser("translate", help="translate lines with an exported model")
    t.add_argument("model_dir", help="the directory python -m fairseq_insertion.export wrote")
    t.add_argument("--input", default="-", help="input file (default: standard input)")
    t.add_argument("--batch-size", type=int, default=32, help="sentences decoded together (default 32)")
    t.add_argument("--threads", type=int, default=1, help="threads per pass (0: all cores; default 1)")
    t.add_argument("--tokenizer", choices=("moses",), default=None, help="raw text in and out (needs --bpe-codes)")
    t.add_argument("--bpe-codes", default=None, help="subword-nmt codes of the model (with --tokenizer moses)")
    t.add_argument("--source-lang", default="en", help="Moses tokeniser language (default en)")
    t.add_argument("--target-lang", default="de", help="Moses detokeniser language (default de)")
    t.add_argument("--post-process", choices=("none", "subword_nmt"), default="none",
                   help="subword_nmt: undo the @@ joins of the output pieces (default: none)")
    g = t.add_argument_group("decoding (default: the export's)")
    d = DecodingConfig()
    for name in RUNTIME_OPTIONS:
        default = getattr(d, name)
        if isinstance(default, bool):
            g.add_argument(FLAGS[name], dest=name, action="store_true", default=None)
        else:
            g.add_argument(FLAGS[name], dest=name, type=type(default), default=None, metavar=name.upper())
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    parser = build_parser()
    args = parser.parse_args(argv)
    parser = parser.translate_parser
    if args.tokenizer == "moses" and not args.bpe_codes:
        parser.error("--tokenizer moses needs --bpe-codes")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        return translate(args, sys.stdout)
    except (TranslatorError, DecodingError) as exc:
        parser.error(exc.command_line() if isinstance(exc, DecodingError) else str(exc))
    except OSError as exc:
        parser.error(f"{exc.filename}: {exc.strerror}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
