"""No committed text file holds an absolute path of the machine it was written on (a checkout, a home,
a scratch or output directory). Commands and results write such paths with the placeholders REPO,
DATA, OUT, KIT and VENV instead. A few generic system paths (``/usr/bin/env`` in a shebang,
``/dev/null``) are allowed by name."""

import re
import subprocess
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from tests.utils import REPO

# the top-level directories a machine-specific path starts with
ROOTS = ("work", "root", "home", "tmp", "Users", "mnt", "opt", "scratch", "var", "private", "srv", "media", "data",
         "workspace", "content", "kaggle", "gpfs", "lustre", "fsx", "nfs", "usr", "etc", "bin", "sbin", "lib",
         "dev", "proc", "sys", "run", "snap", "net", "Volumes")
# an absolute path: not inside a URL, a relative path or a variable's expansion ($(VENV)/bin, {tmp_path}/x)
ABSOLUTE = re.compile(r"(?<![\w.~$/:)}\]-])/(?:" + "|".join(ROOTS) + r")(?:/[\w.@%+=,~-]+)+")
WINDOWS = re.compile(r"(?<![\w/])[A-Za-z]:\\(?:Users|home)\\")
ALLOWED = {"/usr/bin/env", "/bin/sh", "/bin/bash", "/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr",
           "/proc/cpuinfo", "/proc/meminfo"}


def machine_paths(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, path) of every absolute machine path in ``text``."""
    for number, line in enumerate(text.splitlines(), 1):
        for m in ABSOLUTE.finditer(line):
            path = m.group(0).rstrip(".,:")  # a path ending a sentence
            if path not in ALLOWED:
                yield number, path
        for m in WINDOWS.finditer(line):
            yield number, m.group(0)


def tracked_files() -> List[Path]:
    """The files git tracks in this checkout (that are still there)."""
    run = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        pytest.skip("not a git checkout")
    return [REPO / name for name in run.stdout.split("\0") if name and (REPO / name).is_file()]


def text_of(path: Path) -> str:
    """The file's text, or "" for a binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def test_the_scanner_finds_machine_paths_and_only_those():
    r = "/"  # the samples are built at runtime, so this file holds none of them
    text = "\n".join([
        f'"command": "{r}work/main/.venv/bin/fairseq-generate {r}work/runs/data/data-bin"',
        f"outputs in {r}tmp/demo_final; cache '{r}root/.cache/x'",
        f"see {r}home/alice/ckpt.pt, then",
        "C:" + "\\Users\\alice\\data",
        "#!/usr/bin/env bash",
        "fairseq-generate DATA/data-bin > /dev/null; python ../shared/data/multi30k/prepare.py",
        "https://github.com/multi30k/dataset/raw/master/data/task1/raw/ and $(VENV)/bin/python {tmp_path}/bin/x",
        "REPO/fairseq_insertion OUT/bench KIT/checkpoint.pt data/tok/train",
    ])
    assert [p for _, p in machine_paths(text)] == [
        f"{r}work/main/.venv/bin/fairseq-generate", f"{r}work/runs/data/data-bin", f"{r}tmp/demo_final",
        f"{r}root/.cache/x", f"{r}home/alice/ckpt.pt", "C:" + "\\Users\\"]
    assert [n for n, _ in machine_paths(text)] == [1, 1, 2, 2, 3, 4]


def test_no_committed_file_holds_an_absolute_machine_path():
    found = [f"{path.relative_to(REPO)}:{number}: {found}"
             for path in tracked_files() for number, found in machine_paths(text_of(path))]
    assert not found, "absolute machine paths (write REPO, DATA, OUT, KIT or VENV instead):\n" + "\n".join(found)
