"""Hard lexical constraints and templates (docs/constraints.md) read and encoded for fairseq-generate
(``--constraints-file``), fairseq-interactive (``--constraints``, tab-separated) and the hub; text only. A ``___``
gap inside a constraint is encoded as the target dictionary's pad index, which no real constraint token can be."""

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from fairseq.token_generation_constraints import pack_constraints
from torch import Tensor

from .errors import InsertionError
from .fairseq_fixes import read_text_lines
from .preprocess import GAP, GAP_SPLIT

logger = logging.getLogger(__name__)

EncodeFn = Optional[Callable[[str], str]]


def _encoded_pieces(text: str, encode_fn: EncodeFn, dictionary) -> List[str]:
    """The pieces of a constraint between its ``___`` gaps, checked, then encoded by ``encode_fn`` (None: as given)."""
    pieces = GAP_SPLIT.split(text.strip())
    special = (dictionary.eos_word, dictionary.bos_word, dictionary.pad_word)  # </s>, <s> end a sentence; <pad>: a gap
    for piece in pieces:
        found = [w for w in piece.split() if w in special]
        if found:
            raise SpecialSymbolError(f"constraint {text!r} holds the special symbol(s) {' '.join(found)}; "
                                     f"a constraint is words of the target text (a template gap is {GAP})")
    return [encode_fn(p.strip()) if encode_fn is not None and p.strip() else p.strip() for p in pieces]


def _unknown(pieces: Sequence[str], dictionary) -> List[str]:
    """The words of ``pieces`` missing from ``dictionary``."""
    unk = dictionary.unk()
    return [w for p in pieces for w in p.split() if dictionary.index(w) == unk and w != dictionary.unk_word]


def encode_constraints(fields: Sequence[str], encode_fn: EncodeFn, dictionary, line: str) -> List[Tensor]:
    """One line's constraints as token ids, a warning naming any unknown words; a special symbol is an error naming
    ``line``. ``encode_fn`` (None: already encoded) is applied to the pieces between ``___`` gaps, so a gap survives
    any tokenizer; each gap becomes ``pad()``."""
    out = []
    for text in fields:
        try:
            pieces = _encoded_pieces(text, encode_fn, dictionary)
        except SpecialSymbolError as e:
            raise SpecialSymbolError(f"{line}: {e}") from None
        ids: List[int] = []
        for i, piece in enumerate(pieces):
            ids.extend([dictionary.pad()] * (i > 0) + [dictionary.index(w) for w in piece.split()])
        unknown = _unknown(pieces, dictionary)
        if unknown:
            logger.warning("%s: constraint %r holds %d word(s) not in the target dictionary, read as <unk>: %s",
                           line, text, len(unknown), " ".join(repr(w) for w in unknown))
        out.append(torch.tensor(ids, dtype=torch.long))
    return out


class SpecialSymbolError(InsertionError):
    """A constraint holding one of the dictionary's special symbols (``</s>``, ``<s>``, ``<pad>``)."""


class ConstraintsFile:
    """``--constraints-file``: the constraints of every sentence id of the test set, one line per sentence,
    separated by tabs (an empty line: none; an invalid UTF-8 byte read as U+FFFD, with a warning)."""

    def __init__(self, path: str):
        self.path = path
        self.lines = [[c for c in line.split("\t") if c.strip()] if line.strip() else []
                      for line in read_text_lines(path, "--constraints-file")]

    def check_sentences(self, num_sentences: Dict[str, int]) -> None:
        """Raise unless one of the loaded test sets (sentences per split) has one sentence per line."""
        if not num_sentences:
            raise ValueError(f"--constraints-file {self.path}: it is for fairseq-generate (constraints of a binarised "
                             "test set); in fairseq-interactive give constraints after tabs with --constraints")
        if len(self.lines) not in num_sentences.values():
            sizes = ", ".join(f"{split}: {n}" for split, n in num_sentences.items())
            raise ValueError(f"--constraints-file {self.path} has {len(self.lines)} lines, but the test set has "
                             f"a different number of sentences ({sizes}); give one line per sentence")

    def packed(self, ids: Sequence[int], encode_fn: EncodeFn, dictionary) -> Tensor:
        """Packed constraints (B, C) for the sentence ``ids`` of one batch."""
        return pack_constraints([
            encode_constraints(self.lines[i], encode_fn, dictionary, f"sentence {i} ({self.path} line {i + 1})")
            for i in ids])


class TextEncoders:
    """The tokenizer and BPE fairseq built through the task, raw (None: not configured); the task encodes
    ``--constraints-file`` constraints and fairseq-interactive sources with them."""

    def __init__(self) -> None:
        self.tokenizer: Optional[Any] = None
        self.bpe: Optional[Any] = None

    def encode(self, x: str) -> str:
        """Tokenizer, then BPE, as fairseq-interactive and the hub encode a source line."""
        x = self.tokenizer.encode(x) if self.tokenizer is not None else x
        return self.bpe.encode(x) if self.bpe is not None else x


class ConstraintEncoder:
    """Wraps a tokenizer or BPE (or nothing) as what fairseq-interactive encodes ``--constraints`` with, so that ``___``
    gaps survive encoding (the task encodes source lines itself: ``encode`` sees constraints only). ``last`` marks
    the encoder applied last (BPE): it turns gaps into ``<pad>`` and names words missing from the dictionary."""

    def __init__(self, inner: Optional[Any], dictionary, last: bool):
        self.inner, self.dictionary, self.last = inner, dictionary, last

    def encode(self, x: str) -> str:
        """One constraint: the pieces between gaps encoded one by one, the gaps kept."""
        pieces = _encoded_pieces(x, None if self.inner is None else self.inner.encode, self.dictionary)
        if not self.last:
            return f" {GAP} ".join(pieces)
        unknown = _unknown(pieces, self.dictionary)
        if unknown:  # the generator names the line (fairseq gives the encoder none)
            logger.warning("constraint %r holds %d word(s) not in the target dictionary, read as <unk>: %s",
                           x, len(unknown), " ".join(repr(w) for w in unknown))
        return f" {self.dictionary.pad_word} ".join(pieces)

    def decode(self, x: str) -> str:
        return self.inner.decode(x) if self.inner is not None else x

    def __getattr__(self, name):  # anything else fairseq asks of the wrapped encoder
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)
