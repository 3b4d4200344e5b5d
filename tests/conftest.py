"""The suite's run-wide machinery: one store of trained tiny models for every worker, one intra-op thread a
worker, and xdist's work units (a file, or an ``xdist_group``) handed out heaviest first.

``make test`` runs ``pytest -n 2 --dist loadgroup``; a plain ``pytest tests/test_x.py`` works the same way in one
process."""

import os
import shutil
import tempfile

import pytest

from tests.utils import STORE_ENV

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on two cores: one intra-op thread each (torch here and in the fairseq CLIs it starts)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"

MADE_STORE = pytest.StashKey[str]()
MEASURED_REPORTS: list = []  # the reports of tests that recorded a measurement


def pytest_configure(config: pytest.Config) -> None:
    """The model store (``tests.utils.train_once``): made by the first process of the run (the controller under
    xdist), inherited by its workers through the environment, removed at the end."""
    config.addinivalue_line("markers", "heavy: minutes of work; handed to a worker before the rest")
    if not os.environ.get(STORE_ENV):
        os.environ[STORE_ENV] = config.stash[MADE_STORE] = tempfile.mkdtemp(prefix="fairseq-insertion-tests-")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep what the tests measured (``record_property``; under xdist it reaches the controller with the report)."""
    if report.when == "call" and report.user_properties:
        MEASURED_REPORTS.append(report)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The measurements the tests recorded, one line a test (the learning tests' exact-match accuracies)."""
    if MEASURED_REPORTS:
        terminalreporter.section("measured")
        for report in sorted(MEASURED_REPORTS, key=lambda r: r.nodeid):
            values = ", ".join(f"{k} {v}" for k, v in report.user_properties)
            terminalreporter.write_line(f"{report.nodeid}: {values}")


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(MADE_STORE, None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(STORE_ENV, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Heavy tests first (a stable sort: the rest keep their order), so that the last work unit is a short one."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``--dist loadgroup``: a work unit is a test file (its module fixtures built once), or the tests of one
    ``xdist_group`` mark (so one file's independent heavy tests can run on both workers), handed out in the
    collection's order (heavy first) rather than xdist's largest-unit-first."""
    if config.getoption("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):
                return nodeid.rsplit("@", 1)[-1]
            return nodeid.split("::", 1)[0]

    return FileScheduling(config, log)
