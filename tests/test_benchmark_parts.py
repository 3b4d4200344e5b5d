"""The benchmark's parts that run no fairseq command: the checks on --teacher/--distilled, the
targets and the table from a hand-made results dict, and finished steps reused."""

import argparse
import json
from functools import partial
from pathlib import Path

import pytest
import torch

from benchmarks import checks
from benchmarks import run as B
from examples.commands import Size

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
    def row(name, bleu, t1, t128, tok=100.0, it=None, bound=None):
        return {"name": name, "data": "distilled" if "_distilled" in name else "raw", "bleu": bleu,
                "eos_penalty": 0.0, "mean_iterations": it, "mean_log2_bound": bound, "decode_seconds_batch1": t1,
                "decode_seconds_batch128": t128, "train_target_tokens_per_s": tok}

    rows = [
        row("ar_greedy", 20.0, 2.0, 4.0, tok=200.0),
        row("insertion_binary_tree_parallel", 12.0, 1.0, 2.0, tok=150.0),
        row("ar_greedy_distilled", 19.0, 2.0, 4.0),
        row("fairseq_nat_insertion_distilled", 14.0, 1.0, 3.0),
        row("insertion_binary_tree_parallel_distilled", 17.0, 0.8, 1.6, it=4.5, bound=3.7),
        row("insertion_uniform_parallel_distilled", 17.5, 0.9, 2.5),
    ]
    return {"machine": "m1", "device": device, "updates": 10, "arch": "tiny", "max_tokens": 64,
            "test_set": "t", "batch1_sentences": 4, "systems": rows, "notes": [], "failed": {}}


def test_targets_on_hand_made_rows():
    results = hand_made_results()
    B.add_ratios(results)
    by_metric = {t["metric"]: t for t in results["targets"]}
    assert len(by_metric) == len(B.TARGETS)
    batch1 = by_metric["decode time at batch 1, plugin parallel / AR greedy (distilled)"]
    assert batch1 == {"metric": batch1["metric"], "target": "<= 0.5 (CPU)", "value": 0.4, "met": True}
    throughput = by_metric["decode throughput at batch 128, plugin parallel / AR greedy (distilled)"]
    assert (throughput["value"], throughput["met"]) == (2.5, True)
    nat = by_metric["decode throughput at batch 128, plugin parallel / fairseq built-in insertion_transformer "
                    "(distilled)"]
    assert (nat["target"], nat["value"], nat["met"]) == (">= 1.5", 1.875, True)
    best = by_metric["test BLEU, best plugin parallel system (insertion_uniform_parallel_distilled) / AR greedy"]
    assert (best["value"], best["met"]) == (0.875, True)
    rerank = by_metric["test BLEU, best reranked plugin system (none) / AR greedy"]
    assert (rerank["value"], rerank["met"]) == (None, None)
    iterations = by_metric["mean parallel iterations - mean floor(log2 n)+1 (binary tree, distilled)"]
    assert (iterations["value"], iterations["met"]) == (0.8, True)
    train = by_metric["training target tokens/s, plugin / AR transformer"]
    assert (train["target"], train["value"], train["met"]) == ("reported", 0.75, None)
    warm = by_metric["test BLEU, warm start from the teacher / cold start (binary tree parallel, distilled, same "
                     "updates)"]
    assert (warm["target"], warm["value"]) == ("reported (--extras)", None)
    rows = {r["name"]: r for r in results["systems"]}
    assert rows["insertion_binary_tree_parallel"]["decode_time_ratio_batch1_vs_ar_greedy"] == 0.5
    assert rows["insertion_uniform_parallel_distilled"]["decode_throughput_ratio_batch128_vs_ar_greedy"] == 1.6
    assert rows["insertion_uniform_parallel_distilled"]["decode_time_ratio_batch1_vs_fairseq_nat"] == 0.9
    table = B.markdown(results)
    assert all(f"| {r['name']} |" in table for r in results["systems"])
    assert "| decode time at batch 1, plugin parallel / AR greedy (distilled) | <= 0.5 (CPU) | 0.400 | yes |" in table


def test_goals_follow_the_device():
    results = hand_made_results("cuda")
    B.add_ratios(results)
    goals = {t["metric"]: t["target"] for t in results["targets"]}
    assert goals["decode time at batch 1, plugin parallel / AR greedy (distilled)"] == "<= 0.35 (GPU)"
    assert goals["decode throughput at batch 128, plugin parallel / AR greedy (distilled)"] == ">= 2.0 (GPU)"


def test_committed_results_render_unchanged():
    """The committed results.json files give their committed tables back."""
    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    for name in ("cpu_2core_d64_500updates", "cpu_2core_d256_600updates", "h200_800updates_incomplete"):
        results = json.loads((committed / f"{name}.json").read_text())
        B.add_ratios(results)
        assert B.markdown(results) == (committed / f"{name}.md").read_text(), name


def test_finished_steps_are_reused_and_failures_skip_what_needs_them(tmp_path):
    setup = B.Setup(tmp_path, tmp_path / "data", "cpu", Size(), 10, 64, (0.0, 1.0), 0.0, 20, 4)
    run = B.Run(setup, ["ar_greedy"], hand_made_results())
    calls = []

    def step(name, fail=False):
        calls.append(name)
        if fail:
            raise RuntimeError(name)
        return {"name": name}

    (tmp_path / "a.json").write_text(json.dumps({"name": "finished earlier"}))
    run.step("train:a", tmp_path / "a.json", partial(step, "a"))
    run.step("train:b", tmp_path / "b.json", partial(step, "b", True))
    run.step("distill", tmp_path / "d.json", partial(step, "d"), ("train:a",))
    run.step("train:c", tmp_path / "c.json", partial(step, "c"), ("train:b",))
    assert calls == ["b", "d"]  # a's output was there; c needs the failed b
    assert run.done == {"train:a": {"name": "finished earlier"}, "distill": {"name": "d"}}
    assert run.results["failed"] == {"train:b": "RuntimeError: b", "train:c": "skipped: a step it needs failed"}
    assert json.loads((tmp_path / "d.json").read_text()) == {"name": "d"} and not (tmp_path / "b.json").exists()
    run.step("distill", tmp_path / "d.json", partial(step, "again"))
    assert calls == ["b", "d"]
    # a phase runs its groups side by side, the steps of a group in order, and writes the results
    run.phase([[("train:x", tmp_path / "x.json", partial(step, "x"), ()),
                ("distill:x", tmp_path / "y.json", partial(step, "y"), ("train:x",))],
               [("train:z", tmp_path / "z.json", partial(step, "z"), ())]], 2)
    assert calls.index("x") < calls.index("y") and "z" in calls and run.done["distill:x"] == {"name": "y"}
    assert "| ar_greedy |" in (tmp_path / "results.md").read_text()


def test_every_system_has_its_training_run_and_every_flag_its_help():
    assert all(run in B.ALL_RUNS for run, _, _ in B.ALL_SYSTEMS.values())
    assert [n for n in B.ALL_SYSTEMS if B.on_distilled(B.ALL_SYSTEMS[n][0])] == [
        n for n in B.ALL_SYSTEMS if "_distilled" in n]
    parser = B.build_parser()
    assert all(a.help for a in parser._actions), [a.dest for a in parser._actions if not a.help]
