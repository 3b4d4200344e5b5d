"""The README as a user meets it: its "Use" block runs as written (made small only by flags appended to each
command, argparse's last value winning), and every number of its results tables is in the results files the
row names."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import REPO

README = REPO / "README.md"
RAW = REPO.parent / "shared" / "data" / "multi30k"
# what makes each command small; appended, so the README's own values are overridden, not edited
SMALL = {
    "examples/multi30k/prepare.py": ["--train-lines", "300", "--test-lines", "20", "--bpe-merges", "200"],
    "fairseq-train": ["--max-update", "20", "--arch", "insertion_transformer_tiny", "--max-tokens", "1000", "--cpu"],
    "fairseq-generate": ["--cpu"],
    "fairseq-interactive": ["--cpu"],
}


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def commands(block: str) -> list[str]:
    """The block's shell commands, continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.split("   #")[0].strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def use_block() -> str:
    match = re.search(r"```bash\n(.*?)```", section("Use"), re.S)
    assert match, "README's Use section has no bash block"
    return match.group(1)


def small(command: str) -> str:
    for marker, flags in SMALL.items():
        if marker in command.split("|")[-1]:
            return f"{command} {shlex.join(flags)}"
    raise AssertionError(f"a README command this test does not know how to make small: {command}")


def test_the_use_block_is_the_commands_a_user_runs():
    cmds = commands(use_block())
    assert [next(m for m in SMALL if m in c) for c in cmds] == list(SMALL)
    train = cmds[1]
    assert "--max-update" in train and "--end-learning-rate 0" in train  # stops by itself, annealed
    assert "fairseq-preprocess" not in use_block()  # prepare.py runs it: a second one would find its files


@pytest.mark.heavy
@pytest.mark.skipif(not (RAW / "train.en.gz").is_file(), reason=f"needs raw Multi30k in {RAW}")
def test_the_use_block_runs_as_written(tmp_path):
    repo = tmp_path / "repo"  # the checkout as a user has it, ../shared beside it
    repo.mkdir()
    for name in ("fairseq_insertion", "examples"):
        (repo / name).symlink_to(REPO / name, target_is_directory=True)
    (tmp_path / "shared").symlink_to(REPO.parent / "shared", target_is_directory=True)
    env_path = f"{Path(sys.executable).parent}:{__import__('os').environ['PATH']}"
    outputs = []
    for cmd in commands(use_block()):
        cmd = small(cmd).replace("python ", f"{sys.executable} ", 1) if cmd.startswith("python ") else small(cmd)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=repo, capture_output=True, text=True,
                              env={**__import__("os").environ, "PATH": env_path}, check=False)
        assert done.returncode == 0, f"{cmd}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    test_lines = len((repo / "data" / "raw" / "test.tgt").read_text(encoding="utf-8").splitlines())
    hypotheses = [line for line in outputs[2].splitlines() if line.startswith("H-")]
    assert test_lines == 20 and len(hypotheses) == test_lines
    assert re.search(r"BLEU4? = ", outputs[2])  # fairseq-generate's score line
    assert any(line.startswith("H-") for line in outputs[3].splitlines())


# ---------------------------------------------------------------- the results tables
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
SKIP = {"model", "made by", "results file", "results files", "precision"}


def tables(text: str) -> list[list[list[str]]]:
    found, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            found.append([r for r in rows if not set("".join(r)) <= set("- ")])
            rows = []
    return found


def file_numbers(paths: set[Path]) -> list[float]:
    return [float(x) for p in paths for x in NUMBER.findall(p.read_text(encoding="utf-8"))]


def unmatched(text: str) -> list[str]:
    """Each number of a results table not in the results files its row (or, for a row naming none, the rows
    above it) links."""
    missing = []
    for table in tables(text):
        header, seen = table[0], set()
        for row in table[1:]:
            links = {REPO / m for m in re.findall(r"\]\((benchmarks/results/[^)#]+)\)", " ".join(row))}
            files = links or seen
            seen |= links
            assert files, f"a results row names no results file: {row}"
            numbers = file_numbers(files)
            for name, cell in zip(header, row, strict=True):
                if name.lower() in SKIP:
                    continue
                for value in NUMBER.findall(cell):
                    if not any(abs(x - float(value)) < 0.005 + 1e-9 for x in numbers):
                        missing.append(f"{value} ({row[0]}) not in {sorted(p.name for p in files)}")
    return missing


def test_every_results_number_is_in_the_results_files_its_row_names():
    assert not unmatched(section("Results"))


def test_a_number_no_results_file_holds_is_reported():
    text = section("Results").replace("37.32 / 37.67", "37.32 / 37.71", 1)
    assert any("37.71" in m for m in unmatched(text))
