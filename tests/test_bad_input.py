"""Bad input in fairseq-generate and fairseq-interactive: empty lines, over-long
lines, unknown words, invalid UTF-8 and a dictionary that does not match the
checkpoint. Each is named in a message; every other line is translated."""

import logging

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary

from tests.utils import (
    PLUGIN,
    build_task,
    generate_args,
    parse_generate,
    preprocess,
    run,
    train_args,
    train_once,
    write_reverse_corpus,
)

LONG = " ".join(f"w{i % 24}" for i in range(40))  # 41 tokens with eos: over --max-source-positions 30
TEST = ["w1 w2 w3", "", LONG, "w4 zz1 w5 zz2", "w6 w7"]  # ids 1 empty, 2 too long, 3 two unknown words


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("badinput")
    write_reverse_corpus(root / "raw", sizes=(("train", 200), ("valid", 8), ("test", 2)))
    for side, lines in (("src", TEST), ("tgt", [" ".join(reversed(x.split())) for x in TEST])):
        (root / "raw" / f"test.{side}").write_text("\n".join(lines) + "\n")
    preprocess(root / "raw", root / "bin")
    train_once(train_args(root / "bin", root / "ckpt", "--max-update", "3", "--no-epoch-checkpoints"), root / "bin",
               root / "ckpt")
    return root


def test_generate_names_bad_lines_and_translates_the_rest(trained):
    proc = run(generate_args(trained / "bin", trained / "ckpt" / "checkpoint_last.pt", "--batch-size", "8",
                             "--max-source-positions", "30"))
    log = proc.stdout + proc.stderr
    assert sorted(map(int, parse_generate(proc.stdout, "H"))) == [0, 1, 3, 4]  # all but the over-long line
    assert "sentence 2 ('w0 w1 w2 w3 w4 w5' ...): 41 source tokens exceed" in log
    assert "skipped 1 over-long sentence(s): ids [2]" in log
    assert "sentence 1: empty source line" in log
    assert parse_generate(proc.stdout, "H")["1"][1] == ""
    assert "sentence 3: 2 unknown source word(s)" in log


def test_the_size_rule_follows_how_the_dataset_was_made(trained, caplog):
    """Loaded for training: fairseq's rule. Loaded with a checkpoint's task config (fairseq-generate) or
    built from lines (interactive, hub): the over-long line is skipped and named."""
    task, _ = build_task(trained / "bin")
    indices, limit, rest = np.arange(len(TEST)), (30, 30), [0, 1, 3, 4]
    task.load_dataset("test")  # as fairseq-train loads its splits
    with pytest.raises(Exception, match="skip-invalid-size-inputs-valid-test"):
        task.filter_indices_by_size(indices, task.dataset("test"), limit)
    assert list(task.filter_indices_by_size(indices, task.dataset("test"), limit, ignore_invalid_inputs=True)) == rest
    task.load_dataset("test", task_cfg=task.cfg)  # as fairseq-generate loads its test set
    lines = [task.source_dictionary.encode_line(x, add_if_not_exist=False).long() for x in TEST]
    inference = task.build_dataset_for_inference(lines, torch.tensor([len(t) for t in lines]))
    for dataset in (task.dataset("test"), inference):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="fairseq_insertion.task"):
            assert list(task.filter_indices_by_size(indices, dataset, limit)) == rest
        assert "skipped 1 over-long sentence(s): ids [2]" in caplog.text


def test_interactive_names_bad_lines_and_translates_the_rest(trained):
    lines = ["w1 w2 w3", "", LONG, "w4 zz1 w5", "w6 \udcff w7"]
    stdin = "\n".join(lines).encode("utf-8", "surrogateescape") + b"\n"  # line 4 holds an invalid byte
    proc = run(["fairseq-interactive", trained / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                "--path", trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--source-lang", "src",
                "--target-lang", "tgt", "--buffer-size", "8", "--batch-size", "8", "--max-source-positions", "30"],
               input=stdin.decode("latin-1"), encoding="latin-1")
    log = proc.stdout + proc.stderr
    assert sorted(map(int, parse_generate(proc.stdout, "H"))) == [0, 1, 2, 3, 4]  # one output per line
    assert parse_generate(proc.stdout, "H")["2"][1] == ""  # the over-long line: empty, named by input line
    assert "input line 3 ('w0 w1 w2 w3 w4 w5' ...): 41 source tokens exceed" in log
    assert "source line '': empty source line" in log
    assert "source line 'w4 <unk> w5': 1 unknown source word(s)" in log
    assert "source line 'w6 <unk> w7': 1 unknown source word(s)" in log  # the invalid byte, as U+FFFD


def test_dictionary_mismatch_is_named(trained, tmp_path):
    other = tmp_path / "other"
    write_reverse_corpus(other / "raw", sizes=(("train", 50), ("valid", 4), ("test", 4)), vocab=40)
    preprocess(other / "raw", other / "bin")
    proc = run(generate_args(other / "bin", trained / "ckpt" / "checkpoint_last.pt", "--batch-size", "4"),
               check=False)
    assert proc.returncode != 0
    rows = len(Dictionary.load(str(trained / "bin" / "dict.src.txt")))  # the checkpoint's embedding table
    assert (f"the checkpoint: encoder.embed_tokens.weight has {rows} rows, but the source dictionary "
            f"{other / 'bin' / 'dict.src.txt'} gives") in proc.stderr


def test_standard_input_read_before_the_generator_is_left_as_it_is(monkeypatch):
    """A process that read standard input before building a generator (a second decode in one
    process): the tolerant reading is skipped, not an error; an unread stream is made tolerant."""
    import io

    from fairseq_insertion.fairseq_fixes import tolerate_invalid_utf8_stdin

    read = io.TextIOWrapper(io.BytesIO(b"a\nb\n"), encoding="utf-8")
    read.readline()
    monkeypatch.setattr("sys.stdin", read)
    tolerate_invalid_utf8_stdin()
    assert read.errors == "strict"
    fresh = io.TextIOWrapper(io.BytesIO(b"a \xff\n"), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", fresh)
    tolerate_invalid_utf8_stdin()
    assert fresh.readline() == "a \ufffd\n"


def test_every_refusal_shares_the_base_class():
    """The plugin's commands catch one class: each part's error is an InsertionError (and a ValueError)."""
    import importlib
    import inspect
    import pkgutil

    import fairseq_insertion
    from fairseq_insertion.errors import InsertionError

    found = {}
    for info in pkgutil.walk_packages(fairseq_insertion.__path__, "fairseq_insertion."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name and issubclass(cls, Exception):
                found[name] = cls
    assert len(found) >= 7, sorted(found)
    assert all(issubclass(cls, InsertionError) for name, cls in found.items() if name != "InsertionError"), \
        [name for name, cls in found.items() if not issubclass(cls, InsertionError)]
