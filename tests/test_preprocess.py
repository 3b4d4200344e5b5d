"""Raw text is prepared as the training data was (fairseq_insertion.preprocess): the kit's 1,000 test
lines give exactly its data-bin's pieces, examples/multi30k/prepare.py writes the settings it used, and
an export records them for the runtime to replay."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_insertion.preprocess import (
    RECORD,
    PreprocessError,
    Preprocessing,
    detokenize,
    prepare_line,
    read_record,
    write_record,
)

REPO = Path(__file__).resolve().parents[1]
KIT = REPO.parent / "shared" / "models" / "multi30k-en-de-transformer-d256"
RAW = REPO.parent / "shared" / "data" / "multi30k"
pytest.importorskip("sacremoses")
pytest.importorskip("subword_nmt")


def raw_lines(path: Path) -> list:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
        return [line.rstrip("\r\n") for line in handle]


# ---------------------------------------------------------------- the kit
@pytest.mark.skipif(not (KIT / "data-bin" / "test.src-tgt.src.bin").is_file()
                    or not (RAW / "test_2016_flickr.en.gz").is_file(),
                    reason=f"the teacher kit ({KIT}) or the raw Multi30k ({RAW}) is absent")
def test_the_kit_test_lines_prepare_to_its_data_bin_pieces():
    """The kit README: its data-bin is prepare.py's, with prepare.py's defaults (en, de, joint BPE)."""
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(KIT / "data-bin" / "dict.src.txt"))
    dataset = data_utils.load_indexed_dataset(str(KIT / "data-bin" / "test.src-tgt.src"), dictionary)
    binarised = [dictionary.string(dataset[i]) for i in range(len(dataset))]
    settings = Preprocessing(source_lang="en", target_lang="de", bpe_codes=str(KIT / "bpe.codes"))
    prepared = [prepare_line(line, settings) for line in raw_lines(RAW / "test_2016_flickr.en.gz")]
    assert len(binarised) == len(prepared) == 1000
    differ = [i for i, (a, b) in enumerate(zip(prepared, binarised)) if a != b]
    assert not differ, [(prepared[i], binarised[i]) for i in differ[:3]]
    assert any("-" in line.split()[i] and line.split()[i] != "-" for line in prepared
               for i in range(len(line.split())))  # words with a dash inside stay whole
    # what the runtime's raw path once did (fairseq's moses tokenizer: dashes split) differs here
    split = Preprocessing(source_lang="en", bpe_codes=str(KIT / "bpe.codes"), normalize_punctuation=False,
                          aggressive_dash_splits=True)
    assert sum(prepare_line(line, split) != b for line, b in
               zip(raw_lines(RAW / "test_2016_flickr.en.gz"), binarised)) > 30


@pytest.mark.skipif(not (RAW / "train.en.gz").is_file(), reason=f"the raw Multi30k ({RAW}) is absent")
def test_prepare_py_writes_the_settings_its_data_was_made_with(tmp_path):
    out = tmp_path / "m30k"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "multi30k" / "prepare.py"), "--out", str(out),
                           "--raw-dir", str(RAW), "--train-lines", "300", "--test-lines", "40",
                           "--bpe-merges", "300", "--workers", "1"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "data-bin" / RECORD).read_text(encoding="utf-8"))
    assert record["bpe_codes"] == "../bpe.codes" and record["source_lang"] == "en" and record["target_lang"] == "de"
    settings = read_record(out / "data-bin" / RECORD)
    assert Path(settings.bpe_codes).resolve() == (out / "bpe.codes").resolve()
    for side, lang in (("src", "en"), ("tgt", "de")):
        raw = raw_lines(RAW / f"test_2016_flickr.{lang}.gz")[:40]
        tok = (out / "tok" / f"test.{side}").read_text(encoding="utf-8").splitlines()
        assert [prepare_line(line, settings, lang) for line in raw] == tok
    assert any("@@ " in line for line in tok)


# ---------------------------------------------------------------- the function and its record
def codes(tmp_path: Path) -> Path:
    path = tmp_path / "bpe.codes"
    path.write_text("#version: 0.2\nf a\nfa t\nfat h\ne r</w>\nfath er</w>\n", encoding="utf-8")
    return path


def test_prepare_line_and_detokenize(tmp_path):
    settings = Preprocessing(source_lang="en", target_lang="de", bpe_codes=str(codes(tmp_path)))
    line = "  A father’s «father-figure»!  "
    assert prepare_line(line, settings) == 'A father \'@@ s " fath@@ e@@ r@@ -@@ f@@ i@@ g@@ u@@ r@@ e " !'
    assert prepare_line(" \t ", settings) == ""
    dashes = Preprocessing(source_lang="en", bpe_codes=str(codes(tmp_path)), aggressive_dash_splits=True,
                           normalize_punctuation=False)
    assert prepare_line(line, dashes) == "A father ’ s « father @@@ -@@ @ f@@ i@@ g@@ u@@ r@@ e » !"
    assert prepare_line("A & B", Preprocessing(escape=True, lowercase=True)) == "a &amp; b"
    assert detokenize(["Ein", "Vater@@", "figur", "&", "Hund", "."], settings) == "Ein Vaterfigur & Hund."
    assert detokenize(["Ein@@", "e", "&amp;"], Preprocessing(escape=True, bpe_codes="x")) == "Eine &"


def test_a_record_round_trips_with_its_codes_relative(tmp_path):
    (tmp_path / "data-bin").mkdir()
    settings = Preprocessing(source_lang="fr", target_lang="en", bpe_codes=str(codes(tmp_path)), lowercase=True)
    write_record(tmp_path / "data-bin" / RECORD, settings)
    assert json.loads((tmp_path / "data-bin" / RECORD).read_text())["bpe_codes"] == "../bpe.codes"
    back = read_record(tmp_path / "data-bin" / RECORD)
    assert back.lowercase and back.source_lang == "fr"
    assert Path(back.bpe_codes).resolve() == (tmp_path / "bpe.codes").resolve()


BAD_RECORDS = {  # key: value, the message
    "tokenizer": ("spacy", "tokenizer must be one of ['moses'], got 'spacy'"),
    "source_lang": ("en us", "source_lang must be a language code such as 'en', got 'en us'"),
    "target_lang": (7, "target_lang must be a language code"),
    "normalize_punctuation": ("yes", "normalize_punctuation must be true or false, got 'yes'"),
    "aggressive_dash_splits": (1, "aggressive_dash_splits must be true or false, got 1"),
    "bpe": ("sentencepiece", "bpe must be one of ['subword_nmt']"),
    "bpe_separator": ("", "bpe_separator must be a non-empty string without whitespace"),
    "bpe_codes": (3, "bpe_codes must be a path or null, got 3"),
    "beam": (5, "has unknown key(s) ['beam']"),
}


@pytest.mark.parametrize("key", sorted(BAD_RECORDS))
def test_a_bad_record_is_refused_naming_the_key(tmp_path, key):
    value, message = BAD_RECORDS[key]
    (tmp_path / RECORD).write_text(json.dumps({**Preprocessing().record(), key: value}), encoding="utf-8")
    with pytest.raises(PreprocessError) as info:
        read_record(tmp_path / RECORD)
    assert str(info.value).startswith(f"{tmp_path / RECORD}: ") and message in str(info.value), str(info.value)


def test_bad_codes_are_refused_naming_the_file(tmp_path):
    (tmp_path / "bad").write_text("not codes at all\n", encoding="utf-8")
    for path, message in ((tmp_path / "bad", "not subword-nmt BPE codes"), (tmp_path / "none", "No such file")):
        with pytest.raises(PreprocessError, match=f"{path}: {message}"):
            prepare_line("a line", Preprocessing(bpe_codes=str(path)))
