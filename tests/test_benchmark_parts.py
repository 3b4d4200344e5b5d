"""The benchmark's parts that run no fairseq command: the checks on --teacher/--distilled, the
targets and the table from a hand-made results dict, the plan and the scheduler."""

import argparse
import json
from functools import partial
from pathlib import Path

import pytest
import torch

from benchmarks import checks, cli, plan, report, systems
from benchmarks import targets as T
from benchmarks.jobs import DISTILL, Key, Setup, Step
from benchmarks.schedule import Job, Ledger, run_alone, run_shared
from examples.multi30k.recipe import Size

WORDS = ["der 10", "die 9", "das 8", "und 7"]


def write_dicts(directory: Path, words=WORDS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        (directory / f"dict.{side}.txt").write_text("\n".join(words) + "\n")
    return directory


def test_dictionaries_must_match_naming_the_file_and_the_line(tmp_path):
    data = write_dicts(tmp_path / "data-bin")
    same = write_dicts(tmp_path / "same")
    other = write_dicts(tmp_path / "other", ["der 10", "die 9", "ein 8", "und 7"])
    with pytest.raises(checks.CheckError, match=r"other/dict.src.txt differs from .*data-bin/dict.src.txt at line 3"):
        checks.check_distilled(data, other)
    short = write_dicts(tmp_path / "short", WORDS[:3])
    with pytest.raises(checks.CheckError, match=r"short/dict.src.txt has 3 entries, .* has 4"):
        checks.check_distilled(data, short)
    with pytest.raises(checks.CheckError, match=r"gone/dict.src.txt: no such file"):
        checks.check_distilled(data, tmp_path / "gone")
    # the same dictionaries pass: what is missing then is the training set
    with pytest.raises(checks.CheckError, match=r"same: no train.src-tgt.src.bin, train.src-tgt.tgt.bin"):
        checks.check_distilled(data, same)


def test_teacher_embedding_tables_must_fit_the_dictionaries(tmp_path):
    data = write_dicts(tmp_path / "data-bin")
    for rows, ok in ((4 + len(WORDS), True), (16, False)):
        teacher = tmp_path / f"teacher{rows}.pt"
        model = {f"{p}.embed_tokens.weight": torch.zeros(rows, 2) for p in ("encoder", "decoder")}
        torch.save({"args": argparse.Namespace(arch="transformer"), "model": model}, teacher)
        if ok:
            checks.check_teacher(teacher, data)
        else:
            with pytest.raises(checks.CheckError, match=r"teacher16.pt: encoder.embed_tokens.weight has 16 rows, "
                                                        r"but .*dict.src.txt gives 8 entries"):
                checks.check_teacher(teacher, data)


def hand_made_results(device="cpu") -> dict:
    def row(name, bleu, t1, t128, tok=100.0, it=None, bound=None, machine="m1"):
        return {"name": name, "data": "distilled" if "_distilled" in name else "raw", "bleu": bleu,
                "eos_penalty": 0.0, "mean_iterations": it, "mean_log2_bound": bound, "decode_seconds_batch1": t1,
                "decode_seconds_batch128": t128, "train_target_tokens_per_s": tok, "machine": machine}

    rows = [
        row("ar_greedy", 20.0, 2.0, 4.0, tok=200.0),
        row("insertion_binary_tree_parallel", 12.0, 1.0, 2.0, tok=150.0),
        row("ar_greedy_distilled", 19.0, 2.0, 4.0),
        row("fairseq_nat_insertion_distilled", 14.0, 1.0, 3.0),
        row("insertion_binary_tree_parallel_distilled", 17.0, 0.8, 1.6, it=4.5, bound=3.7),
        row("insertion_uniform_parallel_distilled", 17.5, 0.9, 2.5, machine="m2"),
    ]
    return {"machine": "m1", "device": device, "updates": 10, "arch": "tiny", "max_tokens": 64,
            "test_set": "t", "batch1_sentences": 4, "systems": rows, "notes": [], "failed": {}}


def test_targets_from_the_data_file_on_hand_made_rows():
    results = hand_made_results()
    report.add_ratios(results)
    by_metric = {t["metric"]: t for t in results["targets"]}
    assert len(by_metric) == len(T.load())
    batch1 = by_metric["decode time at batch 1, plugin parallel / AR greedy (distilled)"]
    assert batch1 == {"metric": batch1["metric"], "target": "<= 0.5 (CPU)", "value": 0.4, "met": True}
    throughput = by_metric["decode throughput at batch 128, plugin parallel / AR greedy (distilled)"]
    assert (throughput["value"], throughput["met"]) == (2.5, True)
    best = by_metric["test BLEU, best plugin parallel system (insertion_uniform_parallel_distilled) / AR greedy"]
    assert (best["value"], best["met"]) == (0.875, True)
    rerank = by_metric["test BLEU, best reranked plugin system (none) / AR greedy"]
    assert (rerank["value"], rerank["met"]) == (None, None)
    iterations = by_metric["mean parallel iterations - mean floor(log2 n)+1 (binary tree, distilled)"]
    assert (iterations["value"], iterations["met"]) == (0.8, True)
    train = by_metric["training target tokens/s, plugin / AR transformer"]
    assert (train["target"], train["value"], train["met"]) == ("reported", 0.75, None)
    rows = {r["name"]: r for r in results["systems"]}
    assert rows["insertion_binary_tree_parallel"]["decode_time_ratio_batch1_vs_ar_greedy"] == 0.5
    # timed on another machine: no timing ratio against this run's AR rows
    assert rows["insertion_uniform_parallel_distilled"]["decode_time_ratio_batch1_vs_ar_greedy"] is None
    table = report.markdown(results)
    assert all(f"| {r['name']} |" in table for r in results["systems"])
    assert "| decode time at batch 1, plugin parallel / AR greedy (distilled) | <= 0.5 (CPU) | 0.400 | yes |" in table
    assert "Note: measured on m2: insertion_uniform_parallel_distilled." in table


def test_goals_follow_the_device_and_the_data_file(tmp_path):
    results = hand_made_results("cuda")
    report.add_ratios(results)
    goals = {t["metric"]: t["target"] for t in results["targets"]}
    assert goals["decode time at batch 1, plugin parallel / AR greedy (distilled)"] == "<= 0.35 (GPU)"
    custom = tmp_path / "targets.json"
    custom.write_text(json.dumps({"targets": [{"metric": "x", "compute": "ratio", "goal": 0.1, "direction": "<=",
                                               "a": {"system": "ar_greedy", "key": "bleu"},
                                               "b": {"system": "ar_greedy_distilled", "key": "bleu"}}]}))
    [x] = T.evaluate(results["systems"], "cpu", T.load(custom))
    assert x == {"metric": "x", "target": "<= 0.1", "value": round(20 / 19, 3), "met": False}


def test_committed_results_render_unchanged(tmp_path):
    """--render on a committed results.json gives the committed table back."""
    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    for name in ("cpu_2core_d64_500updates", "h200_800updates_incomplete"):
        results = json.loads((committed / f"{name}.json").read_text())
        report.add_ratios(results)
        assert report.markdown(results) == (committed / f"{name}.md").read_text(), name


def setup_for(tmp_path: Path, **given) -> Setup:
    return Setup(tmp_path, tmp_path / "data", "cpu", Size(), 10, 64, (0.0, 1.0), 0.0, 20, 4, **given)


def test_plan_with_a_given_teacher_and_distilled_data_trains_neither(tmp_path):
    chosen, trainings = systems.select(["insertion_binary_tree_parallel_distilled"], extras=False)
    assert sorted(trainings) == ["ar", "binary_tree_distilled"]
    keys = {str(j.key): [str(d) for d in j.deps] for j in plan.shared_jobs(setup_for(tmp_path), chosen, trainings, "m")}
    assert keys["distill"] == ["train:ar"] and keys["train:binary_tree_distilled"] == ["distill"]
    chosen, trainings = systems.select(["insertion_binary_tree_parallel_distilled"], False, train_teacher=False)
    given = setup_for(tmp_path, teacher=tmp_path / "t.pt", distilled=tmp_path / "d")
    keys = {str(j.key): [str(d) for d in j.deps] for j in plan.shared_jobs(given, chosen, trainings, "m")}
    assert keys == {"train:binary_tree_distilled": [], "sweep:insertion_binary_tree_parallel_distilled":
                    ["train:binary_tree_distilled"]}


def test_scheduler_records_failures_and_skips_what_depends_on_them():
    def step(name, fail=False):
        if fail:
            raise RuntimeError(name)
        return {"name": name}

    train = partial(Key, Step.TRAIN)
    ledger, calls = Ledger(), []
    shared = [Job(train("a"), partial(step, "a")), Job(train("b"), partial(step, "b", True)),
              Job(DISTILL, partial(step, "d"), (train("a"),), first=True), Job(train("c"), partial(step, "c"),
                                                                                 (train("b"),))]
    run_shared(shared, 2, ledger, lambda: calls.append(len(ledger.done)))
    run_alone([Job(Key(Step.TEST, "s", 1), partial(step, "t"), (DISTILL,)),
               Job(Key(Step.TEST, "u", 1), partial(step, "u"), (train("c"),))], ledger, lambda: None)
    assert {str(k) for k in ledger.done} == {"train:a", "distill", "test1:s"}
    assert {str(k): v for k, v in ledger.failed.items()} == {
        "train:b": "RuntimeError: b", "train:c": "skipped: a step it needs failed",
        "test1:u": "skipped: a step it needs failed"}
    assert len(calls) == 3  # after every finished shared step


def test_every_flag_has_help():
    parser = cli.build_parser("Benchmark: doc.")
    assert all(a.help for a in parser._actions), [a.dest for a in parser._actions if not a.help]


def test_a_resumed_run_keeps_the_earlier_rows_and_trainings_with_their_machine():
    earlier = {"trainings": {"ar": {"machine": "old"}},
               "systems": [{"name": "insertion_binary_tree_parallel", "machine": "old"},
                           {"name": "ar_greedy", "machine": "old", "timing_machine": "gpu"}],
               "timing_runs": [{"machine": "gpu", "systems": ["insertion_binary_tree_parallel", "ar_greedy"]}]}
    chosen, _ = systems.select(["insertion_binary_tree_parallel"], extras=False)
    ledger = Ledger()
    ledger.done[Key(Step.TRAIN, "binary_tree")] = {"train_target_tokens_per_s": 5.0, "machine": "new"}
    results = {"machine": "new"}
    plan.collect(results, ledger, chosen, earlier)
    assert [(r["name"], r["machine"]) for r in results["systems"]] == [
        ("ar_greedy", "old"), ("insertion_binary_tree_parallel", "new")]
    assert results["timing_runs"] == [{"machine": "gpu", "systems": ["ar_greedy"]}]
    assert results["trainings"] == {"ar": {"machine": "old"},
                                    "binary_tree": ledger.done[Key(Step.TRAIN, "binary_tree")]}
