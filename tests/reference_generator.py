"""A frozen copy of the insertion decoding loop as it was before the per-pass cost work
(issue "cut the cost of each parallel pass"): the reference the optimised
:mod:`fairseq_insertion.generator` is checked against (tests/test_decoder_reference.py).
Not used by the plugin. Original docstring:

Greedy and parallel insertion decoding (paper: "Inference").

The loop starts from the empty canvas ``[bos, eos]`` (or, with hard
constraints, from a canvas that holds them, with the slots inside a constraint
closed: see :func:`canvas.constraint_canvas`), asks the model for slot
scores, applies insertions with :func:`canvas.insert`, and stops a sentence
when no slot inserts anything (every slot picks end-of-slot), when its canvas
reaches the length limit, or after the iteration bound.

An *iteration* is a step that inserted at least one token (the paper's count:
a perfect binary-tree decode of n tokens takes floor(log2 n) + 1 of them); the
final pass that only finds end-of-slot is counted separately as a forward pass.
"""

from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq_insertion import canvas as C

logger = logging.getLogger(__name__)

DECODINGS = ("parallel", "greedy")
CONSTRAINT_ORDERS = ("ordered", "unordered")


class ReferenceInsertionGenerator:
    """Builds fairseq hypothesis dicts by iterative insertion.

    decoding: ``parallel`` (insert the argmax token into every slot whose
    argmax is not end-of-slot) or ``greedy`` (one insertion per step).
    eos_penalty: beta, subtracted from the end-of-slot/sequence log-prob.
    The canvas never grows beyond ``max_len_a * src_len + max_len_b`` nor the
    model's maximum target positions (minus the two boundary markers), and a
    sentence stops after ``max_iterations`` iterations (0: its length limit).

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
    ):
        if decoding not in DECODINGS:
            raise ValueError(f"--decoding must be one of {DECODINGS}, got {decoding!r}")
        if constraint_order is not None and str(constraint_order) not in CONSTRAINT_ORDERS:
            raise ValueError(f"--constraints must be one of {CONSTRAINT_ORDERS}, got {constraint_order!r}")
        self.constraint_order = str(constraint_order or "ordered")
        if max_iterations < 0:
            raise ValueError(f"--max-iterations must be >= 0, got {max_iterations}")
        self.tgt_dict = tgt_dict
        self.decoding = decoding
        self.eos_penalty = float(eos_penalty)
        self.max_len_a, self.max_len_b = float(max_len_a), int(max_len_b)
        self.max_iterations = int(max_iterations)
        self.retain_history = retain_history
        self.bos, self.eos, self.pad = tgt_dict.bos(), tgt_dict.eos(), tgt_dict.pad()
        self.src_dict = src_dict if src_dict is not None else tgt_dict
        self.src_pad, self.src_eos, self.src_unk = self.src_dict.pad(), self.src_dict.eos(), self.src_dict.unk()
        self.stats = {"sentences": 0, "iterations": 0, "log2_bound": 0, "forward_passes": 0, "tokens": 0}

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
        model.eval()
        net_input = sample["net_input"]
        src_tokens, src_lengths = net_input["src_tokens"], net_input["src_lengths"]
        B, device = src_tokens.size(0), src_tokens.device
        encoder_out = model.encoder(src_tokens, src_lengths=src_lengths)

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
        if self.constraint_order == "unordered" and constraints is not None and init[0].size(1) > 0:
            first = self._decode(model, encoder_out, _empty_init(B, device, self.pad), max_len, src_tokens)
            init = _reorder_constraints(init, first[0], first[2])
        canvas, scores, lengths, iterations, final_eos, history, passes = self._decode(
            model, encoder_out, init, max_len, src_tokens)

        hypos = []
        for b in range(B):
            h = self._hypo(canvas[b], scores[b], lengths[b], iterations[b], final_eos[b])
            if self.retain_history:
                h["history"] = history[b]
            hypos.append([h])
        self._update_stats(lengths, iterations, passes)
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

    def _decode(self, model, encoder_out, init, max_len: Tensor, src_tokens: Tensor):
        """The insertion loop from the initial canvas ``init`` (see :meth:`_initial_canvas`).

        Closed slots never receive an insertion and count as finished (as if
        they chose end-of-slot). Returns canvas (B, K), scores (B, K),
        lengths, iterations, final end-of-slot log-prob (B,), history, passes.
        """
        canvas, lengths, closed_before, closed_end = init[0], init[1].clone(), init[2], init[3]
        B, device = canvas.size(0), canvas.device
        scores = torch.zeros(canvas.shape, device=device)  # (B, K) log p(c | l) when inserted; 0 for constraints
        iterations = torch.zeros(B, dtype=torch.long, device=device)
        final_eos = torch.zeros(B, device=device)  # mean end-of-slot log-prob of the last pass over open slots
        S0 = canvas.size(1) + 1
        any_open = (C.slot_mask(lengths, S0) & ~C.closed_slots(closed_before, closed_end, lengths, S0)).any(1)  # (B,)
        active = torch.arange(B, device=device)[(max_len > lengths) & any_open]
        max_iter = (self.max_iterations or int((max_len - lengths).clamp(min=0).max())) if B else 0
        termination = getattr(model, "termination", "slot")
        history: List[List[Dict]] = [[] for _ in range(B)]
        passes = 0

        for _ in range(max_iter + 1):
            if active.numel() == 0:
                break
            enc = model.encoder.reorder_encoder_out(encoder_out, active)
            framed = C.frame(canvas[active], lengths[active], self.bos, self.eos, self.pad)  # (A, K+2)
            content_lp, location_lp = model.slot_log_probs(model.decoder(framed, encoder_out=enc), framed)
            passes += 1
            S = content_lp.size(1)
            closed = C.closed_slots(closed_before[active], closed_end[active], lengths[active], S)  # (A, S)
            slots = C.slot_mask(lengths[active], S) & ~closed  # (A, S) the open slots
            final_eos[active] = (content_lp[..., self.eos] * slots).sum(1) / slots.sum(1).clamp(min=1)
            content_lp[..., self.eos] -= self.eos_penalty
            content_lp[..., self.bos] = float("-inf")
            content_lp[..., self.pad] = float("-inf")
            best_lp, best_tok = content_lp.max(-1)  # (A, S) per-slot argmax of p(c | l)
            open_ = slots & best_tok.ne(self.eos)
            room = max_len[active] - lengths[active]  # (A,)
            if self.decoding == "parallel":
                insert = _cap(open_, best_lp, room)
            elif termination == "slot":
                joint = (best_lp + location_lp).masked_fill(~open_, float("-inf"))  # restrict to open slots
                insert = _one_hot_argmax(joint) & open_.any(1, keepdim=True)
            else:  # sequence finalization: stop when end-of-sequence wins anywhere (closed slots excluded)
                V = content_lp.size(-1)
                joint = (content_lp + location_lp.unsqueeze(-1)).masked_fill(closed.unsqueeze(-1), float("-inf"))
                flat = joint.flatten(1).argmax(1)  # (A,) over (l, c)
                slot, tok = flat.div(V, rounding_mode="floor"), flat.remainder(V)
                ok = tok.ne(self.eos) & slots.gather(1, slot.unsqueeze(1)).squeeze(1)
                insert = torch.zeros_like(open_).scatter_(1, slot.unsqueeze(1), ok.unsqueeze(1))
                best_tok = tok.unsqueeze(1).expand_as(best_tok)
                best_lp = content_lp.flatten(1).gather(1, flat.unsqueeze(1)).expand_as(best_lp)
            inserted = insert.any(1)  # (A,)
            new_canvas, new_len = C.insert(canvas[active], lengths[active], best_tok, insert, self.pad)
            new_scores, _ = C.insert(scores[active], lengths[active], best_lp, insert, 0.0)
            # an inserted token opens the slots on both its sides: the slot before it is open
            new_closed, _ = C.insert(closed_before[active], lengths[active], torch.zeros_like(insert), insert, False)
            width = max(canvas.size(1), new_canvas.size(1))
            canvas = _widen(canvas, width, self.pad)
            scores = _widen(scores, width, 0.0)
            closed_before = _widen(closed_before, width, False)
            canvas[active] = _widen(new_canvas, width, self.pad)
            scores[active] = _widen(new_scores, width, 0.0)
            closed_before[active] = _widen(new_closed, width, False)
            lengths[active] = new_len
            iterations[active] += inserted.long()
            if self.retain_history:
                for i, b in enumerate(active.tolist()):
                    if inserted[i]:
                        history[b].append(self._hypo(canvas[b], scores[b], lengths[b], iterations[b], 0.0))
            keep_going = inserted & (new_len < max_len[active]) & (iterations[active] < max_iter)
            active = active[keep_going]
        return canvas, scores, lengths, iterations, final_eos, history, passes

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
        return {
            "tokens": tokens,
            "score": positional.mean(),
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

    def summary(self) -> str:
        s = self.stats
        n = max(s["sentences"], 1)
        return (
            f"insertion decoding ({self.decoding}): {s['sentences']} sentences, "
            f"mean iterations {s['iterations'] / n:.3f}, mean floor(log2 n)+1 {s['log2_bound'] / n:.3f}, "
            f"mean length {s['tokens'] / n:.2f}, batched forward passes {s['forward_passes']}"
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


def _widen(x: Tensor, width: int, value) -> Tensor:
    if x.size(1) >= width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.size(1)), value=value)
