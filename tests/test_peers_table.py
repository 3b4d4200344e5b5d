"""The benchmark's --peers-table parts that need no trained model: ratios against each decode's own
sitting, steps left pending by --deadline and --train-box, the training-loss report, the paired bootstrap,
and fairseq commands run in pre-started processes."""

import json
from functools import partial

import pytest

from benchmarks import run as B
from benchmarks.prestart import Prestarted, fairseq_module
from examples.commands import RecipeError, Size, fairseq_cli, run
from examples.steps import training_losses


def table_results() -> dict:
    def row(name, t1, t128, b1, b128, tok=None, **extra):
        return {"name": name, "data": "distilled", "bleu": 30.0, "brevity_penalty": 0.95, "eos_penalty": 0.0,
                "mean_iterations": 4.0, "decode_seconds_batch1": t1, "decode_seconds_batch128": t128,
                "baseline_seconds_batch1": b1, "baseline_seconds_batch128": b128,
                "train_target_tokens_per_s": tok, **extra}

    rows = [row("teacher_greedy", 10.0, 4.0, 10.0, 4.0, tok=1000.0),
            # decoded in another sitting, whose teacher greedy took 20 s and 5 s
            row("insertion_binary_tree_parallel_distilled", 6.0, 2.0, 20.0, 5.0, tok=800.0, train_updates=1500,
                train_finished=False),
            row("fairseq_cmlm_4_distilled", 2.0, None, 10.0, None)]
    return {"machine": "m1", "device": "cuda", "updates": 1800, "arch": "tiny", "max_tokens": 4096,
            "test_set": "t", "batch1_sentences": 100, "mode": "peers-table", "schedule_text": "s",
            "trainings": {"teacher_recipe": {"train_target_tokens_per_s": 1000.0}}, "systems": rows,
            "notes": [], "failed": {}, "pending": {"test128:fairseq_cmlm_4_distilled": "not started"}}


def test_ratios_are_against_the_teacher_greedy_of_each_decodes_sitting():
    results = table_results()
    B.add_ratios(results)
    rows = {r["name"]: r for r in results["systems"]}
    teacher, ours, cmlm = (rows[n] for n in ("teacher_greedy", "insertion_binary_tree_parallel_distilled",
                                             "fairseq_cmlm_4_distilled"))
    assert teacher["decode_time_ratio_batch1_vs_teacher_greedy"] == 1.0
    assert ours["decode_time_ratio_batch1_vs_teacher_greedy"] == 0.3  # 6 / 20, not 6 / 10
    assert ours["decode_throughput_ratio_batch128_vs_teacher_greedy"] == 2.5  # 5 / 2
    assert ours["train_speed_ratio_vs_teacher"] == 0.8
    assert cmlm["decode_throughput_ratio_batch128_vs_teacher_greedy"] is None
    assert cmlm["train_speed_ratio_vs_teacher"] is None
    table = B.markdown(results)
    assert "| time vs teacher greedy |" in table
    assert "| insertion_binary_tree_parallel_distilled | 30.00 | 0.950 | 4.00 | 0 | 6.00 | 0.30 | 2.00 | 2.50 " \
           "| 800 | 0.80 | 1500 (stopped) |" in table
    assert "Pending steps: test128:fairseq_cmlm_4_distilled: not started" in table


def test_steps_past_the_deadline_or_the_training_box_are_left_pending(tmp_path):
    import time

    past = time.time() - 1
    setup = B.Setup(tmp_path, tmp_path / "data", "cpu", Size(), 10, 64, (0.0,), 0.0, 20, 4, deadline=past,
                    train_until=past)
    run = B.Run(setup, ["teacher_greedy"], table_results())
    run.results["failed"], run.results["pending"] = {}, {}
    calls = []

    def step(name):
        calls.append(name)
        return {"name": name}

    (tmp_path / "done.json").write_text(json.dumps({"name": "finished earlier"}))
    run.step("test128:done", tmp_path / "done.json", partial(step, "done"))  # a finished step is still read
    run.step("train:a", tmp_path / "a.json", partial(step, "a"))
    run.step("test1:b", tmp_path / "b.json", partial(step, "b"))
    run.step("sweep:c", tmp_path / "c.json", partial(step, "c"), ("train:a",))
    assert calls == [] and run.done == {"test128:done": {"name": "finished earlier"}}
    assert run.results["failed"] == {}
    assert run.results["pending"] == {"train:a": "not started: no training time left (--train-box)",
                                      "test1:b": "not started: too close to --deadline",
                                      "sweep:c": "waits for train:a"}
    # with time left the same steps run
    later = B.Run(B.Setup(tmp_path, tmp_path / "data", "cpu", Size(), 10, 64, (0.0,), 0.0, 20, 4,
                          deadline=time.time() + 600, train_until=time.time() + 600), [], table_results())
    later.step("train:a", tmp_path / "a.json", partial(step, "a"))
    assert calls == ["a"]


def test_training_losses_report_a_non_finite_loss_and_the_fp16_overflows(tmp_path):
    log = tmp_path / "train.log"
    lines = ['2026 | INFO | train_inner | {"epoch": 1, "loss": "9.5", "loss_scale": "128"}',
             "2026 | INFO | fairseq | NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0",
             '2026 | INFO | train_inner | {"epoch": 1, "loss": "8.25", "loss_scale": "64"}',
             '2026 | INFO | train | {"epoch": 1, "train_loss": "8.5", "train_loss_scale": "64"}']
    log.write_text("\n".join(lines) + "\n")
    assert training_losses(log) == {"losses_logged": 3, "losses_finite": True, "last_loss": 8.5,
                                    "gradient_overflows": 1, "min_loss_scale": 64.0}
    log.write_text("\n".join(lines + ['| train_inner | {"epoch": 2, "loss": "nan"}']) + "\n")
    assert training_losses(log)["losses_finite"] is False
    log.write_text("no json here\n")
    assert training_losses(log)["losses_finite"] is False  # nothing logged is not "finite"


def test_paired_bootstrap_interval():
    refs = [f"ein Hund läuft über die Wiese Nummer {i} ." for i in range(60)]
    worse = [f"ein Hund Nummer {i} ." for i in range(60)]
    diff, low, high = B.paired_bootstrap(refs, refs, refs, samples=200)
    assert diff == low == high == 0.0
    diff, low, high = B.paired_bootstrap(refs, worse, refs, samples=200)
    assert 0.0 < low <= diff <= high


def test_fairseq_commands_are_recognised():
    assert fairseq_module(["/x/bin/fairseq-generate", "a", "--b"]) == ("fairseq_cli.generate", ["a", "--b"])
    assert fairseq_module(["python", "-m", "fairseq_cli.train", "d"]) == ("fairseq_cli.train", ["d"])
    assert fairseq_module(["python", "-m", "benchmarks.run"]) is None and fairseq_module(["ls"]) is None


def test_prestarted_processes_run_fairseq_commands_with_their_output_and_exit_status(tmp_path):
    with Prestarted() as launcher:
        run([*fairseq_cli("preprocess"), "--help"], tmp_path / "help.log", stdout=tmp_path / "help.out",
            launcher=launcher)
        assert "--trainpref" in (tmp_path / "help.out").read_text()
        waiting = launcher.waiting
        assert waiting is not None and waiting.poll() is None  # the next one was started meanwhile
        with pytest.raises(RecipeError, match="exit 2"):
            run([*fairseq_cli("preprocess"), "--no-such-flag"], tmp_path / "bad.log", launcher=launcher)
        assert "unrecognized arguments: --no-such-flag" in (tmp_path / "bad.log").read_text()
        assert waiting.poll() is not None  # that one ran the second command
    assert launcher.waiting is None


def test_the_fp16_system_trains_and_decodes_with_fp16_and_the_shared_schedule(tmp_path, monkeypatch):
    import time

    seen = {}
    monkeypatch.setattr(B.R, "train", lambda data, save, **kw: seen.setdefault("train", kw) and {"train_updates": 9})
    monkeypatch.setattr(B.R, "decode", lambda *a, **kw: seen.setdefault("decode", kw) and {"decode_seconds": 1.0})
    setup = B.Setup(tmp_path, tmp_path / "data", "cpu", Size(), 10, 64, (0.0, 1.0), 0.0, 20, 4,
                    distilled=tmp_path / "d", schedule=(("warmup", 500), ("dropout", 0.3), ("clip_norm", None)),
                    train_until=time.time() + 600)
    trained = B.train(setup, "binary_tree_fp16_distilled")
    assert trained["finished"] is False  # 9 of 10 updates
    kw = seen["train"]
    assert (kw["model"], kw["order"], kw["warmup"], kw["dropout"], kw["clip_norm"]) == (
        "insertion", "binary_tree", 500, 0.3, None)
    stop = kw["extra"][kw["extra"].index("--stop-time-hours") + 1]
    assert "--fp16" in kw["extra"] and 0.14 < float(stop) < 0.16  # (600 - 30) s
    B.timed_decode(setup, "insertion_binary_tree_parallel_fp16_distilled", 128, 3.0)
    assert seen["decode"]["extra"] == ("--fp16",) and seen["decode"]["eos_penalty"] == 3.0


def test_peers_table_needs_a_teacher_kit(tmp_path, capsys):
    with pytest.raises(SystemExit):
        B.main(["--out", str(tmp_path), "--peers-table", "--teacher", str(tmp_path / "t.pt")])
    assert "--peers-table needs --teacher and --distilled" in capsys.readouterr().err
