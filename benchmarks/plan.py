"""Which steps a run has and what each one waits for, and the system rows built from the
finished steps."""

from __future__ import annotations

from functools import partial

from . import jobs as J
from .jobs import DISTILL, Key, Setup, Step
from .schedule import Job, Ledger
from .systems import TEACHER_RUN, System, Training, table_position, timing_order


def swept(system: System, setup: Setup) -> bool:
    return system.sweep_eos and len(setup.betas) > 1


def shared_jobs(setup: Setup, systems: dict[str, System], trainings: dict[str, Training],
                machine: str) -> list[Job]:
    """Trainings (raw first), the distillation (when a distilled run needs it) and the EOS sweeps."""
    jobs = []
    distilling = setup.distilled is None and any(t.distilled for t in trainings.values())
    teacher: tuple[Key, ...] = (Key(Step.TRAIN, TEACHER_RUN),) if setup.teacher is None else ()
    for t in sorted(trainings.values(), key=lambda t: (t.distilled, t.name)):
        deps: tuple[Key, ...] = (DISTILL,) if t.distilled and distilling else ()
        if t.warm_start:
            deps += teacher
        jobs.append(Job(Key(Step.TRAIN, t.name), partial(J.train, setup, t, machine), deps))
    if distilling:
        jobs.append(Job(DISTILL, partial(J.distill, setup), teacher, first=True))
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
        if s.rerank and setup.teacher is None:
            deps += (Key(Step.TRAIN, TEACHER_RUN),)
        beta = setup.betas[0]
        if swept(s, setup):
            deps += (Key(Step.SWEEP, s.name),)
            beta = ledger.done.get(Key(Step.SWEEP, s.name), {}).get("eos_penalty", beta)
        model = trainings[s.training].model
        for batch in (128, 1) if s.time_batch1 else (128,):
            decode = partial(J.timed_decode, setup, s, model, batch, beta)
            jobs.append(Job(Key(Step.TEST, s.name, batch), decode, deps))
    return jobs


def row(system: System, done: dict, machine: str | None) -> dict:
    """One system's row of ``results.json`` from the finished steps (None where a step is missing);
    ``machine``: the machine that produced it."""
    train = done.get(Key(Step.TRAIN, system.training), {})
    r128, r1 = done.get(Key(Step.TEST, system.name, 128), {}), done.get(Key(Step.TEST, system.name, 1), {})
    sweep = done.get(Key(Step.SWEEP, system.name))
    return timings({
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
        "machine": machine,
    }, r1, r128)


def timings(row: dict, r1: dict, r128: dict) -> dict:
    """``row`` with the timed decodes' seconds and commands (and every run's seconds under --repeat)."""
    for batch, r in ((1, r1), (128, r128)):
        if r:
            row[f"decode_seconds_batch{batch}"] = r["decode_seconds"]
            row["command_batch1" if batch == 1 else "command"] = r["command"]
        if "decode_seconds_runs" in r:
            row[f"decode_seconds_batch{batch}_runs"] = r["decode_seconds_runs"]
    return row


def collect(results: dict, ledger: Ledger, systems: dict[str, System], earlier: dict) -> None:
    """Fill ``results`` from the finished steps (after every step). ``earlier``: the results of an
    earlier run into the same OUT, whose trainings and rows this run does not redo are kept."""
    results["trainings"] = {**earlier.get("trainings", {}),
                            **{k.name: v for k, v in ledger.done.items() if k.step is Step.TRAIN}}
    if DISTILL in ledger.done:
        results["distillation"] = ledger.done[DISTILL]
    results["failed"] = {str(k): v for k, v in ledger.failed.items()}
    kept = [r for r in earlier.get("systems", []) if r["name"] not in systems]
    rows = [row(s, ledger.done, results["machine"]) for s in systems.values()] + kept
    results["systems"] = sorted(rows, key=lambda r: table_position(r["name"]))
    retimed = [{**t, "systems": [n for n in t["systems"] if n not in systems]} for t in earlier.get("timing_runs", [])]
    if any(t["systems"] for t in retimed):  # --time-only runs that timed kept rows
        results["timing_runs"] = [t for t in retimed if t["systems"]]
