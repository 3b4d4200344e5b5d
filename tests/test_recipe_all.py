"""``python -m examples.multi30k.recipe all`` end to end on a slice of raw Multi30k with tiny models: every
step runs, the report has its fields, a run started again after a kill keeps the finished steps, and
``--from-teacher`` skips the teacher."""

import json
import subprocess
import sys

import pytest

from tests.utils import REPO

pytestmark = pytest.mark.heavy  # the whole recipe twice: minutes

RAW = REPO.parent / "shared" / "data" / "multi30k"
TINY = ["--train-lines", "300", "--test-lines", "20", "--bpe-merges", "200", "--layers", "1", "--dim", "32",
        "--heads", "2", "--ffn", "64", "--max-tokens", "1000", "--teacher-updates", "4", "--anneal-updates", "4",
        "--stage-updates", "4", "--check-lines", "5", "--betas", "2", "3", "--device", "cpu"]


def recipe(out, *flags):
    cmd = [sys.executable, "-m", "examples.multi30k.recipe", "all", "--out", str(out), "--raw-dir", str(RAW), *TINY,
           *flags]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    if not (RAW / "train.en.gz").is_file():
        pytest.skip(f"needs raw Multi30k in {RAW}")
    out = tmp_path_factory.mktemp("recipe_all")
    done = recipe(out, "--stages", "2", "--seeds", "13", "15")
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def test_every_step_runs_and_the_report_has_its_fields(first_run):
    out, done = first_run
    report = json.loads((out / "report.json").read_text())
    rows = report["results"]
    assert {"teacher_greedy", "teacher_beam5", "teacher_greedy_valid", "insertion_parallel",
            "insertion_candidates_reranked"} <= set(rows)
    parallel = rows["insertion_parallel"]
    for key in ("test_bleu", "valid_bleu", "x_teacher_greedy", "x_teacher_greedy_valid", "eos_penalty",
                "mean_iterations", "mean_log2_bound"):
        assert key in parallel, key
    assert parallel["mean_iterations"] >= 1 and parallel["mean_log2_bound"] >= 1
    assert [s["stage"] for s in report["stages"]] == [1, 2]
    trainings = report["trainings"]
    assert [t["what"].split(",")[0].split(" (")[0] for t in trainings] == [
        "teacher", "teacher", "insertion stage 1", "insertion stage 2"]
    for t in trainings:
        assert t["updates"] == 4 and t["seconds_per_update"] > 0 and "fairseq-train" in t["command"]
    assert "--lr-scheduler inverse_sqrt" in trainings[0]["command"]
    assert "--end-learning-rate 0" in trainings[1]["command"]  # the teacher annealed
    assert "--init-from-transformer" in trainings[2]["command"] and "--seed 15" in trainings[3]["command"]
    assert report["export"]["check_lines"] == 5 and report["export"]["first_translation"].strip()
    closure = report["closure"]  # the slot-closure head: kept, or the model exported without one
    assert "examples.train_closure" in closure["command"] and closure["sweep"] and closure["training_slots"] > 0
    assert report["export"]["path"] == closure["checkpoint"] and closure["kept"] == (closure["threshold"] is not None)
    assert (out / "export").is_dir() and any((out / "export").iterdir())
    md = (out / "report.md").read_text()
    assert "seconds per update" in md and "fairseq-train" in md and "teacher, beam 5" in md
    assert "Slot-closure head" in md
    assert "report:" in done.stdout


def test_a_run_started_again_keeps_the_finished_steps(first_run):
    out, _ = first_run
    kept = {p: p.stat().st_mtime_ns for p in (out / "data" / "data-bin" / "dict.src.txt",
                                              out / "teacher" / "annealed" / "checkpoint_last.pt",
                                              out / "insertion" / "train" / "checkpoint_last.pt")}
    # as if killed during the second stage: its work, and everything after it, not there
    for name in ("insertion/results.json", "insertion/continue1/train.json", "export.json", "report.json"):
        (out / name).unlink()
    again = recipe(out, "--stages", "2", "--seeds", "13", "15")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[1/6] data: done before" in again.stderr and "[2/6] teacher: done before" in again.stderr
    assert "[4/6] closure: running" in again.stderr  # the last stage was trained again: so is its head
    for path, mtime in kept.items():
        assert path.stat().st_mtime_ns == mtime, f"{path} was made again"
    assert (out / "insertion" / "continue1" / "train.json").is_file() and (out / "report.json").is_file()


def test_from_teacher_skips_the_teacher(first_run, tmp_path):
    out, _ = first_run
    teacher = out / "teacher" / "annealed" / "checkpoint_last.pt"
    (tmp_path / "data").symlink_to(out / "data", target_is_directory=True)  # the teacher's dictionaries
    done = recipe(tmp_path, "--stages", "1", "--seeds", "13", "--from-teacher", str(teacher))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "teacher").exists()
    report = json.loads((tmp_path / "report.json").read_text())
    assert [t["what"] for t in report["trainings"]] == ["insertion stage 1 (from the teacher)"]
    assert str(teacher) in report["trainings"][0]["command"]


@pytest.mark.parametrize("flags, message", [
    (["--stages", "2", "--seeds", "13"], "--seeds: 1 seeds for 2 stages"),
    (["--stage-updates", "0"], "--stage-updates 0"),
    (["--from-teacher", "/nonexistent/teacher.pt"], "--from-teacher /nonexistent/teacher.pt: not found"),
])
def test_bad_flags_are_named_before_any_work(tmp_path, flags, message):
    done = recipe(tmp_path / "out", *flags)
    assert done.returncode == 1 and message in done.stderr
    assert not (tmp_path / "out" / "data").exists()


LOG = """2026-12-04 18:36:01 | INFO | fairseq_cli.train | {'max_update': 1800, 'max_epoch': 0}
2026-12-04 18:36:50 | INFO | train_inner | {"epoch": 1, "num_updates": "50", "wall": "110"}
2026-12-04 18:38:42 | INFO | train_inner | {"epoch": 1, "num_updates": "100", "wall": "220"}
"""


def test_a_trainings_progress_is_one_line_with_the_time_left(tmp_path):
    from examples.multi30k.pipeline import training_progress

    log = tmp_path / "teacher" / "annealed" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(LOG.splitlines(keepends=True)[0])
    assert training_progress(log) is None  # no update logged yet
    log.write_text(LOG)
    # 220 s for 100 updates: 1,700 left take 3,740 s
    assert training_progress(log) == "teacher/annealed: update 100 of 1800, about 62 min left"


def test_the_progress_watcher_reports_the_newest_log(tmp_path, capsys):
    import time

    from examples.multi30k.pipeline import progress

    log = tmp_path / "insertion" / "continue1" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(LOG)
    with progress(tmp_path, interval=0.05):
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert err.count("insertion/continue1: update 100 of 1800") == 1  # once: unchanged lines are not repeated


def test_a_second_run_with_other_flags_is_refused_naming_them(first_run):
    out, _ = first_run
    report = (out / "report.json").stat().st_mtime_ns
    done = recipe(out, "--stages", "2", "--seeds", "13", "16")
    assert done.returncode == 1
    assert "--seeds [13, 15] -> [13, 16]" in done.stderr and "give a new --out" in done.stderr
    assert (out / "report.json").stat().st_mtime_ns == report
