"""Every model the benchmark measures, trained on the prepared Multi30k data at one size, schedule and
number of updates: fairseq's Transformer (``ar``, the distillation teacher), fairseq's NAT insertion
model (``nat``), the plugin's orders (``binary_tree``, ``uniform``, ``left_to_right``), each raw and on the
teacher's distillation (``*_distilled``), and on the distilled data: a warm start from the teacher, two
canvases per sentence, fairseq's mask-predict (``cmlm_distilled``) and Levenshtein Transformer
(``levenshtein_distilled``) and the plugin with ``--fp16`` (GPU).

    python -m examples.multi30k.systems --data DATA --out MODELS [--only ar binary_tree_distilled ...] \\
        [--teacher KIT/checkpoint.pt] [--distilled KIT/distilled/data-bin] [--jobs 8] [--updates 1800]

Each model trains into ``MODELS/NAME`` (``train.json`` when finished); an unfinished training goes on
from fairseq's ``checkpoint_last.pt`` when the command runs again, a finished one is left as it is. The
distillation (``MODELS/data-bin-distilled``) needs the teacher: ``--teacher`` or ``MODELS/ar``, trained
first. ``--teacher`` and ``--distilled`` must fit the prepared data's dictionaries.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..commands import RecipeError, Size, default_device
from . import recipe as R


@dataclass(frozen=True)
class Training:
    """One model: its kind (``examples.commands.MODELS``), ``train_command`` keywords, further flags, whether it
    trains on the distilled data and whether it starts from the teacher's weights."""

    name: str
    model: str
    options: dict = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    distilled: bool = False
    warm: bool = False


RAW = [Training("ar", "transformer"), Training("nat", "fairseq_nat"),
       Training("binary_tree", "insertion", {"order": "binary_tree"}),
       Training("uniform", "insertion", {"order": "uniform"}),
       # the paper trains left-to-right with sequence finalization (end-of-sequence in the last slot)
       Training("left_to_right", "insertion", {"order": "left_to_right", "termination": "sequence"})]
TRAININGS = {t.name: t for t in [
    *RAW, *(Training(t.name + "_distilled", t.model, t.options, distilled=True) for t in RAW),
    Training("binary_tree_distilled_warm_start", "insertion", {"order": "binary_tree"}, distilled=True, warm=True),
    Training("binary_tree_distilled_k2", "insertion", {"order": "binary_tree"}, ("--canvases-per-sentence", "2"),
             distilled=True),
    Training("cmlm_distilled", "fairseq_cmlm", distilled=True),
    Training("levenshtein_distilled", "fairseq_levenshtein", distilled=True),
    Training("binary_tree_fp16_distilled", "insertion", {"order": "binary_tree"}, ("--fp16",), distilled=True)]}


@dataclass(frozen=True)
class Plan:
    """Where and how every model of one run trains."""

    data: Path
    out: Path
    size: Size = Size()
    updates: int = 1800
    device: str = "cpu"
    max_tokens: int = 4096
    schedule: dict = field(default_factory=dict)  # train_command's warmup, dropout, clip_norm
    teacher: Path | None = None
    distilled: Path | None = None

    @property
    def teacher_checkpoint(self) -> Path:
        return self.teacher or self.out / "ar" / "checkpoint_last.pt"

    @property
    def distilled_bin(self) -> Path:
        return self.distilled or self.out / "data-bin-distilled"


def train(plan: Plan, t: Training) -> dict:
    """One model, or its finished record; fairseq goes on from the save directory's checkpoint_last.pt."""
    done = plan.out / t.name / "train.json"
    if done.is_file():
        return json.loads(done.read_text())
    extra = [*t.flags, *(["--init-from-transformer", str(plan.teacher_checkpoint)] if t.warm else [])]
    result = R.train(plan.distilled_bin if t.distilled else R.data_bin(plan.data), plan.out / t.name, model=t.model,
                     size=plan.size, updates=plan.updates, device=plan.device, max_tokens=plan.max_tokens,
                     extra=extra, **t.options, **plan.schedule)
    done.write_text(json.dumps(result, indent=2) + "\n")
    return result


def make(plan: Plan, names: list[str], jobs: int = 1) -> dict[str, dict]:
    """The models ``names`` (the teacher and the distillation first, where they are needed)."""
    wanted = [TRAININGS[n] for n in names]
    first = ["ar"] if plan.teacher is None and any(t.distilled or t.warm for t in wanted) else []
    records = {n: train(plan, TRAININGS[n]) for n in first}
    distill = any(t.distilled for t in wanted) and plan.distilled is None
    if distill and not (plan.distilled_bin / "distill.json").exists():
        record = R.distill(plan.data, plan.teacher_checkpoint, plan.device, out=plan.distilled_bin)
        (plan.distilled_bin / "distill.json").write_text(json.dumps(record, indent=2) + "\n")
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        records.update(zip([t.name for t in wanted], pool.map(lambda t: train(plan, t), wanted)))
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="prepare.py's --out directory")
    p.add_argument("--out", type=Path, required=True, help="where the models go, one directory each")
    p.add_argument("--only", nargs="+", choices=list(TRAININGS), default=None, help="these models (default all "
                   "but the fp16 one)")
    p.add_argument("--teacher", type=Path, help="a trained Transformer to distil with and warm-start from")
    p.add_argument("--distilled", type=Path, help="a distilled data-bin (the prepared data's dictionaries)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--jobs", type=int, default=1, help="trainings side by side")
    p.add_argument("--updates", type=int, default=1800, help="updates of every training")
    p.add_argument("--size", type=int, nargs=4, default=[3, 256, 4, 1024], metavar=("LAYERS", "DIM", "HEADS", "FFN"))
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    p.add_argument("--warmup", type=int, default=400, help="warmup updates")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout")
    p.add_argument("--clip-norm", type=float, default=1.0, help="gradient clipping, 0: none")
    args = p.parse_args(argv)
    schedule = {"warmup": args.warmup, "dropout": args.dropout, "clip_norm": args.clip_norm or None}
    plan = Plan(data=args.data.resolve(), out=args.out.resolve(), size=Size(*args.size), updates=args.updates,
                device=args.device or default_device(), max_tokens=args.max_tokens, schedule=schedule,
                teacher=args.teacher and args.teacher.resolve(), distilled=args.distilled and args.distilled.resolve())
    try:
        check_given(plan)
        records = make(plan, args.only or [n for n in TRAININGS if "fp16" not in n], args.jobs)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({n: r.get("train_updates") for n, r in records.items()}, indent=2))
    return 0


def check_given(plan: Plan) -> None:
    """``--teacher`` and ``--distilled`` must share the prepared data's dictionaries (RecipeError names the file)."""
    from fairseq_insertion.checkpoints import DictionaryFiles, check_dictionaries

    files = lambda d: DictionaryFiles(str(d / "dict.src.txt"), str(d / "dict.tgt.txt"))  # noqa: E731
    data = R.data_bin(plan.data)
    try:
        if plan.distilled:
            check_dictionaries(files(data), str(plan.distilled), trained_with=files(plan.distilled))
            if not (plan.distilled / "train.src-tgt.src.bin").is_file():
                raise RecipeError(f"{plan.distilled}: no train.src-tgt.src.bin (the distilled training set)")
        if plan.teacher:
            import torch

            state = torch.load(plan.teacher, map_location="cpu", weights_only=True)
            check_dictionaries(files(data), str(plan.teacher), weights=state.get("model") or {})
    except (ValueError, FileNotFoundError) as exc:
        raise RecipeError(str(exc)) from None


if __name__ == "__main__":
    sys.exit(main())
