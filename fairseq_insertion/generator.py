"""Greedy and parallel insertion decoding (paper: "Inference").

The loop starts from the empty canvas ``[bos, eos]`` (or, with hard
constraints, from a canvas that holds them, with the slots inside a constraint
closed: see :func:`canvas.constraint_canvas`) and repeats one step per pass:

* predict: the model scores the open slots of every active canvas
  (:meth:`InsertionGenerator._predict`), reusing the encoder's keys and values;
* choose: one decoding rule picks the insertions (:func:`parallel_step`,
  :func:`greedy_slot_step`, :func:`greedy_sequence_step`), chosen once;
* insert: :func:`canvas.insertion_destinations` moves every per-token tensor at once;
* stop: a sentence leaves the batch when no slot inserts anything (every open
  slot picks end-of-slot), when its canvas reaches the length limit, or after
  the iteration bound.

An *iteration* is a step that inserted at least one token (the paper's count:
a perfect binary-tree decode of n tokens takes floor(log2 n) + 1 of them); the
final pass that only finds end-of-slot is counted separately as a forward pass.
"""

from __future__ import annotations

import atexit
import logging
import math
from typing import Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import torch
from torch import Tensor

from . import canvas as C

logger = logging.getLogger(__name__)

DECODINGS = ("parallel", "greedy")
CONSTRAINT_ORDERS = ("ordered", "unordered")


class Canvases(NamedTuple):
    """The decoding state: one row per sentence (the active ones inside the loop)."""

    rows: Tensor  # (A,) index of each sentence in the batch
    tokens: Tensor  # (A, K) canvas tokens, pad after each length
    scores: Tensor  # (A, K) log p(c, l) of each inserted token when inserted; 0 for constraint tokens
    closed_before: Tensor  # (A, K) the slot just before token j is closed
    closed_end: Tensor  # (A,) the last slot is closed
    lengths: Tensor  # (A,)
    iterations: Tensor  # (A,) steps that inserted at least one token
    final_eos: Tensor  # (A,) the latest pass's end-of-slot decisions: sum of their log p(eos, l)
    max_len: Tensor  # (A,) length limit
    eos_penalty: Tensor  # (A,) beta of each row (several per sentence with --eos-penalties)

    def take(self, idx: Tensor) -> "Canvases":
        return Canvases(*(t.index_select(0, idx) for t in self))


class SlotScores(NamedTuple):
    """One pass's prediction for the slots of the active canvases, (A, S) each."""

    open: Tensor  # slots that may receive a token: real and not closed
    tokens: Tensor  # the best token of each open slot (eos elsewhere): bos/pad excluded, eos penalised
    log_probs: Tensor  # its log p(c | l) (the eos penalty included when eos wins)
    location: Tensor  # log p(l), -inf at padding slots
    final_eos: Tensor  # (A,) log-prob of this pass's end-of-slot decisions, sum of log p(eos, l), no penalty
    content: Optional[Tensor]  # (A, S, V) log p(c | l) of the open slots (-inf elsewhere); greedy sequence only


class Insertions(NamedTuple):
    """What one step inserts: ``tokens[l]`` (with score ``log_probs[l]``) into every slot l where ``mask``."""

    mask: Tensor  # (A, S)
    tokens: Tensor  # (A, S)
    log_probs: Tensor  # (A, S) log p(c | l)


def parallel_step(p: SlotScores, room: Tensor, eos: int) -> Insertions:
    """Insert the best token into every open slot whose best is not end-of-slot,
    at most ``room`` (A,) per canvas (the highest-scoring ones)."""
    return Insertions(_cap(p.open & p.tokens.ne(eos), p.log_probs, room), p.tokens, p.log_probs)


def greedy_slot_step(p: SlotScores, room: Tensor, eos: int) -> Insertions:
    """Slot finalization: the one (slot, token) with the best log p(c, l) among the
    slots whose best token is not end-of-slot."""
    ok = p.open & p.tokens.ne(eos)  # (A, S)
    joint = (p.log_probs + p.location).masked_fill(~ok, float("-inf"))
    return Insertions(_one_hot_argmax(joint) & ok.any(1, keepdim=True), p.tokens, p.log_probs)


def greedy_sequence_step(p: SlotScores, room: Tensor, eos: int) -> Insertions:
    """Sequence finalization: the best (slot, token) over every open slot and the
    whole vocabulary; stop when it is end-of-sequence."""
    A, S, V = p.content.shape
    flat = (p.content + p.location.unsqueeze(-1)).flatten(1).argmax(1)  # (A,) over (l, c)
    slot, tok = flat.div(V, rounding_mode="floor"), flat.remainder(V)
    ok = tok.ne(eos) & p.open.gather(1, slot.unsqueeze(1)).squeeze(1)  # (A,)
    mask = torch.zeros_like(p.open).scatter_(1, slot.unsqueeze(1), ok.unsqueeze(1))
    log_prob = p.content.flatten(1).gather(1, flat.unsqueeze(1))  # (A, 1)
    return Insertions(mask, tok.unsqueeze(1).expand(A, S), log_prob.expand(A, S))


Step = Callable[[SlotScores, Tensor, int], Insertions]


class CandidateScorer(Protocol):
    """Scores candidate translations, e.g. :class:`fairseq_insertion.rerank.AutoregressiveScorer`."""

    def score(self, src_tokens: Tensor, src_lengths: Tensor, hyps: List[Tensor]) -> Tensor: ...


def choose_step(decoding: str, termination: str) -> Step:
    """The decoding rule: parallel, or greedy with the model's training termination."""
    if decoding == "parallel":
        return parallel_step
    return greedy_slot_step if termination == "slot" else greedy_sequence_step


class InsertionGenerator:
    """Builds fairseq hypothesis dicts by iterative insertion.

    decoding: ``parallel`` (insert the argmax token into every slot whose
    argmax is not end-of-slot) or ``greedy`` (one insertion per step).
    eos_penalty: beta, subtracted from the end-of-slot/sequence log-prob.
    eos_penalties: several betas: every sentence is decoded under each of them
    in one batch, and its candidates (one per beta, ``eos_penalty`` says
    which) are returned best first (fairseq's ``--nbest`` prints the first
    k): by the model's own score (``score``), or by ``rerank``'s score when
    given (an autoregressive model, one teacher-forced batch for all
    candidates; stored as ``rerank_score``).

    Scores. A hypothesis's ``positional_scores`` are the log-probability of
    the decode that made it: for each token, log p(c, l) = log p(l) +
    log p(c | l) in the pass that inserted it (0 for constraint tokens), and
    last, the end-of-slot decisions that ended it, the sum of log p(eos, l)
    over the slots that chose end-of-slot in the final pass (for greedy
    sequence finalization: the end-of-sequence (slot, eos) that won). EOS
    penalties shape the decisions but never enter these log-probabilities.
    ``log_prob`` is their sum; ``score`` is ``log_prob / (n + 1) ** lenpen``
    (fairseq's ``--lenpen``; n tokens plus the termination term), and
    ``rerank``'s scores use the same ``lenpen``.

    Repetition: ``block_neighbour_copies`` (default) stops a slot from
    inserting a copy of either of its neighbours; ``no_repeat_ngram_size`` n
    stops it from inserting a token that makes an n-gram of the canvas occur
    twice (see :func:`canvas.repeated_tokens`). End-of-slot is never blocked.
    The canvas never grows beyond ``max_len_a * src_len + max_len_b`` nor the
    model's maximum target positions (minus the two boundary markers), and a
    sentence stops after ``max_iterations`` iterations (0: its length limit).
    close_ended_slots: a slot whose best token is end-of-slot stays closed for
    the rest of the decode (its neighbours never change, only its context
    does), so later passes score only the slots still open; applies to models
    trained with slot finalization. Off by default: it can change the output.

    Hard constraints (``constraints=`` of :meth:`generate`) are put on the
    initial canvas in order and never split: the slots inside a constraint are
    closed. ``constraint_order="unordered"`` first decodes without them and
    places them in the order in which their first tokens first occur in that
    translation (absent ones after, in the given order; lines with a template
    anchored at the start or end keep the given order).
    """

    def __init__(
        self,
        tgt_dict,
        decoding: str = "parallel",
        eos_penalty: float = 0.0,
        max_len_a: float = 0.0,
        max_len_b: int = 200,
        max_iterations: int = 0,
        retain_history: bool = False,
        src_dict=None,
        constraint_order: Optional[str] = None,
        close_ended_slots: bool = False,
        eos_penalties: Optional[Sequence[float]] = None,
        rerank: Optional[CandidateScorer] = None,
        block_neighbour_copies: bool = True,
        no_repeat_ngram_size: int = 0,
        lenpen: float = 1.0,
    ):
        if decoding not in DECODINGS:
            raise ValueError(f"--decoding must be one of {DECODINGS}, got {decoding!r}")
        if constraint_order is not None and str(constraint_order) not in CONSTRAINT_ORDERS:
            raise ValueError(f"--constraints must be one of {CONSTRAINT_ORDERS}, got {constraint_order!r}")
        self.constraint_order = str(constraint_order or "ordered")
        if int(no_repeat_ngram_size) < 0 or int(no_repeat_ngram_size) == 1:
            raise ValueError("the repeated n-gram size, --repeat-ngram-block / --no-repeat-ngram-size must be 0 "
                             f"(off) or >= 2, got {no_repeat_ngram_size}")
        self.block_neighbour_copies = bool(block_neighbour_copies)
        self.no_repeat_ngram_size = int(no_repeat_ngram_size)
        self.lenpen = float(lenpen)
        if max_iterations < 0:
            raise ValueError(f"--max-iterations must be >= 0, got {max_iterations}")
        self.tgt_dict = tgt_dict
        self.decoding = decoding
        self.eos_penalty = float(eos_penalty)
        self.eos_penalties = tuple(float(b) for b in eos_penalties) if eos_penalties else (self.eos_penalty,)
        self.rerank = rerank
        self.max_len_a, self.max_len_b = float(max_len_a), int(max_len_b)
        self.max_iterations = int(max_iterations)
        self.retain_history = retain_history
        self.close_ended_slots = bool(close_ended_slots)
        self.bos, self.eos, self.pad = tgt_dict.bos(), tgt_dict.eos(), tgt_dict.pad()
        self.src_dict = src_dict if src_dict is not None else tgt_dict
        self.src_pad, self.src_eos, self.src_unk = self.src_dict.pad(), self.src_dict.eos(), self.src_dict.unk()
        self.stats = {"sentences": 0, "iterations": 0, "log2_bound": 0, "forward_passes": 0, "tokens": 0,
                      "batches": 0}
        _track(self)

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **kwargs) -> List[List[Dict]]:
        """Decode a batch. ``constraints``: fairseq's packed constraints (B, C)
        (``pack_constraints``); a ``pad`` token inside a constraint is a
        template gap. Without it, ``sample["constraints"]`` is used if present."""
        if len(models) != 1:
            raise NotImplementedError(f"insertion decoding takes one model; got an ensemble of {len(models)}")
        if prefix_tokens is not None:
            raise NotImplementedError("insertion decoding does not support --prefix-size")
        if constraints is None:
            constraints = sample.get("constraints")
        model = models[0]
        if model.training:  # fairseq's CLIs and the hub already put it in eval mode
            model.eval()
        net_input = sample["net_input"]
        src_tokens, src_lengths = net_input["src_tokens"], net_input["src_lengths"]
        B, device = src_tokens.size(0), src_tokens.device
        cache = model.decoding_cache(model.encoder(src_tokens, src_lengths=src_lengths))

        limit = model.max_decoder_positions() - 2  # the frame adds bos and eos
        max_len = (src_lengths.float() * self.max_len_a + self.max_len_b).long().clamp(0, limit)  # (B,)
        real_src = src_tokens.ne(self.src_pad) & src_tokens.ne(self.src_eos)  # (B, S)
        empty = ~real_src.any(1)  # (B,) an empty source line translates to an empty output (or its constraints)
        self._report_inputs(sample, src_tokens, empty, src_tokens.eq(self.src_unk).sum(1))

        init = self._initial_canvas(constraints, B, device)
        len0 = init[1]  # (B,) constraint tokens per line
        max_len = torch.where(empty, len0, max_len)
        too_long = len0 > max_len  # (B,) constraints that do not fit: that line's output is empty
        if bool(too_long.any()):
            self._report_too_long(sample, src_tokens, too_long, len0, max_len)
            init = _drop_rows(init, too_long, self.pad)
            max_len = max_len.masked_fill(too_long, 0)
        step = choose_step(self.decoding, model.termination)
        close_ended = self.close_ended_slots and model.termination == "slot"
        n = len(self.eos_penalties)  # candidates per sentence: row c of sentence b is b n + c
        beta = torch.tensor(self.eos_penalties, device=device).repeat(B)  # (B n,)
        if n > 1:
            order = torch.arange(B, device=device).repeat_interleave(n)  # (B n,)
            cache = model.reorder_decoding_cache(cache, order)
            init, max_len = tuple(t.index_select(0, order) for t in init), max_len.index_select(0, order)
        if self.constraint_order == "unordered" and constraints is not None and init[0].size(1) > 0:
            first, _, _ = self._decode(model, cache, _empty_init(B * n, device, self.pad), max_len, beta, step,
                                       close_ended)
            init = _reorder_constraints(init, first.tokens, first.lengths)
        out, history, passes = self._decode(model, cache, init, max_len, beta, step, close_ended)

        rows = []
        for r in range(B * n):
            h = self._hypo(out.tokens[r], out.scores[r], out.lengths[r], out.iterations[r], out.final_eos[r])
            h["eos_penalty"] = self.eos_penalties[r % n]
            if self.retain_history:
                h["history"] = history[r]
            rows.append(h)
        if self.rerank is not None:
            src = src_tokens.repeat_interleave(n, 0), src_lengths.repeat_interleave(n, 0)
            for h, s in zip(rows, self.rerank.score(*src, [h["tokens"] for h in rows]).tolist()):
                h["rerank_score"] = s
        hypos = [_candidates(rows[b * n:(b + 1) * n], "rerank_score" if self.rerank else "score") for b in range(B)]
        self._update_stats(torch.tensor([len(c[0]["tokens"]) - 1 for c in hypos], dtype=torch.long),
                           torch.tensor([c[0]["steps"] for c in hypos], dtype=torch.long), passes)
        return hypos

    def _initial_canvas(self, constraints, B: int, device) -> Tuple[Tensor, ...]:
        """(canvas (B, K), lengths, closed_before (B, K), closed_end (B,), segment (B, K))."""
        if constraints is None:
            return _empty_init(B, device, self.pad)
        if not torch.is_tensor(constraints) or constraints.dim() != 2 or constraints.size(0) != B:
            raise ValueError("constraints must be fairseq's packed constraints, a (batch, length) tensor "
                             f"(fairseq.token_generation_constraints.pack_constraints); got {constraints!r}")
        # a pad token inside a constraint is a template gap (___)
        return C.constraint_canvas(constraints.to(device).long(), gap=self.pad, pad=self.pad)

    def _decode(self, model, cache, init, max_len: Tensor, eos_penalty: Tensor, step: Step,
                close_ended: bool) -> Tuple[Canvases, List[List[Dict]], int]:
        """The insertion loop from the initial canvas ``init`` (see :meth:`_initial_canvas`):
        predict, choose, insert, stop, with finished sentences leaving the batch.

        Closed slots never receive an insertion and count as finished (as if
        they chose end-of-slot). Returns the final canvases of all B sentences
        (in batch order), the history and the number of forward passes.
        """
        tokens, lengths = init[0], init[1].clone()
        B, K, device = tokens.size(0), tokens.size(1), tokens.device
        zeros = torch.zeros(B, device=device)
        state = Canvases(torch.arange(B, device=device), tokens, torch.zeros(tokens.shape, device=device), init[2],
                         init[3], lengths, torch.zeros(B, dtype=torch.long, device=device), zeros, max_len,
                         eos_penalty)
        closed = C.closed_slots(state.closed_before, state.closed_end, lengths, K + 1)
        start = (max_len > lengths) & (C.slot_mask(lengths, K + 1) & ~closed).any(1)  # (B,)
        width, room, n_active, started_width = (torch.stack([
            max_len.max(), (max_len - lengths).clamp(min=0).max(), start.sum(), (lengths * start).max()]).tolist()
            if B else (0, 0, 0, 0))
        out = _widened(state, max(width, K), self.pad)  # the result, filled in as sentences finish
        max_iter = self.max_iterations or room
        history: List[List[Dict]] = [[] for _ in range(B)]
        state, cache = self._keep(model, state, cache, start, n_active, started_width)
        passes = 0
        for _ in range(max_iter + 1):
            if n_active == 0:
                break
            scores = self._predict(model, state, cache)
            choice = step(scores, state.max_len - state.lengths, self.eos)
            passes += 1
            before = state.lengths
            state, keep, n_keep, kept_width = self._insert(state, scores, choice, max_iter, close_ended)
            if self.retain_history:
                self._record(history, state, state.lengths > before)
            if n_keep < n_active:
                _store(out, state.take(keep.long().argsort(stable=True)[:n_active - n_keep]))  # the finished rows
                state, cache = self._keep(model, state, cache, keep, n_keep, kept_width)
            n_active = n_keep
        if n_active:
            _store(out, state)
        return out, history, passes

    def _keep(self, model, state: Canvases, cache, keep: Tensor, n_keep: int,
              width: int) -> Tuple[Canvases, object]:
        """The rows ``keep`` (A,) of the state and of the encoder cache, in order (``n_keep`` of them),
        the canvases trimmed to ``width``, the longest kept one (so a single canvas has no padding)."""
        if n_keep == keep.numel():
            return state, cache
        idx = keep.long().argsort(descending=True, stable=True)[:n_keep]  # kept rows first, in order
        state = state.take(idx)
        state = state._replace(tokens=state.tokens[:, :width], scores=state.scores[:, :width],
                               closed_before=state.closed_before[:, :width])
        return state, model.reorder_decoding_cache(cache, idx)

    def _predict(self, model, state: Canvases, cache) -> SlotScores:
        """One forward pass: the best token and its log p(c | l) for every open slot.

        Only the open slots are projected onto the vocabulary, and only the
        log-normaliser (logsumexp) of each is computed: no (A, S, V) log-softmax
        (except for greedy sequence finalization, which needs the whole table).
        """
        framed = C.frame(state.tokens, state.lengths, self.bos, self.eos, self.pad)  # (A, K+2)
        A, S = framed.size(0), framed.size(1) - 1
        closed = C.closed_slots(state.closed_before, state.closed_end, state.lengths, S)
        open_ = C.slot_mask(state.lengths, S) & ~closed  # (A, S)
        content, location = model.decode_slots(framed, cache, open_)  # (N, V), (A, S)
        lse = content.logsumexp(-1)  # (N,) log-normaliser of each open slot
        eos_lp = content[:, self.eos] - lse  # (N,)
        if self.block_neighbour_copies or self.no_repeat_ngram_size:
            blocked = C.repeated_tokens(framed, self.no_repeat_ngram_size, self.block_neighbour_copies,
                                        (self.bos, self.eos), self.pad)  # (A, S, M), pad: nothing
            content.scatter_(1, blocked[open_], float("-inf"))  # pad is -inf below anyway
        if len(self.eos_penalties) == 1:
            content[:, self.eos] -= self.eos_penalties[0]
        else:  # each slot its row's beta
            content[:, self.eos] -= state.eos_penalty.unsqueeze(1).expand(A, S)[open_]
        content[:, self.bos] = float("-inf")
        content[:, self.pad] = float("-inf")
        best, tok = content.max(-1)  # (N,)
        tokens = torch.full((A, S), self.eos, dtype=torch.long, device=framed.device).masked_scatter(open_, tok)
        log_probs = location.new_zeros(A, S).masked_scatter(open_, best - lse)
        eos_joint = location.new_full((A, S), float("-inf")).masked_scatter(open_, eos_lp) + location  # (A, S)
        full = None
        if self.decoding == "greedy" and model.termination == "sequence":
            full = content.new_full((A, S, content.size(-1)), float("-inf"))
            full[open_] = content - lse.unsqueeze(1)  # (A, S, V)
            final_eos = eos_joint.max(1).values  # the end-of-sequence decision: its best (slot, eos)
        else:  # every slot that chose end-of-slot
            final_eos = eos_joint.masked_fill(~(open_ & tokens.eq(self.eos)), 0.0).sum(1)
        return SlotScores(open_, tokens, log_probs, location, final_eos, full)

    def _insert(self, state: Canvases, scores: SlotScores, choice: Insertions, max_iter: int,
                close_ended: bool) -> Tuple[Canvases, Tensor, int, int]:
        """Apply one step's insertions to every per-token tensor; say which sentences go on.
        Returns the new state, keep (A,), the number kept and their longest canvas (this
        pass's one host sync)."""
        new_len = state.lengths + choice.mask.sum(1)  # (A,)
        inserted = choice.mask.any(1)
        iterations = state.iterations + inserted.long()
        keep = inserted & (new_len < state.max_len) & (iterations < max_iter)
        width, n_keep, kept_width = torch.stack([new_len.max(), keep.sum(), (new_len * keep).max()]).tolist()
        K = state.tokens.size(1)
        dest = C.insertion_destinations(state.lengths, choice.mask, K, width)  # (A, K+S)
        closed_before, closed_end = state.closed_before, state.closed_end
        if close_ended:  # the slots that chose end-of-slot close; slot l < k is the one before token l
            ended = scores.open & scores.tokens.eq(self.eos)  # (A, S)
            closed_end = closed_end | ended.gather(1, state.lengths.unsqueeze(1)).squeeze(1)
            closed_before = closed_before | (ended[:, :K] & C.slot_mask(state.lengths - 1, K))
        # an inserted token opens the slots on both its sides: the slot before it is open
        new = Canvases(
            state.rows,
            C.place(dest, state.tokens, choice.tokens, width, self.pad),
            C.place(dest, state.scores, choice.log_probs + scores.location, width, 0.0),  # log p(c, l)
            C.place(dest, closed_before, torch.zeros_like(choice.mask), width, False),
            closed_end, new_len, iterations, scores.final_eos, state.max_len, state.eos_penalty,
        )
        return new, keep, n_keep, kept_width

    def _record(self, history: List[List[Dict]], state: Canvases, inserted: Tensor) -> None:
        """--retain-iter-history: the canvas of every sentence that changed in this step."""
        for i in inserted.nonzero().flatten().tolist():
            history[int(state.rows[i])].append(
                self._hypo(state.tokens[i], state.scores[i], state.lengths[i], state.iterations[i], 0.0))

    # -------------------------------------------------------------- helpers
    def _line_name(self, sample, src_tokens: Tensor, i: int) -> str:
        """fairseq-generate passes sentence ids; fairseq-interactive does not, so
        there the line is named by its text."""
        if "id" in sample:
            return f"sentence {int(sample['id'][i])}"
        return f"source line {self.src_dict.string(src_tokens[i][src_tokens[i].ne(self.src_pad)])!r}"

    def _report_inputs(self, sample, src_tokens: Tensor, empty: Tensor, unknown: Tensor) -> None:
        """Name the lines that are empty or hold unknown words (one host sync)."""
        flagged = (empty | unknown.gt(0)).nonzero().flatten().tolist()
        for i in flagged:
            line = self._line_name(sample, src_tokens, i)
            if empty[i]:
                logger.warning("%s: empty source line; its translation is empty", line)
            else:
                logger.warning("%s: %d unknown source word(s), read as <unk>", line, int(unknown[i]))

    def _report_too_long(self, sample, src_tokens: Tensor, too_long: Tensor, n: Tensor, max_len: Tensor) -> None:
        for i in too_long.nonzero().flatten().tolist():
            logger.error("%s: its constraints hold %d tokens, over the length limit %d (min(max_len_a * src_len "
                         "+ max_len_b, max target positions - 2)); not translated, its output is empty",
                         self._line_name(sample, src_tokens, i), int(n[i]), int(max_len[i]))

    def _hypo(self, canvas: Tensor, scores: Tensor, length: Tensor, steps: Tensor, eos_score) -> Dict:
        n = int(length)
        tokens = torch.cat([canvas[:n], canvas.new_tensor([self.eos])])
        positional = torch.cat([scores[:n].float(), scores.new_tensor([float(eos_score)]).float()])
        log_prob = positional.sum()
        return {
            "tokens": tokens,
            "score": log_prob / (n + 1) ** self.lenpen,
            "log_prob": log_prob,
            "positional_scores": positional,
            "steps": int(steps),
            "attention": None,
            "alignment": None,
        }

    def _update_stats(self, lengths: Tensor, iterations: Tensor, passes: int) -> None:
        s = self.stats
        s["sentences"] += lengths.numel()
        s["iterations"] += int(iterations.sum())
        powers = 2 ** torch.arange(32, device=lengths.device)  # floor(log2 n)+1 = #{j : 2^j <= n}
        s["log2_bound"] += int((lengths.unsqueeze(1) >= powers).sum())
        s["tokens"] += int(lengths.sum())
        s["forward_passes"] += passes
        s["batches"] += 1

    def summary(self) -> str:
        s = self.stats
        n = max(s["sentences"], 1)
        return (
            f"insertion decoding ({self.decoding}): {s['sentences']} sentences, "
            f"mean iterations {s['iterations'] / n:.3f}, mean floor(log2 n)+1 {s['log2_bound'] / n:.3f}, "
            f"mean length {s['tokens'] / n:.2f}, batched forward passes {s['forward_passes']} "
            f"({s['forward_passes'] / max(s['batches'], 1):.2f} per batch of {n / max(s['batches'], 1):.1f})"
        )


def log2_bound(n: int) -> int:
    """floor(log2 n) + 1: iterations of a perfect binary-tree decode (0 for n = 0)."""
    return int(math.floor(math.log2(n))) + 1 if n > 0 else 0


def _cap(insert: Tensor, score: Tensor, room: Tensor) -> Tensor:
    """Keep at most ``room`` insertions per row, the highest-scoring ones. (A, S)."""
    rank = score.masked_fill(~insert, float("-inf")).argsort(1, descending=True).argsort(1)
    return insert & (rank < room.unsqueeze(1))


def _one_hot_argmax(x: Tensor) -> Tensor:
    return torch.zeros_like(x, dtype=torch.bool).scatter_(1, x.argmax(1, keepdim=True), True)


def _empty_init(B: int, device, pad: int) -> Tuple[Tensor, ...]:
    """The unconstrained start: an empty canvas, every slot open."""
    long0 = torch.zeros(B, 0, dtype=torch.long, device=device)
    no = torch.zeros(B, dtype=torch.bool, device=device)
    return long0 + pad, torch.zeros(B, dtype=torch.long, device=device), long0.bool(), no, long0


def _drop_rows(init: Tuple[Tensor, ...], rows: Tensor, pad: int) -> Tuple[Tensor, ...]:
    """Empty the initial canvas of ``rows`` (B,)."""
    canvas, lengths, closed_before, closed_end, segment = init
    r = rows.unsqueeze(1)
    return canvas.masked_fill(r, pad), lengths.masked_fill(rows, 0), closed_before & ~r, closed_end & ~rows, segment


def _reorder_constraints(init: Tuple[Tensor, ...], hyp: Tensor, hyp_lengths: Tensor) -> Tuple[Tensor, ...]:
    """``unordered``: sort each line's constraints by the first occurrence of
    their first token in ``hyp`` (B, T), the unconstrained translation.
    Lines whose first or last slot is closed (an anchored template) keep the
    given order."""
    canvas, lengths, closed_before, closed_end, segment = init
    B, K = canvas.shape
    G = int(segment.max()) + 1
    j = torch.arange(K, device=canvas.device).unsqueeze(0)
    real = j < lengths.unsqueeze(1)
    starts = real & (j.eq(0) | segment.ne(torch.nn.functional.pad(segment[:, :-1], (1, 0), value=-1)))  # (B, K)
    first_tok = canvas.new_full((B, G + 1), -1).scatter(1, torch.where(starts, segment, G), canvas)[:, :G]
    key = C.first_occurrence(hyp, hyp_lengths, first_tok)  # (B, G)
    anchored = (closed_before[:, 0] if K else closed_end) | closed_end
    key = torch.where(anchored.unsqueeze(1), torch.arange(G, device=key.device).expand_as(key), key)
    perm = C.order_segments(segment, lengths, key)  # (B, K)
    return canvas.gather(1, perm), lengths, closed_before.gather(1, perm), closed_end, segment.gather(1, perm)


def _widened(state: Canvases, width: int, pad: int) -> Canvases:
    """A copy of ``state`` whose per-token tensors are ``width`` wide (the result buffer)."""
    return Canvases(state.rows, _widen(state.tokens, width, pad).clone(), _widen(state.scores, width, 0.0).clone(),
                    state.closed_before, state.closed_end, state.lengths.clone(), state.iterations.clone(),
                    state.final_eos.clone(), state.max_len, state.eos_penalty)


def _candidates(rows: List[Dict], key: str) -> List[Dict]:
    """One sentence's candidates (one per EOS penalty), best ``key`` first; ties keep the given order."""
    return sorted(rows, key=lambda h: -float(h[key]))


def _store(out: Canvases, done: Canvases) -> None:
    """Write the finished canvases ``done`` into the batch result ``out`` at their rows."""
    W, r = done.tokens.size(1), done.rows
    out.tokens[r, :W] = done.tokens
    out.scores[r, :W] = done.scores
    out.lengths[r] = done.lengths
    out.iterations[r] = done.iterations
    out.final_eos[r] = done.final_eos


def _widen(x: Tensor, width: int, value) -> Tensor:
    if x.size(1) >= width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.size(1)), value=value)


# one summary line per generator when the process ends (fairseq-generate and
# fairseq-interactive give the task no end-of-run hook)
_generators: List[InsertionGenerator] = []


def _track(gen: InsertionGenerator) -> None:
    _generators.append(gen)


@atexit.register
def _log_summaries() -> None:
    for gen in _generators:
        if gen.stats["sentences"]:
            logger.info(gen.summary())
