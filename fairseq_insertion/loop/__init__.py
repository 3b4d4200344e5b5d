"""The insertion decoding loop, written once for both backends (paper: "Inference").

Everything after the model's scores lives here, one concern a module:

* :mod:`.ops`: the arrays of a backend (:class:`Ops`; :data:`NUMPY` here, ``decoding.TORCH`` for the
  PyTorch generator);
* :mod:`.geometry`: framed canvases, slots, and how insertions move every per-token array;
* :mod:`.bans`: what the slot rules bar, on the framed canvases: repeated tokens, pieces glued onto constraints;
* :mod:`.rules`: the slot rules, one object each (:data:`RULES`): what each open slot brings to the choice of its
  token besides its scores (:class:`SlotInputs`), and the pass graph's inputs they fill (:data:`FEEDS`);
* :mod:`.starts`: where a decode starts (the empty canvas, constraints, first insertions) and length limits;
* :mod:`.state`: the typed state (:class:`Canvases`, :class:`SlotScores`, :class:`Insertions`);
* :mod:`.steps`: the step rules that choose a pass's insertions, the room cap, :class:`DecodeOptions` and
  :class:`Bounds`;
* :mod:`.driver`: the loop (:func:`run`) and the one decode driver (:func:`decode`) over a :class:`Backend`, which
  supplies three calls: ``score_slots`` (one pass of the model with the slot rule), ``reorder`` (its memory
  follows the sentences that go on) and ``score_candidates`` (an optional scorer).

The code uses only what numpy arrays and torch tensors share (operators, ``x[idx]``, slicing,
``sum``/``any``/``argmax``/``cumsum`` along an axis, ``clip``); the rest goes through ``Ops``. One
host round trip per pass (:meth:`Ops.host`): on a GPU the loop waits for the device once a pass.

A canvas of k tokens has k + 1 slots; slot l sits just before canvas token l. Framed canvases are
``[bos] canvas [eos]``, right-padded: slot l lies between columns l and l + 1.

The package imports numpy, the standard library and :mod:`fairseq_insertion.config` only (the deployment
runtime uses it).
"""

from .bans import WORD_SCHEMES, repeated_tokens, repeats_a_token, word_edge_bans, word_edge_slots, word_edge_table
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
from .ops import NEG_INF, NUMPY, Array, NumpyOps, Ops
from .rules import FEEDS, RULES, Feed, SlotInputs, first_insertion_inputs, shortlist_positions, slot_inputs
from .starts import Start, constraint_canvas, length_limit, length_limits, pack
from .state import Canvases, Insertions, SlotScores, open_slots, slot_scores, start_state
from .steps import Bounds, DecodeOptions, GreedySequenceStep, GreedySlotStep, ParallelStep, step_rule

__all__ = ["Array", "Backend", "Bounds", "Canvases", "DecodeOptions", "Decoded", "FEEDS", "Feed", "GreedySequenceStep",
           "GreedySlotStep", "Insertions", "NEG_INF", "NUMPY", "NumpyOps", "Ops", "ParallelStep", "RULES",
           "SlotChoice", "SlotInputs", "SlotScores", "Start", "WORD_SCHEMES", "candidate_scores", "candidate_targets",
           "closed_slots", "constraint_canvas", "decode", "first_insertion_inputs", "frame", "gather_canvas",
           "insertion_destinations", "length_limit", "length_limits", "new_stats", "open_slots", "pack", "place",
           "predict", "repeated_tokens", "repeats_a_token", "run", "shortlist_positions", "slot_inputs", "slot_mask",
           "slot_scores", "start_state", "step_rule", "tally", "word_edge_bans", "word_edge_slots", "word_edge_table"]
