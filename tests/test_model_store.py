"""tests.utils.train_once: a training runs once per configuration and run; later calls get its files."""

import sys
from pathlib import Path

from tests.utils import STORE_ENV, train_once

# a stand-in for fairseq-train: writes a random "checkpoint" to its save directory and counts its runs
FAKE = ("import os, sys; save = sys.argv[1]; os.makedirs(save, exist_ok=True); "
        "open(os.path.join(save, 'checkpoint_last.pt'), 'wb').write(os.urandom(16)); "
        "open(sys.argv[2], 'a').write('run\\n')")


def data_bin(path: Path, train: bytes) -> Path:
    path.mkdir(parents=True)
    (path / "dict.src.txt").write_text("w0 1\n")
    (path / "train.src-tgt.src.bin").write_bytes(train)
    (path / "valid.src-tgt.src.bin").write_bytes(b"not part of the key")
    return path


def train(data: Path, save: Path, runs: Path, *flags) -> bytes:
    train_once([sys.executable, "-c", FAKE, save, runs, "--data", data, *flags], data, save)
    return (save / "checkpoint_last.pt").read_bytes()


def test_a_configuration_trains_once_and_every_caller_gets_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    runs = tmp_path / "runs.txt"
    a = data_bin(tmp_path / "a", b"corpus")
    b = data_bin(tmp_path / "b", b"corpus")  # the same training data in another directory
    first = train(a, tmp_path / "save1", runs)
    assert train(b, tmp_path / "save2", runs) == first
    assert runs.read_text().count("run") == 1
    # another flag or other training data is another configuration
    assert train(b, tmp_path / "save3", runs, "--seed", "2") != first
    assert train(data_bin(tmp_path / "c", b"other corpus"), tmp_path / "save4", runs) != first
    assert runs.read_text().count("run") == 3


def test_without_a_store_every_call_trains(tmp_path, monkeypatch):
    monkeypatch.delenv(STORE_ENV, raising=False)
    runs = tmp_path / "runs.txt"
    a = data_bin(tmp_path / "a", b"corpus")
    assert train(a, tmp_path / "save1", runs) != train(a, tmp_path / "save2", runs)
    assert runs.read_text().count("run") == 2
