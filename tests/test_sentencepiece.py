"""A SentencePiece setup from raw text to the runtime: ``prepare.py --spm`` (a joint SentencePiece model on the raw
lines, no Moses), fairseq-train, fairseq-interactive with ``--bpe sentencepiece`` (raw text in, detokenised text
out, constraints as whole words), the export recording the SentencePiece model, and the runtime translating the
raw lines as fairseq-interactive does. The corpus is made-up sentences with punctuation and capitals, the target
words the source's translated and reversed, so a tiny model learns something in 200 updates."""

import random
import re
import shutil

import pytest

from examples.multi30k.prepare import PrepareError, learn_spm, prepare
from fairseq_insertion import preprocess as P
from tests.test_runtime_input import assert_one_line_error, runtime
from tests.utils import PLUGIN, run, train_once

pytest.importorskip("onnxruntime")
pytest.importorskip("sentencepiece")
SPACE = "\u2581"
LEXICON = {"man": "Mann", "woman": "Frau", "dog": "Hund", "cat": "Katze", "child": "Kind", "ball": "Ball",
           "street": "Straße", "park": "Park", "red": "rot", "blue": "blau", "small": "klein", "big": "groß",
           "runs": "läuft", "sits": "sitzt", "plays": "spielt", "looks": "schaut", "near": "neben", "with": "mit"}
TEST_LINES = 20
DECODE = ["--eos-penalty", "0.5"]


def write_raw(raw, seed=0):
    """Multi30k's raw file names, plain text: train 1,500 lines, val 10, test TEST_LINES."""
    rng = random.Random(seed)
    raw.mkdir(parents=True)
    words = sorted(LEXICON)
    for stem, n in (("train", 1500), ("val", 10), ("test_2016_flickr", TEST_LINES)):
        src, tgt = [], []
        for _ in range(n):
            chosen = rng.sample(words, rng.randint(2, 7))
            comma = rng.random() < 0.3
            src.append(" ".join(chosen).capitalize() + ("," if comma else "") + " " * rng.randint(0, 1) + ".")
            tgt.append(" ".join(LEXICON[w] for w in reversed(chosen)).capitalize() + ("," if comma else "") + ".")
        (raw / f"{stem}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (raw / f"{stem}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentencepiece")
    write_raw(root / "raw")
    prepare(root / "data", root / "raw", spm=120, workers=1)
    data = root / "data" / "data-bin"
    cmd = ["fairseq-train", data, "--user-dir", PLUGIN, "--task", "insertion_translation",
           "--arch", "insertion_transformer_tiny", "--share-all-embeddings", "--criterion", "insertion_loss",
           "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
           "--max-tokens", "3000", "--save-dir", root / "ckpt", "--cpu", "--seed", "1", "--max-update", "400",
           "--no-epoch-checkpoints", "--disable-validation"]
    train_once(cmd, data, root / "ckpt")
    return root


def interactive(root, lines, *extra):
    """fairseq-interactive on raw lines with the SentencePiece model: the D- lines (detokenised), in input order."""
    proc = run(["fairseq-interactive", root / "data" / "data-bin", "--user-dir", PLUGIN, "--task",
                "insertion_translation", "--path", root / "ckpt" / "checkpoint_last.pt", "--cpu", "--source-lang",
                "src", "--target-lang", "tgt", "--bpe", "sentencepiece", "--sentencepiece-model",
                root / "data" / "spm.model", "--buffer-size", "8", "--batch-size", "8", *DECODE, *extra],
               input="".join(f"{line}\n" for line in lines))
    out = {int(m.group(1)): m.group(2) for m in re.finditer(r"^D-(\d+)\t[^\t]*\t(.*)$", proc.stdout, re.M)}
    assert sorted(out) == list(range(len(lines))), proc.stdout[-2000:]
    return [out[i] for i in range(len(lines))], proc


def test_the_data_is_prepared_with_the_sentencepiece_model(spm):
    record = P.read_record(spm / "data" / "data-bin" / P.RECORD)
    assert (record.tokenizer, record.bpe, record.normalize_punctuation) == ("none", "sentencepiece", False)
    assert record.bpe_codes == str(spm / "data" / "data-bin" / ".." / "spm.model")
    raw = (spm / "data" / "raw" / "test.tgt").read_text(encoding="utf-8").splitlines()
    pieces = (spm / "data" / "tok" / "test.tgt").read_text(encoding="utf-8").splitlines()
    assert len(raw) == len(pieces) == TEST_LINES
    assert all(p.startswith(SPACE) for p in pieces)
    # the pieces are the raw line's, and detokenise back to it
    assert [P.detokenize(p.split(), record) for p in pieces] == raw
    assert [P.prepare_line(r, record, "de") for r in raw] == pieces


def test_prepare_refuses_a_vocabulary_sentencepiece_cannot_make(tmp_path):
    write_raw(tmp_path / "raw")
    with pytest.raises(PrepareError, match=r"^--spm 100000: .*[Vv]ocabulary size"):
        prepare(tmp_path / "data", tmp_path / "raw", spm=100000, workers=1)


def test_interactive_translates_raw_text_into_detokenised_text(spm):
    lines = (spm / "data" / "raw" / "test.src").read_text(encoding="utf-8").splitlines()
    out, _ = interactive(spm, lines)
    assert all(out) and not any(SPACE in line for line in out)
    known = set(LEXICON.values()) | {w.lower() for w in LEXICON.values()}
    words = [w.strip(".,") for line in out for w in line.split()]
    assert sum(w in known for w in words) >= 0.8 * len(words)  # the model learnt the lexicon's words


def whole_word(text: str, phrase: str) -> bool:
    return re.search(rf"(?<!\S){re.escape(phrase)}(?=[\s.,]|$)", text) is not None


def test_constraints_come_out_as_whole_words(spm):
    sources = (spm / "data" / "raw" / "test.src").read_text(encoding="utf-8").splitlines()[:8]
    rng = random.Random(5)
    given = [rng.sample(sorted(set(LEXICON.values())), 2) for _ in sources]
    out, _ = interactive(spm, [f"{s}\t{a}\t{b}" for s, (a, b) in zip(sources, given)], "--constraints")
    assert all(whole_word(text, c) for text, cs in zip(out, given) for c in cs), list(zip(out, given))


def test_the_runtime_translates_raw_text_as_interactive_does(spm, tmp_path):
    lines = (spm / "data" / "raw" / "test.src").read_text(encoding="utf-8").splitlines()
    expected, _ = interactive(spm, lines)
    export = tmp_path / "export"
    run(["python", "-m", "fairseq_insertion.export", "--path", spm / "ckpt" / "checkpoint_last.pt", "--data",
         spm / "data" / "data-bin", "--out", export, *DECODE])
    assert (export / "spm.model").read_bytes() == (spm / "data" / "spm.model").read_bytes()
    assert not (export / "bpe.codes").exists()
    proc = runtime("translate", export, "--tokenizer", "none", "--batch-size", "6",  # without fairseq and torch
                   stdin="".join(f"{line}\n" for line in lines))
    assert proc.returncode == 0, proc.stderr
    got = proc.stdout.splitlines()
    assert got == expected and all(got)
    # the API: raw lines in, the same text out
    from fairseq_insertion.runtime import Translator

    assert Translator(export, intra_threads=1).translate_text(lines[:5], max_batch_size=2) == expected[:5]
    # constraints, raw target words
    sources = lines[:6]
    out = runtime("translate", export, "--tokenizer", "none", "--constraints",
                  stdin="".join(f"{s}\tKatze\tblau\n" for s in sources)).stdout.splitlines()
    assert len(out) == len(sources) and all(whole_word(t, "Katze") and whole_word(t, "blau") for t in out), out


def test_a_damaged_or_other_sentencepiece_model_is_refused_naming_it(spm, tmp_path):
    from fairseq_insertion.runtime import Translator, TranslatorError

    export = tmp_path / "export"
    run(["python", "-m", "fairseq_insertion.export", "--path", spm / "ckpt" / "checkpoint_last.pt", "--data",
         spm / "data" / "data-bin", "--out", export])
    damaged = tmp_path / "damaged"
    shutil.copytree(export, damaged)
    model = damaged / "spm.model"
    model.write_bytes(model.read_bytes()[:-10])
    with pytest.raises(TranslatorError, match=re.escape(str(model))) as info:
        Translator(damaged)
    assert "\n" not in str(info.value)
    assert_one_line_error(runtime("translate", damaged, "--tokenizer", "none", stdin="A dog.\n"), str(model))
    # another SentencePiece model (of other text) given for the export's data: refused at export, naming it
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.en").write_text("".join(f"Zebra {i} quokka xylophone.\n" for i in range(300)))
    model = learn_spm(other / "spm", (other / "train.en").read_text().splitlines(), 30)
    proc = run(["python", "-m", "fairseq_insertion.export", "--path", spm / "ckpt" / "checkpoint_last.pt", "--data",
                spm / "data" / "data-bin", "--out", tmp_path / "mismatched", "--tokenizer", "none", "--bpe",
                "sentencepiece", "--sentencepiece-model", model], check=False)
    assert proc.returncode != 0 and f"{model}: not the SentencePiece model of the target dictionary" in proc.stderr
    assert_one_line_error(runtime("translate", export, "--tokenizer", "none", "--sentencepiece-model", model,
                                  stdin="A dog.\n"), f"{model}: not the SentencePiece model")
    # a file that is no SentencePiece model
    assert_one_line_error(runtime("translate", export, "--tokenizer", "none", "--sentencepiece-model",
                                  other / "train.en", stdin="A dog.\n"), f"{other / 'train.en'}: not a SentencePiece")


def test_the_hub_translates_raw_text_as_interactive_does(spm):
    from fairseq_insertion.hub import from_pretrained

    lines = (spm / "data" / "raw" / "test.src").read_text(encoding="utf-8").splitlines()[:6]
    expected, _ = interactive(spm, lines)
    hub = from_pretrained(str(spm / "ckpt"), checkpoint_file="checkpoint_last.pt",
                          data_name_or_path=str(spm / "data" / "data-bin"), bpe="sentencepiece",
                          sentencepiece_model=str(spm / "data" / "spm.model"), eos_penalty=0.5)
    assert hub.translate(lines) == expected and all(expected)
