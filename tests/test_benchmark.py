"""The benchmark's --quick mode end to end on a slice of Multi30k: every system gets every field, every
step leaves its output file."""

import json
import subprocess
import sys

import pytest

from .utils import REPO

RAW = REPO.parent / "shared" / "data" / "multi30k"
SYSTEMS = [
    "ar_greedy", "ar_beam5", "fairseq_nat_insertion", "insertion_binary_tree_parallel",
    "insertion_binary_tree_greedy", "insertion_uniform_parallel", "insertion_left_to_right_greedy",
]  # fmt: skip
FIELDS = ["name", "bleu", "mean_iterations", "mean_log2_bound", "decode_seconds_batch1", "decode_seconds_batch128",
          "train_target_tokens_per_s", "command"]


@pytest.mark.skipif(not RAW.is_dir(), reason="needs ../shared/data/multi30k")
def test_quick_benchmark_writes_every_field_for_every_system(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--out", str(out), "--raw-dir", str(RAW), "--quick",
         "--jobs", "2", "--device", "cpu", "--train-lines", "1000", "--test-lines", "24", "--updates", "20"],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    for key in ("machine", "device", "updates", "arch", "test_set", "systems"):
        assert results[key] not in (None, "", []), key
    assert results["device"] == "cpu" and results["updates"] == 20 and results["failed"] == {}
    names = [s["name"] for s in results["systems"]]
    assert sorted(names) == sorted(SYSTEMS + [n + "_distilled" for n in SYSTEMS])
    for s in results["systems"]:
        for field in FIELDS:
            assert s[field] is not None, (s["name"], field)
        assert 0.0 <= s["bleu"] <= 100.0, s
        assert s["mean_iterations"] >= 1.0, s
        assert s["decode_seconds_batch1"] > 0 and s["decode_seconds_batch128"] > 0, s
        assert s["train_target_tokens_per_s"] > 0, s
        assert "fairseq-generate" in s["command"] or "fairseq_cli.generate" in s["command"], s
        assert "fairseq-train" in s["train_command"] or "fairseq_cli.train" in s["train_command"], s
    # insertion systems report decoding iterations from the I- lines; AR iterations equal the output length
    rows = {s["name"]: s for s in results["systems"]}
    assert rows["ar_greedy"]["mean_iterations"] == pytest.approx(rows["ar_greedy"]["mean_length"])
    assert rows["insertion_binary_tree_parallel"]["decode_time_ratio_batch1_vs_ar_greedy"] is not None
    # every step left its output file, which a later run into the same OUT reuses
    assert all((out / "decode" / n / "test.batch128.json").is_file() for n in names)
    assert all((out / run / "train.json").is_file() for run in ("ar", "binary_tree", "binary_tree_distilled"))
    table = (out / "results.md").read_text()
    assert all(f"| {n} |" in table for n in names)
    assert (out / "iterations.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the distilled training set is the teacher's output, line-aligned with the source
    work = out / "data-bin-distilled.work"
    src, tgt = (work / "train.src").read_text().splitlines(), (work / "train.tgt").read_text().splitlines()
    assert len(src) == len(tgt) == 1000
    assert tgt != (out / "data" / "tok" / "train.tgt").read_text().splitlines()
