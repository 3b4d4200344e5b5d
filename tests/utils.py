"""Helpers for the CLI tests: synthetic corpora and running fairseq's CLIs."""

import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
PLUGIN = str(REPO / "fairseq_insertion")
BIN = Path(sys.executable).parent
# a directory every process of one test run shares (tests/conftest.py sets it): trained models by configuration
STORE_ENV = "FAIRSEQ_INSERTION_TEST_STORE"


def write_reverse_corpus(directory: Path, sizes=(("train", 2000), ("valid", 64), ("test", 29)),
                         vocab: int = 24, min_len: int = 4, max_len: int = 20, seed: int = 0) -> None:
    """Source: a random string of distinct tokens; target: the same string reversed.

    Distinct tokens keep the task well posed for an insertion model: with
    repeats, a canvas does not say which copy of a token it holds.
    """
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        with open(directory / f"{split}.src", "w") as fs, open(directory / f"{split}.tgt", "w") as ft:
            for _ in range(n):
                s = rng.sample(words, rng.randint(min_len, max_len))
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(reversed(s)) + "\n")


def reverse_data(tmp_path_factory, name: str, train: int, valid: int, test: int) -> Path:
    """A fresh directory with a reverse corpus in ``raw/`` and its binarised form in ``bin/``."""
    root = tmp_path_factory.mktemp(name)
    write_reverse_corpus(root / "raw", sizes=(("train", train), ("valid", valid), ("test", test)))
    preprocess(root / "raw", root / "bin")
    return root


def trained_reverse_model(tmp_path_factory, name: str, test_lines: int, updates: int = 150):
    """(root, model in eval mode, task with its test split loaded): a tiny insertion model trained a few
    hundred updates on a reverse corpus (outputs of every length, neither empty nor perfect)."""
    from fairseq import checkpoint_utils

    root = reverse_data(tmp_path_factory, name, 800, 8, test_lines)
    train_once(train_args(root / "bin", root / "ckpt", "--max-update", str(updates), "--no-epoch-checkpoints"),
               root / "bin", root / "ckpt")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(root / "ckpt" / "checkpoint_last.pt")], arg_overrides={"data": str(root / "bin")})
    task.load_dataset("test")
    return root, models[0].eval(), task


def run(cmd: Sequence[str], timeout: int = 600, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a CLI from the test environment's bin directory, capturing output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [str(BIN / cmd[0]) if (BIN / cmd[0]).exists() else cmd[0], *map(str, cmd[1:])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def training_key(cmd: Sequence, data: Path, save_dir: Path) -> str:
    """What determines a training's checkpoint: its command (data and save directories left out) and the
    data-bin's dictionaries and binarised training split."""
    h = hashlib.sha256()
    for arg in map(str, cmd):
        h.update(arg.replace(str(data), "DATA").replace(str(save_dir), "SAVE").encode() + b"\0")
    for f in sorted(p for p in Path(data).iterdir() if p.name.startswith(("dict.", "train."))):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:20]


def train_once(cmd: Sequence, data: Path, save_dir: Path) -> Path:
    """Run the training ``cmd`` (on the data-bin ``data``, saving to ``save_dir``) once per test run for its
    configuration (``training_key``): a later call with the same configuration, in any worker, gets a copy of
    the first one's ``save_dir``; the workers wait for each other on a file lock. Outside a run that sets
    ``STORE_ENV`` it just trains. Returns ``save_dir``."""
    store = os.environ.get(STORE_ENV)
    if not store:
        run(cmd)
        return save_dir
    done = Path(store) / training_key(cmd, data, save_dir)
    with FileLock(f"{done}.lock"):
        if done.is_dir():
            shutil.copytree(done, save_dir, dirs_exist_ok=True)
        else:
            run(cmd)
            partial = done.with_name(done.name + ".partial")
            shutil.copytree(save_dir, partial)
            partial.rename(done)
    return save_dir


def preprocess(raw: Path, dest: Path) -> None:
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", dest, "--joined-dictionary",
         "--workers", "1"])


def train_args(data: Path, save_dir: Path, *extra) -> List[str]:
    return ["fairseq-train", data, "--user-dir", PLUGIN, "--task", "insertion_translation",
            "--arch", "insertion_transformer_tiny", "--share-all-embeddings", "--criterion", "insertion_loss",
            "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
            "--max-tokens", "2000", "--save-dir", save_dir, "--log-format", "simple", "--log-interval", "10",
            "--cpu", "--seed", "1", *extra]


def generate_args(data: Path, checkpoint: Path, *extra) -> List[str]:
    return ["fairseq-generate", data, "--user-dir", PLUGIN, "--task", "insertion_translation", "--path",
            checkpoint, "--cpu", *extra]


def parse_generate(stdout: str, prefix: str = "H") -> dict:
    """{sentence id: fields after the id} for lines starting with ``prefix-``."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith(prefix + "-"):
            head, *rest = line.split("\t")
            out[head[len(prefix) + 1:]] = rest
    return out


def build_task(data: Path, *flags):
    """(task, args) for a tiny insertion model on ``data``, parsed as fairseq-train would."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", PLUGIN, "--task", "insertion_translation", "--arch", "insertion_transformer_tiny",
        "--criterion", "insertion_loss", "--cpu", *map(str, flags)])
    return tasks.setup_task(args), args


def never_end_slot(model, d) -> None:
    """Bias ``model``'s slot head so that end-of-slot never wins."""
    head_forward = model.decoder.head.forward

    def biased(*a, **k):
        content, location = head_forward(*a, **k)
        content[..., d.eos()] = -1e4
        return content, location

    model.decoder.head.forward = biased


def random_source_batch(d, src_lengths: Sequence[int]) -> dict:
    """A fairseq sample of random sources with ``n`` real tokens each: left-padded, ending with eos."""
    import torch

    lengths = [n + 1 for n in src_lengths]
    B, S = len(lengths), max(lengths)
    src = torch.randint(d.nspecial, len(d), (B, S))
    for b, n in enumerate(lengths):
        src[b, : S - n] = d.pad()
        src[b, -1] = d.eos()
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor(lengths)}}


def canvas_positions_one_by_one(translator, ids, opts) -> int:
    """Each source in ``ids`` decoded alone by the runtime ``translator``: the framed canvas positions its passes
    read, from its history (the canvases before each step that inserted, then the final one for each pass that
    inserted nothing), each with bos and eos; one candidate a sentence."""
    total = 0
    for x in ids:
        before = dict(translator.stats)
        ((c, *_),) = translator.translate_ids([x], 1, opts, passes=True)
        ran = translator.stats["sentence_passes"] - before["sentence_passes"]
        steps = [0, *map(len, c.passes)]  # canvas lengths before the first step, after each inserting one
        total += sum(n + 2 for n in steps[:-1]) + (ran - len(c.passes)) * (steps[-1] + 2)
    return total
