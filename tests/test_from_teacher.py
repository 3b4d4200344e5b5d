"""examples.warm_start end to end on a tiny teacher and corpus: the size read from the teacher's
checkpoint, distil, fine-tune, average, choose the decoding on valid, two continuation stages, decode
the test set beside the teacher, at two precisions; and examples.generate_output on real fairseq-generate and
fairseq-interactive outputs of the teacher and the fine-tuned model."""

import json
import subprocess
import sys

import pytest
import torch

from examples.commands import Size, interactive_command, run
from examples.generate_output import read_generate_output, read_reference, remove_bpe, score
from examples.steps import closest_candidates
from fairseq_insertion.canvas import log2_bound
from tests.test_warm_start import train_teacher
from tests.utils import REPO, reverse_data

pytestmark = pytest.mark.heavy  # the warm-start recipe end to end: minutes

# the teacher's size differs from every default: the recipe must read it from the checkpoint
SIZE = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-ffn-embed-dim", "128",
        "--decoder-ffn-embed-dim", "128"]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "from_teacher", 200, 8, 6)
    return root, train_teacher(root / "bin", root / "teacher", "--share-all-embeddings", *SIZE)


@pytest.fixture(scope="module")
def warm_start(kit, tmp_path_factory):
    root, teacher = kit
    out = tmp_path_factory.mktemp("warm_start_out")
    cmd = [sys.executable, "-m", "examples.warm_start", "--teacher", teacher, "--data-bin", root / "bin",
           "--valid-ref", root / "raw" / "valid.tgt", "--test-ref", root / "raw" / "test.tgt", "--lang", "none",
           "--out", out, "--device", "cpu", "--updates", "4", "--save-every", "2", "--average", "2",
           "--betas", "0", "1", "--curve-beta", "1", "--candidates", "0", "1", "--lenpens", "0.5", "1",
           "--max-len-a", "1", "--max-len-b", "5", "--batch1-sentences", "3", "--precisions", "fp32", "int8",
           "--continue-stages", "2", "--continue-updates", "3", "--continue-warmup", "1", "--continue-seeds", "5", "6",
           "--train-extra", "--max-tokens", "400", "--seed", "3"]  # several updates an epoch
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


def test_size_is_read_from_the_teacher_checkpoint(kit, tmp_path):
    _, teacher = kit
    assert Size.from_checkpoint(teacher) == Size(layers=1, dim=64, heads=4, ffn=128, share_all=True)
    with pytest.raises(Exception, match="no such checkpoint"):
        Size.from_checkpoint(tmp_path / "missing.pt")


def test_warm_start_writes_every_system(kit, warm_start):
    root, teacher = kit
    out, res = warm_start
    assert res["arch"] == "1+1 layers, d=64, 4 heads, FFN 128, shared embeddings"
    command = res["training"]["command"]
    assert "--encoder-layers 1 " in command and "--decoder-ffn-embed-dim 128 " in command
    assert f"--init-from-transformer {teacher} --warm-start-slots left" in command
    assert f"{out / 'distilled'} " in command  # trained on its own distillation
    # the distilled targets are the teacher's translations of the training sources, binarised
    work = out / "distilled.work"
    src, tgt = (work / "train.src").read_text().splitlines(), (work / "train.tgt").read_text().splitlines()
    assert len(src) == len(tgt) == res["distillation"]["sentences"] == 200 - res["distillation"]["skipped"]
    assert set(src) <= set((root / "raw" / "train.src").read_text().splitlines())
    # each target is one of the teacher's five candidates for its source, the one nearest the reference
    gen = read_generate_output(work / "train.generate")
    assert res["distillation"]["select"] == "closest" and "--nbest 5" in res["distillation"]["command"]
    assert all(len(c) == 5 for c in gen.candidates.values())
    assert tgt == [closest_candidates(gen.candidates, gen.targets)[i] for i in sorted(gen.hypotheses)]
    assert 0 < res["distillation"]["not_the_top_candidate"] < len(tgt)
    assert all((out / "distilled" / f"{split}.src-tgt.tgt.bin").is_file() for split in ("train", "valid", "test"))
    assert set(res["systems"]) == {"ar_greedy", "ar_beam5", "insertion_warm_distilled_parallel",
                                   "insertion_warm_distilled_parallel_candidates",
                                   "insertion_warm_distilled_parallel_rerank"}
    for name, row in res["systems"].items():
        assert row["decode_seconds_batch128"] > 0 and row["decode_seconds_batch1"] > 0, name
        assert row["batch1_sentences"] == 3 and 0 <= row["bleu"] <= 100 and 0 < row["brevity_penalty"] <= 1
        if name.startswith("insertion"):
            assert row["train_updates"] == 4 + 3 + 3  # fine-tuning and two continuation stages
            assert f"--path {out / 'continue2' / 'checkpoint_last.pt'} " in row["command_batch128"]
            assert row["mean_iterations"] is not None and "p99" in row["iterations"]
    assert "--rerank-with" in res["systems"]["insertion_warm_distilled_parallel_rerank"]["command_batch128"]
    valid = res["valid"]
    assert set(valid["valid_bleu_by_update"]) == {"2", "4"}
    assert set(valid["valid_bleu_by_eos_penalty"]) == {"last", "average"}
    assert valid["eos_penalty"] in (0.0, 1.0) and set(valid["lenpen"]) == {"model", "rerank"}
    assert set(valid["valid_by_lenpen"]["rerank"]) == {"0.5", "1"}
    # the average is the element-wise mean of the last two saved checkpoints
    import fairseq_insertion  # noqa: F401  safe globals

    states = [torch.load(p, weights_only=True)["model"] for p in valid["averaged"]]
    avg = torch.load(out / "train" / "checkpoint_average.pt", weights_only=True)["model"]
    key = "decoder.layers.0.fc1.weight"
    assert not torch.equal(states[0][key], states[1][key])
    torch.testing.assert_close(avg[key], (states[0][key] + states[1][key]) / 2)
    # both models through the plugin's task at each precision, and the ratios
    assert set(res["precisions"]) == {"fp32", "int8"}
    for precision, r in res["precisions"].items():
        assert set(r["ratios"]) == {"batch1_time_ratio", "batch128_throughput_ratio"}
        assert all(v > 0 for v in r["ratios"].values())
        for name in ("ar_greedy", "insertion_parallel"):
            one, full = r["systems"][name]["batch1"], r["systems"][name]["batch128"]
            assert one["sentences"] == 3 and full["sentences"] == 6 and 0 <= full["bleu"] <= 100
            assert f"--decode-precision {precision}" in full["command"]
            assert "--task insertion_translation" in full["command"]  # the teacher too: the same conversion


def test_continuation_stages(warm_start):
    """Each stage starts from the previous stage's model (the first from fine-tuning's choice) with a fresh
    optimizer, schedule and meters, its own seed, warmup and learning rate; its beta is chosen on valid."""
    import fairseq_insertion  # noqa: F401  safe globals

    out, res = warm_start
    stages = res["stages"]
    assert [s["stage"] for s in stages] == [1, 2] and [s["seed"] for s in stages] == [5, 6]
    starts = [out / "train" / f"checkpoint_{res['valid']['checkpoint']}.pt", out / "continue1" / "checkpoint_last.pt"]
    for stage, start in zip(stages, starts):
        command = stage["training"]["command"]
        assert f"--finetune-from-model {start} " in command and "--reset-optimizer" not in command
        assert "--lr 0.0005 " in command and "--warmup-updates 1 " in command and "--max-update 3 " in command
        assert "--total-num-update 3 --end-learning-rate 0 " in command and "--dropout 0.3 " in command
        assert command.endswith(f"--seed {stage['seed']}")  # after --train-extra's --seed 3
        assert f"{out / 'distilled'} " in command and stage["training"]["train_updates"] == 3
        assert stage["eos_penalty"] in (0.0, 1.0) and set(stage["valid_bleu_by_eos_penalty"]) == {"0", "1"}
        assert 0 <= stage["test"]["bleu"] <= 100 and stage["test"]["sentences"] == 6
    assert res["eos_penalty"] == stages[-1]["eos_penalty"]
    assert res["checkpoint"] == str(out / "continue2" / "checkpoint_last.pt")
    key = "decoder.layers.0.fc1.weight"
    states = [torch.load(p, weights_only=True) for p in (*starts, out / "continue2" / "checkpoint_last.pt")]
    for before, after in zip(states, states[1:]):
        assert after["optimizer_history"][-1]["num_updates"] == 3  # counted from 0: the meters were reset
        assert not torch.equal(before["model"][key], after["model"][key])


def test_a_stage_is_the_hand_run_continuation(warm_start, tmp_path):
    """The stage's fairseq-train command gives the same weights as the kit's hand-run continuation (``--restore-file``
    with the four resets), update for update."""
    import shlex

    import fairseq_insertion  # noqa: F401  safe globals

    out, res = warm_start
    stage = res["stages"][0]
    cmd = shlex.split(stage["training"]["command"])
    at = cmd.index("--finetune-from-model")
    cmd[at:at + 2] = ["--restore-file", cmd[at + 1], "--reset-optimizer", "--reset-lr-scheduler",
                      "--reset-dataloader", "--reset-meters"]
    cmd[cmd.index("--save-dir") + 1] = str(tmp_path)
    run(cmd, tmp_path / "train.log")
    key = "decoder.layers.0.fc1.weight"
    mine, theirs = (torch.load(p / "checkpoint_last.pt", weights_only=True)["model"]
                    for p in (tmp_path, out / "continue1"))
    assert torch.equal(mine[key], theirs[key]) and torch.equal(mine["decoder.head.location_query"],
                                                                theirs["decoder.head.location_query"])


def test_score_model(kit, warm_start, tmp_path):
    """examples.score_model on the last stage's model: each beta on valid and test, the rule's beta, and first
    insertions chosen by the teacher on test at it."""
    from examples.steps import choose_eos_penalty

    root, teacher = kit
    out, res = warm_start
    base = [sys.executable, "-m", "examples.score_model", "--checkpoint", out / "continue2" / "checkpoint_last.pt",
            "--data-bin", root / "bin", "--valid-ref", root / "raw" / "valid.tgt", "--test-ref",
            root / "raw" / "test.tgt", "--lang", "none", "--out", tmp_path, "--betas", "0", "1"]
    proc = subprocess.run(list(map(str, base + ["--first-insertions", "2:0.5"])), cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "--first-insertions needs --rerank-with" in proc.stderr
    proc = subprocess.run(list(map(str, base + ["--first-insertions", "2:0.5", "--rerank-with", teacher])), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    rows = scores["scores"]
    assert [(r["subset"], r["beta"]) for r in rows] == [("valid", 0), ("valid", 1), ("test", 0), ("test", 1)]
    for r in rows:
        assert 0 <= r["bleu"] <= 100 and r["mean_iterations"] > 0 and r["length_ratio"] > 0
        assert f"--eos-penalty {r['beta']:g} " in r["command"]
    valid = {r["beta"]: r["bleu"] for r in rows if r["subset"] == "valid"}
    assert scores["eos_penalty"] == choose_eos_penalty([0.0, 1.0], valid.__getitem__)[0]
    (first,) = scores["first_insertions"]
    assert first["first_insertions"] == 2 and first["beta"] == scores["eos_penalty"] and 0 <= first["bleu"] <= 100
    assert "--first-insertions 2 --lenpen 2 --rerank-weight 0.5" in first["command"]
    assert f"--rerank-with {teacher}" in first["command"]


def test_continuation_flags_are_checked(kit, tmp_path):
    root, teacher = kit
    base = [sys.executable, "-m", "examples.warm_start", "--teacher", teacher, "--data-bin", root / "bin",
            "--valid-ref", root / "raw" / "valid.tgt", "--test-ref", root / "raw" / "test.tgt", "--lang", "none",
            "--out", tmp_path, "--device", "cpu"]
    for flags, message in ((["--continue-from", teacher], "--continue-stages 0: give at least 1 with --continue-from"),
                           (["--continue-from", tmp_path / "no.pt", "--continue-stages", "1"], "no.pt: not found"),
                           (["--continue-stages", "2", "--continue-seeds", "1", "2", "3"],
                            "--continue-seeds: 3 seeds for 2 stages")):
        proc = subprocess.run(list(map(str, base + flags)), cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / "distilled").exists()  # refused before any work


def test_generate_output_parser_on_real_outputs(kit, warm_start, tmp_path):
    """S-/T-/H-/D-/P-/I- lines, fairseq's time line and the plugin's summary line of the recipe's real
    decodes of the test set, and fairseq-interactive's output of two typed lines."""
    root, teacher = kit
    raw_src = read_reference(root / "raw" / "test.src")
    raw_tgt = read_reference(root / "raw" / "test.tgt")
    out, res = warm_start
    insertion = out / "continue2" / "checkpoint_last.pt"
    for model, name in (("transformer", "ar_greedy"), ("insertion", "insertion_warm_distilled_parallel")):
        decoded = out / "decode" / name / "test.batch128.out"  # the recipe's own decode, stdout and log
        assert f"--path {teacher if model == 'transformer' else insertion} " in res["systems"][name]["command_batch128"]
        gen = read_generate_output(decoded, decoded.with_suffix(".log"))
        assert [gen.sources[i] for i in range(6)] == raw_src and [gen.targets[i] for i in range(6)] == raw_tgt
        assert sorted(gen.hypotheses) == sorted(gen.scores) == sorted(gen.positional_scores) == list(range(6))
        words = {i: len(remove_bpe(h).split()) for i, h in gen.hypotheses.items()}
        assert all(gen.positional_scores[i] == words[i] + 1 for i in words)  # one score per token and </s>
        assert gen.detokenized == gen.hypotheses  # no --tokenizer: D- repeats H-
        assert gen.decode_seconds is not None and gen.decode_seconds > 0
        result = score(gen, raw_tgt, None)
        assert 0 <= result["bleu"] <= 100 and result["sentences"] == 6
        assert result["mean_length"] == pytest.approx(sum(words.values()) / 6)
        if model == "transformer":
            assert gen.iterations == {} and gen.insertion_summary == {}
            continue
        # the plugin's own summary agrees with the per-sentence lines
        summary = gen.insertion_summary
        assert summary["sentences"] == 6 and summary["forward_passes"] >= max(gen.iterations.values())
        assert summary["mean_iterations"] == pytest.approx(sum(gen.iterations.values()) / 6, abs=1e-3)
        assert summary["mean_log2_bound"] == pytest.approx(sum(log2_bound(n) for n in words.values()) / 6, abs=1e-3)
        assert result["mean_iterations"] == pytest.approx(summary["mean_iterations"], abs=1e-3)
    # fairseq-interactive prints the same lines for standard input
    lines = tmp_path / "input.txt"
    lines.write_text("\n".join(raw_src[:2]) + "\n")
    typed = tmp_path / "interactive.out"
    run(interactive_command(root / "bin", insertion, source_lang="src", target_lang="tgt", eos_penalty=1.0),
        typed.with_suffix(".log"), stdout=typed, stdin=lines)
    gen = read_generate_output(typed)
    assert sorted(gen.hypotheses) == [0, 1] and [gen.sources[0], gen.sources[1]] == raw_src[:2]
