"""The deployment runtime refuses what it cannot take, naming it: a damaged or inconsistent export
(files, settings.json's keys, the graphs), bad command-line arguments and bad ``translate_batch``
arguments; and its command line reads and writes as a filter should (batches streamed in order,
UTF-8 whatever the locale, a byte-order mark skipped, a closed pipe ending quietly, lines named
from 1).

The models are tiny untrained ones (their translations are arbitrary but deterministic) over a
vocabulary of non-ASCII words. The command line runs as it is deployed, with torch and fairseq
unimportable; every refusal there is one line on standard error and exit status 2."""

import json
import os
import random
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairseq_insertion.export import export_model
from fairseq_insertion.runtime import Translator, TranslatorError
from tests.utils import REPO, build_task, preprocess

pytest.importorskip("onnxruntime")
WORDS = [f"wé{i}" for i in range(16)] + [f"ß{i}" for i in range(8)]
RUNTIME = ("import runpy, sys\nfor m in ('torch', 'fairseq'): sys.modules[m] = None\n"
           "runpy.run_module('fairseq_insertion.runtime', run_name='__main__', alter_sys=True)\n")


def write_corpus(directory: Path, sizes=(("train", 60), ("valid", 4), ("test", 4))) -> None:
    """Target: the source reversed, over WORDS."""
    rng = random.Random(0)
    directory.mkdir(parents=True)
    for split, n in sizes:
        lines = [rng.sample(WORDS, rng.randint(2, 8)) for _ in range(n)]
        (directory / f"{split}.src").write_text("".join(" ".join(x) + "\n" for x in lines), encoding="utf-8")
        (directory / f"{split}.tgt").write_text("".join(" ".join(x[::-1]) + "\n" for x in lines), encoding="utf-8")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("runtime_input")
    write_corpus(root / "raw")
    preprocess(root / "raw", root / "bin")
    task, args = build_task(root / "bin", "--share-all-embeddings")
    torch.manual_seed(0)
    return task.build_model(args).eval(), task


@pytest.fixture(scope="module")
def export(model, tmp_path_factory):
    m, task = model
    return export_model(m, task.source_dictionary, task.target_dictionary, tmp_path_factory.mktemp("fp32") / "x")


@pytest.fixture
def copy(export, tmp_path):
    """A fresh copy of the export, to damage."""
    return Path(shutil.copytree(export, tmp_path / "export"))


def runtime(*args, stdin: str | bytes = "", env=None):
    """``python -m fairseq_insertion.runtime ARGS`` without torch and fairseq, as deployed."""
    return subprocess.run([sys.executable, "-c", RUNTIME, *map(str, args)], input=stdin, capture_output=True,
                          cwd=REPO, timeout=300, env=env, text=isinstance(stdin, str))


def assert_one_line_error(proc, *parts: str) -> str:
    """Exit status 2 and one line on standard error, naming every part."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("python -m fairseq_insertion.runtime translate: error: "), lines[0]
    assert all(part in lines[0] for part in parts), (parts, lines[0])
    return lines[0]


# ---------------------------------------------------------------- a damaged or inconsistent export
def edit_settings(change):
    def edit(d: Path) -> None:
        values = json.loads((d / "settings.json").read_text(encoding="utf-8"))
        change(values)
        (d / "settings.json").write_text(json.dumps(values), encoding="utf-8")
    return edit


def setting(path: str, value):
    """settings.json with the key ``path`` (dotted) set to ``value``."""
    *parents, key = path.split(".")

    def change(values):
        for p in parents:
            values = values[p]
        values[key] = value
    return edit_settings(change)


def without(path: str):
    *parents, key = path.split(".")

    def change(values):
        for p in parents:
            values = values[p]
        del values[key]
    return edit_settings(change)


def old_export(d: Path) -> None:
    """As exports were before settings.json recorded the files' sizes and digests."""
    without("files")(d)


def then(*edits):
    def edit(d: Path) -> None:
        for e in edits:
            e(d)
    return edit


def write(name: str, data: bytes):
    return lambda d: (d / name).write_bytes(data)


def cut(name: str, keep: float):
    return lambda d: (d / name).write_bytes((d / name).read_bytes()[:int((d / name).stat().st_size * keep)])


def flip_byte(name: str):
    def edit(d: Path) -> None:
        data = bytearray((d / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (d / name).write_bytes(bytes(data))
    return edit


def append(name: str, text: str):
    return lambda d: (d / name).write_text((d / name).read_text(encoding="utf-8") + text, encoding="utf-8")


DAMAGE = {  # what is done to the export: the file named, and what the message says
    "missing pass": (lambda d: (d / "pass.onnx").unlink(), "export", "missing pass.onnx"),
    "empty vocabulary": (write("target_vocab.txt", b""), "target_vocab.txt", "empty"),
    "empty settings": (write("settings.json", b""), "settings.json", "empty"),
    "settings not json": (write("settings.json", b'{"format_version": 1,'), "settings.json", "not valid JSON"),
    "settings a list": (write("settings.json", b"[1]"), "settings.json", "a JSON object expected"),
    "newer format": (setting("format_version", 5), "settings.json", "format version 5"),
    "missing id": (without("model.eos"), "settings.json", "model.eos is missing"),
    "missing decoding": (without("decoding"), "settings.json", "decoding is missing"),
    "id a string": (setting("model.eos", "2"), "settings.json", "model.eos must be an integer in [0, 32)"),
    "id a bool": (setting("model.pad", True), "settings.json", "model.pad must be an integer in [0, 32)"),
    "id past the vocabulary": (setting("model.unk", 32), "settings.json", "model.unk must be an integer in [0, 32)"),
    "source id past": (setting("model.source.eos", 99), "settings.json", "model.source.eos must be an integer"),
    "no positions": (setting("model.max_target_positions", 0), "settings.json",
                     "model.max_target_positions must be an integer >= 1, got 0"),
    "positions a float": (setting("model.max_source_positions", 10.5), "settings.json",
                          "model.max_source_positions must be an integer >= 1"),
    "termination": (setting("model.termination", "both"), "settings.json",
                    "model.termination must be one of ['slot', 'sequence'], got 'both'"),
    "precision": (setting("model.precision", "fp8"), "settings.json", "model.precision must be one of"),
    "unknown decoding key": (setting("decoding.beam", 5), "settings.json", "decoding has unknown key(s) ['beam']"),
    "decoding choice": (setting("decoding.decoding", "beam"), "settings.json",
                        "decoding.decoding must be one of ('parallel', 'greedy'), got 'beam'"),
    "decoding negative": (setting("decoding.max_len_b", -5), "settings.json",
                          "settings.json: decoding.max_len_b must be an integer >= 0, got -5"),
    "decoding int a float": (setting("decoding.max_len_b", 2.5), "settings.json",
                             "decoding.max_len_b must be an integer, got 2.5"),
    "decoding flag a string": (setting("decoding.block_neighbour_copies", "yes"), "settings.json",
                               "decoding.block_neighbour_copies must be true or false, got 'yes'"),
    "decoding number a string": (setting("decoding.eos_penalty", "3"), "settings.json",
                                 "decoding.eos_penalty must be a number, got '3'"),
    "candidates a string": (setting("decoding.eos_penalties", "1,2"), "settings.json",
                            "decoding.eos_penalties must be a list of numbers, got '1,2'"),
    "candidates not numbers": (setting("decoding.eos_penalties", [1, "x"]), "settings.json",
                               "decoding.eos_penalties must be a list of numbers"),
    "scorer another file": (setting("scorer", "pass.onnx"), "settings.json", "scorer must be 'scorer.onnx'"),
    "scorer missing": (setting("scorer", "scorer.onnx"), "scorer.onnx", "missing or empty"),
    "decoding nan": (setting("decoding.lenpen", float("nan")), "settings.json",
                     "decoding.lenpen must be a finite number"),
    "decoding unigram": (setting("decoding.no_repeat_ngram_size", 1), "settings.json",
                         "decoding.no_repeat_ngram_size must be 0 (off) or >= 2"),
    "files record": (edit_settings(lambda v: v["files"].update({"pass.onnx": None})), "settings.json",
                     "files.pass.onnx must be an object"),
    "truncated graph": (cut("pass.onnx", 0.5), "pass.onnx", "bytes, the export wrote"),
    "changed graph": (flip_byte("encoder.onnx"), "encoder.onnx", "sha256 differs"),
    "longer vocabulary": (append("target_vocab.txt", "neu\n"), "target_vocab.txt", "bytes, the export wrote"),
    "old truncated graph": (then(old_export, cut("pass.onnx", 0.5)), "pass.onnx", "onnxruntime cannot load it"),
    "old garbage graph": (then(old_export, write("encoder.onnx", b"\x00garbage" * 9)), "encoder.onnx",
                          "onnxruntime cannot load it"),
    "old swapped graphs": (then(old_export, lambda d: shutil.copy(d / "encoder.onnx", d / "pass.onnx")),
                           "pass.onnx", "inputs ['src_tokens']"),
    "old longer vocabulary": (then(old_export, append("target_vocab.txt", "neu\n")), "pass.onnx",
                              "a target vocabulary of 32 symbols", "target_vocab.txt has 33"),
    "old cut vocabulary": (then(old_export, cut("source_vocab.txt", 0.99)), "source_vocab.txt", "no line end"),
    "old latin-1 vocabulary": (then(old_export, write("source_vocab.txt", "wé\n".encode("latin-1"))),
                               "source_vocab.txt", "not UTF-8"),
    "layers": (setting("model.decoder_layers", 3), "encoder.onnx", "keys for 2 decoder layers",
               "model.decoder_layers 3"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_export_is_refused_naming_the_file_and_key(copy, case):
    damage, name, *parts = DAMAGE[case]
    damage(copy)
    path = str(copy / name) if name != "export" else str(copy)
    with pytest.raises(TranslatorError) as info:
        Translator(copy, intra_threads=1)
    message = str(info.value)
    assert message.startswith(path + ":") and all(p in message for p in parts), message
    assert "--" not in message  # never a command-line flag
    assert_one_line_error(runtime("translate", copy, stdin="wé1 wé2\n"), path + ":", *parts)


def test_exports_without_file_digests_still_load(export, copy):
    old_export(copy)
    line = ["wé1", "ß2", "wé3"]
    assert (Translator(copy, intra_threads=1).translate_batch([line])[0].hypotheses
            == Translator(export, intra_threads=1).translate_batch([line])[0].hypotheses)


def test_settings_record_every_file_and_the_int8_graphs_their_vocabulary(model, tmp_path):
    m, task = model
    out = export_model(m, task.source_dictionary, task.target_dictionary, tmp_path / "int8", int8="per-row")
    files = json.loads((out / "settings.json").read_text(encoding="utf-8"))["files"]
    assert sorted(files) == ["encoder.onnx", "pass.onnx", "source_vocab.txt", "target_vocab.txt"]
    assert files["pass.onnx"]["bytes"] == (out / "pass.onnx").stat().st_size
    Translator(out, intra_threads=1)
    old_export(out)
    append("source_vocab.txt", "neu\n")(out)
    with pytest.raises(TranslatorError, match="encoder.onnx: a source vocabulary of 32 symbols"):
        Translator(out, intra_threads=1)


# ---------------------------------------------------------------- translate_batch's arguments
BAD_CALLS = {  # (translate_batch's arguments, the message)
    "a string": ((["wé1 wé2"],), {}, "source[0]: expected a list of str tokens, got a str 'wé1 wé2'"),
    "not a list": (("wé1",), {}, "source: expected a list of token lists, got str"),
    "a generator": (((x for x in [["wé1"]]),), {}, "source: expected a list of token lists, got generator"),
    "an int token": (([["wé1"], ["wé1"], ["wé1"], ["wé2", 7]],), {}, "source[3][1]: expected a str token, got int"),
    "a token list of ints": (([{1, 2}],), {}, "source[0]: expected a list of str tokens, got set"),
    "an empty token": (([["wé1", ""]],), {}, "source[0][1]: an empty token"),
    "a token with a space": (([["wé1", "wé2 ß1"]],), {}, "source[0][1]: a token with whitespace 'wé2 ß1'"),
    "a token with a tab": (([["wé1\t"]],), {}, "source[0][0]: a token with whitespace"),
    "batch size bool": (([["wé1"]],), {"max_batch_size": True}, "max_batch_size: expected an integer >= 0, got True"),
    "batch size float": (([["wé1"]],), {"max_batch_size": 2.0}, "max_batch_size: expected an integer >= 0, got 2.0"),
    "batch size str": (([["wé1"]],), {"max_batch_size": "2"}, "max_batch_size: expected an integer >= 0, got '2'"),
    "batch size negative": (([["wé1"]],), {"max_batch_size": -1}, "max_batch_size: expected an integer >= 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_translate_batch_refuses_bad_arguments_naming_them(export, case):
    args, kwargs, message = BAD_CALLS[case]
    translator = Translator(export, intra_threads=1)
    with pytest.raises(TranslatorError) as info:
        translator.translate_batch(*args, **kwargs)
    assert str(info.value).startswith(message), str(info.value)
    assert translator.stats["sentences"] == 0


def test_translate_batch_takes_lists_and_tuples_and_empty_sentences(export):
    translator = Translator(export, intra_threads=1)
    lists = translator.translate_batch([["wé1", "ß2"], []], max_batch_size=1)
    tuples = translator.translate_batch((("wé1", "ß2"), ()), max_batch_size=0)
    assert [r.hypotheses for r in lists] == [r.hypotheses for r in tuples] and lists[1].hypotheses == [[]]


@pytest.mark.parametrize("kwargs,message", [
    ({"intra_threads": -1}, "intra_threads: expected an integer >= 0, got -1"),
    ({"intra_threads": 1.5}, "intra_threads: expected an integer >= 0, got 1.5"),
    ({"inter_threads": "2"}, "inter_threads: expected an integer >= 0, got '2'"),
    ({"providers": "CPUExecutionProvider"}, "providers: expected a non-empty list of provider names"),
    ({"providers": ["NoSuchExecutionProvider"]}, "providers: ['NoSuchExecutionProvider'] not available"),
])
def test_the_constructor_refuses_bad_arguments_naming_them(export, kwargs, message):
    with pytest.raises(TranslatorError) as info:
        Translator(export, **kwargs)
    assert str(info.value).startswith(message), str(info.value)


# ---------------------------------------------------------------- the command line's arguments
@pytest.mark.parametrize("args,message", [
    (["--bpe-codes", "codes"], "--bpe-codes is used with --tokenizer"),
    (["--tokenizer", "moses"], "--tokenizer moses needs --bpe-codes"),
    (["--tokenizer", "moses", "--bpe-codes", "codes", "--post-process", "subword_nmt"],
     "--post-process applies to subword pieces"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--threads", "-1"], "--threads must be >= 0"),
    (["--batch-size", "two"], "argument --batch-size: invalid int value: 'two'"),
    (["--max-len-b=-5"], "--max-len-b must be an integer >= 0, got -5"),
    (["--block-neighbour-copies=1"], "ignored explicit argument"),
])
def test_bad_arguments_are_one_line(export, args, message):
    assert_one_line_error(runtime("translate", export, *args, stdin="wé1\n"), message)


def test_every_on_off_option_has_a_no_twin(copy):
    """An export's block_neighbour_copies=True is switched off by --no-block-neighbour-copies."""
    from fairseq_insertion.export import build_parser as export_parser
    from fairseq_insertion.runtime.__main__ import build_parser

    for parse in (lambda a: build_parser().parse_args(["translate", "d", *a]),
                  lambda a: export_parser().parse_args(["--path", "p", "--data", "d", "--out", "o", *a])):
        assert parse(["--no-close-ended-slots"]).close_ended_slots is False
        assert parse(["--close-ended-slots"]).close_ended_slots is True
        assert parse([]).block_neighbour_copies is None
    setting("decoding.block_neighbour_copies", True)(copy)
    lines = [" ".join(random.Random(i).sample(WORDS, 6)) for i in range(12)]
    translator = Translator(copy, intra_threads=1)
    on, off = ([" ".join(r.hypotheses[0]) for r in translator.translate_batch([x.split() for x in lines],
                                                                              block_neighbour_copies=flag)]
               for flag in (True, False))
    assert on != off  # the option matters for these lines
    proc = runtime("translate", copy, "--no-block-neighbour-copies", stdin="".join(x + "\n" for x in lines))
    assert proc.returncode == 0 and proc.stdout.splitlines() == off, proc.stderr
    assert runtime("translate", copy, stdin="".join(x + "\n" for x in lines)).stdout.splitlines() == on


# ---------------------------------------------------------------- reading and writing
def api_lines(export, lines, **options):
    translator = Translator(export, intra_threads=1)
    return [" ".join(r.hypotheses[0]) for r in translator.translate_batch([x.split() for x in lines], **options)]


def some_lines(n: int, seed: int = 0):
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, rng.randint(2, 7))) for _ in range(n)]


def start_runtime(*args, stdout=subprocess.PIPE):
    return subprocess.Popen([sys.executable, "-c", RUNTIME, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=stdout, stderr=subprocess.PIPE, cwd=REPO, bufsize=0)


def read_lines(stream, n: int, seconds: float = 120) -> list:
    """The first ``n`` lines the process writes, waiting at most ``seconds`` for each."""
    data = b""
    while data.count(b"\n") < n:
        ready, _, _ = select.select([stream], [], [], seconds)
        assert ready, f"no output line within {seconds} s"
        data += os.read(stream.fileno(), 1 << 16)
    return data.splitlines(keepends=True)


def test_each_batch_is_written_before_the_next_is_read(export):
    lines = some_lines(5)
    proc = start_runtime("translate", export, "--batch-size", "2")
    try:
        proc.stdin.write("".join(x + "\n" for x in lines[:2]).encode())
        proc.stdin.flush()  # standard input stays open: a runtime reading all of it first would wait
        got = read_lines(proc.stdout, 2)
        proc.stdin.write("".join(x + "\n" for x in lines[2:]).encode())
        proc.stdin.close()
        got += proc.stdout.read().splitlines(keepends=True)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        proc.kill()
    assert [g.decode("utf-8") for g in got] == [x + "\n" for x in api_lines(export, lines)]


def test_output_is_utf8_whatever_the_locale_and_a_bom_is_skipped(export, tmp_path):
    lines = some_lines(6, seed=1)
    expected = api_lines(export, lines)
    assert any(not x.isascii() for x in expected)
    assert api_lines(export, ["\ufeff" + lines[0]]) != expected[:1]  # the mark, read as a token, would matter
    env = dict(os.environ, PYTHONIOENCODING="ascii", LC_ALL="C", LANG="C", PYTHONUTF8="0")
    (tmp_path / "in.txt").write_bytes(b"\xef\xbb\xbf" + "".join(x + "\n" for x in lines).encode())
    for args, stdin in ((["--input", tmp_path / "in.txt"], b""), ([], (tmp_path / "in.txt").read_bytes())):
        proc = runtime("translate", export, *args, stdin=stdin, env=env)
        assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
        assert proc.stdout.decode("utf-8").split("\n") == expected + [""]


def test_a_closed_output_pipe_ends_quietly(export):
    lines = some_lines(300, seed=2)
    proc = start_runtime("translate", export, "--batch-size", "1")
    try:
        proc.stdin.write("".join(x + "\n" for x in lines).encode())
        proc.stdin.close()
        assert read_lines(proc.stdout, 1)[0].decode("utf-8") == api_lines(export, lines[:1])[0] + "\n"
        proc.stdout.close()  # as `| head -1` does
        assert proc.wait(timeout=120) == 0
        assert proc.stderr.read() == b""
    finally:
        proc.kill()


def test_warnings_number_lines_from_1_across_batches(copy):
    setting("model.max_source_positions", 6)(copy)
    lines = ["wé1 wé2", "", "wé3", " \t ", "ß1 ß2 ß3", "wé1 wé2 wé3 wé4 wé5 wé6", "ß4", "\ufeff"]
    proc = runtime("translate", copy, "--batch-size", "3", stdin="".join(x + "\n" for x in lines))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "WARNING: standard input line 2: empty; its translation is empty",
        "WARNING: standard input line 4: empty; its translation is empty",
        "WARNING: standard input line 6: 7 source tokens with the end-of-sentence marker, over the model's 6; "
        "its translation is empty"]
    ok = [0, 2, 4, 6, 7]
    expected = dict(zip(ok, api_lines(copy, [lines[i] for i in ok])))
    assert proc.stdout.split("\n")[:-1] == [expected.get(i, "") for i in range(len(lines))]


def test_a_line_that_tokenises_to_nothing_is_named_as_empty(export, tmp_path):
    pytest.importorskip("sacremoses")
    pytest.importorskip("subword_nmt")
    (tmp_path / "codes").write_text("#version: 0.2\nw é\n", encoding="utf-8")
    (tmp_path / "bad").write_text("not codes at all\n", encoding="utf-8")
    proc = runtime("translate", export, "--tokenizer", "moses", "--bpe-codes", tmp_path / "bad", stdin="wé1\n")
    assert_one_line_error(proc, f"{tmp_path / 'bad'}: not subword-nmt BPE codes (Error: invalid line 1")
    stdin = "wé1 wé2\n\x01\x02\n\nß3\n"
    proc = runtime("translate", export, "--tokenizer", "moses", "--bpe-codes", tmp_path / "codes", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    assert [line.split(": ", 1)[1] for line in proc.stderr.splitlines()] == [
        f"standard input line {n}: empty; its translation is empty" for n in (2, 3)]
    assert [bool(x) for x in proc.stdout.split("\n")[:-1]] == [True, False, False, True]
