"""``--time-only``: the timed decodes again, one at a time, on the checkpoints an earlier run
left in OUT, without training anything; the rows' timing fields and the ratios in
``OUT/results.json`` are updated, and the timing run (machine, device, date) recorded."""

from __future__ import annotations

import argparse
import datetime
import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from examples.multi30k import recipe as R

from . import cli, plan, report
from . import jobs as J
from .jobs import Key, Setup, Step
from .machine import machine_info
from .schedule import Job, Ledger, run_alone
from .systems import System, Training, timing_order


@dataclass
class Retiming:
    """The results being re-timed, rewritten after every timed decode."""

    out: Path
    results: dict
    ledger: Ledger
    run: dict  # this timing run's entry in results["timing_runs"]

    def write(self) -> None:
        rows = {r["name"]: r for r in self.results["systems"]}
        for key, result in self.ledger.done.items():
            row = rows[key.name]
            plan.timings(row, result if key.batch == 1 else {}, result if key.batch == 128 else {})
            row["timing_machine"] = self.run["machine"]
        self.run["failed"] = {str(k): v for k, v in self.ledger.failed.items()}
        report.add_ratios(self.results)
        report.save(self.out, self.results)


def earlier_settings(args: argparse.Namespace, results: dict) -> None:
    """Output limits and the batch-1 slice as the run being re-timed had them, unless given
    (its data directory too: ``results["data"]``)."""
    for name in ("max_len_a", "max_len_b", "batch1_sentences"):
        if getattr(args, name) is None:
            setattr(args, name, results.get(name))


def jobs_for(setup: Setup, systems: list[System], trainings: dict[str, Training], rows: dict) -> list[Job]:
    """Batch 128 and batch 1 of every system, with the EOS penalty its row already has."""
    jobs = []
    for s in systems:
        beta = rows[s.name].get("eos_penalty")
        beta = setup.betas[0] if beta is None else beta
        for batch in (128, 1) if s.time_batch1 else (128,):
            decode = partial(J.timed_decode, setup, s, trainings[s.training].model, batch, beta)
            jobs.append(Job(Key(Step.TEST, s.name, batch), decode))
    return jobs


def time_only(args: argparse.Namespace, systems: dict[str, System], trainings: dict[str, Training]) -> int:
    """Re-time every selected system (``--systems``, else every system with a row in
    ``results.json``) whose training run has a ``checkpoint_last.pt`` in OUT."""
    out = args.out.resolve()
    path = out / "results.json"
    if not path.is_file():
        raise SystemExit(f"error: --time-only needs {path} from an earlier run")
    results = json.loads(path.read_text())
    earlier_settings(args, results)
    cli.fill_defaults(args)
    data = args.data.resolve() if args.data else Path(results.get("data", out / "data"))
    n_test = len(R.read_reference(data / "raw" / "test.tgt"))
    setup = cli.make_setup(args, data, n_test)
    rows = {r["name"]: r for r in results["systems"]}
    chosen = [s for s in timing_order(systems) if setup.checkpoint(s.training).is_file()
              and (args.systems or s.name in rows)]
    for s in chosen:
        if s.name not in rows:
            rows[s.name] = plan.row(s, {}, None)
            results["systems"].append(rows[s.name])
    run = {"machine": machine_info(setup.device), "device": setup.device, "repeat": setup.repeat,
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "batch1_sentences": setup.batch1, "systems": [s.name for s in chosen]}
    results.setdefault("timing_runs", []).append(run)
    retiming = Retiming(out, results, Ledger(), run)
    start = time.time()
    run_alone(jobs_for(setup, chosen, trainings, rows), retiming.ledger, retiming.write)
    run["wall_seconds"] = round(time.time() - start, 1)
    retiming.write()
    print(report.markdown(results))
    return 1 if retiming.ledger.failed else 0
