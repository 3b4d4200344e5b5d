"""Raw text is prepared as the training data was (fairseq_insertion.preprocess): the kit's 1,000 test
lines give exactly its data-bin's pieces, examples/multi30k/prepare.py writes the settings it used, and
an export records them for the runtime to replay."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import shutil
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


def test_it_runs_without_torch_or_fairseq(tmp_path):
    code = ("import sys\nfor m in ('torch', 'fairseq'): sys.modules[m] = None\n"
            "from fairseq_insertion.preprocess import Preprocessing, prepare_line\n"
            f"print(prepare_line('A father-figure.', Preprocessing(bpe_codes={str(codes(tmp_path))!r})))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout == "A fath@@ e@@ r@@ -@@ f@@ i@@ g@@ u@@ r@@ e .\n", proc.stderr


def test_a_record_round_trips_with_its_codes_relative(tmp_path):
    (tmp_path / "data-bin").mkdir()
    settings = Preprocessing(source_lang="fr", target_lang="en", bpe_codes=str(codes(tmp_path)), lowercase=True)
    write_record(tmp_path / "data-bin" / RECORD, settings)
    assert json.loads((tmp_path / "data-bin" / RECORD).read_text())["bpe_codes"] == "../bpe.codes"
    back = read_record(tmp_path / "data-bin" / RECORD)
    assert back.lowercase and back.source_lang == "fr"
    assert Path(back.bpe_codes).resolve() == (tmp_path / "bpe.codes").resolve()


BAD_RECORDS = {  # key: value, the message
    "tokenizer": ("spacy", "tokenizer must be one of ['moses', 'none'], got 'spacy'"),
    "source_lang": ("en us", "source_lang must be a language code such as 'en', got 'en us'"),
    "target_lang": (7, "target_lang must be a language code"),
    "normalize_punctuation": ("yes", "normalize_punctuation must be true or false, got 'yes'"),
    "aggressive_dash_splits": (1, "aggressive_dash_splits must be true or false, got 1"),
    "bpe": ("wordpiece", "bpe must be one of ['subword_nmt', 'sentencepiece']"),
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


# ---------------------------------------------------------------- an export that records it
SOURCE_WORDS = ["dog", "cat", "father-figure", "well-known", "runs", "«quickly»", "big", "a", "the", "“red”",
                "it's", "sleeps", "Mr.", "blue-green", "&", "(small)"]
RAW_TEXT = ["A father-figure runs, quickly!", "The well-known cat’s «big» dog.", "", "  \t ",
            "dog-cat-dog & the blue-green (small) cat", "Mr. Dog sleeps; it's “red”…"]


def independent_pieces(line: str, codes: Path, aggressive: bool = False) -> str:
    """sacremoses and subword-nmt called as the training data's preparation calls them."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    from subword_nmt.apply_bpe import BPE

    line = line.strip()
    if not line:
        return ""
    if not aggressive:
        line = MosesPunctNormalizer(lang="en").normalize(line)
    words = MosesTokenizer(lang="en").tokenize(line, escape=False, return_str=True, aggressive_dash_splits=aggressive)
    with open(codes, encoding="utf-8") as handle:
        return BPE(handle).process_line(words.strip()).strip()


def scored(pieces: list) -> str:
    """An output as the benchmarks score it: BPE removed, Moses-detokenised in German."""
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang="de").detokenize((" ".join(pieces) + " ").replace("@@ ", "").split(), unescape=False)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A corpus of raw text prepared with prepare_line (BPE learnt on it), binarised, its preprocess.json."""
    from subword_nmt.learn_bpe import learn_bpe

    from fairseq_insertion.preprocess import tokenize_line
    from tests.utils import preprocess

    root = tmp_path_factory.mktemp("preprocess")
    rng = random.Random(0)
    raw = {split: [rng.sample(SOURCE_WORDS, rng.randint(2, 7)) for _ in range(n)]
           for split, n in (("train", 80), ("valid", 4), ("test", 4))}
    settings = Preprocessing(source_lang="en", target_lang="de")
    train = [tokenize_line(" ".join(x), settings) for x in raw["train"]]
    with open(root / "bpe.codes", "w", encoding="utf-8") as handle:
        learn_bpe(io.StringIO("\n".join(train) + "\n"), handle, 40)
    settings = Preprocessing(source_lang="en", target_lang="de", bpe_codes=str(root / "bpe.codes"))
    (root / "tok").mkdir()
    for split, lines in raw.items():
        for side, lang, order in (("src", "en", 1), ("tgt", "de", -1)):
            (root / "tok" / f"{split}.{side}").write_text(
                "".join(prepare_line(" ".join(x[::order]), settings, lang) + "\n" for x in lines), encoding="utf-8")
    preprocess(root / "tok", root / "bin")
    write_record(root / "bin" / RECORD, settings)
    return root


@pytest.fixture(scope="module")
def model(prepared):
    import torch

    from tests.utils import build_task

    task, args = build_task(prepared / "bin", "--share-all-embeddings")
    torch.manual_seed(0)
    return task.build_model(args).eval(), task


@pytest.fixture(scope="module")
def exported(prepared, model, tmp_path_factory):
    """``python -m fairseq_insertion.export`` (its model loader replaced by the model above) on the data-bin."""
    import fairseq_insertion.export as E
    import fairseq_insertion.export.files as EF

    out = tmp_path_factory.mktemp("export") / "x"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EF, "load", lambda path, data: model)
        assert E.main(["--path", "unused.pt", "--data", str(prepared / "bin"), "--out", str(out)]) == 0
    return out


def test_the_export_records_the_data_bins_preprocessing(prepared, exported):
    from fairseq_insertion.export_format import sha256

    values = json.loads((exported / "settings.json").read_text(encoding="utf-8"))
    assert values["preprocessing"] == Preprocessing(source_lang="en", target_lang="de", bpe_codes="bpe.codes").record()
    assert (exported / "bpe.codes").read_bytes() == (prepared / "bpe.codes").read_bytes()
    assert values["files"]["bpe.codes"] == {"bytes": (exported / "bpe.codes").stat().st_size,
                                            "sha256": sha256(prepared / "bpe.codes")}


def test_raw_text_translates_as_its_pieces_through_the_api_and_the_command_line(prepared, exported):
    pytest.importorskip("onnxruntime")
    from fairseq_insertion.runtime import Translator
    from tests.test_runtime_input import runtime

    codes = prepared / "bpe.codes"
    pieces = [independent_pieces(line, codes) for line in RAW_TEXT]
    assert [independent_pieces(line, codes, aggressive=True) for line in RAW_TEXT] != pieces  # dashes matter
    translator = Translator(exported, intra_threads=1)
    hypotheses = [r.hypotheses[0] for r in translator.translate_batch([x.split() for x in pieces])]
    expected = [scored(h) for h in hypotheses]
    assert any("@@" in " ".join(h) for h in hypotheses) and sum(bool(x) for x in expected) >= 3, hypotheses
    assert translator.translate_text(RAW_TEXT) == expected
    assert translator.translate_text(tuple(RAW_TEXT), max_batch_size=2) == expected
    proc = runtime("translate", exported, "--tokenizer", "moses", "--batch-size", "4",
                   stdin="".join(x + "\n" for x in RAW_TEXT))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == expected
    # BPE'd input stays the default, with or without a record
    proc = runtime("translate", exported, stdin="".join(x + "\n" for x in pieces))
    assert proc.stdout.split("\n")[:-1] == [" ".join(h) for h in hypotheses], proc.stderr


def test_explicit_options_change_the_recorded_preprocessing(prepared, exported, tmp_path):
    pytest.importorskip("onnxruntime")
    from fairseq_insertion.runtime import Translator
    from tests.test_runtime_input import runtime

    translator = Translator(exported, intra_threads=1)
    split = dataclasses.replace(translator.preprocessing, aggressive_dash_splits=True, normalize_punctuation=False)
    pieces = [independent_pieces(line, prepared / "bpe.codes", aggressive=True) for line in RAW_TEXT]
    expected = [scored(r.hypotheses[0]) for r in translator.translate_batch([x.split() for x in pieces])]
    assert expected != translator.translate_text(RAW_TEXT)
    assert translator.translate_text(RAW_TEXT, preprocessing=split) == expected
    proc = runtime("translate", exported, "--tokenizer", "moses", "--aggressive-dash-splits",
                   "--no-normalize-punctuation", stdin="".join(x + "\n" for x in RAW_TEXT))
    assert proc.returncode == 0 and proc.stdout.split("\n")[:-1] == expected, proc.stderr
    (tmp_path / "copy.codes").write_bytes((prepared / "bpe.codes").read_bytes())
    proc = runtime("translate", exported, "--tokenizer", "moses", "--bpe-codes", tmp_path / "copy.codes",
                   "--aggressive-dash-splits", "--no-normalize-punctuation", "--source-lang", "en",
                   stdin="".join(x + "\n" for x in RAW_TEXT))
    assert proc.returncode == 0 and proc.stdout.split("\n")[:-1] == expected, proc.stderr


def test_options_given_to_the_export_are_recorded(prepared, model, tmp_path):
    import fairseq_insertion.export as E
    import fairseq_insertion.export.files as EF

    (tmp_path / "bin").mkdir()  # a data-bin without preprocess.json
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EF, "load", lambda path, data: model)
        assert E.main(["--path", "p", "--data", str(tmp_path / "bin"), "--out", str(tmp_path / "a"),
                       "--tokenizer", "moses", "--bpe-codes", str(prepared / "bpe.codes"), "--source-lang", "fr",
                       "--target-lang", "en", "--no-normalize-punctuation"]) == 0
        assert E.main(["--path", "p", "--data", str(prepared / "bin"), "--out", str(tmp_path / "b"),
                       "--tokenizer", "moses", "--lowercase"]) == 0
        assert E.main(["--path", "p", "--data", str(tmp_path / "bin"), "--out", str(tmp_path / "c")]) == 0
    record = {name: json.loads((tmp_path / name / "settings.json").read_text()).get("preprocessing")
              for name in "abc"}
    assert record["a"] == Preprocessing(source_lang="fr", target_lang="en", normalize_punctuation=False,
                                        bpe_codes="bpe.codes").record()
    assert record["b"] == Preprocessing(lowercase=True, bpe_codes="bpe.codes").record()
    assert record["c"] is None and not (tmp_path / "c" / "bpe.codes").exists()


@pytest.mark.parametrize("args,message", [
    (["--bpe-codes", "x"], "--bpe-codes is used with --tokenizer"),
    (["--no-normalize-punctuation"], "--normalize-punctuation is used with --tokenizer"),
    (["--tokenizer", "moses"], "--tokenizer moses needs --bpe-codes"),
    (["--tokenizer", "moses", "--bpe-codes", "BIN/none"], "BIN/none: No such file or directory"),
    (["--tokenizer", "moses", "--bpe-codes", "BIN/bad"], "BIN/bad: not subword-nmt BPE codes (Error: invalid line 1"),
    (["--tokenizer", "moses", "--bpe-codes", "CODES", "--source-lang", "en us"],
     "--source-lang must be a language code such as 'en', got 'en us'"),
])
def test_the_export_refuses_bad_preprocessing_options_in_one_line(prepared, tmp_path, capsys, args, message):
    import fairseq_insertion.export as E

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bad").write_text("not codes at all\n", encoding="utf-8")
    args = [a.replace("BIN", str(tmp_path / "bin")).replace("CODES", str(prepared / "bpe.codes")) for a in args]
    assert E.main(["--path", "p", "--data", str(tmp_path / "bin"), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    message = message.replace("BIN", str(tmp_path / "bin"))
    assert len(err) == 1 and err[0].startswith("python -m fairseq_insertion.export: error: ") and message in err[0], err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- a bad record in an export
def bad_record(key: str, value):
    def edit(d: Path) -> None:
        values = json.loads((d / "settings.json").read_text(encoding="utf-8"))
        values["preprocessing"][key] = value
        (d / "settings.json").write_text(json.dumps(values), encoding="utf-8")
    return edit


def drop_codes_record(d: Path) -> None:
    values = json.loads((d / "settings.json").read_text(encoding="utf-8"))
    del values["files"]["bpe.codes"]
    (d / "settings.json").write_text(json.dumps(values), encoding="utf-8")


BAD_EXPORTS = {  # what is done to the export, the file named and what the message says
    "tokenizer": (bad_record("tokenizer", "spacy"), "settings.json",
                  "preprocessing.tokenizer must be one of ['moses', 'none'], got 'spacy'"),
    "language": (bad_record("source_lang", ""), "settings.json", "preprocessing.source_lang must be a language code"),
    "flag a string": (bad_record("normalize_punctuation", "true"), "settings.json",
                      "preprocessing.normalize_punctuation must be true or false, got 'true'"),
    "escape a number": (bad_record("escape", 0), "settings.json", "preprocessing.escape must be true or false, got 0"),
    "separator": (bad_record("bpe_separator", "@ @"), "settings.json", "preprocessing.bpe_separator must be a non"),
    "unknown key": (bad_record("glossaries", []), "settings.json",
                    "preprocessing has unknown key(s) ['glossaries']"),
    "codes outside": (bad_record("bpe_codes", "../bpe.codes"), "settings.json",
                      "preprocessing.bpe_codes must name a file of the export, got '../bpe.codes'"),
    "codes a number": (bad_record("bpe_codes", 1), "settings.json", "preprocessing.bpe_codes must be a path or null"),
    "not an object": (lambda d: (d / "settings.json").write_text(json.dumps(
        {**json.loads((d / "settings.json").read_text()), "preprocessing": ["moses"]})), "settings.json",
        "preprocessing must be an object, got list"),
    "codes missing": (lambda d: (d / "bpe.codes").unlink(), "bpe.codes", "missing or empty",
                      "records it as preprocessing.bpe_codes"),
    "codes changed": (lambda d: (d / "bpe.codes").write_text("#version: 0.2\na b\n"), "bpe.codes",
                      "bytes, the export wrote"),
    "codes not in files": (drop_codes_record, "settings.json", "files must name"),
}


@pytest.mark.parametrize("case", sorted(BAD_EXPORTS))
def test_a_bad_preprocessing_record_is_refused_in_one_line(exported, tmp_path, case):
    pytest.importorskip("onnxruntime")
    from fairseq_insertion.runtime import Translator, TranslatorError
    from tests.test_runtime_input import assert_one_line_error, runtime

    copy = Path(shutil.copytree(exported, tmp_path / "export"))
    damage, name, *parts = BAD_EXPORTS[case]
    damage(copy)
    with pytest.raises(TranslatorError) as info:
        Translator(copy, intra_threads=1)
    message = str(info.value)
    assert message.startswith(f"{copy / name}: ") and all(p in message for p in parts), message
    assert "\n" not in message
    assert_one_line_error(runtime("translate", copy, "--tokenizer", "moses", stdin="A dog.\n"), f"{copy / name}: ",
                          *parts)


def test_an_export_without_a_record_needs_the_settings(model, prepared, tmp_path):
    pytest.importorskip("onnxruntime")
    from fairseq_insertion.export import export_model
    from fairseq_insertion.runtime import Translator, TranslatorError
    from tests.test_runtime_input import assert_one_line_error, runtime

    m, task = model
    out = export_model(m, task.source_dictionary, task.target_dictionary, tmp_path / "plain")
    translator = Translator(out, intra_threads=1)
    assert translator.preprocessing is None
    with pytest.raises(TranslatorError, match=f"{out / 'settings.json'}: records no preprocessing"):
        translator.translate_text(RAW_TEXT)
    with pytest.raises(TranslatorError, match="lines: expected a list of str lines, got str 'A dog.'"):
        translator.translate_text("A dog.")
    settings = read_record(prepared / "bin" / RECORD)
    got = translator.translate_text(RAW_TEXT, preprocessing=settings)
    assert_one_line_error(runtime("translate", out, "--tokenizer", "moses", stdin="A dog.\n"),
                          f"--tokenizer moses needs --bpe-codes when {out / 'settings.json'} records none")
    proc = runtime("translate", out, "--tokenizer", "moses", "--bpe-codes", prepared / "bpe.codes",
                   stdin="".join(x + "\n" for x in RAW_TEXT))
    assert proc.returncode == 0 and proc.stdout.split("\n")[:-1] == got, proc.stderr


def test_raw_constraints_are_prepared_as_the_target_side_and_placed(prepared, exported):
    """translate_text(constraints=): each raw phrase tokenised in the target language and BPE'd, ``___`` kept,
    as translate_batch with those pieces; the phrases come out whole, in order."""
    pytest.importorskip("onnxruntime")
    from fairseq_insertion.preprocess import prepare_constraint
    from fairseq_insertion.runtime import Translator

    settings = Preprocessing(source_lang="en", target_lang="de", bpe_codes=str(prepared / "bpe.codes"))
    lines = ["A father-figure runs, quickly!", "The big cat sleeps.", ""]
    constraints = [["well-known dog"], ["blue-green", "(small) ___ cat"], ["the red sleeps"]]
    pieces = [[prepare_constraint(c, settings).split() for c in cs] for cs in constraints]
    assert pieces[1][1][:3] == prepare_line("(small)", settings, "de").split()[:3] and "___" in pieces[1][1]
    translator = Translator(exported, intra_threads=1)
    expected = [detokenize(r.hypotheses[0], settings) for r in translator.translate_batch(
        [prepare_line(x, settings).split() for x in lines], constraints=pieces, max_len_b=30)]
    got = translator.translate_text(lines, constraints=constraints, max_len_b=30)
    assert got == expected
    assert "well-known dog" in got[0] and got[1].index("blue-green") < got[1].index("(small)") < got[1].index("cat")
    assert "the red sleeps" in got[2]  # an empty line with constraints: decoded from them
    with pytest.raises(Exception, match=r"constraints\[1\]: expected a list of str lines"):
        translator.translate_text(lines, constraints=[[], "blue-green", []])
