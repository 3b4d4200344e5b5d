"""Tests for examples/multi30k/prepare.py and score.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "multi30k"
RAW_DIR = REPO.parent / "shared" / "data" / "multi30k"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False
    )


@pytest.mark.skipif(
    not (RAW_DIR / "train.en.gz").is_file(),
    reason=f"Multi30k raw data not found at {RAW_DIR}",
)
def test_prepare_small(tmp_path: Path) -> None:
    out = tmp_path / "m30k"
    proc = _run(
        str(EXAMPLES / "prepare.py"),
        "--out", str(out),
        "--raw-dir", str(RAW_DIR),
        "--train-lines", "300",
        "--test-lines", "20",
        "--bpe-merges", "200",
        "--workers", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "train 300 / valid 20 / test 20" in proc.stdout

    bin_dir = out / "data-bin"
    src_dict = (bin_dir / "dict.src.txt").read_text(encoding="utf-8")
    assert src_dict == (bin_dir / "dict.tgt.txt").read_text(encoding="utf-8")
    assert len(src_dict.splitlines()) > 50
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            for ext in ("bin", "idx"):
                path = bin_dir / f"{split}.src-tgt.{side}.{ext}"
                assert path.is_file() and path.stat().st_size > 0, path

    expected = {"train": 300, "valid": 20, "test": 20}
    for split, count in expected.items():
        for side in ("src", "tgt"):
            lines = (out / "tok" / f"{split}.{side}").read_text("utf-8").splitlines()
            assert len(lines) == count, (split, side)
            if split == "train":
                assert any("@@ " in line for line in lines)
            if split != "train":
                raw = (out / "raw" / f"{split}.{side}").read_text("utf-8")
                assert len(raw.splitlines()) == count
                assert "@@" not in raw
    codes = (out / "bpe.codes").read_text(encoding="utf-8").splitlines()
    assert codes[0].startswith("#version")
    assert len(codes) == 201

    # a second run into the same --out: one clear line, the data left as it was
    before = (bin_dir / "train.src-tgt.src.bin").stat().st_mtime_ns
    again = _run(str(EXAMPLES / "prepare.py"), "--out", str(out), "--raw-dir", str(RAW_DIR))
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: {bin_dir} already holds prepared data: give a new --out, or remove {bin_dir} to prepare it again")
    assert (bin_dir / "train.src-tgt.src.bin").stat().st_mtime_ns == before


def test_prepare_mismatched_line_counts(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        (raw / f"{stem}.en").write_text("A dog runs .\nA cat .\n", encoding="utf-8")
        (raw / f"{stem}.de").write_text("Ein Hund läuft .\n", encoding="utf-8")
    proc = _run(
        str(EXAMPLES / "prepare.py"),
        "--out",
        str(tmp_path / "o"),
        "--raw-dir",
        str(raw),
    )
    assert proc.returncode != 0
    assert "line count mismatch" in proc.stderr
    assert str(raw / "train.de") in proc.stderr


REFERENCES = [
    "Ein Mann fährt Fahrrad.",
    'Zwei Hunde spielen im Schnee, "draußen".',
    "Eine Frau (mit Hut) liest.",
]
# Tokenised, BPE partly left in (score.py removes it), plus noise lines.
GENERATE_OUTPUT = """\
S-2\tA woman ( with hat ) reads .
T-2\tEine Frau ( mit Hut ) liest .
H-2\t-0.3\tEine Frau ( mit Hut ) li@@ est .
D-2\t-0.3\tignored
P-2\t-0.1 -0.2 -0.3 -0.1 -0.2 -0.3 -0.1 -0.2 -0.1
I-2\t3
H-0\t-0.1\tEin Mann fährt Fahrrad .
P-0\t-0.1 -0.2 -0.3 -0.1 -0.2 -0.3
I-0\t2
H-1\t-0.2\tZwei Hunde spielen im Schnee , " draußen " .
P-1\t-0.1 -0.2 -0.3 -0.1 -0.2 -0.3 -0.1 -0.2 -0.1 -0.3 -0.1
I-1\t4
Generate test with beam=1: BLEU4 = 0.00
"""


def _write_score_inputs(tmp_path: Path, generate: str) -> tuple[Path, Path]:
    gen = tmp_path / "gen.out"
    gen.write_text(generate, encoding="utf-8")
    ref = tmp_path / "ref.de"
    ref.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    return gen, ref


def test_score_perfect(tmp_path: Path) -> None:
    gen, ref = _write_score_inputs(tmp_path, GENERATE_OUTPUT)
    out_json = tmp_path / "scores.json"
    proc = _run(
        str(EXAMPLES / "score.py"),
        "--generate-output", str(gen),
        "--reference", str(ref),
        "--lang", "de",
        "--json", str(out_json),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("BLEU = 100.00")
    data = json.loads(out_json.read_text(encoding="utf-8"))
    assert data["bleu"] == pytest.approx(100.0)
    assert data["sentences"] == 3
    assert data["mean_iterations"] == pytest.approx(3.0)
    # n = #P - 1 = 5, 10, 8 -> floor(log2 n) + 1 = 3, 4, 4
    assert data["mean_log2_bound"] == pytest.approx(11 / 3)
    assert "nrefs:1" in data["signature"]


def test_score_without_p_and_i_lines(tmp_path: Path) -> None:
    generate = "".join(
        line + "\n"
        for line in GENERATE_OUTPUT.splitlines()
        if line.startswith(("H-", "S-"))
    )
    gen, ref = _write_score_inputs(tmp_path, generate)
    out_json = tmp_path / "scores.json"
    proc = _run(
        str(EXAMPLES / "score.py"),
        "--generate-output", str(gen),
        "--reference", str(ref),
        "--lang", "de",
        "--json", str(out_json),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out_json.read_text(encoding="utf-8"))
    assert data["bleu"] == pytest.approx(100.0)
    assert data["mean_iterations"] is None
    # n = H words = 5, 10, 8 -> 3, 4, 4
    assert data["mean_log2_bound"] == pytest.approx(11 / 3)


def test_score_missing_id(tmp_path: Path) -> None:
    generate = "".join(
        line + "\n"
        for line in GENERATE_OUTPUT.splitlines()
        if not line.split("\t")[0].endswith("-1")
    )
    gen, ref = _write_score_inputs(tmp_path, generate)
    proc = _run(
        str(EXAMPLES / "score.py"),
        "--generate-output", str(gen),
        "--reference", str(ref),
        "--lang", "de",
    )  # fmt: skip
    assert proc.returncode != 0
    assert "2 hypotheses but 3 reference lines" in proc.stderr
    assert "missing hypothesis ids: 1" in proc.stderr


def test_prepare_keeps_empty_lines(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        (raw / f"{stem}.en").write_text("A dog runs.\n\nA cat.\n", encoding="utf-8")
        (raw / f"{stem}.de").write_text("Ein Hund läuft.\nLeer\n\n", encoding="utf-8")
    out = tmp_path / "o"
    proc = _run(
        str(EXAMPLES / "prepare.py"),
        "--out", str(out),
        "--raw-dir", str(raw),
        "--bpe-merges", "10",
        "--workers", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "2 line pair(s) in split 'train' have an empty side (lines 2, 3)" in proc.stderr
    )
    for split in ("train", "valid", "test"):
        src = (out / "tok" / f"{split}.src").read_text("utf-8").split("\n")
        tgt = (out / "tok" / f"{split}.tgt").read_text("utf-8").split("\n")
        assert len(src) == len(tgt) == 4  # 3 lines + trailing ""
        assert src[1] == "" and tgt[2] == ""
