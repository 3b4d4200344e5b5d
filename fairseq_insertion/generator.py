"""Greedy and parallel insertion decoding (paper: "Inference").

The loop starts from the empty canvas ``[bos, eos]``, asks the model for slot
scores, applies insertions with :func:`canvas.insert`, and stops a sentence
when no slot inserts anything (every slot picks end-of-slot), when its canvas
reaches the length limit, or after the iteration bound.

An *iteration* is a step that inserted at least one token (the paper's count:
a perfect binary-tree decode of n tokens takes floor(log2 n) + 1 of them); the
final pass that only finds end-of-slot is counted separately as a forward pass.
"""

from __future__ import annotations

import atexit
import logging
import math
from typing import Dict, List

import torch
from torch import Tensor

from . import canvas as C

logger = logging.getLogger(__name__)

DECODINGS = ("parallel", "greedy")


class InsertionGenerator:
    """Builds fairseq hypothesis dicts by iterative insertion.

    decoding: ``parallel`` (insert the argmax token into every slot whose
    argmax is not end-of-slot) or ``greedy`` (one insertion per step).
    eos_penalty: beta, subtracted from the end-of-slot/sequence log-prob.
    The canvas never grows beyond ``max_len_a * src_len + max_len_b`` nor the
    model's maximum target positions (minus the two boundary markers), and a
    sentence stops after ``max_iterations`` iterations (0: its length limit).
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
    ):
        if decoding not in DECODINGS:
            raise ValueError(f"--decoding must be one of {DECODINGS}, got {decoding!r}")
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
        _track(self)

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **kwargs) -> List[List[Dict]]:
        if len(models) != 1:
            raise NotImplementedError(f"insertion decoding takes one model; got an ensemble of {len(models)}")
        if prefix_tokens is not None:
            raise NotImplementedError("insertion decoding does not support --prefix-size")
        if constraints is not None:
            raise NotImplementedError("insertion decoding does not support --constraints yet")
        model = models[0]
        model.eval()
        net_input = sample["net_input"]
        src_tokens, src_lengths = net_input["src_tokens"], net_input["src_lengths"]
        B, device = src_tokens.size(0), src_tokens.device
        encoder_out = model.encoder(src_tokens, src_lengths=src_lengths)

        limit = model.max_decoder_positions() - 2  # the frame adds bos and eos
        max_len = (src_lengths.float() * self.max_len_a + self.max_len_b).long().clamp(0, limit)  # (B,)
        real_src = src_tokens.ne(self.src_pad) & src_tokens.ne(self.src_eos)  # (B, S)
        empty = ~real_src.any(1)  # (B,) an empty source line translates to an empty output
        max_len = max_len.masked_fill(empty, 0)
        self._report_inputs(sample, src_tokens, empty, src_tokens.eq(self.src_unk).sum(1))
        max_iter = (self.max_iterations or int(max_len.max())) if B else 0
        termination = getattr(model, "termination", "slot")

        canvas = src_tokens.new_full((B, 0), self.pad)  # (B, K)
        scores = torch.zeros(B, 0, device=device)  # (B, K) log p(c | l) when inserted
        lengths = torch.zeros(B, dtype=torch.long, device=device)
        iterations = torch.zeros(B, dtype=torch.long, device=device)
        final_eos = torch.zeros(B, device=device)  # mean end-of-slot log-prob of the last pass
        active = torch.arange(B, device=device)[max_len > 0]
        history: List[List[Dict]] = [[] for _ in range(B)]
        passes = 0

        for _ in range(max_iter + 1):
            if active.numel() == 0:
                break
            enc = model.encoder.reorder_encoder_out(encoder_out, active)
            framed = C.frame(canvas[active], lengths[active], self.bos, self.eos, self.pad)  # (A, K+2)
            content_lp, location_lp = model.slot_log_probs(model.decoder(framed, encoder_out=enc), framed)
            passes += 1
            slots = C.slot_mask(lengths[active], content_lp.size(1))  # (A, S)
            final_eos[active] = (content_lp[..., self.eos] * slots).sum(1) / slots.sum(1)
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
            else:  # sequence finalization: stop when end-of-sequence wins anywhere
                V = content_lp.size(-1)
                flat = (content_lp + location_lp.unsqueeze(-1)).flatten(1).argmax(1)  # (A,) over (l, c)
                slot, tok = flat.div(V, rounding_mode="floor"), flat.remainder(V)
                insert = torch.zeros_like(open_).scatter_(1, slot.unsqueeze(1), tok.ne(self.eos).unsqueeze(1))
                best_tok = tok.unsqueeze(1).expand_as(best_tok)
                best_lp = content_lp.flatten(1).gather(1, flat.unsqueeze(1)).expand_as(best_lp)
            inserted = insert.any(1)  # (A,)
            new_canvas, new_len = C.insert(canvas[active], lengths[active], best_tok, insert, self.pad)
            new_scores, _ = C.insert(scores[active], lengths[active], best_lp, insert, 0.0)
            width = max(canvas.size(1), new_canvas.size(1))
            canvas = _widen(canvas, width, self.pad)
            scores = _widen(scores, width, 0.0)
            canvas[active] = _widen(new_canvas, width, self.pad)
            scores[active] = _widen(new_scores, width, 0.0)
            lengths[active] = new_len
            iterations[active] += inserted.long()
            if self.retain_history:
                for i, b in enumerate(active.tolist()):
                    if inserted[i]:
                        history[b].append(self._hypo(canvas[b], scores[b], lengths[b], iterations[b], 0.0))
            keep_going = inserted & (new_len < max_len[active]) & (iterations[active] < max_iter)
            active = active[keep_going]

        hypos = []
        for b in range(B):
            h = self._hypo(canvas[b], scores[b], lengths[b], iterations[b], final_eos[b])
            if self.retain_history:
                h["history"] = history[b]
            hypos.append([h])
        self._update_stats(lengths, iterations, passes)
        return hypos

    # -------------------------------------------------------------- helpers
    def _report_inputs(self, sample, src_tokens: Tensor, empty: Tensor, unknown: Tensor) -> None:
        """Name the lines that are empty or hold unknown words (one host sync).

        fairseq-generate passes sentence ids; fairseq-interactive does not, so
        there the line is named by its text."""
        flagged = (empty | unknown.gt(0)).nonzero().flatten().tolist()
        if not flagged:
            return
        ids = sample["id"].tolist() if "id" in sample else None
        for i in flagged:
            text = self.src_dict.string(src_tokens[i][src_tokens[i].ne(self.src_pad)])
            line = f"sentence {ids[i]}" if ids is not None else f"source line {text!r}"
            if empty[i]:
                logger.warning("%s: empty source line; its translation is empty", line)
            else:
                logger.warning("%s: %d unknown source word(s), read as <unk>", line, int(unknown[i]))

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
