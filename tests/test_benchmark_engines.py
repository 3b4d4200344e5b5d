"""benchmarks.engines end to end on a tiny teacher and insertion model: every engine, thread count and
batch gets a row with numbers, the comparisons are made, the JSON holds placeholders for the paths and
renders to the same table; CTranslate2's rows are left out, with a note, where it cannot be imported."""

import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import engines as E
from benchmarks import harness as H
from tests.test_warm_start import train_teacher
from tests.utils import REPO, reverse_data, train_args, train_once

pytestmark = pytest.mark.heavy  # the engines and checkouts benchmarks end to end, many processes: minutes

SENTENCES, THREADS, BATCHES = 5, (1, 2), (1, 4)
NUMBERS = ("seconds", "sentences_per_s", "passes", "passes_per_sentence", "ms_per_pass", "bleu", "mean_length")


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """(root, teacher, insertion checkpoint) on a reverse corpus: a 3-update teacher, a 20-update insertion model."""
    root = reverse_data(tmp_path_factory, "engines", 200, 8, 8)
    teacher = train_teacher(root / "bin", root / "teacher", "--share-all-embeddings")
    train_once(train_args(root / "bin", root / "insertion", "--max-update", "20", "--no-epoch-checkpoints"),
               root / "bin", root / "insertion")
    return root, teacher, root / "insertion" / "checkpoint_last.pt"


def benchmark(kit, out, *extra, env=None):
    root, teacher, insertion = kit
    cmd = [sys.executable, "-m", "benchmarks.engines", "--teacher", teacher, "--data-bin", root / "bin",
           "--insertion", insertion, "--ref", root / "raw" / "test.tgt", "--lang", "none", "--out", out,
           "--sentences", str(SENTENCES), *extra]
    return subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900, env=env)


@pytest.fixture(scope="module")
def results(kit, tmp_path_factory):
    out = tmp_path_factory.mktemp("engines_out")
    proc = benchmark(kit, out, "--threads", *map(str, THREADS), "--batches", *map(str, BATCHES), "--rounds", "2",
                     "--raw-source", kit[0] / "raw" / "test.src")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "engines.json").read_text())


def ctranslate2_available():
    return importlib.util.find_spec("ctranslate2") is not None


def expected_engines():
    return [k for k, s in E.systems(None, None).items() if (s.engine != "ctranslate2" or ctranslate2_available())
            and not k.endswith(("first_step", "first_pass"))]


def test_every_engine_thread_count_and_batch_has_a_row_with_numbers(results):
    out, res = results
    rows = {r["name"]: r for r in res["rows"]}
    wanted = [E.row_name(k, t, b) for k in expected_engines() for t in THREADS for b in BATCHES]
    assert sorted(rows) == sorted(wanted)
    for r in rows.values():
        for key in NUMBERS:
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (r["name"], key)
        assert r["seconds"] > 0 and r["passes"] > 0 and 0 <= r["bleu"] <= 100, r
        # the engines took turns for two rounds: the row's seconds are their median
        assert len(r["seconds_by_round"]) == 2 and r["seconds"] == pytest.approx(sum(r["seconds_by_round"]) / 2)
        assert r["sentences"] == SENTENCES and r["threads"] in THREADS and r["batch"] in BATCHES
        hyps = (out / "hyps" / f"{r['name']}.txt").read_text().splitlines()
        assert len(hyps) == SENTENCES
        if r["model"] == "teacher":  # one greedy step per output piece and the end marker
            assert r["mean_iterations"] is None
            if r["batch"] == 1:
                assert r["passes"] == sum(len(h.split()) + 1 for h in hyps), r
        else:  # at least one pass a sentence, and as many passes as the iterations at batch 1 (+ the last)
            assert r["mean_iterations"] >= 1 and r["mean_log2_bound"] >= 1, r
            if r["batch"] == 1:
                assert r["passes_per_sentence"] >= r["mean_iterations"], r
    if not ctranslate2_available():
        assert any("ctranslate2" in n for n in res["notes"])
    assert {(b["engine_key"], b["batch"]) for b in res["best_threads"]} == {
        (k, b) for k in expected_engines() for b in BATCHES}


def test_the_runtime_gives_the_pytorch_hypotheses_and_every_comparison_is_made(results):
    _, res = results
    for name in ("runtime fp32 = PyTorch, parallel", "runtime fp32 = PyTorch, greedy"):
        mine = [p for p in res["parity"] if p["comparison"] == name]
        assert len(mine) == len(THREADS) * len(BATCHES)
        assert all(p["identical"] == p["sentences"] == SENTENCES for p in mine), mine
    metrics = [t["metric"] for t in res["targets"]]
    assert any(m.startswith("runtime int8 - fp32 BLEU") for m in metrics)
    if ctranslate2_available():
        for precision in ("fp32", "int8"):
            speed = [t for t in res["targets"] if t["metric"].startswith(f"runtime / CTranslate2 seconds, {precision}, "
                                                                         "batch 1 ")]
            assert len(speed) == 1 and speed[0]["target"] == "<= 1" and speed[0]["value"] > 0, speed
            # the ratio of each round, beside the ratio of the medians
            assert len(speed[0]["by_round"]) == 2 and all(x > 0 for x in speed[0]["by_round"]), speed
    agreement = {(a["engine_key"], a["threads"]) for a in res["batch_agreement"]}
    assert agreement == {(k, t) for k in expected_engines() for t in THREADS}
    # raw lines through translate_text (Moses leaves the corpus's words as they are) give the data-bin path's outputs
    raw = res["raw_text"]
    assert raw["identical"] == raw["sentences"] == SENTENCES and raw["mean_length"] > 1, raw
    assert raw["bleu_raw_text"] == raw["bleu_data_bin"]


def test_paths_are_placeholders_and_the_table_renders_again(results):
    out, res = results
    text = (out / "engines.json").read_text()
    assert str(out) not in text and str(REPO) not in text and str(out.parent) not in text
    assert res["command"].startswith("python -m benchmarks.engines --teacher ") and "--out OUT " in res["command"]
    assert "--insertion INS/checkpoint_last.pt" in res["command"] and "--data-bin DATA-BIN " in res["command"]
    assert (out / "export" / "insertion_runtime_int8" / "pass.onnx").is_file()  # the runtime's export, int8
    assert res["machine"] and res["versions"]["onnxruntime"] and res["thread_counts"] == list(THREADS)
    table = (out / "engines.md").read_text()
    (out / "engines.md").unlink()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.engines", "--render", str(out / "engines.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "engines.md").read_text() == table == proc.stdout
    committed = out / "elsewhere" / "engines_cpu.json"  # a results file renders beside itself
    committed.parent.mkdir()
    committed.write_text(text)
    assert E.main(["--render", str(committed)]) == 0 and committed.with_suffix(".md").read_text() == table
    assert table.count("| runtime | insertion | fp32 | parallel |") == len(BATCHES)
    header = next(line for line in table.splitlines() if line.startswith("| engine |")).split(" | ")
    teacher = next(r for r in res["rows"] if r["engine_key"] == "teacher_fairseq_fp32")
    ratio = header.index("x teacher greedy")
    assert any(line.split(" | ")[ratio] == "1.000" for line in table.splitlines() if line.startswith("| fairseq |"))
    insertion = next(r for r in res["rows"] if r["engine_key"] == "insertion_runtime_fp32")
    assert f"{insertion['bleu'] / teacher['bleu']:.3f}" in {line.split(" | ")[ratio] for line in table.splitlines()
                                                             if line.startswith("| runtime | insertion | fp32 |")}


def test_without_ctranslate2_its_rows_are_left_out_with_a_note(kit, tmp_path):
    blocker = tmp_path / "block" / "ctranslate2"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('ctranslate2 blocked by the test')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path / "block")}
    proc = benchmark(kit, tmp_path / "out", "--threads", "1", "--batches", "1", "--engines",
                     "teacher_ctranslate2_fp32", "insertion_runtime_fp32", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "engines.json").read_text())
    assert [r["engine_key"] for r in res["rows"]] == ["insertion_runtime_fp32"]
    assert "ctranslate2 is not installed: its rows are left out" in res["notes"]


def test_bad_input_is_named(kit, tmp_path):
    proc = benchmark(kit, tmp_path / "out", "--insertion", tmp_path / "missing.pt")
    assert proc.returncode == 2 and f"--insertion {tmp_path / 'missing.pt'}: not found" in proc.stderr


def test_schedule_longest_first():
    sources = [["a"] * n for n in (2, 5, 3, 5, 1)]
    assert H.schedule(sources, 2) == [[1, 3], [2, 0], [4]]
    assert sorted(i for b in H.schedule(sources, 1) for i in b) == list(range(5))


def test_the_pass_profile_names_where_the_time_goes(kit, tmp_path):
    root, _, insertion = kit
    out = tmp_path / "passes"
    cmd = [sys.executable, "-m", "benchmarks.passes", "--insertion", insertion, "--data-bin", root / "bin",
           "--out", out, "--sentences", "6", "--batches", "1", "4", "--rounds", "1", "--label", "tiny"]
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "passes.json").read_text())
    assert [(r["precision"], r["batch"]) for r in res["rows"]] == [(p, b) for p in ("fp32", "int8") for b in (1, 4)]
    for r in res["rows"]:
        p = r["profiled"]
        shares = [p[k] for k in ("share_pass_kernels", "share_pass_between_kernels", "share_encoder",
                                 "share_outside_onnxruntime")]
        assert all(x >= 0 for x in shares) and abs(sum(shares) - 1) < 0.01, p
        assert p["passes"] == r["passes"] > 0 and p["pass_graph_nodes"] > 20 and r["mean_length"] > 1, p
        assert r["passes"] <= p["graph_runs"] <= 2 * r["passes"], p  # once a pass; twice in two width groups
        assert "MatMul" in " ".join(p["pass_kernel_share_by_op"]), p  # MatMul (fp32) or a quantized MatMul (int8)
    table = (out / "passes.md").read_text()
    assert "| tiny | int8 | 4 |" in table and "outside onnxruntime" in table
    assert str(root) not in (out / "passes.json").read_text()


def test_two_variants_take_turns_and_are_compared(kit, tmp_path):
    root, _, insertion = kit
    out = tmp_path / "checkouts"
    cmd = [sys.executable, "-m", "benchmarks.checkouts", "--variant", f"plain={REPO}", "--variant",
           f"closed={REPO}:close_ended_slots=true,max_iterations=1", "--insertion", insertion, "--data-bin",
           root / "bin", "--ref", root / "raw" / "test.tgt", "--out", out, "--sentences", "6", "--batches", "1", "3",
           "--precisions", "fp32", "--rounds", "2"]
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "checkouts.json").read_text())
    assert [(r["precision"], r["batch"]) for r in res["rows"]] == [("fp32", 1), ("fp32", 3)]
    for r in res["rows"]:
        assert len(r["seconds_by_round"]["plain"]) == len(r["seconds_by_round"]["closed"]) == 2 and r["ratio"] > 0
        assert r["sentences"] == 6 and r["mean_length"]["plain"] > 1
        assert r["identical"] < 6  # one iteration changes the outputs: the options reach the decode
    assert res["variants"][1]["options"] == {"close_ended_slots": True, "max_iterations": 1}
    text = (out / "checkouts.json").read_text()  # the checkouts named by their variants, no machine path
    assert "| fp32 | 3 |" in (out / "checkouts.md").read_text() and "--variant plain=PLAIN" in text
    assert str(REPO) not in text and str(root) not in text


def test_candidates_rows_against_the_teachers_beam(kit, tmp_path):
    """--candidates: the runtime's candidates ordered by the teacher exported as its scorer, and the teacher's
    beam 5 through CTranslate2, with the ratio of their seconds."""
    engines = ["insertion_runtime_fp32_candidates", "insertion_runtime_int8_candidates"]
    if ctranslate2_available():
        engines += ["teacher_ctranslate2_fp32_beam5", "teacher_ctranslate2_int8_beam5"]
    proc = benchmark(kit, tmp_path, "--threads", "1", "--batches", "1", "--rounds", "1", "--candidates", "1", "2", "3",
                     "--first-insertions", "2", "--rerank-lenpen", "2", "--engines", *engines)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "engines.json").read_text())
    rows = {r["engine_key"]: r for r in res["rows"]}
    assert set(rows) == set(engines)
    assert rows["insertion_runtime_fp32_candidates"]["decoding"] == ("parallel, 6 candidates (2 first insertions), "
                                                                     "teacher-ordered")
    assert all(r["mean_length"] > 0 and r["seconds"] > 0 for r in rows.values())
    assert res["candidates"] == {"eos_penalties": [1.0, 2.0, 3.0], "first_insertions": 2, "lenpen": 2.0,
                                 "rerank_weight": 0.0, "scorer": True}
    assert (tmp_path / "export" / "insertion_runtime_fp32_candidates" / "scorer.onnx").is_file()
    if ctranslate2_available():
        assert rows["teacher_ctranslate2_fp32_beam5"]["decoding"] == "beam 5"
        speed = [t for t in res["targets"] if t["metric"].startswith("runtime candidates / CTranslate2 beam 5")]
        assert len(speed) == 2 and all(t["value"] > 0 for t in speed), speed


def test_shortlist_rows_beside_the_plain_decode(kit, tmp_path):
    """--shortlist: the runtime (exported with the table) and PyTorch decode with it, beside the same decode
    without it: their parity, the share of hypotheses the table leaves unchanged and the ratio of seconds."""
    from fairseq.data import Dictionary

    from fairseq_insertion.slots import Shortlist

    root = kit[0]
    src, tgt = (Dictionary.load(str(root / "bin" / f"dict.{side}.txt")) for side in ("src", "tgt"))
    table = tmp_path / "table.npz"
    Shortlist(frequent=np.arange(4, 8), translations=np.zeros((len(src), 1), np.int64),
              target_vocab=len(tgt)).save(table)  # 4 words: most outputs change
    engines = ["insertion_runtime_fp32", "insertion_runtime_fp32_shortlist", "insertion_runtime_int8_shortlist",
               "insertion_pytorch_fp32_shortlist"]
    proc = benchmark(kit, tmp_path / "out", "--threads", "1", "--batches", "1", "--rounds", "1", "--shortlist", table,
                     "--engines", *engines)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "engines.json").read_text())
    assert {r["engine_key"] for r in res["rows"]} == set(engines)
    assert (tmp_path / "out" / "export" / "insertion_runtime_fp32_shortlist" / "shortlist.npz").is_file()
    parity = {p["comparison"]: p for p in res["parity"]}
    mine = parity["runtime fp32 = PyTorch, parallel with the shortlist"]
    assert mine["identical"] == mine["sentences"] == SENTENCES
    listed = (tmp_path / "out" / "hyps" / "insertion_runtime_fp32_shortlist.threads1.batch1.txt").read_text().split()
    assert listed and set(listed) <= {tgt[i] for i in range(4, 8)}
    assert any(t["metric"].startswith("runtime with the shortlist / without seconds, fp32") for t in res["targets"])
    assert "the shortlist = none, runtime fp32" in parity and "TABLE" in json.dumps(res["command"])


def test_first_step_rows_split_the_time(kit, tmp_path):
    """The first-step rows: the encoder and one decoder step of CTranslate2 (one token a sentence) and one pass of
    the runtime (one insertion a sentence), beside the whole decodes, with the ratio of their seconds."""
    engines = ["insertion_runtime_fp32", "insertion_runtime_fp32_first_pass"]
    if ctranslate2_available():
        engines += ["teacher_ctranslate2_fp32", "teacher_ctranslate2_fp32_first_step"]
    proc = benchmark(kit, tmp_path, "--threads", "1", "--batches", "4", "--rounds", "1", "--engines", *engines)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["engine_key"]: r for r in json.loads((tmp_path / "engines.json").read_text())["rows"]}
    assert set(rows) == set(engines)
    for whole, first in (("insertion_runtime_fp32", "insertion_runtime_fp32_first_pass"),
                         ("teacher_ctranslate2_fp32", "teacher_ctranslate2_fp32_first_step")):
        if first in rows:
            assert rows[first]["mean_length"] <= min(1, rows[whole]["mean_length"]), (rows[first], rows[whole])
            assert rows[first]["seconds"] > 0 and rows[first]["decoding"].endswith(", the first step")
    assert rows["insertion_runtime_fp32_first_pass"]["passes"] == math.ceil(SENTENCES / 4)  # one pass a batch
    assert rows["insertion_runtime_fp32"]["passes"] > math.ceil(SENTENCES / 4)
    if ctranslate2_available():
        res = json.loads((tmp_path / "engines.json").read_text())
        assert any(t["metric"].startswith("runtime / CTranslate2 seconds, the encoder and the first step, fp32")
                   and t["value"] > 0 for t in res["targets"])
