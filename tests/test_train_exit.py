"""examples.steps.train keeps a training whose process was killed by a signal only after fairseq logged the end of
training and saved checkpoint_last.pt (a warning names the exit status); a process killed before that, or one that
fails otherwise, still stops the recipe. The stand-in for fairseq-train writes fairseq's log lines and aborts."""

import sys

import pytest

from examples.commands import RecipeError
from examples.steps import train

FAKE = """
import os, pathlib, signal, sys
save, finished, how = pathlib.Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
print('2026-12-05 08:20:55 | INFO | train | {"epoch": 1, "train_loss": "8.9", "train_wps": "100.0", '
      '"train_wpb": "50.0", "train_num_updates": "4"}', flush=True)
if finished:
    (save / "checkpoint_last.pt").write_bytes(b"saved")
    print("2026-12-05 08:20:55 | INFO | fairseq_cli.train | done training in 0.1 seconds", flush=True)
if how == "abort":
    os.kill(os.getpid(), signal.SIGABRT)
sys.exit(3 if how == "fail" else 0)
"""


def fake(tmp_path, finished: bool, how: str):
    return [sys.executable, "-c", FAKE, str(tmp_path), "1" if finished else "0", how]


def test_an_abort_after_the_end_of_training_keeps_the_checkpoint(tmp_path, capsys):
    out = train(fake(tmp_path, True, "abort"), tmp_path)
    assert out["train_updates"] == 4 and (tmp_path / "checkpoint_last.pt").read_bytes() == b"saved"
    assert f"exit -6) after it finished training and saved {tmp_path / 'checkpoint_last.pt'}: kept" in \
        capsys.readouterr().err


@pytest.mark.parametrize("finished, how", [(False, "abort"), (True, "fail")])
def test_an_abort_before_the_end_or_a_failure_stops(tmp_path, finished, how):
    with pytest.raises(RecipeError, match=r"command failed \(exit (-6|3)\)"):
        train(fake(tmp_path, finished, how), tmp_path)
