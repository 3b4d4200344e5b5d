"""``make demo`` on a fresh clone: it takes raw Multi30k from ``../shared/data/multi30k`` when that
directory exists, else lets ``prepare.py`` download it, and ``DATA=`` overrides both. Checked without
network or training: the Makefile and ``demo.sh`` run for real in a copy of the checkout whose venv holds a
stand-in ``python`` that records how ``prepare.py`` was called and stops the demo there."""

import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

from tests.utils import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")

STAND_IN = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/../prepare.args"
exit 3
"""


def clone(root: Path) -> Path:
    """A checkout at ROOT/clone with what ``make demo`` runs, and a venv marked installed."""
    repo = root / "clone"
    (repo / "examples" / "multi30k").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", repo / "Makefile")
    shutil.copy(REPO / "setup.py", repo / "setup.py")
    shutil.copy(REPO / "examples" / "multi30k" / "demo.sh", repo / "examples" / "multi30k" / "demo.sh")
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN)
    python.chmod(0o755)
    (repo / ".venv" / ".installed").touch()
    os.utime(repo / "setup.py", (0, 0))  # older than .installed: make does not reinstall
    return repo


def prepare_args(repo: Path, *make_args: str) -> List[str]:
    """The arguments ``make demo`` passes to prepare.py (the stand-in stops the demo right after)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATA", "MAKEFLAGS", "MAKELEVEL", "DEMO_DIR")}
    run = subprocess.run(["make", "demo", *make_args], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode != 0, run.stdout  # the stand-in exits 3
    recorded = repo / ".venv" / "prepare.args"
    assert recorded.is_file(), f"prepare.py was not called:\n{run.stdout}\n{run.stderr}"
    return recorded.read_text().splitlines()


def raw_dir(args: List[str]) -> Optional[str]:
    assert args[0].endswith("examples/multi30k/prepare.py"), args
    return args[args.index("--raw-dir") + 1] if "--raw-dir" in args else None


def test_shared_data_is_used_when_present(tmp_path):
    repo = clone(tmp_path)
    (tmp_path / "shared" / "data" / "multi30k").mkdir(parents=True)
    args = prepare_args(repo)
    assert raw_dir(args) == "../shared/data/multi30k"
    assert args[args.index("--out") + 1] == str((repo / ".demo" / "data").resolve())


def test_download_when_there_is_no_shared_data(tmp_path):
    repo = clone(tmp_path)
    assert raw_dir(prepare_args(repo)) is None  # prepare.py without --raw-dir downloads


def test_a_file_named_like_the_shared_data_is_not_used(tmp_path):
    repo = clone(tmp_path)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "multi30k").write_text("not a directory")
    assert raw_dir(prepare_args(repo)) is None


def test_data_overrides_and_empty_data_downloads(tmp_path):
    repo = clone(tmp_path)
    (tmp_path / "shared" / "data" / "multi30k").mkdir(parents=True)
    mine = str(tmp_path / "my-multi30k")
    assert raw_dir(prepare_args(repo, f"DATA={mine}")) == mine
    assert raw_dir(prepare_args(repo, "DATA=")) is None
