"""``python -m fairseq_insertion.export``: the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from .. import preprocess as P
from ..config import INT8_SCHEMES, RUNTIME_OPTIONS, DecodingConfig, add_runtime_arguments
from ..errors import InsertionError
from ..export_format import SHORTLIST
from .files import export, recorded_preprocessing


def build_parser() -> argparse.ArgumentParser:
    doc = sys.modules[__package__].__doc__  # the package's: what an export holds
    p = argparse.ArgumentParser(prog="python -m fairseq_insertion.export", description=doc.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    p.add_argument("--path", type=Path, required=True, help="an insertion_transformer checkpoint")
    p.add_argument("--data", type=Path, required=True, help="the fairseq-preprocess directory of its dictionaries")
    p.add_argument("--out", type=Path, required=True, help="the directory to write")
    p.add_argument("--int8", nargs="?", const="per-row", default=None, choices=tuple(INT8_SCHEMES),
                   help="int8 products: per-row activation scales (the default: a sentence's translation does not "
                   "depend on its batch) or onnxruntime's dynamic quantization (faster at batch 1; its outputs "
                   "move with the batch)")
    p.add_argument("--rerank-with", type=Path, default=None, metavar="CHECKPOINT",
                   help="an autoregressive fairseq transformer of the same dictionaries (e.g. the distillation "
                   "teacher), exported as scorer.onnx: it chooses among the --eos-penalties candidates")
    p.add_argument("--shortlist", type=Path, default=None, metavar="TABLE",
                   help="a lexical shortlist table (python -m fairseq_insertion.shortlist), exported as "
                   f"{SHORTLIST}: each sentence's slots choose among its list only")
    add_runtime_arguments(p.add_argument_group("decoding (the runtime's defaults; DecodingConfig's when not given)"))
    P.add_arguments(p.add_argument_group("raw text (how it was prepared for the model, recorded for the runtime)"),
                    f"--data's {P.RECORD} when it has one")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    given = {k: v for k in RUNTIME_OPTIONS if (v := getattr(args, k, None)) is not None}  # constraint_order: no flag
    try:
        config = DecodingConfig(**given)
        recorded = recorded_preprocessing(args.data)
        preprocessing = P.from_arguments(args, recorded, str(args.data / P.RECORD)) or recorded
        out = export(args.path, args.data, args.out, args.int8, config, preprocessing, args.rerank_with, args.shortlist)
    except InsertionError as exc:  # the export's, the options' and the preprocessing's refusals
        print(f"python -m fairseq_insertion.export: error: {exc}", file=sys.stderr)
        return 2
    print(f"exported to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0
