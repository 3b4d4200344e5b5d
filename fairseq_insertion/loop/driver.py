"""The loop (:func:`run`: predict, choose, insert, stop, finished sentences leaving the batch) and the decode driver
(:func:`decode`: first insertions, candidate rows, the initial state, the loop, the candidates' scores and order),
over a :class:`Backend`'s three calls."""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Protocol, Tuple

import numpy as np

from .geometry import frame, insertion_destinations, place, slot_mask
from .ops import Array, Ops
from .rules import SlotInputs, slot_inputs
from .starts import Start, arrange_constraints, first_insertions
from .state import Canvases, Insertions, SlotScores, open_slots, slot_scores, start_state
from .steps import DecodeOptions, step_rule


class SlotChoice(NamedTuple):
    """A backend's answer for one pass's open slots (N of them, row-major), the slot rule applied
    (:func:`fairseq_insertion.slots.choose`)."""

    tokens: Array  # (N, k) each open slot's k best tokens, best first
    log_probs: Array  # (N, k) their log p(c | l)
    eos_log_probs: Array  # (N, 1) log p(eos | l)
    location: Array  # (A, S) log p(l) of every slot, -inf at padding
    ends: Optional[Array] = None  # (N,) the look-ahead closure: the next pass closes every slot this one leaves
    end_log_probs: Optional[Array] = None  # (N,) its log-probability of that; None (both): no look-ahead
    memory: Any = None  # an incremental backend's memory after the pass (the new tokens' states); None: unchanged


class Backend(Protocol):
    """The model's side of the loop: its arrays (:class:`~fairseq_insertion.loop.ops.Ops`) and three calls.
    ``incremental``: the memory keeps the canvas tokens' states between passes, and a pass reads the ``fresh``
    tokens alone (those inserted since the last pass, or on the canvas at the start)."""

    xp: Ops
    incremental: bool

    def score_slots(self, memory: Any, framed: Array, open_: Array, inputs: SlotInputs, k: int,
                    fresh: Optional[Array] = None) -> SlotChoice:
        """One pass of the model over the canvases ``framed`` (A, S + 1) of the sentences whose encoder side is
        ``memory``: the slot rule's k best tokens of each open slot (``open_`` (A, S)) given its ``inputs``.
        ``fresh`` (A, S + 1): an incremental backend's, the columns not yet in its memory (None: otherwise);
        its new memory is returned in :attr:`SlotChoice.memory`."""

    def reorder(self, memory: Any, keep: Array) -> Any:
        """The memory of the rows ``keep`` (N,), in that order."""

    def score_candidates(self, tokens: Array, lengths: Array, per_source: int) -> Optional[Array]:
        """(B n,) a scorer's log-probability of each candidate (its first ``lengths`` of ``tokens`` (B n, W) and
        the end), sentence b's at rows b n ... b n + n - 1; None without a scorer."""


def predict(backend: Backend, state: Canvases, memory: Any, options: DecodeOptions) -> Tuple[SlotScores, Any]:
    """One pass's :class:`SlotScores` (:func:`slot_inputs`, :meth:`Backend.score_slots`, :func:`slot_scores`) and the
    memory after the pass."""
    xp, o = backend.xp, options
    framed = frame(xp, state.tokens, state.lengths, o.bos, o.eos, o.pad)  # (A, K + 2)
    open_ = open_slots(xp, state, state.tokens.shape[1] + 1)  # (A, S)
    inputs = slot_inputs(xp, state, framed, open_, options)
    fresh = None if state.fresh is None else frame(xp, xp.long(state.fresh), state.lengths, 0, 0, 0) == 1
    c = backend.score_slots(memory, framed, open_, inputs, 1, fresh)  # (N, 1) each, (A, S)
    return slot_scores(xp, open_, c.tokens[:, 0], c.log_probs[:, 0], c.eos_log_probs[:, 0], c.location, o.eos,
                       options.sequence, c.ends, c.end_log_probs), memory if c.memory is None else c.memory


def first_tokens(backend: Backend, memory: Any, k: int, options: DecodeOptions, max_len: Array,
                 shortlist: Optional[Array]) -> Tuple[Array, Array]:
    """The k best first insertions of each sentence (:func:`first_insertions`), best first (B, k), and their
    log p(c | l) (B, k): one pass over the empty canvases, every slot rule applied and unk and end-of-slot barred
    besides (with a shortlist, unk's position in each list is its id: the specials lead every list); ``max_len`` (B,)
    the length limits; ``shortlist`` (B, L): each sentence's, or None."""
    xp, o = backend.xp, options
    state = start_state(xp, Start.blank(xp, max_len.shape[0], max_len, o.pad), max_len, None, False, False,
                        shortlist=shortlist)
    framed = frame(xp, state.tokens, state.lengths, o.bos, o.eos, o.pad)  # (B, 2) the empty canvases
    open_ = framed[:, :1] == framed[:, :1]  # (B, 1)
    inputs = slot_inputs(xp, state, framed, open_, options)
    unk = xp.full((framed.shape[0], 1), o.unk, like=state.lengths)  # (B, 1)
    blocked = unk if inputs.blocked is None else xp.concat([inputs.blocked, unk], 1)
    c = backend.score_slots(memory, framed, open_, inputs._replace(blocked=blocked, no_end=unk[:, 0] == unk[:, 0]), k)
    return c.tokens, c.log_probs


class Pass(NamedTuple):
    """The state after one pass's insertions, and which rows go on."""

    state: Canvases
    keep: Array  # (A,)
    n_keep: int
    kept_width: int  # the longest kept canvas
    positions: int  # the decoder positions the pass ran, unpadded: the framed canvases' (incremental: the fresh tokens)
    canvas: int  # the framed canvases' positions, unpadded (what a recomputed layer reads)


class Work(NamedTuple):
    """What a decode ran: batched decoder passes, passes of one sentence, decoder positions (unpadded: each pass's
    framed canvases; an incremental backend's fresh tokens, and bos and eos once a sentence), framed canvas ones."""

    passes: int = 0
    sentence_passes: int = 0
    positions: int = 0
    canvas: int = 0

    def __add__(self, other: "Work") -> "Work":  # type: ignore[override]
        return Work(*(a + b for a, b in zip(self, other)))


def run(backend: Backend, state: Canvases, memory: Any, options: DecodeOptions,
        record: Optional[Callable[[Canvases, Array], None]] = None) -> Tuple[Canvases, Work]:
    """The insertion loop from ``state``: predict, choose, insert, stop, with finished sentences leaving
    the batch. Closed slots never receive an insertion and count as finished. ``record(state,
    inserted)``: called after every pass (the canvases' history). Returns the final canvases of every
    row, in batch order, and the passes run (:class:`Work`)."""
    xp = backend.xp
    B, K = state.tokens.shape
    start = (state.max_len > state.lengths) & open_slots(xp, state, K + 1).any(1)  # (B,) rows taking a first pass
    rooms = (state.max_len - state.lengths).clip(min=0)  # (B,) tokens each may still take
    width, room, n_active, started_width = xp.host(
        state.max_len.max(), rooms.max(), start.sum(), (state.lengths * start).max()) if B else (0, 0, 0, 0)
    out = state.widened(xp, max(width, K), options.pad)  # the result, filled in as sentences finish
    max_iter, cap = options.config.max_iterations or room, options.config.max_per_pass
    rule = step_rule(xp, options.config.decoding, options.termination, options.eos)
    state, memory = _keep(backend, state, memory, start, n_active, started_width)
    work = Work()
    for _ in range(max_iter + 1):
        if n_active == 0:
            break
        scores, memory = predict(backend, state, memory, options)
        left = state.max_len - state.lengths  # (A,)
        choice = rule(scores, left.clip(max=cap) if cap else left)
        after = step(xp, state, scores, choice, max_iter, options)
        work = work + Work(1, n_active, after.positions, after.canvas)
        if record is not None:
            record(after.state, after.state.lengths > state.lengths)  # the rows that inserted a token
        state = after.state
        if after.n_keep < n_active:
            out.store(state.take(xp.argsort(xp.long(after.keep))[:n_active - after.n_keep]))  # the finished
            state, memory = _keep(backend, state, memory, after.keep, after.n_keep, after.kept_width)
        n_active = after.n_keep
    if n_active:
        out.store(state)
    return out, work


def step(xp: Ops, state: Canvases, scores: SlotScores, choice: Insertions, max_iter: int, options: DecodeOptions
         ) -> Pass:
    """Apply one step's insertions to every per-token array; say which sentences go on (the pass's one host round trip):
    those that inserted something, are below their length limit and their iteration bound."""
    new_len = state.lengths + choice.mask.sum(1)  # (A,)
    inserted = choice.mask.any(1)
    iterations = state.iterations + xp.long(inserted)
    keep = inserted & (new_len < state.max_len) & (iterations < max_iter)
    final_eos = scores.final_eos
    if scores.ends is not None and options.look_ahead and state.given is None:
        keep, final_eos = _look_ahead(xp, scores, choice, keep, new_len, options)
    canvas = state.lengths.sum() + 2 * len(state.lengths)
    width, n_keep, kept_width, canvas, positions = xp.host(new_len.max(), keep.sum(), (new_len * keep).max(), canvas,
                                                           canvas if state.fresh is None else state.fresh.sum())
    K = state.tokens.shape[1]
    dest = insertion_destinations(xp, state.lengths, choice.mask, K, width)  # (A, K+S)
    closed_before, closed_end = state.closed_before, state.closed_end
    none = choice.mask & False  # (A, S) no slot value: a new token opens the slots on both its sides
    if options.close_ended:  # the slots that chose end-of-slot close; slot l < k is the one before token l
        ended = scores.open & (scores.tokens == options.eos)  # (A, S)
        closed_end = closed_end | xp.gather(ended, state.lengths[:, None])[:, 0]
        closed_before = closed_before | (ended[:, :K] & slot_mask(xp, state.lengths - 1, K))
    new = state._replace(
        tokens=place(xp, dest, state.tokens, choice.tokens, width, options.pad),
        scores=place(xp, dest, state.scores, choice.log_probs + scores.location, width, 0.0),  # log p(c, l)
        closed_before=None if closed_before is None else place(xp, dest, closed_before, none, width, False),
        given=None if state.given is None else place(xp, dest, state.given, none, width, False),
        fresh=None if state.fresh is None else place(xp, dest, state.fresh & False, choice.mask, width, False),
        closed_end=closed_end, lengths=new_len, iterations=iterations, final_eos=final_eos)
    return Pass(state=new, keep=keep, n_keep=n_keep, kept_width=kept_width, positions=positions, canvas=canvas)


def _look_ahead(xp: Ops, scores: SlotScores, choice: Insertions, keep: Array, new_len: Array, options: DecodeOptions
                ) -> Tuple[Array, Array]:
    """The look-ahead closure in a parallel step: the rows ``keep`` (A,) whose every open slot it says the next pass
    closes (the two beside a token inserted, a slot that chose end-of-slot itself) end now, without that pass; their
    final end-of-slot decisions are scored by the head with a uniform log p(l) over the new canvas's slots (the
    pass that would give the model's is not run). Returns the rows that go on and each row's ``final_eos``."""
    at_end = scores.open & (scores.tokens == options.eos)  # (A, S)
    closes = scores.ends & (choice.mask | at_end)  # (A, S)
    done = keep & (closes | ~scores.open).all(1)  # (A,)
    slots = xp.cast(2 * choice.mask.sum(1) + at_end.sum(1), like=scores.final_eos)  # (A,) the slots it closes
    guess = xp.where(closes, scores.end_log_probs, 0.0).sum(1) - slots * xp.log(xp.cast(new_len + 1, like=slots))
    return keep & ~done, xp.where(done, guess, scores.final_eos)


def _keep(backend: Backend, state: Canvases, memory: Any, keep: Array, n_keep: int, width: int) -> Tuple[Canvases, Any]:
    """The rows ``keep`` (A,) of the state and of the memory (``n_keep`` of them), longest canvas first (a backend
    may then run the longer and the shorter rows of a pass apart, with less padding), the canvases trimmed to
    ``width``, the longest kept one (so a single canvas has no padding)."""
    if n_keep == len(keep):
        return state, memory
    xp = backend.xp
    idx = xp.argsort(xp.where(keep, state.lengths + 1, 0), descending=True)[:n_keep]  # kept rows, longest first
    return state.take(idx).trimmed(width), backend.reorder(memory, idx)


def candidate_scores(log_prob: Array, lengths: Array, lenpen: float, teacher: Optional[Array] = None,
                     weight: float = 0.0) -> Array:
    """(R,) each candidate's score, by which its sentence's candidates are ordered: the decode's log-probability
    ``log_prob`` (R,) / (n + 1) ** lenpen, its n tokens and the end; with a scorer's log-probabilities ``teacher`` (R,)
    (the end included), the scorer's / (n + 1) ** lenpen + ``weight`` x the decode's (``--rerank-weight``)."""
    norm = (lengths + 1) ** lenpen  # (R,)
    return log_prob / norm if teacher is None else (teacher + weight * log_prob) / norm


def candidate_targets(xp: Ops, tokens: Array, lengths: Array, eos: int, pad: int) -> Array:
    """(R, W) each candidate as a scorer reads it: its first ``lengths`` (R,) of ``tokens`` (R, K), the end, then
    ``pad``; W the longest plus one."""
    W = xp.host(lengths.max())[0] + 1
    target = xp.full((tokens.shape[0], W), pad, like=tokens)
    width = min(W, tokens.shape[1])
    target[:, :width] = tokens[:, :width]
    columns = xp.arange(W, like=lengths)[None, :]
    return xp.where(columns < lengths[:, None], target, xp.where(columns == lengths[:, None], eos, pad))


class Decoded(NamedTuple):
    """Every candidate of a batch's decode: rows (b K + j) n / K + c (:func:`decode`)."""

    canvases: Canvases  # (B n rows) the final canvases, their history with ``record``
    log_prob: Array  # (B n,) the decode's log-probability: its tokens' log p(c, l) and the final end-of-slot
    teacher: Optional[Array]  # (B n,) the scorer's log-probability, when the backend has a scorer
    score: Array  # (B n,) the ordering score (:func:`candidate_scores`)
    order: Array  # (B, n) each sentence's candidates, best first (indices within the sentence)
    passes: int  # forward passes, the first insertions' included
    sentence_passes: int = 0  # passes of one sentence (a batched pass counts its rows), the first insertions' included
    positions: int = 0  # decoder positions the passes ran, and the framed canvases' (:class:`Work`)
    canvas: int = 0


def decode(backend: Backend, memory: Any, start: Start, max_len: Array, options: DecodeOptions,
           record: Optional[Callable[[Canvases, Array], None]] = None, shortlist: Optional[Array] = None) -> Decoded:
    """Decode a batch of B sentences, for any backend: ``memory`` their encoder side, ``start`` (B rows) the
    empty canvases or their constraints, ``max_len`` (B,) their length limits (both from
    :func:`~fairseq_insertion.loop.starts.prepare`), ``options`` the decoding options and the dictionary's ids. With
    ``first_insertions`` K > 1 each sentence branches from its K best first insertions, and with several
    ``eos_penalties`` each start is decoded under each penalty, as rows of one batch (each source encoded once).
    With ``constraint_order="unordered"`` the constraints are put in order once an unconstrained decode of every
    row is known (:func:`arrange_constraints`). ``shortlist`` (B, L): the tokens each sentence's slots may receive
    (:func:`fairseq_insertion.slots.shortlist_rows`; None: the whole vocabulary)."""
    xp, config, pad = backend.xp, options.config, options.pad
    B, betas, K, n = max_len.shape[0], config.betas, config.first_insertions, config.candidates
    # an incremental backend's memory starts with bos's and eos's states, the first insertions' pass runs no token
    first_scores, work = None, Work(positions=2 * B if backend.incremental else 0)
    if K > 1:
        tokens, log_probs = first_tokens(backend, memory, K, options, max_len, shortlist)  # (B, K) each
        start, first_scores = first_insertions(xp, tokens, log_probs, max_len > 0, pad)
        work = work + Work(1, B, 0 if backend.incremental else 2 * B, 2 * B)
    if n > 1:  # row (b K + j) n / K + c: sentence b's j-th first insertion (of K) under its c-th EOS penalty
        rows = xp.arange(B * n, like=max_len)  # (B n,)
        sentence, start_row = rows // n, rows // len(betas)  # (B n,) each: its sentence b and start row (b or b K + j)
        memory, start, max_len = backend.reorder(memory, sentence), start.take(start_row), max_len[sentence]
        shortlist = None if shortlist is None else shortlist[sentence]
        first_scores = None if first_scores is None else first_scores[start_row]
    eos_penalty = xp.asarray(np.tile(np.asarray(betas, np.float32), B * K), like=max_len) if len(betas) > 1 \
        else None  # (B n,) each row's beta; None: the one beta
    given = start.tokens.shape[1] > 0 and first_scores is None  # constraints on the canvas
    if config.constraint_order == "unordered" and given:
        blank = Start.blank(xp, B * n, start.lengths, pad)
        unconstrained, more = run(backend, start_state(xp, blank, max_len, eos_penalty, False, options.close_ended,
                                                    shortlist=shortlist, fresh=backend.incremental), memory, options)
        start = arrange_constraints(xp, start, unconstrained.tokens, unconstrained.lengths)
        work = work + more
    state = start_state(xp, start, max_len, eos_penalty, given and options.joins_next is not None,
                        options.close_ended or given, first_scores, record is not None, shortlist, backend.incremental)
    out, more = run(backend, state, memory, options, record)
    work = work + more
    real = xp.arange(out.tokens.shape[1], like=out.lengths)[None, :] < out.lengths[:, None]  # (B n, W)
    log_prob = xp.where(real, out.scores, 0.0).sum(1) + out.final_eos  # (B n,)
    teacher = backend.score_candidates(out.tokens, out.lengths, n) if n > 1 else None
    score = candidate_scores(log_prob, xp.cast(out.lengths, like=log_prob), config.lenpen, teacher,
                             config.rerank_weight)  # (B n,)
    order = xp.argsort(score.reshape(-1, n), descending=True)  # (B, n) the best first; ties: the lower EOS penalty
    return Decoded(canvases=out, log_prob=log_prob, teacher=teacher, score=score, order=order, passes=work.passes,
                   sentence_passes=work.sentence_passes, positions=work.positions, canvas=work.canvas)


def new_stats() -> Dict[str, int]:
    """The counts both front ends keep since they were made (:func:`tally`): sentences, batches, batched passes (no
    encoder), passes of one sentence, decoder and framed canvas positions (:class:`Work`), iterations (steps that
    inserted), floor(log2 n)+1 of each output's length n (the paper's bound on them), output tokens."""
    return dict.fromkeys(("sentences", "batches", "passes", "sentence_passes", "positions", "canvas", "iterations",
                          "log2_bound", "tokens"), 0)


def tally(stats: Dict[str, int], found: Decoded) -> None:
    """Add a batch's decode to ``stats`` (:func:`new_stats`): each sentence's best candidate counted."""
    B, n = found.order.shape
    best = np.asarray((found.order[:, 0] + n * np.arange(B)).tolist() if B else [], np.int64)  # (B,) their rows
    lengths = np.asarray(found.canvases.lengths.tolist(), np.int64)[best]  # (B,)
    bound = np.where(lengths > 0, np.floor(np.log2(np.maximum(lengths, 1))) + 1, 0)  # (B,)
    counts = {"sentences": B, "batches": 1, "passes": found.passes, "sentence_passes": found.sentence_passes,
              "positions": found.positions, "canvas": found.canvas, "tokens": int(lengths.sum()),
              "iterations": int(np.asarray(found.canvases.iterations.tolist(), np.int64)[best].sum()),
              "log2_bound": int(bound.sum())}
    for key, value in counts.items():
        stats[key] += value
