"""The systems recipe and the harness on tiny models: the recipe trains every model it is asked for (the
teacher and the distillation first), leaves a finished one as it is and goes on from checkpoint_last.pt;
the harness takes turns after a burn-in; the peers comparison measures what the recipe made, with its
ratios, targets and placeholders; the report's targets on hand-made rows."""

import argparse
import json
from pathlib import Path

import pytest
import torch

from benchmarks import harness as H
from benchmarks import peers as P
from examples.commands import RecipeError, Size
from examples.multi30k import systems as M
from tests.test_repo_hygiene import machine_paths
from tests.utils import reverse_data

TRAINED = ["ar", "nat", "binary_tree", "ar_distilled", "binary_tree_distilled"]
MEASURED = ["ar_greedy", "ar_beam5", "fairseq_nat_insertion", "insertion_binary_tree_parallel",
            "ar_greedy_distilled", "insertion_binary_tree_parallel_distilled"]
DISTILLED = MEASURED[-2:]  # trained on the teacher's distillation (the recipe's ar_distilled, binary_tree_distilled)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(plan, records): the recipe's models, 3 updates each, on a reverse corpus in prepare.py's layout."""
    root = reverse_data(tmp_path_factory, "systems", 200, 8, 10)
    (root / "data").mkdir()
    (root / "data" / "data-bin").symlink_to(root / "bin")
    (root / "data" / "raw").symlink_to(root / "raw")
    plan = M.Plan(root / "data", root / "models", Size(1, 32, 2, 64), updates=3, max_tokens=512)
    return plan, M.make(plan, TRAINED)


def test_the_recipe_trains_each_model_once_and_goes_on_from_its_last_checkpoint(made, monkeypatch):
    plan, records = made
    assert sorted(records) == sorted(TRAINED) and all(r["train_updates"] == 3 for r in records.values())
    assert (plan.out / "data-bin-distilled" / "distill.json").is_file()
    assert "--arch insertion_transformer" in records["nat"]["command"] and "--task translation_lev" in records[
        "nat"]["command"]
    assert str(plan.out / "data-bin-distilled") in records["binary_tree_distilled"]["command"]
    monkeypatch.setattr(M.R, "train", lambda *a, **k: pytest.fail("a finished model was trained again"))
    assert M.make(plan, TRAINED) == records
    monkeypatch.undo()
    (plan.out / "binary_tree" / "train.json").unlink()  # unfinished: fairseq goes on from checkpoint_last.pt
    longer = M.Plan(plan.data, plan.out, plan.size, updates=4, max_tokens=plan.max_tokens)
    again = M.make(longer, ["binary_tree"])["binary_tree"]
    log = (plan.out / "binary_tree" / "train.log").read_text()
    assert again["train_updates"] == 4 and "checkpoint_last.pt (epoch 1 @ 3 updates)" in log


def test_given_teacher_and_distilled_data_must_fit_the_dictionaries(made, tmp_path):
    plan, _ = made
    other = tmp_path / "other"
    other.mkdir()
    for side in ("src", "tgt"):
        (other / f"dict.{side}.txt").write_text("der 10\ndie 9\n")
    with pytest.raises(RecipeError, match=r"other/dict.src.txt differs from .*data-bin/dict.src.txt at line 1"):
        M.check_given(M.Plan(plan.data, plan.out, distilled=other))
    teacher = tmp_path / "teacher.pt"
    model = {f"{p}.embed_tokens.weight": torch.zeros(7, 2) for p in ("encoder", "decoder")}
    torch.save({"args": argparse.Namespace(arch="transformer"), "model": model}, teacher)
    with pytest.raises(RecipeError, match=r"teacher.pt: encoder.embed_tokens.weight has 7 rows"):
        M.check_given(M.Plan(plan.data, plan.out, teacher=teacher))
    M.check_given(M.Plan(plan.data, plan.out, distilled=plan.out / "data-bin-distilled"))


def test_the_peers_comparison_measures_what_the_recipe_made(made, tmp_path):
    plan, _ = made
    out = tmp_path / "out"
    argv = ["--models", str(plan.out), "--data", str(plan.data), "--out", str(out), "--systems", *MEASURED,
            "--betas", "0", "1", "--batch1-sentences", "4", "--rounds", "2", "--threads", "1", "--profile"]
    assert P.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in results["systems"]}
    assert list(rows) == MEASURED and results["notes"] == []
    for r in rows.values():
        for key in ("bleu", "mean_iterations", "decode_seconds_batch1", "decode_seconds_batch128", P.SPEED):
            assert r[key] is not None, (r["name"], key)
        assert len(r["decode_seconds_batch128_by_round"]) == 2 and r["profile_batch1"]["top_ops"], r["name"]
        assert r["data"] == ("distilled" if r["name"] in DISTILLED else "raw"), r
        assert r["train_updates"] in (3, 4) and r["checkpoint"].startswith("MODELS/"), r  # 4: binary_tree went on
    swept = rows["insertion_binary_tree_parallel"]
    assert sorted(swept["valid_bleu_by_eos_penalty"]) == ["0", "1"] and swept["eos_penalty"] in (0.0, 1.0)
    assert swept["options"]["block_neighbour_copies"] is True  # the recipes' repetition rules
    assert rows["ar_greedy"]["mean_iterations"] == rows["ar_greedy"]["mean_length"]  # one token per step
    assert rows["fairseq_nat_insertion"]["mean_iterations"] <= 9  # at most 10 refinement passes
    assert rows["ar_greedy"]["decode_time_ratio_batch1_vs_ar_greedy"] == 1.0
    assert rows["insertion_binary_tree_parallel_distilled"]["decode_throughput_ratio_batch128_vs_ar_greedy"] == \
        pytest.approx(rows["ar_greedy_distilled"]["decode_seconds_batch128"] /
                      rows["insertion_binary_tree_parallel_distilled"]["decode_seconds_batch128"], abs=1e-3)
    assert len(results["targets"]) == len(P.TARGETS)
    text = (out / "results.json").read_text()
    assert list(machine_paths(text)) == [] and "--models MODELS --data DATA --out OUT" in text
    table = (out / "results.md").read_text()
    assert all(f"| {n} |" in table for n in MEASURED)
    (out / "results.md").unlink()
    assert P.main(["--render", str(out / "results.json")]) == 0 and (out / "results.md").read_text() == table


class Recorded(H.Engine):
    """A fake engine: every batch it is given, and outputs that name its sentences."""

    def __init__(self, name, calls):
        super().__init__(H.System(name, Path(name)), H.Where(Path("."), Path(".")))
        self.name, self.calls = name, calls

    def translate(self, batch, constraints=None):
        self.calls.append((self.name, [s[0] for s in batch], constraints))
        return self.count([H.Output([s[0], "x"]) for s in batch])


def test_the_engines_take_turns_after_a_burn_in_batch():
    calls = []
    sources = [[f"s{i}"] * n for i, n in enumerate((1, 3, 2))]
    inputs = H.Inputs(sources, ["r"] * 3, [["c0"], [], ["c2"]])
    timed = H.rounds({"a": Recorded("a", calls), "b": Recorded("b", calls)}, inputs, 2, n=2)
    one = [["s1", "s2"], ["s1", "s2"], ["s0"]]  # the burn-in batch (the longest sources), then every batch
    assert [c[0] for c in calls] == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    assert [c[1] for c in calls] == one * 4 and calls[0][2] == [[], ["c2"]]
    assert [[o.tokens[0] for o in t.outputs] for t in timed.values()] == [["s0", "s1", "s2"]] * 2  # line order
    assert all(len(t.seconds) == 2 and t.passes == 3 + 3 for t in timed.values())  # 2 pieces + 1 per batch


def hand_made(sets=("main",), device="cpu") -> dict:
    def row(name, data, bleu, t1, t128, tok=100.0, it=None, bound=None):
        return {"name": name, "data": data, "bleu": bleu, "mean_iterations": it, "mean_log2_bound": bound,
                "decode_seconds_batch1": t1, "decode_seconds_batch128": t128, P.SPEED: tok}

    rows = [row("ar_greedy", "raw", 20.0, 2.0, 4.0, tok=200.0),
            row("insertion_binary_tree_parallel", "raw", 12.0, 1.0, 2.0, tok=150.0),
            row("ar_greedy_distilled", "distilled", 19.0, 2.0, 4.0),
            row("fairseq_nat_insertion_distilled", "distilled", 14.0, 1.0, 3.0),
            row("insertion_binary_tree_parallel_distilled", "distilled", 17.0, 0.8, 1.6, it=4.5, bound=3.7),
            row("insertion_uniform_parallel_distilled", "distilled", 17.5, 0.9, 2.5)]
    return {"sets": list(sets), "device": device, "systems": rows}


def test_targets_and_ratios_on_hand_made_rows():
    results = hand_made()
    P.add_ratios(results)
    by_metric = {t["metric"]: t for t in results["targets"]}
    assert by_metric["decode time at batch 1, plugin parallel / AR greedy (distilled)"] == {
        "metric": "decode time at batch 1, plugin parallel / AR greedy (distilled)", "target": "<= 0.5 (CPU)",
        "value": 0.4, "met": True}
    throughput = by_metric["decode throughput at batch 128, plugin parallel / AR greedy (distilled)"]
    assert (throughput["target"], throughput["value"], throughput["met"]) == (">= 1 (CPU)", 2.5, True)
    nat = by_metric["decode throughput at batch 128, plugin parallel / fairseq built-in insertion_transformer "
                    "(distilled)"]
    assert (nat["value"], nat["met"]) == (1.875, True)
    best = by_metric["test BLEU, best plugin parallel system (insertion_uniform_parallel_distilled) / AR greedy"]
    assert (best["value"], best["met"]) == (0.875, True)
    assert by_metric["test BLEU, best reranked plugin system (none) / AR greedy"]["met"] is None
    iterations = by_metric["mean parallel iterations - mean floor(log2 n)+1 (binary tree, distilled)"]
    assert (iterations["value"], iterations["met"]) == (0.8, True)
    train = by_metric["training target tokens/s, plugin / AR transformer"]
    assert (train["target"], train["value"], train["met"]) == ("reported", 0.75, None)
    rows = {r["name"]: r for r in results["systems"]}
    assert rows["insertion_binary_tree_parallel"]["decode_time_ratio_batch1_vs_ar_greedy"] == 0.5
    assert rows["insertion_uniform_parallel_distilled"]["decode_throughput_ratio_batch128_vs_ar_greedy"] == 1.6
    assert rows["insertion_uniform_parallel_distilled"]["decode_time_ratio_batch1_vs_fairseq_nat"] == 0.9
    gpu = hand_made(device="cuda")
    P.add_ratios(gpu)
    assert gpu["targets"][2]["target"] == "<= 0.35 (GPU)" and gpu["targets"][3]["target"] == ">= 2 (GPU)"


def test_the_table_set_compares_with_the_kits_teacher():
    results = hand_made(("table",))
    results["systems"][0]["name"] = "teacher_greedy"
    P.add_ratios(results)
    rows = {r["name"]: r for r in results["systems"]}
    assert results["targets"] == [] and rows["teacher_greedy"]["decode_time_ratio_batch1_vs_teacher_greedy"] == 1.0
    assert rows["insertion_binary_tree_parallel_distilled"]["decode_time_ratio_batch1_vs_teacher_greedy"] == 0.4
    assert rows["insertion_binary_tree_parallel_distilled"]["train_speed_ratio_vs_teacher_greedy"] == 0.5


def test_every_flag_has_its_help():
    from benchmarks import constrained, engines

    for parser in (P.build_parser(), engines.build_parser(), constrained.build_parser()):
        assert all(a.help for a in parser._actions), [a.dest for a in parser._actions if not a.help]
