"""The benchmark's command line: the flags, their full-mode and ``--quick`` defaults, and the
:class:`~benchmarks.jobs.Setup` they make."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from examples.multi30k import recipe as R

from .jobs import Setup

# flag: (full mode, --quick) default, used where the flag is not given
DEFAULTS: dict[str, tuple] = {
    "layers": (3, 2),
    "dim": (256, 64),
    "heads": (4, 4),
    "ffn": (1024, 256),
    "updates": (1800, 30),
    "max_tokens": (4096, 1024),
    "betas": ([float(b) for b in range(8)], [0.0]),
    "max_len_a": (1.2, 0.0),
    "max_len_b": (10, 20),
    "bpe_merges": (8000, 1000),
    "train_lines": (None, 2000),
    "test_lines": (None, 48),
    "batch1_sentences": (None, 16),  # None: the whole test set
}


def model_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and training (the same for every system)")
    g.add_argument("--updates", type=int, help="training updates per system (default 1800; quick 30)")
    g.add_argument("--layers", type=int, help="encoder and decoder layers (default 3; quick 2)")
    g.add_argument("--dim", type=int, help="embedding dimension (default 256; quick 64)")
    g.add_argument("--heads", type=int, help="attention heads (default 4)")
    g.add_argument("--ffn", type=int, help="feed-forward dimension (default 1024; quick 256)")
    g.add_argument("--max-tokens", type=int, help="training batch size in tokens (default 4096; quick 1024)")
    g.add_argument("--tau", type=float, default=1.0, help="binary tree temperature (default 1.0)")


def data_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("data")
    g.add_argument("--raw-dir", type=Path, default=None,
                   help="raw Multi30k files (default: download from the multi30k/dataset repository)")
    g.add_argument("--data", type=Path, default=None,
                   help="an already prepared directory (prepare.py --out; default OUT/data, prepared if missing)")
    g.add_argument("--train-lines", type=int, help="first N training lines only (default: all; quick 2000)")
    g.add_argument("--test-lines", type=int, help="first N valid and test lines only (default: all; quick 48)")
    g.add_argument("--bpe-merges", type=int, help="joint BPE merges (default 8000; quick 1000)")
    g.add_argument("--teacher", type=Path, default=None,
                   help="an existing fairseq transformer checkpoint as the distillation teacher (and the warm "
                        "start's), instead of training OUT/ar for it; its embedding tables must fit the "
                        "data's dictionaries")
    g.add_argument("--distilled", type=Path, default=None,
                   help="an existing distilled data-bin directory (fairseq-preprocess output with the data's "
                        "dict.src.txt and dict.tgt.txt) for the *_distilled systems, instead of distilling")


def decode_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("decoding")
    g.add_argument("--betas", type=float, nargs="+",
                   help="EOS penalties tried on valid (default 0-7 in steps of 1; quick 0)")
    g.add_argument("--batch1-sentences", type=int,
                   help="time batch-1 decoding on the first N test sentences (default: all; quick 16)")
    g.add_argument("--max-len-a", type=float,
                   help="longest output = a x source length + b, for every system and the distillation "
                        "(fairseq's --max-len-a/--max-len-b; default a=1.2, b=10; quick a=0, b=20)")
    g.add_argument("--max-len-b", type=int, help="see --max-len-a (default 10; quick 20)")
    g.add_argument("--repeat", type=int, default=1,
                   help="run every timed decode N times and report the median seconds (default 1)")


def build_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=doc.split(":")[0] + ".",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    parser.add_argument("--out", type=Path, required=True,
                        help="work and results directory; a run into an existing OUT reuses its finished "
                             "trainings and distillation")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model, 2,000 training lines, 48 test lines, 30 updates: proves the pipeline")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    parser.add_argument("--jobs", type=int, default=1,
                        help="trainings and EOS sweeps run this many at a time (timed decodes always alone)")
    parser.add_argument("--systems", nargs="+", default=None,
                        help="only these systems (default: all); the rows of other systems already in "
                             "OUT/results.json are kept, each naming the machine that produced it")
    parser.add_argument("--extras", action="store_true",
                        help="also warm start from the teacher and --canvases-per-sentence 2 (distilled)")
    parser.add_argument("--render", action="store_true",
                        help="only recompute the ratios, targets and OUT/results.md from OUT/results.json")
    parser.add_argument("--time-only", action="store_true",
                        help="train nothing: re-time (batch 1 and 128, one at a time) every system of --systems "
                             "(default: every system in OUT/results.json, --extras included) whose training run "
                             "has OUT/<run>/checkpoint_last.pt, and update their timing fields, the "
                             "ratios and OUT/results.json's timing_runs (the machine of this timing run); output "
                             "limits and the batch-1 slice default to the earlier run's")
    model_flags(parser)
    data_flags(parser)
    decode_flags(parser)
    return parser


def fill_defaults(args: argparse.Namespace) -> None:
    """Each flag not given takes its full-mode or ``--quick`` default."""
    for name, (full, quick) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)


def make_setup(args: argparse.Namespace, data: Path, n_test: int) -> Setup:
    out: Path = args.out.resolve()
    return Setup(
        out=out,
        data=data,
        device=args.device or R.default_device(),
        size=R.Size(args.layers, args.dim, args.heads, args.ffn),
        updates=args.updates,
        max_tokens=args.max_tokens,
        betas=tuple(args.betas),
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        batch1=min(n_test if args.batch1_sentences is None else args.batch1_sentences, n_test),
        tau=args.tau,
        threads=max(1, (os.cpu_count() or 1) // max(1, args.jobs)),
        repeat=max(1, args.repeat),
        teacher=args.teacher.resolve() if args.teacher else None,
        distilled=args.distilled.resolve() if args.distilled else None,
    )
