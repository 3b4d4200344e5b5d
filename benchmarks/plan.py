"""Which steps a run has and what each one waits for, and the system rows built from the
finished steps."""

from __future__ import annotations

from functools import partial

from . import jobs as J
from .jobs import DISTILL, Key, Setup, Step
from .schedule import Job, Ledger
from .systems import TEACHER_RUN, System, Training, timing_order


def swept(system: System, setup: Setup) -> bool:
    return system.sweep_eos and len(setup.betas) > 1


def shared_jobs(setup: Setup, systems: dict[str, System], trainings: dict[str, Training]) -> list[Job]:
    """Trainings (raw first), the distillation (when a distilled run needs it) and the EOS sweeps."""
    jobs = []
    distilling = any(t.distilled for t in trainings.values())
    for t in sorted(trainings.values(), key=lambda t: (t.distilled, t.name)):
        deps: tuple[Key, ...] = (DISTILL,) if t.distilled else ()
        if t.warm_start:
            deps += (Key(Step.TRAIN, TEACHER_RUN),)
        jobs.append(Job(Key(Step.TRAIN, t.name), partial(J.train, setup, t), deps))
    if distilling:
        jobs.append(Job(DISTILL, partial(J.distill, setup), (Key(Step.TRAIN, TEACHER_RUN),), first=True))
    for s in timing_order(systems):
        if swept(s, setup):
            sweep = partial(J.sweep, setup, s, trainings[s.training].model)
            jobs.append(Job(Key(Step.SWEEP, s.name), sweep, (Key(Step.TRAIN, s.training),)))
    return jobs


def timed_jobs(setup: Setup, systems: dict[str, System], trainings: dict[str, Training],
               ledger: Ledger) -> list[Job]:
    """The timed decodes (distilled systems first), each with the EOS penalty its sweep chose."""
    jobs = []
    for s in timing_order(systems):
        deps: tuple[Key, ...] = (Key(Step.TRAIN, s.training),)
        beta = setup.betas[0]
        if swept(s, setup):
            deps += (Key(Step.SWEEP, s.name),)
            beta = ledger.done.get(Key(Step.SWEEP, s.name), {}).get("eos_penalty", beta)
        model = trainings[s.training].model
        for batch in (128, 1) if s.time_batch1 else (128,):
            decode = partial(J.timed_decode, setup, s, model, batch, beta)
            jobs.append(Job(Key(Step.TEST, s.name, batch), decode, deps))
    return jobs


def row(system: System, done: dict) -> dict:
    """One system's row of ``results.json`` from the finished steps (None where a step is missing)."""
    train = done.get(Key(Step.TRAIN, system.training), {})
    r128, r1 = done.get(Key(Step.TEST, system.name, 128), {}), done.get(Key(Step.TEST, system.name, 1), {})
    sweep = done.get(Key(Step.SWEEP, system.name))
    return {
        "name": system.name,
        "data": system.data,
        "bleu": r128.get("bleu"),
        "bleu_signature": r128.get("signature"),
        "mean_iterations": r128.get("mean_iterations"),
        "mean_log2_bound": r128.get("mean_log2_bound"),
        "mean_length": r128.get("mean_length"),
        "eos_penalty": r128.get("eos_penalty"),
        "valid_bleu_by_eos_penalty": sweep.get("valid_bleu_by_eos_penalty") if sweep else None,
        "decode_seconds_batch1": r1.get("decode_seconds"),
        "decode_seconds_batch128": r128.get("decode_seconds"),
        "train_target_tokens_per_s": train.get("train_target_tokens_per_s"),
        "command": r128.get("command"),
        "command_batch1": r1.get("command"),
        "train_command": train.get("command"),
    }


def collect(results: dict, ledger: Ledger, systems: dict[str, System]) -> None:
    """Fill ``results`` from the finished steps (after every step)."""
    results["trainings"] = {k.name: v for k, v in ledger.done.items() if k.step is Step.TRAIN}
    if DISTILL in ledger.done:
        results["distillation"] = ledger.done[DISTILL]
    results["failed"] = {str(k): v for k, v in ledger.failed.items()}
    results["systems"] = [row(s, ledger.done) for s in systems.values()]
