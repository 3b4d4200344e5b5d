"""Hard lexical constraints and templates: reading and encoding them for
fairseq-generate (``--constraints-file``), fairseq-interactive
(``--constraints``, tab-separated) and the hub interface
(``translate(..., constraints=[...])``).

A constraint is a word sequence that must appear verbatim, contiguous and in
order in the output; the decoder (:mod:`fairseq_insertion.generator`) puts it
on the initial canvas. The word ``___`` inside a constraint marks an open slot
(a template gap); it is encoded as the target dictionary's pad index, which no
real constraint token can be.
"""

import logging
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.token_generation_constraints import pack_constraints
from torch import Tensor

logger = logging.getLogger(__name__)

GAP = "___"
_GAP_SPLIT = re.compile(r"(?<!\S)___(?!\S)")  # ___ as a whole whitespace-delimited word

EncodeFn = Optional[Callable[[str], str]]


def encode_constraint(text: str, encode_fn: EncodeFn, dictionary) -> Tuple[Tensor, List[str]]:
    """Token ids of one constraint, and its words missing from ``dictionary``.

    ``encode_fn`` (tokenizer then BPE, or None for already-encoded text) is
    applied to the pieces between ``___`` gaps, so a gap survives any
    tokenizer; each gap becomes ``dictionary.pad()``."""
    ids: List[int] = []
    unknown: List[str] = []
    pieces = _GAP_SPLIT.split(text.strip())
    for i, piece in enumerate(pieces):
        words = (encode_fn(piece.strip()) if encode_fn is not None and piece.strip() else piece).split()
        for w in words:
            idx = dictionary.index(w)
            ids.append(idx)
            if idx == dictionary.unk() and w != dictionary.unk_word:
                unknown.append(w)
        if i < len(pieces) - 1:
            ids.append(dictionary.pad())
    return torch.tensor(ids, dtype=torch.long), unknown


def encode_constraints(fields: Sequence[str], encode_fn: EncodeFn, dictionary, line: str) -> List[Tensor]:
    """Encode one line's constraints; warn naming ``line`` and any unknown words."""
    out = []
    for text in fields:
        ids, unknown = encode_constraint(text, encode_fn, dictionary)
        if unknown:
            _warn_unknown(line, text, unknown)
        out.append(ids)
    return out


def _warn_unknown(line: str, text: str, unknown: List[str]) -> None:
    logger.warning("%s: constraint %r holds %d word(s) not in the target dictionary, read as <unk>: %s",
                   line, text, len(unknown), " ".join(repr(w) for w in unknown))


def read_constraints_file(path: str) -> List[List[str]]:
    """One line per test sentence, constraints separated by tabs (an empty line: none)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [[c for c in line.rstrip("\r").split("\t") if c.strip()] if line.strip() else [] for line in lines]


class ConstraintsFile:
    """``--constraints-file``: the constraints of every sentence id of the test set."""

    def __init__(self, path: str, num_sentences: Dict[str, int]):
        self.path = path
        self.lines = read_constraints_file(path)
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


class ConstraintEncoder:
    """Wraps a tokenizer or BPE (or nothing) for fairseq-interactive's
    ``--constraints`` so that ``___`` gaps survive encoding, and names
    constraint words missing from the target dictionary.

    fairseq-interactive encodes sources and constraints with the same
    function; the task sets ``encoding_source`` while it encodes sources, and
    then this passes text straight to the wrapped encoder. ``last`` marks the
    encoder applied last (BPE): it turns gaps into ``<pad>`` (which the
    dictionary maps to the gap index) and checks the words."""

    def __init__(self, inner, dictionary, last: bool, state: Dict[str, bool]):
        self.inner, self.dictionary, self.last, self.state = inner, dictionary, last, state

    def encode(self, x: str) -> str:
        if self.state.get("encoding_source"):
            return self.inner.encode(x) if self.inner is not None else x
        pieces = [self.inner.encode(p.strip()) if self.inner is not None and p.strip() else p.strip()
                  for p in _GAP_SPLIT.split(x.strip())]
        if not self.last:
            return f" {GAP} ".join(pieces)
        unknown = [w for p in pieces for w in p.split() if self.dictionary.index(w) == self.dictionary.unk()
                   and w != self.dictionary.unk_word]
        if unknown:
            _warn_unknown("fairseq-interactive", x, unknown)
        return f" {self.dictionary.pad_word} ".join(pieces)

    def decode(self, x: str) -> str:
        return self.inner.decode(x) if self.inner is not None else x

    def __getattr__(self, name):  # anything else fairseq asks of the wrapped encoder
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


class InsertionHubInterface(GeneratorHubInterface):
    """fairseq's hub interface, plus hard constraints and templates.

    ``translate(sentence, constraints=["word a", "b"])``, or for a list of
    sentences one list of constraints each. Constraints are plain text,
    encoded with the hub's tokenizer and BPE like the target; ``___`` marks a
    template gap. ``constraint_order="unordered"`` lets the decoder choose
    the order (see :class:`fairseq_insertion.generator.InsertionGenerator`).
    """

    _packed: Optional[Tensor] = None

    @classmethod
    def from_hub(cls, hub: GeneratorHubInterface) -> "InsertionHubInterface":
        """The same models, task and configuration, with constraint support."""
        return cls(hub.cfg, hub.task, list(hub.models))

    def sample(self, sentences: Union[str, List[str]], beam: int = 1, verbose: bool = False,
               constraints: Optional[Union[List[str], List[List[str]]]] = None,
               constraint_order: str = "ordered", **kwargs):
        if isinstance(sentences, str):
            batch = [constraints] if constraints is not None else None
            return self.sample([sentences], beam, verbose, constraints=batch, constraint_order=constraint_order,
                               **kwargs)[0]
        if constraints is None:
            return super().sample(sentences, beam, verbose, **kwargs)
        if len(constraints) != len(sentences) or any(isinstance(c, str) for c in constraints):
            raise ValueError(f"constraints: give one list of strings per sentence ({len(sentences)} sentences); "
                             f"got {constraints!r}")

        def encode_fn(x: str) -> str:
            return self.apply_bpe(self.tokenize(x))

        self._packed = pack_constraints([
            encode_constraints(cs, encode_fn, self.tgt_dict, f"sentence {i} ({s!r})")
            for i, (s, cs) in enumerate(zip(sentences, constraints))])
        try:
            return super().sample(sentences, beam, verbose, constraints=constraint_order, **kwargs)
        finally:
            self._packed = None

    def _build_batches(self, tokens, skip_invalid_size_inputs: bool):
        if self._packed is None:
            return super()._build_batches(tokens, skip_invalid_size_inputs)
        lengths = torch.LongTensor([t.numel() for t in tokens])
        return self.task.get_batch_iterator(
            dataset=self.task.build_dataset_for_inference(tokens, lengths, constraints=self._packed),
            max_tokens=self.cfg.dataset.max_tokens,
            max_sentences=self.cfg.dataset.batch_size,
            max_positions=self.max_positions,
            ignore_invalid_inputs=skip_invalid_size_inputs,
            disable_iterator_cache=True,
        ).next_epoch_itr(shuffle=False)


def from_pretrained(model_name_or_path: str, checkpoint_file: str = "model.pt", data_name_or_path: str = ".",
                    **kwargs) -> InsertionHubInterface:
    """``InsertionTransformerModel.from_pretrained`` returning an
    :class:`InsertionHubInterface` (translate with ``constraints=``)."""
    from .model import InsertionTransformerModel

    hub = InsertionTransformerModel.from_pretrained(model_name_or_path, checkpoint_file=checkpoint_file,
                                                    data_name_or_path=data_name_or_path, **kwargs)
    return hub if isinstance(hub, InsertionHubInterface) else InsertionHubInterface.from_hub(hub)
