"""The insertion decoding loop, written once for both backends (paper: "Inference").

Everything after the model's scores lives here, one concern a module (docs/development.md maps them), each importing
only those before it: :mod:`.ops`, :mod:`.geometry`, :mod:`.starts` (:func:`prepare`), :mod:`.state`, :mod:`.steps`,
:mod:`.bans`, :mod:`.rules` (:data:`FEEDS`) and :mod:`.driver` (:func:`decode` over a :class:`Backend`).

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
