"""Side-by-side benchmark on Multi30k en-de: this plugin against fairseq's autoregressive
``transformer`` and fairseq's built-in NAT ``insertion_transformer``, all trained on the
same data, at the same size, for the same number of updates, in one run. From the
repository root:

    python -m benchmarks.run --out bench --raw-dir ../shared/data/multi30k            # full mode
    python -m benchmarks.run --out bench-quick --raw-dir ../shared/data/multi30k --quick
    python -m benchmarks.run --out bench --render     # ratios, targets and table again from the JSON
    python -m benchmarks.run --out bench --time-only --repeat 5   # re-time bench's checkpoints, no training
    python -m benchmarks.run --out bench --teacher AR.pt --distilled DISTILLED_BIN   # reuse both

Writes ``OUT/results.json`` (after every finished step), ``OUT/results.md`` (the table) and
``OUT/iterations.png``. A run into the same OUT resumes: finished trainings and the
distillation are reused, and with ``--systems`` the rows of the other systems are kept; each
row names the machine that produced it (``machine``, and ``timing_machine`` after
``--time-only``), so a run can go on on another machine. Every figure comes from a fairseq
command recorded next to it:

* BLEU: detokenised sacreBLEU on test_2016_flickr (``examples/multi30k/score.py``), with the
  EOS penalty chosen on valid for the insertion and NAT systems (``--betas``).
* decode seconds: fairseq-generate's own generation time ("Translated N sentences ... in"),
  which excludes start-up and model loading, for the whole test set at batch 128 and for its
  first ``--batch1-sentences`` sentences at batch 1. These timing runs run one at a time, with
  nothing else on the machine; training and the EOS sweeps may run ``--jobs`` at a time.
* training target tokens/s: from fairseq's own per-epoch summaries (wpb x updates / time).
  With ``--jobs`` > 1 trainings share the machine, so only the timings of the decode runs
  are clean; run with ``--jobs 1`` for clean training speed.

The systems are listed in ``benchmarks/systems.py``, the performance targets in
``benchmarks/targets.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from examples.multi30k import recipe as R
from examples.multi30k.prepare import prepare

from . import cli, plan, report
from .checks import CheckError, check_distilled, check_teacher
from .jobs import Setup, probe_label_tau
from .machine import machine_info, versions
from .retime import time_only
from .schedule import Ledger, run_alone, run_shared
from .systems import System, Training, select


@dataclass
class ResultsFile:
    """``OUT/results.json`` and ``OUT/results.md``, rewritten after every finished step."""

    out: Path
    results: dict
    ledger: Ledger
    systems: dict[str, System]
    started: float
    earlier: dict = field(default_factory=dict)  # an earlier run's results (rows this one does not redo)

    def write(self) -> None:
        plan.collect(self.results, self.ledger, self.systems, self.earlier)
        report.add_ratios(self.results)
        self.results["wall_seconds"] = round(time.time() - self.started, 1)
        report.save(self.out, self.results)


def earlier_results(out: Path) -> dict:
    """``OUT/results.json`` of an earlier run (maybe on another machine), each row naming its
    machine: a run resumed with ``--systems`` keeps the rows and trainings it does not redo."""
    path = out / "results.json"
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text())
    for r in earlier.get("systems", []):
        r.setdefault("machine", earlier.get("machine"))
    return earlier


def render(out: Path) -> int:
    """Ratios, targets and the table again from ``OUT/results.json`` (nothing is run)."""
    results = json.loads((out / "results.json").read_text())
    report.add_ratios(results)
    report.save(out, results)
    print(report.markdown(results))
    return 0


def prepared_data(args: argparse.Namespace, out: Path) -> Path:
    """``--data``, or ``OUT/data`` prepared from the raw files when it is not there yet."""
    data = args.data.resolve() if args.data else out / "data"
    if not (data / "data-bin" / "dict.src.txt").is_file():
        prepare(data, args.raw_dir.resolve() if args.raw_dir else None, "en", "de", bpe_merges=args.bpe_merges,
                train_lines=args.train_lines, test_lines=args.test_lines, workers=2)
    return data


def check_given(setup: Setup) -> None:
    """``--distilled`` and ``--teacher`` must fit the prepared data (raises CheckError)."""
    if setup.distilled:
        check_distilled(R.data_bin(setup.data), setup.distilled)
    if setup.teacher:
        check_teacher(setup.teacher, R.data_bin(setup.data))


def header(args: argparse.Namespace, setup: Setup, n_test: int, argv: list[str], started: float) -> dict:
    """The run's description at the top of ``results.json``."""
    return {
        "machine": machine_info(setup.device),
        "device": setup.device,
        "updates": setup.updates,
        "arch": setup.size.describe() + ", shared embeddings",
        "max_tokens": setup.max_tokens,
        "max_len_a": setup.max_len_a,
        "max_len_b": setup.max_len_b,
        "test_set": "test_2016_flickr" + (f" (first {n_test} lines)" if args.quick or args.test_lines else ""),
        "test_sentences": n_test,
        "data": str(setup.data),
        "batch1_sentences": setup.batch1,
        "mode": "quick" if args.quick else "full",
        "jobs": args.jobs,
        "versions": versions(),
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, "-m", "benchmarks.run", *argv]),
        **({"teacher": str(setup.teacher)} if setup.teacher else {}),
        **({"distilled_data": str(setup.distilled)} if setup.distilled else {}),
        "notes": [],
        "trainings": {},
        "systems": [],
        "failed": {},
    }


def run_all(setup: Setup, file: ResultsFile, trainings: dict[str, Training], jobs: int) -> int:
    """Trainings, distillation and sweeps (``jobs`` at a time), then the timed decodes alone."""
    if any(t.model == "fairseq_nat" for t in trainings.values()):
        file.results["notes"].append(probe_label_tau(setup))
    run_shared(plan.shared_jobs(setup, file.systems, trainings, file.results["machine"]), jobs, file.ledger,
               file.write)
    run_alone(plan.timed_jobs(setup, file.systems, trainings, file.ledger), file.ledger, file.write)
    file.write()
    plotted = report.plot(file.results, setup.out)
    if plotted:
        file.results["plot"] = plotted
        file.write()
    print((setup.out / "results.md").read_text())
    return 1 if file.ledger.failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = cli.build_parser(__doc__)
    args = parser.parse_args(argv)
    if args.render:
        return render(args.out)
    try:
        systems, trainings = select(args.systems, args.extras or args.time_only, train_teacher=args.teacher is None)
    except ValueError as exc:
        parser.error(str(exc))
    if args.time_only:
        return time_only(args, systems, trainings)
    cli.fill_defaults(args)
    started = time.time()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = prepared_data(args, out)
    n_test = len(R.read_reference(data / "raw" / "test.tgt"))
    setup = cli.make_setup(args, data, n_test)
    try:
        check_given(setup)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    file = ResultsFile(out, header(args, setup, n_test, argv, started), Ledger(), systems, started,
                       earlier_results(out))
    return run_all(setup, file, trainings, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
