"""The insertion decoding loop, written once for both backends (paper: "Inference").

Everything after the model's scores lives here, one concern a module, in this order (each imports only
those before it): :mod:`.ops` (the arrays of a backend: :class:`Ops`, :data:`NUMPY`), :mod:`.geometry`
(framed canvases, slots, how insertions move every per-token array), :mod:`.bans` (what the slot rules
bar), :mod:`.starts` (where a decode starts: :func:`prepare`), :mod:`.state` (the typed state),
:mod:`.steps` (the step rules, :class:`DecodeOptions`), :mod:`.rules` (the slot rules, one
object each: :data:`RULES`, the pass graph's inputs :data:`FEEDS`) and :mod:`.driver` (the loop
:func:`run` and :func:`decode` over a :class:`Backend`: ``score_slots``, ``reorder``, ``score_candidates``).

The code uses only what numpy arrays and torch tensors share; the rest goes through ``Ops``, with one host
round trip a pass. A canvas of k tokens has k + 1 slots; slot l sits just before canvas token l; framed
canvases are ``[bos] canvas [eos]``, right-padded: slot l lies between columns l and l + 1. Imports numpy,
the standard library and :mod:`fairseq_insertion.config` only.
"""

from .bans import word_edge_table
from .driver import Backend, Decoded, SlotChoice, candidate_scores, candidate_targets, decode, new_stats, tally
from .geometry import frame, gather_canvas, slot_mask
from .ops import NEG_INF, NUMPY, Ops
from .rules import FEEDS, SlotInputs, some_slots
from .starts import Prepared, Start, constraint_canvas, pack, prepare
from .state import Canvases
from .steps import DecodeOptions

__all__ = ["Backend", "Canvases", "DecodeOptions", "Decoded", "FEEDS", "NEG_INF", "NUMPY", "Ops", "Prepared",
           "SlotChoice", "SlotInputs", "Start", "candidate_scores", "candidate_targets", "constraint_canvas", "decode",
           "frame", "gather_canvas", "new_stats", "pack", "prepare", "slot_mask", "some_slots", "tally",
           "word_edge_table"]
