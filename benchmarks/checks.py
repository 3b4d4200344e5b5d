"""Checks on what a run is given instead of making it (``--teacher``, ``--distilled``): the
same dictionaries as the prepared data, and a teacher whose embedding tables fit them."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Tuple


def missing_input(paths: Iterable[Tuple[str, Path]]) -> Optional[str]:
    """The error for the first (option, path) whose path does not exist, or None."""
    for option, path in paths:
        if not path.exists():
            return f"error: {option} {path}: not found"
    return None


class CheckError(ValueError):
    """Given files that do not fit the prepared data; the message names the file and the mismatch."""


def _fit_dictionaries(data_bin: Path, name: str, **given) -> None:
    """The package's dictionary check (fairseq_insertion.checkpoints.check_dictionaries) against the
    prepared data's ``dict.src.txt``/``dict.tgt.txt``, its errors as CheckError."""
    from fairseq_insertion.checkpoints import check_dictionaries

    try:
        check_dictionaries(_dictionary_files(data_bin), name, **given)
    except (ValueError, FileNotFoundError) as e:
        raise CheckError(str(e)) from None


def _dictionary_files(data_bin: Path):
    """fairseq_insertion.checkpoints.DictionaryFiles of a data-bin directory (languages src, tgt)."""
    from fairseq_insertion.checkpoints import DictionaryFiles

    return DictionaryFiles(str(data_bin / "dict.src.txt"), str(data_bin / "dict.tgt.txt"))


def check_distilled(data_bin: Path, distilled: Path) -> None:
    """A distilled data-bin directory must share the prepared data's dictionaries and hold a training set."""
    _fit_dictionaries(data_bin, str(distilled), trained_with=_dictionary_files(distilled))
    missing = [f"train.src-tgt.{side}.bin" for side in ("src", "tgt")
               if not (distilled / f"train.src-tgt.{side}.bin").is_file()]
    if missing:
        raise CheckError(f"{distilled}: no {', '.join(missing)} (the distilled, binarised training set)")


def check_teacher(teacher: Path, data_bin: Path) -> None:
    """The teacher's source and target embedding tables must have one row per dictionary entry."""
    import torch

    import examples.multi30k.fairseq_safe_load  # noqa: F401  argparse.Namespace on torch's safe list

    if not teacher.is_file():
        raise CheckError(f"{teacher}: no such checkpoint")
    state = torch.load(teacher, map_location="cpu", weights_only=True)
    _fit_dictionaries(data_bin, str(teacher), weights=state.get("model") or {})
