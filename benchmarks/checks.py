"""Checks on what a run is given instead of making it (``--teacher``, ``--distilled``): the
same dictionaries as the prepared data, and a teacher whose embedding tables fit them."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Tuple

SPECIALS = 4  # fairseq's Dictionary: <s>, <pad>, </s>, <unk> before the file's entries


def missing_input(paths: Iterable[Tuple[str, Path]]) -> Optional[str]:
    """The error for the first (option, path) whose path does not exist, or None."""
    for option, path in paths:
        if not path.exists():
            return f"error: {option} {path}: not found"
    return None


class CheckError(ValueError):
    """Given files that do not fit the prepared data; the message names the file and the mismatch."""


def compare_dictionaries(expected: Path, given: Path) -> None:
    """``given`` must hold the same entries as ``expected`` (the prepared data's dictionary)."""
    if not given.is_file():
        raise CheckError(f"{given}: no such file (a fairseq-preprocess dictionary is expected)")
    want, got = expected.read_text(encoding="utf-8").splitlines(), given.read_text(encoding="utf-8").splitlines()
    for i, (a, b) in enumerate(zip(want, got), start=1):
        if a != b:
            raise CheckError(f"{given} differs from {expected} at line {i}: {b!r} instead of {a!r}")
    if len(want) != len(got):
        raise CheckError(f"{given} has {len(got)} entries, {expected} has {len(want)}")


def check_distilled(data_bin: Path, distilled: Path) -> None:
    """A distilled data-bin directory must share the prepared data's dictionaries and hold a training set."""
    for side in ("src", "tgt"):
        compare_dictionaries(data_bin / f"dict.{side}.txt", distilled / f"dict.{side}.txt")
    missing = [f"train.src-tgt.{side}.bin" for side in ("src", "tgt")
               if not (distilled / f"train.src-tgt.{side}.bin").is_file()]
    if missing:
        raise CheckError(f"{distilled}: no {', '.join(missing)} (the distilled, binarised training set)")


def dictionary_size(path: Path) -> int:
    return SPECIALS + len(path.read_text(encoding="utf-8").splitlines())


def check_teacher(teacher: Path, data_bin: Path) -> None:
    """The teacher's source and target embedding tables must have one row per dictionary entry."""
    import torch

    import examples.multi30k.fairseq_safe_load  # noqa: F401  argparse.Namespace on torch's safe list

    if not teacher.is_file():
        raise CheckError(f"{teacher}: no such checkpoint")
    state = torch.load(teacher, map_location="cpu", weights_only=True)
    model = state.get("model") or {}
    for side, prefix in (("src", "encoder"), ("tgt", "decoder")):
        key = f"{prefix}.embed_tokens.weight"
        if key not in model:
            raise CheckError(f"{teacher}: no {key} (a fairseq transformer checkpoint is expected)")
        rows, entries = model[key].shape[0], dictionary_size(data_bin / f"dict.{side}.txt")
        if rows != entries:
            raise CheckError(f"{teacher}: {key} has {rows} rows, but {data_bin / f'dict.{side}.txt'} gives "
                             f"{entries} entries ({SPECIALS} special symbols + its lines)")
