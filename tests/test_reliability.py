"""Distributed training, mixed precision, resuming after SIGKILL, safe checkpoint
loading and determinism."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import fairseq_insertion  # noqa: F401  registers the safe globals, as the CLIs do
from tests.utils import (
    BIN,
    REPO,
    build_task,
    generate_args,
    parse_generate,
    reverse_data,
    run,
    train_args,
)

pytestmark = pytest.mark.heavy  # trainings killed, resumed and repeated: minutes


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return reverse_data(tmp_path_factory, "reliability", 300, 16, 13)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_cpu_training_keeps_ranks_identical(data, tmp_path):
    port = _free_port()
    args = train_args(data / "bin", tmp_path / "ckpt", "--max-update", "6", "--no-epoch-checkpoints",
                      "--distributed-world-size", "2", "--distributed-init-method", f"tcp://127.0.0.1:{port}",
                      "--distributed-backend", "gloo", "--distributed-no-spawn", "--ddp-backend", "legacy_ddp")[1:]
    env = dict(os.environ, DUMP_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "dist_worker.py"), *map(str, args),
                               "--distributed-rank", str(rank), "--device-id", str(rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    assert "num_updates 6" in outs[0] or "num_updates=6" in outs[0]
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert r0.keys() == r1.keys()
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    ckpt = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", weights_only=True)
    assert all(torch.equal(ckpt["model"][k].float(), r0[k].float()) for k in r0)


class Payload:
    """Pickles as a call to os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_with_unexpected_object_is_refused(data, tmp_path):
    run(train_args(data / "bin", tmp_path / "ckpt", "--max-update", "2", "--no-epoch-checkpoints"))
    state = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", weights_only=True)
    marker = tmp_path / "executed"
    state["extra"] = Payload(marker)
    torch.save(state, tmp_path / "evil.pt")
    proc = run(generate_args(data / "bin", tmp_path / "evil.pt", "--batch-size", "4"), check=False)
    assert proc.returncode != 0
    assert "Weights only load failed" in proc.stderr and "system" in proc.stderr
    assert not marker.exists()


def test_same_seed_gives_identical_checkpoints_and_decodes(data, tmp_path):
    states, outputs = [], []
    for i in range(2):
        run(train_args(data / "bin", tmp_path / f"ckpt{i}", "--max-update", "5", "--no-epoch-checkpoints",
                       "--dropout", "0.1"))
        states.append(torch.load(tmp_path / f"ckpt{i}" / "checkpoint_last.pt", weights_only=True)["model"])
        out = run(generate_args(data / "bin", tmp_path / f"ckpt{i}" / "checkpoint_last.pt", "--batch-size", "5"))
        outputs.append(parse_generate(out.stdout, "H"))
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 13


def test_bf16_autocast_keeps_slot_softmaxes_and_loss_in_fp32(data):
    """CPU stand-in for --fp16/--bf16 (fairseq's --bf16 means TPU and fails on CPU)."""
    task, args = build_task(data / "bin", "--max-tokens", 2000)
    task.load_dataset("train")
    model, criterion = task.build_model(args), task.build_criterion(args)
    sample = next(iter(task.get_batch_iterator(task.dataset("train"), max_tokens=2000).next_epoch_itr()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net_output = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"],
                           torch.tensor([[0, 5, 6, 2]]).expand(sample["target"].size(0), 4))
        content, location = model.slot_log_probs(net_output, torch.tensor([[0, 5, 6, 2]]))
        loss, _, log = criterion(model, sample)
    assert content.dtype == location.dtype == torch.float32
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_training_killed_mid_epoch_resumes_to_the_same_parameters(data, tmp_path):
    common = ("--max-update", "24", "--batch-size", "8", "--save-interval-updates", "8", "--dropout", "0.1",
              "--no-epoch-checkpoints", "--disable-validation")
    run(train_args(data / "bin", tmp_path / "straight", *common))
    # same command, killed with SIGKILL right after its first mid-epoch checkpoint and its copy to
    # checkpoint_last.pt (renamed into place whole: fairseq_fixes.atomic_checkpoint_copies), then run again
    cmd = [str(c) for c in train_args(data / "bin", tmp_path / "killed", *common)]
    cmd[0] = str(BIN / cmd[0])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not all((tmp_path / "killed" / name).exists() for name in ("checkpoint_1_8.pt", "checkpoint_last.pt")) \
            and proc.poll() is None:
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    proc.kill()
    assert proc.wait() == -signal.SIGKILL  # it was still training when killed
    log = run(train_args(data / "bin", tmp_path / "killed", *common))
    assert "Loaded checkpoint" in log.stdout + log.stderr
    a = torch.load(tmp_path / "straight" / "checkpoint_last.pt", weights_only=True)
    b = torch.load(tmp_path / "killed" / "checkpoint_last.pt", weights_only=True)
    assert a["optimizer_history"][-1]["num_updates"] == b["optimizer_history"][-1]["num_updates"] == 24
    assert all(torch.allclose(a["model"][k].float(), b["model"][k].float(), atol=1e-6) for k in a["model"])


def test_checkpoint_copies_are_renamed_into_place(tmp_path, monkeypatch):
    """fairseq copies the newest checkpoint to checkpoint_last.pt: through a file beside it, renamed over it,
    so a run killed mid-copy leaves the old checkpoint_last.pt whole."""
    from fairseq import checkpoint_utils

    from fairseq_insertion.fairseq_fixes import atomic_checkpoint_copies

    monkeypatch.setattr(checkpoint_utils, "PathManager", checkpoint_utils.PathManager)
    atomic_checkpoint_copies()
    atomic_checkpoint_copies()  # installed once
    assert checkpoint_utils.PathManager.copy.atomic
    (tmp_path / "new.pt").write_bytes(b"new" * 1000)
    (tmp_path / "last.pt").write_bytes(b"old")
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.append(((tmp_path / "last.pt").read_bytes(), a)),
                                                     real_replace(a, b))[1])
    assert checkpoint_utils.PathManager.copy(str(tmp_path / "new.pt"), str(tmp_path / "last.pt"), overwrite=True)
    assert seen == [(b"old", str(tmp_path / "last.pt") + ".tmp")]  # the target untouched until the rename
    assert (tmp_path / "last.pt").read_bytes() == b"new" * 1000 and not (tmp_path / "last.pt.tmp").exists()
