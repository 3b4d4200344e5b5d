"""The benchmark's steps: what one training, the distillation, one EOS sweep and one timed
decode do, and the small typed keys that name them. Each step is a plain function of a
:class:`Setup` (the run's settings) and returns the dict recorded in ``results.json``."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from examples.multi30k import recipe as R

from .systems import TEACHER_RUN, System, Training


# ------------------------------------------------------------------ job keys
class Step(Enum):
    TRAIN = "train"
    DISTILL = "distill"
    SWEEP = "sweep"  # the EOS-penalty sweep on valid
    TEST = "test"  # a timed decode of the test set


@dataclass(frozen=True)
class Key:
    """Names one step: what it does, to which training run (TRAIN) or system (SWEEP, TEST),
    at which batch size (TEST). ``str()`` is its label in the log and in results.json's ``failed``."""

    step: Step
    name: str = ""
    batch: int = 0

    def __str__(self) -> str:
        if self.step is Step.TEST:
            return f"test{self.batch}:{self.name}"
        return f"{self.step.value}:{self.name}" if self.name else self.step.value


DISTILL = Key(Step.DISTILL)


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Setup:
    """Everything a step needs to know about the run (fixed once the arguments are read)."""

    out: Path
    data: Path
    device: str
    size: R.Size
    updates: int
    max_tokens: int
    betas: tuple[float, ...]
    max_len_a: float
    max_len_b: int
    batch1: int  # batch-1 timing on the first ``batch1`` test sentences
    tau: float = 1.0
    threads: int = 1  # OMP threads of a shared step (trainings, sweeps, distillation)
    repeat: int = 1  # each timed decode runs this many times; the median seconds are reported
    teacher: Path | None = None  # --teacher: an existing AR checkpoint instead of OUT/ar's
    distilled: Path | None = None  # --distilled: an existing distilled data-bin instead of distilling

    @property
    def teacher_checkpoint(self) -> Path:
        return self.teacher or self.checkpoint(TEACHER_RUN)

    @property
    def distilled_bin(self) -> Path:
        return self.distilled or self.out / "data-bin-distilled"

    def checkpoint(self, run: str) -> Path:
        return self.out / run / "checkpoint_last.pt"

    def limits(self) -> dict:
        return {"max_len_a": self.max_len_a, "max_len_b": self.max_len_b, "device": self.device}


def env_threads(n: int) -> None:
    """Threads for the fairseq commands a step starts (through the environment: every step of
    one kind uses the same value, so the race between job threads is harmless)."""
    os.environ["OMP_NUM_THREADS"] = str(n)


# --------------------------------------------------------------------- steps
def train(setup: Setup, training: Training, machine: str) -> dict:
    """One training run into ``OUT/<run>``; a finished one (``train.json``, which names the
    machine that trained it) is reused."""
    save = setup.out / training.name
    marker = save / "train.json"
    if marker.is_file() and (save / "checkpoint_last.pt").is_file():
        return json.loads(marker.read_text())  # finished by an earlier run of this benchmark
    for stale in save.glob("checkpoint*.pt"):  # fairseq would resume from a stale checkpoint_last.pt
        stale.unlink()
    env_threads(setup.threads)
    options = dict(training.options)
    if options.get("order") == "binary_tree":
        options["tau"] = setup.tau
    flags = list(training.flags)
    if training.warm_start:
        flags += ["--init-from-transformer", str(setup.teacher_checkpoint)]
    data_dir = setup.distilled_bin if training.distilled else R.data_bin(setup.data)
    result = R.train(data_dir, save, model=training.model, size=setup.size, updates=setup.updates,
                     device=setup.device, max_tokens=setup.max_tokens, extra=flags, **options)
    result["machine"] = machine
    marker.write_text(json.dumps(result, indent=2))
    return result


def distill(setup: Setup) -> dict:
    """The teacher's beam-5 translations of the training set, binarised (reused when done)."""
    marker = setup.distilled_bin / "distill.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    env_threads(setup.threads)
    result = R.distill(setup.data, setup.teacher_checkpoint, device=setup.device, out=marker.parent,
                       max_len_a=setup.max_len_a, max_len_b=setup.max_len_b)
    marker.write_text(json.dumps(result, indent=2))
    return result


def sweep(setup: Setup, system: System, model: str) -> dict:
    """BLEU on valid for every EOS penalty of ``setup.betas``; the best one."""
    env_threads(setup.threads)
    bleu = {}
    for beta in setup.betas:
        out = setup.out / "decode" / system.name / f"valid.beta{beta:g}.out"
        r = R.decode(setup.data, setup.checkpoint(system.training), model, out, subset="valid", eos_penalty=beta,
                     batch_size=128, **setup.limits(), **system.decoding)
        bleu[f"{beta:g}"] = r["bleu"]
    best = max(setup.betas, key=lambda b: bleu[f"{b:g}"])
    return {"eos_penalty": best, "valid_bleu_by_eos_penalty": bleu}


def timed_decode(setup: Setup, system: System, model: str, batch: int, beta: float) -> dict:
    """The test set at ``batch`` (its first ``setup.batch1`` sentences at batch 1), with the
    machine to itself, ``setup.repeat`` times: BLEU and iterations (the same each time) and the
    median of fairseq's generation seconds (all of them in ``decode_seconds_runs``)."""
    env_threads(os.cpu_count() or 1)
    beta = 0.0 if model == "transformer" else beta
    out = setup.out / "decode" / system.name / f"test.batch{batch}.out"
    rerank = {"rerank_with": setup.teacher_checkpoint} if system.rerank else {}
    runs = [R.decode(setup.data, setup.checkpoint(system.training), model, out, eos_penalty=beta, batch_size=batch,
                     head=setup.batch1 if batch == 1 else None, **setup.limits(), **system.decoding, **rerank)
            for _ in range(max(1, setup.repeat))]
    result = {**runs[-1], "eos_penalty": beta}
    if len(runs) > 1:
        result["decode_seconds_runs"] = [r["decode_seconds"] for r in runs]
        result["decode_seconds"] = statistics.median(result["decode_seconds_runs"])
    return result


def probe_label_tau(setup: Setup) -> str:
    """fairseq's own insertion_transformer with --label-tau: run 1 update and report the outcome."""
    save = setup.out / "nat_label_tau_probe"
    for f in save.glob("checkpoint*.pt"):
        f.unlink()
    cmd = R.train_command(R.data_bin(setup.data), save, "fairseq_nat", setup.size, updates=1, device=setup.device,
                          extra=["--label-tau", "1", "--no-save"])
    save.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (save / "train.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode == 0:
        return "fairseq's insertion_transformer trained with --label-tau 1 for 1 update without error."
    errors = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "Error" in ln]
    return (f"fairseq's insertion_transformer with --label-tau 1 fails (exit {proc.returncode}: "
            f"{errors[-1].strip() if errors else 'see log'}); its systems train without --label-tau.")
