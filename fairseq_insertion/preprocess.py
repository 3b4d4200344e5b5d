"""Raw text to a model's subword pieces, and its output pieces back to text, as the training data was prepared
(docs/deploy.md): :func:`prepare_line`, the one preparation of a line that the data, the export's record and the
runtime share, and :func:`detokenize`. Standard library only until a line is prepared.

    settings = Preprocessing(source_lang="en", target_lang="de", bpe_codes="bpe.codes")
    prepare_line("A father-figure smiles.", settings)   # 'A father-figure smiles .' (BPE'd)
    detokenize(["Ein", "Vater@@", "figur", "lächelt", "."], settings)   # 'Ein Vaterfigur lächelt.'
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from .errors import InsertionError

RECORD = "preprocess.json"  # beside a data-bin: how its text was prepared
GAP = "___"  # inside a constraint, a template's open slot
GAP_SPLIT = re.compile(r"(?<!\S)___(?!\S)")  # ___ as a whole whitespace-delimited word
TOKENIZERS = ("moses", "none")  # none: the line goes to the subword model as it is (SentencePiece setups)
BPE_KINDS = ("subword_nmt", "sentencepiece")
SPM_SPACE = "\u2581"  # SentencePiece's word-start mark
LANG = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
MADEUP = re.compile(r"madeupword\d{4}")  # fairseq-preprocess's padding of a dictionary to a multiple of 8


class PreprocessError(InsertionError):
    """Preprocessing settings, a codes file or an option that cannot be used; the message names it."""


@dataclass(frozen=True)
class Preprocessing:
    """How raw text was prepared for a model; ``bpe_codes``: the subword model's file (of the kind ``bpe`` says)."""

    source_lang: str = "en"
    target_lang: str = "de"
    bpe_codes: Optional[str] = None
    tokenizer: str = "moses"
    normalize_punctuation: bool = True
    aggressive_dash_splits: bool = False
    escape: bool = False
    lowercase: bool = False
    bpe: str = "subword_nmt"
    bpe_separator: str = "@@"

    def record(self) -> Dict[str, Any]:
        """The settings as a JSON object (``preprocess.json``, ``settings.json``'s ``preprocessing``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, values: Any, where: str, prefix: str = "") -> "Preprocessing":
        """A record's settings, each key checked: ``WHERE: PREFIXKEY must be ...`` when it is not."""
        what = prefix.rstrip(".") or "the record"
        if not isinstance(values, dict):
            raise PreprocessError(f"{where}: {what} must be an object, got {type(values).__name__}")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise PreprocessError(f"{where}: {what} has unknown key(s) {unknown}; its keys are {fields}")
        for key, value in values.items():
            problem = _problem(key, value)
            if problem:
                raise PreprocessError(f"{where}: {prefix}{key} {problem}, got {value!r}")
        return cls(**values)

    def under(self, directory: Path) -> "Preprocessing":
        """The settings with a relative ``bpe_codes`` taken as relative to ``directory``."""
        if self.bpe_codes is None:
            return self
        return dataclasses.replace(self, bpe_codes=str(Path(directory) / self.bpe_codes))


def _problem(key: str, value: Any) -> str:
    """What is wrong with a record's value, if anything (the text after ``KEY``)."""
    if key in ("source_lang", "target_lang"):
        return "" if isinstance(value, str) and LANG.fullmatch(value) else "must be a language code such as 'en'"
    if key == "tokenizer":
        return "" if value in TOKENIZERS else f"must be one of {list(TOKENIZERS)}"
    if key == "bpe":
        return "" if value in BPE_KINDS else f"must be one of {list(BPE_KINDS)}"
    if key == "bpe_codes":
        return "" if value is None or (isinstance(value, str) and value.strip()) else "must be a path or null"
    if key == "bpe_separator":
        return "" if isinstance(value, str) and value and value.split() == [value] else \
            "must be a non-empty string without whitespace"
    return "" if type(value) is bool else "must be true or false"


def write_record(path: Path, settings: Preprocessing) -> None:
    """``settings`` as a JSON file (``preprocess.json``), its codes path relative to the file's directory."""
    codes = settings.bpe_codes and os.path.relpath(Path(settings.bpe_codes).resolve(), Path(path).parent.resolve())
    record = dataclasses.replace(settings, bpe_codes=codes).record()
    Path(path).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_record(path: Path) -> Preprocessing:
    """The settings of a ``preprocess.json``, its codes path taken from the file's directory."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PreprocessError(f"{path}: not a JSON record ({exc})") from None
    return Preprocessing.from_record(values, str(path)).under(Path(path).parent)


# ---------------------------------------------------------------- the one preparation
def prepare_line(line: str, settings: Preprocessing, lang: Optional[str] = None) -> str:
    """A raw line as the training data's were: tokenised in ``lang`` (default: the source's), then BPE'd."""
    return apply_bpe_line(tokenize_line(line, settings, lang), settings)


def prepare_constraint(text: str, settings: Preprocessing) -> str:
    """A raw constraint as the target side was prepared: each part between ``___`` gaps as a line, the gaps kept."""
    parts = [prepare_line(part, settings, settings.target_lang) for part in GAP_SPLIT.split(text.strip())]
    return f" {GAP} ".join(parts).strip()


def tokenize_line(line: str, settings: Preprocessing, lang: Optional[str] = None) -> str:
    """The Moses steps of :func:`prepare_line` (normalisation, tokenisation, lowercasing)."""
    line = line.strip()
    if not line:
        return ""
    if settings.tokenizer == "none":
        return line.lower() if settings.lowercase else line
    normalizer, tokenizer = _moses(lang or settings.source_lang, settings.normalize_punctuation)
    if normalizer is not None:
        line = normalizer.normalize(line)
    words = tokenizer.tokenize(line, aggressive_dash_splits=settings.aggressive_dash_splits,
                               escape=settings.escape, return_str=True).strip()
    return words.lower() if settings.lowercase else words


def apply_bpe_line(words: str, settings: Preprocessing) -> str:
    """The BPE step of :func:`prepare_line` on a tokenised line (none without ``bpe_codes``)."""
    if not words or settings.bpe_codes is None:
        return words
    if settings.bpe == "sentencepiece":
        return " ".join(_spm(settings.bpe_codes, _stamp(settings.bpe_codes)).encode(words, out_type=str))
    return _bpe(settings.bpe_codes, settings.bpe_separator, _stamp(settings.bpe_codes)).process_line(words).strip()


def detokenize(pieces: Sequence[str], settings: Preprocessing) -> str:
    """Output pieces as text: the subword joins removed, Moses-detokenised with ``tokenizer="moses"``."""
    text = " ".join(pieces)
    if settings.bpe == "sentencepiece":
        text = text.replace(" ", "").replace(SPM_SPACE, " ").strip()
    elif settings.bpe_codes is not None:
        text = (text + " ").replace(settings.bpe_separator + " ", "")
    if settings.tokenizer == "none":
        return text.strip()  # as fairseq's post-processing leaves it (two spaces where a piece is a lone mark)
    return _detokenizer(settings.target_lang).detokenize(text.split(), unescape=settings.escape)


def load(settings: Preprocessing) -> None:
    """Load what :func:`prepare_line` and :func:`detokenize` use: a missing package or bad codes refused now."""
    if settings.tokenizer == "moses":
        _moses(settings.source_lang, settings.normalize_punctuation)
        _detokenizer(settings.target_lang)
    if settings.bpe_codes is not None and settings.bpe == "sentencepiece":
        _spm(settings.bpe_codes, _stamp(settings.bpe_codes))
    elif settings.bpe_codes is not None:
        _bpe(settings.bpe_codes, settings.bpe_separator, _stamp(settings.bpe_codes))


def check_vocabulary(settings: Preprocessing, symbols: Sequence[str], where: str) -> None:
    """Refuse a SentencePiece model that did not make ``symbols`` (``where``'s; ``madeupword`` padding ignored)."""
    if settings.bpe != "sentencepiece" or settings.bpe_codes is None:
        return
    model = _spm(settings.bpe_codes, _stamp(settings.bpe_codes))
    pieces = {model.id_to_piece(i) for i in range(model.get_piece_size())}
    missing = [s for s in symbols if s not in pieces and not MADEUP.fullmatch(s)]
    if missing:
        raise PreprocessError(f"{settings.bpe_codes}: not the SentencePiece model of {where}: {len(missing)} of its "
                              f"{len(symbols)} symbols are not pieces of it (e.g. {missing[0]!r})")


def _import(module: str, name: str) -> Any:
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except ImportError as exc:
        raise PreprocessError(f"raw text needs sacremoses and subword-nmt ({exc}): "
                              "pip install sacremoses subword-nmt") from None


@functools.lru_cache(maxsize=None)
def _moses(lang: str, normalize: bool) -> Tuple[Any, Any]:
    normalizer = _import("sacremoses", "MosesPunctNormalizer")(lang=lang) if normalize else None
    return normalizer, _import("sacremoses", "MosesTokenizer")(lang=lang)


@functools.lru_cache(maxsize=None)
def _detokenizer(lang: str) -> Any:
    return _import("sacremoses", "MosesDetokenizer")(lang=lang)


def _stamp(path: str) -> Tuple[int, int]:
    """The codes file's size and modification time (a rewritten file is read again)."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise PreprocessError(f"{path}: {exc.strerror}") from None
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _bpe(path: str, separator: str, stamp: Tuple[int, int]) -> Any:
    """subword-nmt's BPE of a codes file (which reports on standard error and exits when the file is invalid)."""
    bpe_class = _import("subword_nmt.apply_bpe", "BPE")
    with open(path, encoding="utf-8") as codes, contextlib.redirect_stderr(io.StringIO()) as said:
        try:
            return bpe_class(codes, separator=separator)
        except (SystemExit, UnicodeDecodeError, ValueError):
            pass
    reason = " ".join(said.getvalue().split())
    raise PreprocessError(f"{path}: not subword-nmt BPE codes ({reason or 'unreadable'})")


@functools.lru_cache(maxsize=8)
def _spm(path: str, stamp: Tuple[int, int]) -> Any:
    try:
        import sentencepiece
    except ImportError as exc:
        raise PreprocessError(f"a SentencePiece model needs the sentencepiece package ({exc}): "
                              "pip install sentencepiece") from None
    try:
        return sentencepiece.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as exc:
        raise PreprocessError(f"{path}: not a SentencePiece model ({' '.join(str(exc).split())})") from None


# ---------------------------------------------------------------- command-line options
OPTIONS = {  # flag: (field, type); an on/off field's flag also has its --no- form
    "--source-lang": ("source_lang", str), "--target-lang": ("target_lang", str), "--bpe": ("bpe", str),
    "--bpe-codes": ("bpe_codes", str), "--normalize-punctuation": ("normalize_punctuation", bool),
    "--aggressive-dash-splits": ("aggressive_dash_splits", bool), "--escape": ("escape", bool),
    "--lowercase": ("lowercase", bool),
}


def add_arguments(group: Any, recorded: str) -> None:
    """``--tokenizer`` and the settings' options, each None when not given; ``recorded``: where they come from."""
    group.add_argument("--tokenizer", choices=TOKENIZERS, default=None,
                       help=f"raw text: moses (Moses, then subword-nmt BPE) or none (the text as it is, then the "
                            f"subword model; a SentencePiece model's setups); the settings: {recorded}, changed by "
                            "the options")
    for flag, (field, kind) in OPTIONS.items():
        default = getattr(Preprocessing(), field)
        if kind is bool:
            group.add_argument(flag, dest=field, action=argparse.BooleanOptionalAction, default=None,
                               help=f"with --tokenizer (default {'on' if default else 'off'})")
        elif field == "bpe":
            group.add_argument(flag, dest=field, choices=BPE_KINDS, default=None,
                               help=f"with --tokenizer: the subword model's kind (default {default})")
        else:
            aliases = ("--sentencepiece-model",) if field == "bpe_codes" else ()
            what = "the subword model's file, BPE codes or a SentencePiece model; " if aliases else ""
            group.add_argument(flag, *aliases, dest=field, default=None,
                               help=f"with --tokenizer: {what}default {default}")


def from_arguments(args: argparse.Namespace, recorded: Optional[Preprocessing], where: str) -> Optional[Preprocessing]:
    """The settings of ``--tokenizer``: ``recorded``'s (``where`` names it), with the options given
    applied; None without ``--tokenizer``. Refused: an option without ``--tokenizer``, and no codes."""
    given = {field: getattr(args, field) for field, _ in OPTIONS.values() if getattr(args, field, None) is not None}
    if args.tokenizer is None:
        if given:
            flag = next(f for f, (field, _) in OPTIONS.items() if field in given)
            raise PreprocessError(f"{flag} is used with --tokenizer (raw text)")
        return None
    if "bpe_codes" not in given and (recorded is None or recorded.bpe_codes is None):
        raise PreprocessError(f"--tokenizer {args.tokenizer} needs --bpe-codes when {where} records none")
    for flag, (field, _) in OPTIONS.items():
        problem = _problem(field, given.get(field))
        if field in given and problem:
            raise PreprocessError(f"{flag} {problem}, got {given[field]!r}")
    return dataclasses.replace(recorded or Preprocessing(), tokenizer=args.tokenizer, **given)


__all__ = ["PreprocessError", "Preprocessing", "RECORD", "add_arguments", "apply_bpe_line", "check_vocabulary",
           "detokenize", "from_arguments", "load", "prepare_line", "read_record", "tokenize_line", "write_record"]
