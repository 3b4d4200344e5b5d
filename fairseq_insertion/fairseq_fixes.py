"""Each place the plugin works around fairseq, each function documented with what fairseq does and what the plugin
does instead (over-long lines: the task's ``build_dataset_for_inference`` and ``filter_indices_by_size``). Imports
fairseq and the standard library only.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type

import numpy as np
from fairseq.data import FairseqDataset
from omegaconf import OmegaConf, open_dict

logger = logging.getLogger(__name__)

# -------------------------------- The tail batch
def keep_remainder_batch(dataset: FairseqDataset) -> None:
    """Make ``dataset.batch_by_size`` keep every sentence: fairseq drops the final batch when its size is not a
    multiple of ``--required-batch-size-multiple``. Batches are consecutive runs of ``indices``, so whatever is
    missing is the tail: batch it on its own."""
    batch_by_size = dataset.batch_by_size
    if getattr(batch_by_size, "keeps_remainder", False):
        return

    def batch_all(indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        batches = batch_by_size(indices, max_tokens=max_tokens, max_sentences=max_sentences,
                                required_batch_size_multiple=required_batch_size_multiple)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            tail = np.asarray(indices[covered:], dtype=np.int64)
            logger.info("kept a final batch of %d sentences that fairseq would drop", len(tail))
            batches = list(batches) + [tail]
        return batches

    batch_all.keeps_remainder = True  # type: ignore[attr-defined]
    dataset.batch_by_size = batch_all


# -------------------------------- UTF-8 input
def tolerate_invalid_utf8_stdin() -> None:
    """fairseq-interactive decodes standard input strictly: one invalid UTF-8 byte would end the run. Replace such bytes
    with U+FFFD instead; the word holding it is then unknown, and the generator names its line."""
    stdin = sys.stdin
    if isinstance(stdin, io.TextIOWrapper) and stdin.errors == "strict":
        try:
            stdin.reconfigure(errors="replace")
        except io.UnsupportedOperation:  # already read from (a process that decodes more than once): as it is
            return
        logger.info("invalid UTF-8 bytes in standard input are read as U+FFFD (reported as unknown words)")


# the source of a line that holds only constraints, which fairseq-interactive's strip would otherwise turn
# into the source: a Unicode noncharacter (reserved for a program's internal use, never text), read by the
# task as an empty source (InsertionTranslationTask.get_interactive_tokens_and_lengths)
EMPTY_SOURCE = "\ufdd0"


def only_constraints(line: str, where: str) -> Optional[str]:
    """``line`` (fairseq-interactive ``--constraints`` input; ``where``: its file and line) with :data:`EMPTY_SOURCE`
    as its source, logged, when it is an empty source with constraints (a tab first, or blanks and a tab); else None."""
    source, tab, rest = line.partition("\t")
    if tab and not source.strip() and rest.strip():
        logger.info("%s: an empty source with constraints (%r): decoded from them", where, line.strip())
        return EMPTY_SOURCE + tab + rest
    return None


class ConstraintLines(io.TextIOBase):
    """Standard input for fairseq-interactive ``--constraints``, each line read through :func:`only_constraints`."""

    def __init__(self, stream: Any):
        self._stream, self._lines = stream, 0

    def readline(self, size: int = -1) -> str:  # type: ignore[override]
        line = self._stream.readline()
        if not line:
            return line
        self._lines += 1
        return only_constraints(line, f"standard input line {self._lines}") or line

    def readable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, buffer, ...
        return getattr(self._stream, name)


def tolerant_interactive_input(task_cfg: Any) -> Optional[str]:
    """fairseq-interactive's input (read through the task config's root). Standard input with ``--constraints``:
    ``sys.stdin`` is wrapped in :class:`ConstraintLines` (once) before fairseq opens it. ``--input FILE``, read like
    standard input: fairseq decodes it strictly (one invalid UTF-8 byte ends the run) and strips every line (a line of
    constraints alone loses its leading tab). When ``FILE`` holds invalid UTF-8 or, with ``--constraints``, such a
    line, fairseq's ``interactive.input`` is pointed at a copy with U+FFFD for invalid bytes and :data:`EMPTY_SOURCE`
    as such a line's source, with messages naming the file and each line. Returns the copy's path, else None."""
    root = command_line_root(task_cfg)
    interactive = root.get("interactive") if root is not None else None
    path = getattr(interactive, "input", "-") if interactive is not None else "-"
    constraints = interactive is not None and bool(getattr(root.get("generation"), "constraints", None))
    if path == "-" and constraints and not isinstance(sys.stdin, ConstraintLines):
        sys.stdin = ConstraintLines(sys.stdin)
    if path == "-" or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        data = f.read()
    changed = data.decode("utf-8", errors="replace").encode("utf-8") != data  # invalid UTF-8 somewhere
    lines = read_text_lines(path, "--input")
    for i, line in enumerate(lines):
        kept = only_constraints(line, f"--input {path} line {i + 1}") if constraints else None
        if kept is not None:
            lines[i], changed = kept, True
    if not changed:
        return None
    copy = os.path.join(tempfile.mkdtemp(prefix="fairseq_insertion_input_"), os.path.basename(path))
    with open(copy, "w", encoding="utf-8") as f:
        f.writelines(x + "\n" for x in lines)
    with open_dict(interactive):
        interactive.input = copy
    return copy


def command_line_checkpoints(task_cfg: Any) -> List[str]:
    """The checkpoint files of fairseq-generate's and -interactive's ``--path`` that exist, read from the task
    config's root ([] elsewhere): the task checks them before fairseq loads them."""
    root = command_line_root(task_cfg)
    path = getattr(root.get("common_eval"), "path", None) if root is not None else None
    return [p for p in str(path).split(os.pathsep) if os.path.isfile(p)] if path else []


def command_line_root(task_cfg: Any) -> Any:
    """The whole command line's config, of which fairseq gives a task only ``cfg.task``; None outside it."""
    root = task_cfg._get_root() if OmegaConf.is_config(task_cfg) else None
    return root if root is not None and root is not task_cfg else None


def read_text_lines(path: str, option: str) -> List[str]:
    """The lines of the text file ``path`` (given by ``option``, e.g. ``--constraints-file``), without
    their line ends: an invalid UTF-8 byte becomes U+FFFD (an unknown word), with a warning naming the
    file and the line. A missing or unreadable file is an error naming ``option`` and ``path``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FileNotFoundError(f"{option} {path}: cannot be read ({e.strerror or e})") from None
    raw = (data[:-1] if data.endswith(b"\n") else data).split(b"\n")  # a final line end ends the last line
    lines = []
    for i, line in enumerate(raw):
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            logger.warning("%s %s line %d: invalid UTF-8 (byte %d of the line), read as U+FFFD (an unknown word)",
                           option, path, i + 1, e.start + 1)
            lines.append(line.decode("utf-8", errors="replace"))
    return lines


# -------------------------------- Errors on fairseq's command lines
def exit_on_option_errors(errors: Tuple[Type[BaseException], ...], message: Callable[[Any], str]) -> bool:
    """In a fairseq command-line process (a ``fairseq-*`` script, or ``python -m fairseq_cli.<command>``; not the hub
    or in-process tests), an uncaught exception of the types ``errors`` (options the plugin refuses) or of fairseq's
    own option checks (:func:`fairseq_option_check`) ends the run as argparse does: one line,
    ``prog: error: <message(exception)>`` (``prog`` as argparse shows it, ``fairseq-interactive``), exit status 2.
    Installed once (``sys.excepthook``, others reach the previous hook); True in such a process."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if not (prog.startswith("fairseq-") or (spec is not None and str(spec.name).startswith("fairseq_cli."))):
        return False
    previous = sys.excepthook
    if getattr(previous, "option_errors", None) == errors:
        return True

    def hook(exc_type, exc, tb):
        if isinstance(exc, errors) or fairseq_option_check(exc, tb):
            sys.stderr.write(f"{prog}: error: {message(exc) if isinstance(exc, errors) else exc}\n")
            sys.exit(2)
        previous(exc_type, exc, tb)

    hook.option_errors = errors  # type: ignore[attr-defined]
    sys.excepthook = hook
    return True


def fairseq_option_check(exc: BaseException, tb: Any) -> bool:
    """Whether ``exc`` (raised with the traceback ``tb``) is one of fairseq-generate's or -interactive's
    checks of their options: an assertion with a message, raised in their ``main`` itself (e.g.
    ``--batch-size cannot be larger than --buffer-size``), where nothing but options has been read."""
    if not isinstance(exc, AssertionError) or not str(exc) or tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code, path = tb.tb_frame.f_code, Path(tb.tb_frame.f_code.co_filename)
    return code.co_name == "main" and path.parent.name == "fairseq_cli" and path.name in ("generate.py",
                                                                                            "interactive.py")


# -------------------------------- Checkpoint copies
def atomic_checkpoint_copies() -> None:
    """Make fairseq's checkpoint copies (``save_checkpoint``'s ``checkpoint_last.pt``, ...) atomic for local files:
    written beside the target and renamed over it: the target is the old file or the whole new one. Installed once."""
    from fairseq import checkpoint_utils

    manager = checkpoint_utils.PathManager
    copy = manager.copy
    if getattr(copy, "atomic", False):
        return

    def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if not manager.supports_rename(dst_path):
            return copy(src_path, dst_path, overwrite)
        tmp = f"{dst_path}.tmp"
        done = copy(src_path, tmp, True)
        os.replace(tmp, dst_path)
        return done

    atomic_copy.atomic = True  # type: ignore[attr-defined]
    checkpoint_utils.PathManager = type("AtomicCopies", (manager,), {"copy": staticmethod(atomic_copy)})


# -------------------------------- Over-long lines in the hub
def skipped_inputs(sizes: Sequence[int], max_positions: Any) -> List[int]:
    """The inputs (source ``sizes``, eos included) that fairseq's batching skips as too long for ``max_positions``
    (an int, or a (source, target) pair), in order: fairseq's hub returns results only for the others."""
    limit = max_positions[0] if isinstance(max_positions, (tuple, list)) else max_positions
    return [i for i, n in enumerate(sizes) if limit is not None and int(n) > limit]


def realign(results: Sequence[Any], skipped: Sequence[int], n: int, empty: Any) -> List[Any]:
    """``n`` results in input order from ``results`` (one per input not in ``skipped``, in order), with
    ``empty`` at the ``skipped`` inputs."""
    if len(results) != n - len(skipped):
        raise RuntimeError(f"{len(results)} results for {n} inputs of which {len(skipped)} were skipped")
    it, gone = iter(results), set(skipped)
    return [empty if i in gone else next(it) for i in range(n)]


# -------------------------------- Archives
def local_model_dir(model_name_or_path: str) -> str:
    """What to give fairseq's ``from_pretrained``: a folder as it is, an archive (``.tar(.gz|.bz2)`` or ``.zip``)
    extracted safely into a new folder, where fairseq would extract it unfiltered and replace the archive by a folder.
    A member whose path leaves the folder (absolute, or with ``..``), a link or a device is refused with an error
    naming the archive and the member, before anything is written."""
    archive = str(model_name_or_path)
    if not os.path.isfile(archive):  # fairseq's from_pretrained takes any file as an archive
        return archive
    dest = tempfile.mkdtemp(prefix="fairseq_insertion_model_")
    root = Path(dest).resolve()
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                _check_member(archive, root, name)
            for info in z.infolist():  # a zip symlink: the high bits of external_attr say S_IFLNK
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    _refuse(archive, info.filename, "a link")
            z.extractall(root)
    else:
        try:
            tar = tarfile.open(archive)
        except tarfile.TarError as e:
            raise ValueError(f"{archive}: not a model archive (.tar.gz, .tar.bz2, .tar or .zip) ({e})") from None
        with tar:
            members = tar.getmembers()
            for m in members:
                _check_member(archive, root, m.name)
                if m.issym() or m.islnk():
                    _refuse(archive, m.name, f"a link (to {m.linkname!r})")
                if not (m.isfile() or m.isdir()):
                    _refuse(archive, m.name, "a device, fifo or other special file")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(root, members=members, filter="data")
            else:  # Python without extraction filters: every member was checked above
                tar.extractall(root, members=members)
    entries = [e for e in os.listdir(dest) if not e.startswith(".")]
    if len(entries) == 1 and os.path.isdir(os.path.join(dest, entries[0])):  # model.tar.gz holding model/...
        dest = os.path.join(dest, entries[0])
    logger.info("extracted %s into %s", archive, dest)
    return dest


def _check_member(archive: str, root: Path, name: str) -> None:
    target = None if os.path.isabs(name) or ".." in Path(name).parts else (root / name).resolve()
    if target is None or (target != root and root not in target.parents):
        _refuse(archive, name, "a path that leaves the extraction folder")


def _refuse(archive: str, member: str, what: str) -> None:
    raise ValueError(f"{archive}: member {member!r} is {what}; refused, nothing extracted (a model archive "
                     "holds only regular files and folders inside it)")
