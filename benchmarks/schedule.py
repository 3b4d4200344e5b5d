"""Running the steps: shared ones (trainings, the distillation, EOS sweeps) up to ``--jobs`` at
a time in dependency order, then the timed decodes one by one with the machine to themselves.

A failed step is recorded in the :class:`Ledger` and the others go on; a step whose
dependency failed or never ran is recorded as skipped.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial

from .jobs import Key


@dataclass
class Job:
    key: Key
    fn: Callable[[], dict]
    deps: tuple[Key, ...] = ()
    first: bool = False  # start before the other ready jobs (the distillation unblocks many)


@dataclass
class Ledger:
    """Results of the finished steps and the reasons of the failed ones, by key."""

    done: dict[Key, dict] = field(default_factory=dict)
    failed: dict[Key, str] = field(default_factory=dict)

    def blocked(self, job: Job) -> bool:
        return any(d in self.failed for d in job.deps)

    def ready(self, job: Job) -> bool:
        return all(d in self.done for d in job.deps)

    def record(self, job: Job, outcome: Callable[[], dict]) -> None:
        """Record ``outcome()`` (a finished future's ``result``, or the step itself) under the job."""
        try:
            self.done[job.key] = outcome() or {}
        except Exception as exc:  # a failed step is recorded, the rest goes on
            self.failed[job.key] = f"{type(exc).__name__}: {exc}"
            print(f"[bench] FAILED {job.key}: {exc}", file=sys.stderr, flush=True)
            traceback.print_exc()


def call(job: Job) -> dict:
    print(f"[bench] start {job.key}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = job.fn()
    print(f"[bench] done  {job.key} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    return result


def skip_blocked(pending: dict[Key, Job], ledger: Ledger) -> None:
    for job in [j for j in pending.values() if ledger.blocked(j)]:
        del pending[job.key]
        ledger.failed[job.key] = "skipped: a step it needs failed"


def run_shared(jobs: Iterable[Job], workers: int, ledger: Ledger, on_done: Callable[[], None]) -> None:
    """Run ``jobs`` as their dependencies finish, up to ``workers`` at a time."""
    pending = {job.key: job for job in jobs}
    running: dict[Future, Job] = {}
    with ThreadPoolExecutor(max(1, workers)) as pool:
        while pending or running:
            skip_blocked(pending, ledger)
            ready = sorted((j for j in pending.values() if ledger.ready(j)), key=lambda j: not j.first)
            for job in ready[: max(0, workers - len(running))]:
                del pending[job.key]
                running[pool.submit(call, job)] = job
            if not running:
                break
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in finished:
                ledger.record(running.pop(future), future.result)
                on_done()
    for key in pending:  # waiting for steps that are not in this run
        ledger.failed[key] = "skipped: dependencies never ran"


def run_alone(jobs: Iterable[Job], ledger: Ledger, on_done: Callable[[], None]) -> None:
    """Run ``jobs`` one by one, each with nothing else running."""
    pending = {job.key: job for job in jobs}
    skip_blocked(pending, ledger)
    for job in pending.values():
        if not ledger.ready(job):
            ledger.failed[job.key] = "skipped: dependencies never ran"
            continue
        ledger.record(job, partial(call, job))
        on_done()
