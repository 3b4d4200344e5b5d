"""The step rules that choose a pass's insertions (small objects built from the options by :func:`step_rule`), the
room cap and the decode's options (:class:`DecodeOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from ..config import DecodingConfig
from .ops import NEG_INF, Array, Ops
from .state import Insertions, SlotScores


@dataclass(frozen=True)
class ParallelStep:
    """Insert the best token into every open slot whose best is not end-of-slot, at most ``room`` (A,) per canvas
    (the room cap): the highest-scoring ones; of equal scores, the leftmost slots (a stable sort)."""

    xp: Ops
    eos: int

    def __call__(self, p: SlotScores, room: Array) -> Insertions:
        xp, insert = self.xp, p.open & (p.tokens != self.eos)  # (A, S)
        if xp.might((insert.sum(1) > room).any()):
            order = xp.argsort(xp.where(insert, p.log_probs, NEG_INF), descending=True)  # (A, S)
            insert = insert & (xp.argsort(order) < room[:, None])
        return Insertions(mask=insert, tokens=p.tokens, log_probs=p.log_probs)


@dataclass(frozen=True)
class GreedySlotStep:
    """Slot finalization: the one (slot, token) with the best log p(c, l) among the slots whose best
    token is not end-of-slot."""

    xp: Ops
    eos: int

    def __call__(self, p: SlotScores, room: Array) -> Insertions:
        ok = p.open & (p.tokens != self.eos)  # (A, S)
        slot = self.xp.where(ok, p.log_probs + p.location, NEG_INF).argmax(1)  # (A,)
        return Insertions(mask=_one_hot(self.xp, slot, ok) & ok.any(1)[:, None], tokens=p.tokens, log_probs=p.log_probs)


@dataclass(frozen=True)
class GreedySequenceStep:
    """Sequence finalization: the best (slot, token) over every open slot and the whole vocabulary (each
    slot's best token is its best over the vocabulary); stop when it is end-of-sequence."""

    xp: Ops
    eos: int

    def __call__(self, p: SlotScores, room: Array) -> Insertions:
        xp = self.xp
        slot = xp.where(p.open, p.log_probs + p.location, NEG_INF).argmax(1)[:, None]  # (A, 1)
        ok = (xp.gather(p.tokens, slot) != self.eos) & xp.gather(p.open, slot)  # (A, 1)
        return Insertions(mask=_one_hot(xp, slot[:, 0], p.open) & ok, tokens=p.tokens, log_probs=p.log_probs)


def step_rule(xp: Ops, decoding: str, termination: str, eos: int) -> Callable[[SlotScores, Array], Insertions]:
    """The decoding rule: ``parallel``, or ``greedy`` with the model's training termination (``slot``
    or ``sequence`` finalization)."""
    if decoding == "parallel":
        return ParallelStep(xp, eos)
    return GreedySlotStep(xp, eos) if termination == "slot" else GreedySequenceStep(xp, eos)


def _one_hot(xp: Ops, index: Array, like: Array) -> Array:
    return xp.arange(like.shape[1], like=index)[None, :] == index[:, None]


class DecodeOptions(NamedTuple):
    """A decode's options, the model's termination and the target dictionary's ids the loop needs."""

    config: DecodingConfig
    termination: str  # the model's: slot or sequence finalization
    bos: int
    eos: int
    pad: int
    unk: int
    joins_next: Optional[Array] = None  # (V,) the pieces that join the next token, where the dictionary marks word
    # edges (constraints then stay whole words); None where it does not

    @property
    def close_ended(self) -> bool:
        """A slot that chose end-of-slot stays closed (``close_ended_slots``; slot finalization only)."""
        return self.config.close_ended_slots and self.termination == "slot"

    @property
    def sequence(self) -> bool:
        """Greedy sequence finalization: end-of-sequence is the best (slot, eos) of a canvas."""
        return self.config.decoding == "greedy" and self.termination == "sequence"

    @property
    def look_ahead(self) -> bool:
        """A parallel decode: a model's look-ahead closure may end a sentence a pass early."""
        return self.config.decoding == "parallel"
