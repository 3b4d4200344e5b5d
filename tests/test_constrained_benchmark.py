"""The constrained benchmark (python -m benchmarks.constrained) end to end on tiny models: every system
gets its row, the constraints are drawn as documented, the plugin's constrained outputs hold every
constraint as whole words, --quality-only leaves the seconds out."""

import json
import random
import subprocess
import sys

import pytest

from benchmarks import harness as H
from examples.multi30k.constraints import draw
from examples.multi30k.prepare import prepare
from tests.test_repo_hygiene import machine_paths
from tests.test_warm_start import train_teacher
from tests.utils import REPO, train_args, train_once

EN = ["apple", "banana", "cherry", "dog", "elephant", "forest", "garden", "house", "island", "jungle", "kitchen",
      "lemon", "mountain", "notebook", "orange", "pencil"]
DE = ["Apfel", "Banane", "Kirsche", "Hund", "Elefant", "Wald", "Garten", "Haus", "Insel", "Dschungel", "Küche",
      "Zitrone", "Berg", "Notizbuch", "Orange", "Bleistift"]


def _raw(directory, seed=0):
    """Multi30k-named raw files: a source of distinct words, its target the translated words reversed."""
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    for stem, n in (("train", 300), ("val", 10), ("test_2016_flickr", 12)):
        pairs = []
        for _ in range(n):
            idx = rng.sample(range(len(EN)), rng.randint(3, 8))
            pairs.append((" ".join(EN[i] for i in idx) + " .", " ".join(DE[i] for i in reversed(idx)) + " ."))
        for lang, side in (("en", 0), ("de", 1)):
            (directory / f"{stem}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    root = tmp_path_factory.mktemp("constrained_kit")
    _raw(root / "raw")
    prepare(root / "data", root / "raw", "en", "de", bpe_merges=40, workers=1)
    teacher = train_teacher(root / "data" / "data-bin", root / "teacher", "--share-all-embeddings")
    train_once(train_args(root / "data" / "data-bin", root / "ins", "--max-update", "3", "--no-epoch-checkpoints"),
               root / "data" / "data-bin", root / "ins")
    return root, teacher


def test_constrained_benchmark_end_to_end(kit, tmp_path):
    root, teacher = kit
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks.constrained", "--out", str(out), "--refs", str(root / "data" / "raw"),
           "--teacher", str(teacher), "--data-bin", str(root / "data" / "data-bin"),
           "--insertion", str(root / "ins" / "checkpoint_last.pt"), "--quality-only", "--betas", "1", "3",
           "--candidates", "0,2", "--lenpens", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "constrained.json").read_text())
    assert results["quality_only"] is True and results["sentences"] == 12
    # the constraints: drawn from the data-bin's subword targets, as documented
    targets = [" ".join(p) for p in H.pieces(root / "data" / "data-bin", "test", 1)]
    drawn = draw(targets, 1, 3)
    assert len(drawn) == 12 and all(1 <= len(cs) <= 2 for cs in drawn)
    assert results["beam_probe"]["smallest_beam"] == 1  # fairseq's constrained beam search takes beam 1
    rows = {r["name"]: r for r in results["systems"]}
    assert sorted(rows) == sorted(["ar_greedy", "ar_beam5", "ar_beam5_constrained", "ar_beam1_constrained",
                                   *(f"ins_{s}{c}" for s in ("parallel", "rerank") for c in ("", "_constrained")),
                                   "ins_runtime_fp32_constrained", "ins_runtime_int8_constrained"])
    for r in rows.values():
        assert 0.0 <= r["bleu"] <= 100.0 and r["constraints"] == sum(map(len, drawn)), r["name"]
        assert r["decode_seconds_batch1"] is None and r["decode_seconds_batch128"] is None  # not timed
        assert r["same_outputs_batch1_batch128"]["sentences"] == 12, r["name"]
        assert r["constrained"] == (r["settings"].get("constraints") == "ordered"), r["name"]
    for name in ("ins_parallel_constrained", "ins_rerank_constrained", "ins_runtime_fp32_constrained",
                 "ins_runtime_int8_constrained"):
        assert rows[name]["usage_rate"] == 1.0, rows[name]
    # the runtime decodes the constrained sentences as the PyTorch generator does, not empty
    parity = [p for p in results["parity"] if p["a"] == "ins_runtime_fp32_constrained"]
    assert [(p["b"], p["batch"], p["identical"]) for p in parity] == [("ins_parallel_constrained", 1, 12),
                                                                       ("ins_parallel_constrained", 128, 12)]
    assert all(p["mean_length"] > 2 for p in parity)
    assert rows["ins_parallel_constrained"]["settings"]["eos_penalty"] in (1.0, 3.0)
    assert rows["ins_rerank_constrained"]["settings"]["eos_penalties"] == [0.0, 2.0]
    assert rows["ins_rerank_constrained"]["settings"]["rerank_with"] == "KIT/checkpoint_last.pt"
    assert rows["ar_beam5_constrained"]["settings"] == {"beam": 5, "max_len_a": 2.0, "max_len_b": 50,
                                                        "constraints": "ordered"}
    # the plugin decodes the same at batch 1 and 128
    assert rows["ins_parallel_constrained"]["same_outputs_batch1_batch128"]["all_same"]
    assert results["targets"][0]["met"] is True
    table = (out / "constrained.md").read_text()
    assert all(f"| {n} |" in table for n in rows) and "Not timed" in table
    text = (out / "constrained.json").read_text()  # this machine's paths as placeholders
    assert list(machine_paths(text)) == [] and "--out OUT" in text and "--insertion INS1/checkpoint_last.pt" in text
    (out / "constrained.md").unlink()
    again = subprocess.run([sys.executable, "-m", "benchmarks.constrained", "--render", str(out / "constrained.json")],
                           capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 0 and (out / "constrained.md").read_text() == table == again.stdout
