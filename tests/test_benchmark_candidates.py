"""benchmarks.candidates end to end on a tiny insertion model and teacher: ``collect`` keeps every candidate
(each EOS penalty, each first insertion) with the model's and the teacher's log-probabilities, ``choose``
writes a row per candidate set and chooser with the oracle beside it, and the means over seeds."""

import json
import subprocess
import sys

import pytest
from sacrebleu.metrics import BLEU

from benchmarks import candidates as C
from tests.test_warm_start import train_teacher
from tests.utils import REPO, reverse_data, train_args, train_once


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "bench_candidates", 300, 10, 10)
    train_once(train_args(root / "bin", root / "ckpt", "--max-update", "20", "--no-epoch-checkpoints"), root / "bin",
               root / "ckpt")
    teacher = train_teacher(root / "bin", root / "teacher", "--share-all-embeddings")
    out = root / "collected"
    for split in ("valid", "test"):
        for name, branch in (("a", "2"), ("b", "1")):
            proc = subprocess.run([sys.executable, "-m", "benchmarks.candidates", "collect", "--insertion",
                                   str(root / "ckpt" / "checkpoint_last.pt"), "--teacher", str(teacher), "--data-bin",
                                   str(root / "bin"), "--split", split, "--betas", "2.5,3.5,4.5", "--branch", branch,
                                   "--out", str(out / f"{name}.{split}.json")], cwd=REPO, capture_output=True,
                                  text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
    return root, out


def test_collect_keeps_every_candidate_with_both_scores(collected):
    root, out = collected
    data = json.loads((out / "a.test.json").read_text())
    assert len(data["candidates"]) == 10
    for cands in data["candidates"]:
        assert sorted(c[0] for c in cands) == [2.5, 3.5, 4.5, 102.5, 103.5, 104.5]  # + 100 j: first insertion j
        assert all(c[2] <= 0 and c[3] <= 0 for c in cands)  # log-probabilities
    assert any(c[1] for cands in data["candidates"] for c in cands)  # not all empty


def test_choose_rows_oracles_and_seed_means(collected):
    root, out = collected
    res_path = out / "choice"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.candidates", "choose", "--collected", f"a={out / 'a'}",
                           f"b={out / 'b'}", "--sets", "1", "3", "K2", "--choosers", "model", "teacher",
                           "--valid-ref", str(root / "raw" / "valid.tgt"), "--test-ref", str(root / "raw" / "test.tgt"),
                           "--lang", "none", "--seeds", "a", "b", "--out", str(res_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(res_path.with_suffix(".json").read_text())
    names = {(r["candidates"], r["chooser"]) for r in res["rows"]}
    # "b" holds no second first insertion: no K2 rows for it
    assert names == {(f"{c} {s}", ch) for c in "ab" for s in ("1", "3") for ch in ("model", "teacher")} | {
        ("a K2", "model"), ("a K2", "teacher")}
    for r in res["rows"]:
        assert r["oracle_test"] >= r["test"] - 1e-6 and r["oracle_valid"] >= r["valid"] - 1e-6
        assert r["setting"] in r["valid_by_setting"] and r["valid"] == max(r["valid_by_setting"].values())
    md = res_path.with_suffix(".md").read_text()
    assert "Mean of the seeds' models (a, b)" in md and str(root) not in md and str(root) not in json.dumps(res)


def test_the_teacher_chooser_takes_the_candidate_the_teacher_scores_best():
    cands = [C.Candidate(1.0, "a b", 3, -1.0, -9.0), C.Candidate(2.0, "a b c", 4, -5.0, -2.0)]
    assert C.by_score(C.normalised(1.0, 1.0, 0.0))(cands) == 1
    assert C.by_score(C.normalised(1.0, 0.0, 1.0))(cands) == 0
    refs = ["a b c"]
    assert C.oracle([cands], refs) == BLEU().corpus_score(["a b c"], [refs]).score
    # MBR: the text that agrees most with the rows (two rows of the same text weigh twice)
    rows = [C.Candidate(1.0, "x y z", 4, -1, -1), C.Candidate(2.0, "x y z", 4, -1, -1),
            C.Candidate(3.0, "x y w", 4, -1, -1)]
    assert rows[C.mbr(C.utility("chrf"))(rows)].text == "x y z"
