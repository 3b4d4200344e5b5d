"""Hard lexical constraints and templates: reading and encoding them for fairseq-generate (``--constraints-file``),
fairseq-interactive (``--constraints``, tab-separated) and the hub interface (``translate(..., constraints=[...])``,
:mod:`fairseq_insertion.hub`). Text only: this module imports neither the model nor the hub.

A constraint is a word sequence that must appear verbatim, contiguous and in order in the output; the decoder
(:mod:`fairseq_insertion.generator`) puts it on the initial canvas. The word ``___`` inside a constraint marks an open
slot (a template gap); it is encoded as the target dictionary's pad index, which no real constraint token can be.
"""

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.token_generation_constraints import pack_constraints
from torch import Tensor

from .errors import InsertionError
from .fairseq_fixes import read_text_lines
from .preprocess import GAP
from .preprocess import GAP_SPLIT as _GAP_SPLIT

logger = logging.getLogger(__name__)

EncodeFn = Optional[Callable[[str], str]]


def encode_constraint(text: str, encode_fn: EncodeFn, dictionary) -> Tuple[Tensor, List[str]]:
    """Token ids of one constraint, and its words missing from ``dictionary``.

    ``encode_fn`` (tokenizer then BPE, or None for already-encoded text) is
    applied to the pieces between ``___`` gaps, so a gap survives any
    tokenizer; each gap becomes ``dictionary.pad()``."""
    pieces = _encoded_pieces(text, encode_fn, dictionary)
    ids: List[int] = []
    for i, piece in enumerate(pieces):
        ids.extend([dictionary.pad()] * (i > 0) + [dictionary.index(w) for w in piece.split()])
    return torch.tensor(ids, dtype=torch.long), _unknown(pieces, dictionary)


def _encoded_pieces(text: str, encode_fn: EncodeFn, dictionary) -> List[str]:
    """The pieces of a constraint between its ``___`` gaps, each refused if it holds a special symbol, then
    encoded by ``encode_fn`` (None: as given)."""
    pieces = _GAP_SPLIT.split(text.strip())
    for piece in pieces:
        _refuse_special_symbols(piece, dictionary, text)
    return [encode_fn(p.strip()) if encode_fn is not None and p.strip() else p.strip() for p in pieces]


def _unknown(pieces: Sequence[str], dictionary) -> List[str]:
    """The words of ``pieces`` missing from ``dictionary``."""
    unk = dictionary.unk()
    return [w for p in pieces for w in p.split() if dictionary.index(w) == unk and w != dictionary.unk_word]


def encode_constraints(fields: Sequence[str], encode_fn: EncodeFn, dictionary, line: str) -> List[Tensor]:
    """Encode one line's constraints; warn naming ``line`` and any unknown words. A special symbol
    (``</s>``, ``<s>``, ``<pad>``) in a constraint is an error naming ``line`` and the constraint."""
    out = []
    for text in fields:
        try:
            ids, unknown = encode_constraint(text, encode_fn, dictionary)
        except SpecialSymbolError as e:
            raise SpecialSymbolError(f"{line}: {e}") from None
        if unknown:
            logger.warning("%s: constraint %r holds %d word(s) not in the target dictionary, read as <unk>: %s",
                           line, text, len(unknown), " ".join(repr(w) for w in unknown))
        out.append(ids)
    return out


class SpecialSymbolError(InsertionError):
    """A constraint holding one of the dictionary's special symbols (``</s>``, ``<s>``, ``<pad>``)."""


def _refuse_special_symbols(text: str, dictionary, constraint: str) -> None:
    """``text``, a piece of ``constraint`` between gaps, must hold no special symbol: an end- or
    begin-of-sentence token on the canvas would end or break the sentence, and ``<pad>`` is the gap."""
    special = (dictionary.eos_word, dictionary.bos_word, dictionary.pad_word)
    found = [w for w in text.split() if w in special]
    if found:
        raise SpecialSymbolError(f"constraint {constraint!r} holds the special symbol(s) {' '.join(found)}; "
                                 f"a constraint is words of the target text (a template gap is {GAP})")


class ConstraintsFile:
    """``--constraints-file``: the constraints of every sentence id of the test set, one line per sentence,
    separated by tabs (an empty line: none; an invalid UTF-8 byte read as U+FFFD, with a warning)."""

    def __init__(self, path: str):
        self.path = path
        self.lines = [[c for c in line.split("\t") if c.strip()] if line.strip() else []
                      for line in read_text_lines(path, "--constraints-file")]

    def check_sentences(self, num_sentences: Dict[str, int]) -> None:
        """Raise unless one of the loaded test sets (sentences per split) has one sentence per line."""
        path = self.path
        if not num_sentences:
            raise ValueError(f"--constraints-file {path}: it is for fairseq-generate (constraints of a binarised "
                             "test set); in fairseq-interactive give constraints after tabs with --constraints")
        if len(self.lines) not in num_sentences.values():
            sizes = ", ".join(f"{split}: {n}" for split, n in num_sentences.items())
            raise ValueError(f"--constraints-file {path} has {len(self.lines)} lines, but the test set has "
                             f"a different number of sentences ({sizes}); give one line per sentence")

    def packed(self, ids: Sequence[int], encode_fn: EncodeFn, dictionary) -> Tensor:
        """Packed constraints (B, C) for the sentence ``ids`` of one batch."""
        return pack_constraints([
            encode_constraints(self.lines[i], encode_fn, dictionary, f"sentence {i} ({self.path} line {i + 1})")
            for i in ids])


class TextEncoders:
    """The tokenizer and BPE that fairseq built through the task (``build_tokenizer``/``build_bpe``), raw;
    None where not configured (the text is then already tokenised). Owned by the task, which encodes
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
    gaps survive encoding, and names constraint words missing from the target dictionary.

    fairseq-interactive builds one encode function from what the task's
    ``build_tokenizer``/``build_bpe`` return, and passes it both the
    constraints and the source lines; the task encodes source lines with the
    raw encoders itself (``get_interactive_tokens_and_lengths``), so
    ``encode`` here only ever sees constraints. ``last`` marks the encoder
    applied last (BPE): it turns gaps into ``<pad>`` (which the dictionary
    maps to the gap index) and checks the words."""

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
