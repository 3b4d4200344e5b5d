"""benchmarks.from_teacher end to end on a tiny teacher and corpus: fine-tune, average, choose the
decoding on valid, decode the test set beside the teacher, and write every row; then
benchmarks.decode_speed on its model and teacher at two precisions."""

import json
import subprocess
import sys

import pytest
import torch

from tests.test_warm_start import train_teacher
from tests.utils import REPO, reverse_data


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "from_teacher", 200, 8, 6)
    (root / "data-bin").symlink_to(root / "bin")  # prepare.py's layout: data-bin/, raw/ and tok/
    (root / "tok").symlink_to(root / "raw")
    return root, train_teacher(root / "bin", root / "teacher", "--share-all-embeddings")


def test_from_teacher_writes_every_system(kit, tmp_path):
    root, teacher = kit
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks.from_teacher", "--teacher", teacher, "--data", root, "--distilled",
           root / "bin", "--out", out, "--device", "cpu", "--updates", "4", "--save-every", "2", "--average", "2",
           "--layers", "2", "--dim", "64", "--ffn", "256", "--betas", "0", "1", "--curve-beta", "1",
           "--candidates", "0", "1", "--lenpens", "0.5", "1", "--max-len-a", "1", "--max-len-b", "5",
           "--batch1-sentences", "3", "--train-extra", "--max-tokens", "400"]  # several updates an epoch
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["arch"].startswith("2+2 layers, d=64")
    assert set(res["systems"]) == {"ar_greedy", "ar_beam5", "insertion_warm_distilled_parallel",
                                   "insertion_warm_distilled_parallel_candidates",
                                   "insertion_warm_distilled_parallel_rerank"}
    for name, row in res["systems"].items():
        assert row["decode_seconds_batch128"] > 0 and row["decode_seconds_batch1"] > 0, name
        assert row["batch1_sentences"] == 3 and 0 <= row["bleu"] <= 100 and 0 < row["brevity_penalty"] <= 1
        if name.startswith("insertion"):
            assert row["train_updates"] == 4
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
    assert f"--init-from-transformer {teacher} --warm-start-slots left" in res["training"]["command"]

    # decode_speed: both models through the plugin's task at each precision, the ratios
    speed = tmp_path / "speed"
    cmd = [sys.executable, "-m", "benchmarks.decode_speed", "--insertion", out / "train" / "checkpoint_last.pt",
           "--teacher", teacher, "--data", root, "--out", speed, "--device", "cpu", "--precisions", "fp32", "int8",
           "--batch-sizes", "4", "1", "--batch1-sentences", "3", "--max-len-a", "1", "--max-len-b", "5"]
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((speed / "results.json").read_text())["results"]
    assert set(res) == {"fp32", "int8"}
    for precision, r in res.items():
        assert set(r["ratios"]) == {"batch1_time_ratio", "batch4_throughput_ratio"}
        assert all(v > 0 for v in r["ratios"].values())
        for name in ("ar_greedy", "insertion_parallel"):
            one, four = r["systems"][name]["batch1"], r["systems"][name]["batch4"]
            assert one["sentences"] == 3 and four["sentences"] == 6 and 0 <= four["bleu"] <= 100
            assert f"--decode-precision {precision}" in four["command"]
            assert "--task insertion_translation" in four["command"]  # the teacher too: the same conversion
