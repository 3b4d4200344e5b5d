"""The insertion decoding loop, written once for both backends (paper: "Inference").

Everything after the model's scores lives here, one concern a module, in this order (each imports only
those before it): :mod:`.ops` (the arrays of a backend: :class:`Ops`, :data:`NUMPY`), :mod:`.geometry`
(framed canvases, slots, how insertions move every per-token array), :mod:`.bans` (what the slot rules
bar), :mod:`.starts` (where a decode starts, length limits), :mod:`.state` (the typed state),
:mod:`.steps` (the step rules, :class:`DecodeOptions`, :class:`Bounds`), :mod:`.rules` (the slot rules, one
object each: :data:`RULES`, the pass graph's inputs :data:`FEEDS`) and :mod:`.driver` (the loop
:func:`run` and :func:`decode` over a :class:`Backend`: ``score_slots``, ``reorder``, ``score_candidates``).

The code uses only what numpy arrays and torch tensors share; the rest goes through ``Ops``, with one host
round trip a pass. A canvas of k tokens has k + 1 slots; slot l sits just before canvas token l; framed
canvases are ``[bos] canvas [eos]``, right-padded: slot l lies between columns l and l + 1. Imports numpy,
the standard library and :mod:`fairseq_insertion.config` only.
"""

from .bans import repeated_tokens, repeats_a_token, word_edge_bans, word_edge_slots, word_edge_table
from .driver import (
    Backend,
    Decoded,
    SlotChoice,
    candidate_scores,
    candidate_targets,
    decode,
    new_stats,
    predict,
    run,
    tally,
)
from .geometry import closed_slots, frame, gather_canvas, insertion_destinations, place, slot_mask
from .ops import NEG_INF, NUMPY, Ops
from .rules import FEEDS, RULES, SlotInputs, shortlist_positions, some_slots
from .starts import Start, constraint_canvas, length_limit, length_limits, pack
from .state import Canvases, Insertions, SlotScores, open_slots
from .steps import Bounds, DecodeOptions, ParallelStep

__all__ = ["Backend", "Bounds", "Canvases", "DecodeOptions", "Decoded", "FEEDS", "Insertions", "NEG_INF", "NUMPY",
           "Ops", "ParallelStep", "RULES", "SlotChoice", "SlotInputs", "SlotScores", "Start",
           "candidate_scores", "candidate_targets", "closed_slots", "constraint_canvas", "decode", "frame",
           "gather_canvas", "insertion_destinations", "length_limit", "length_limits", "new_stats", "open_slots",
           "pack", "place", "predict", "repeated_tokens", "repeats_a_token", "run", "shortlist_positions", "slot_mask",
           "some_slots", "tally", "word_edge_bans", "word_edge_slots", "word_edge_table"]
