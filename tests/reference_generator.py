"""A frozen copy of the insertion decoding loop as it was before the per-pass cost work
(one re-encoding of the whole canvas and a full log-softmax per pass): the reference the optimised
:mod:`fairseq_insertion.generator` is checked against (tests/test_decoder_reference.py).
Only the loop (``generate`` and ``_decode``, with its room cap and insertion) is the old code; input checks, hypothesis
dicts and statistics are the current generator's, which the old loop shared. Not used
by the plugin.
"""

from types import SimpleNamespace
from typing import Dict, List, Tuple

import torch
from torch import Tensor

from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.loop import geometry


def _cap(insert: Tensor, score: Tensor, room: Tensor) -> Tensor:
    """At most ``room`` insertions per row, the highest-scoring ones; of equal scores the leftmost
    (frozen here, apart from the package's loop)."""
    order = score.masked_fill(~insert, float("-inf")).argsort(dim=1, descending=True, stable=True)  # (A, S)
    return insert & (order.argsort(dim=1, stable=True) < room.unsqueeze(1))


def _one_hot_argmax(x: Tensor) -> Tensor:
    return torch.zeros_like(x, dtype=torch.bool).scatter_(1, x.argmax(1, keepdim=True), True)


def _widen(x: Tensor, width: int, value) -> Tensor:
    return x if x.size(1) >= width else torch.nn.functional.pad(x, (0, width - x.size(1)), value=value)


def _insert(canvas: Tensor, lengths: Tensor, slot_values: Tensor, mask: Tensor, pad) -> Tuple[Tensor, Tensor]:
    """Insert ``slot_values[l]`` into every slot l where ``mask`` (frozen: the canvas moves as the
    paper says, token j right by the insertions in slots 0..j)."""
    ins = mask.long()
    before = ins.cumsum(1)  # (B, S)
    new_len = lengths + ins.sum(1)
    width = int(new_len.max()) if canvas.size(0) else 0
    K, S = canvas.size(1), mask.size(1)
    j = torch.arange(K, device=canvas.device).unsqueeze(0)
    tok_pos = torch.where(j < lengths.unsqueeze(1), j + before[:, :K], width)
    ins_pos = torch.where(mask, torch.arange(S, device=canvas.device).unsqueeze(0) + before - ins, width)
    out = canvas.new_full((canvas.size(0), width + 1), pad)
    out.scatter_(1, torch.cat([tok_pos, ins_pos], 1), torch.cat([canvas, slot_values.to(canvas.dtype)], 1))
    return out[:, :width], new_len


class ReferenceInsertionGenerator(InsertionGenerator):
    """The previous decoding loop: the whole framed canvas re-encoded on every pass, a
    (B, S, V) log-softmax, three ``loop.insert`` calls and every active row written back."""

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
        cfg = self.config
        max_len = (src_lengths.float() * cfg.max_len_a + cfg.max_len_b).long().clamp(0, limit)  # (B,)
        real_src = src_tokens.ne(self.src_pad) & src_tokens.ne(self.src_eos)  # (B, S)
        empty = ~real_src.any(1)  # (B,) an empty source line translates to an empty output (or its constraints)
        init = self._initial_canvas(constraints, B, device)
        self._report_inputs(sample, src_tokens, empty, src_tokens.eq(self.src_unk).sum(1), init[1].gt(0))

        len0 = init[1]  # (B,) constraint tokens per line
        max_len = torch.where(empty, len0, max_len)
        too_long = len0 > max_len  # (B,) constraints that do not fit: that line's output is empty
        if bool(too_long.any()):
            self._report_too_long(sample, src_tokens, too_long, len0, max_len)
            init = init.emptied(TORCH, too_long, self.pad)
            max_len = max_len.masked_fill(too_long, 0)
        if self.config.constraint_order == "unordered" and constraints is not None and init[0].size(1) > 0:
            blank = L.Start.blank(TORCH, B, torch.zeros(0, dtype=torch.long, device=device), self.pad)
            first = self._decode(model, encoder_out, blank, max_len, src_tokens)
            init = _reorder_constraints(init, first[0], first[2])
        canvas, scores, lengths, iterations, final_eos, history, passes = self._decode(
            model, encoder_out, init, max_len, src_tokens)

        hypos = []
        for b in range(B):
            h = self._hypo(canvas[b], scores[b], lengths[b], iterations[b], final_eos[b])
            if self.config.retain_history:
                h["history"] = history[b]
            hypos.append([h])
        canvases = SimpleNamespace(lengths=lengths, iterations=iterations)  # the current generator's statistics
        L.tally(self.stats, L.Decoded(canvases, None, None, None, torch.zeros(B, 1, dtype=torch.long), passes))
        return hypos


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
        closed = geometry.closed_slots(TORCH, closed_before, closed_end, lengths, S0)  # (B, S0)
        any_open = (L.slot_mask(TORCH, lengths, S0) & ~closed).any(1)  # (B,)
        active = torch.arange(B, device=device)[(max_len > lengths) & any_open]
        max_iter = (self.config.max_iterations or int((max_len - lengths).clamp(min=0).max())) if B else 0
        termination = getattr(model, "termination", "slot")
        history: List[List[Dict]] = [[] for _ in range(B)]
        passes = 0

        for _ in range(max_iter + 1):
            if active.numel() == 0:
                break
            enc = model.encoder.reorder_encoder_out(encoder_out, active)
            framed = L.frame(TORCH, canvas[active], lengths[active], self.bos, self.eos, self.pad)  # (A, K+2)
            content_lp, location_lp = model.slot_log_probs(model.decoder(framed, encoder_out=enc), framed)
            passes += 1
            S = content_lp.size(1)
            closed = geometry.closed_slots(TORCH, closed_before[active], closed_end[active], lengths[active],
                                           S)  # (A, S)
            slots = L.slot_mask(TORCH, lengths[active], S) & ~closed  # (A, S) the open slots
            final_eos[active] = (content_lp[..., self.eos] * slots).sum(1) / slots.sum(1).clamp(min=1)
            content_lp[..., self.eos] -= self.config.eos_penalty
            content_lp[..., self.bos] = float("-inf")
            content_lp[..., self.pad] = float("-inf")
            best_lp, best_tok = content_lp.max(-1)  # (A, S) per-slot argmax of p(c | l)
            open_ = slots & best_tok.ne(self.eos)
            room = max_len[active] - lengths[active]  # (A,)
            if self.config.decoding == "parallel":
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
            new_canvas, new_len = _insert(canvas[active], lengths[active], best_tok, insert, self.pad)
            new_scores, _ = _insert(scores[active], lengths[active], best_lp, insert, 0.0)
            # an inserted token opens the slots on both its sides: the slot before it is open
            new_closed, _ = _insert(closed_before[active], lengths[active], torch.zeros_like(insert), insert, False)
            width = max(canvas.size(1), new_canvas.size(1))
            canvas = _widen(canvas, width, self.pad)
            scores = _widen(scores, width, 0.0)
            closed_before = _widen(closed_before, width, False)
            canvas[active] = _widen(new_canvas, width, self.pad)
            scores[active] = _widen(new_scores, width, 0.0)
            closed_before[active] = _widen(new_closed, width, False)
            lengths[active] = new_len
            iterations[active] += inserted.long()
            if self.config.retain_history:
                for i, b in enumerate(active.tolist()):
                    if inserted[i]:
                        history[b].append(self._hypo(canvas[b], scores[b], lengths[b], iterations[b], 0.0))
            keep_going = inserted & (new_len < max_len[active]) & (iterations[active] < max_iter)
            active = active[keep_going]
        return canvas, scores, lengths, iterations, final_eos, history, passes

    # -------------------------------------------------------------- helpers


# ---------------------------------------------------------------- constraint order (frozen: the torch code it was)
def order_segments(segment: Tensor, lengths: Tensor, key: Tensor) -> Tensor:
    """A permutation of canvas columns that puts whole constraints in order of ``key``.

    segment: (B, K) constraint index of each canvas token; key: (B, G) one
    sort key per constraint (ties keep the given order). Tokens of one
    constraint stay together and in order. Returns (B, K) indices for
    ``gather`` on the canvas (padding stays last).
    """
    B, K = segment.shape
    G = key.size(1)
    seg_rank = (key * (G + 1) + torch.arange(G, device=key.device)).argsort(1).argsort(1)  # (B, G)
    tok_rank = seg_rank.gather(1, segment.clamp(0, max(G - 1, 0))) if G > 0 else segment
    j = torch.arange(K, device=segment.device).unsqueeze(0)
    real = j < lengths.unsqueeze(1)
    token_key = torch.where(real, tok_rank * (K + 1) + j, (G + 1) * (K + 1) + j)  # (B, K)
    return token_key.argsort(1)


def first_occurrence(tokens: Tensor, lengths: Tensor, query: Tensor) -> Tensor:
    """Index of the first occurrence of each ``query`` token in ``tokens``.

    tokens: (B, T) with real lengths (B,); query: (B, G). Returns (B, G), ``T + g``
    where query token g does not occur (so absent ones sort last, in order).
    """
    T, G = tokens.size(1), query.size(1)
    absent = T + torch.arange(G, device=tokens.device).unsqueeze(0)  # (1, G)
    if T == 0:  # every translation empty (e.g. every line's constraints over its length limit)
        return absent.expand(tokens.size(0), G)
    valid = torch.arange(T, device=tokens.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
    hit = query.unsqueeze(2).eq(tokens.unsqueeze(1)) & valid.unsqueeze(1)  # (B, G, T)
    found = hit.any(2)
    return torch.where(found, hit.long().argmax(2), absent)


def _reorder_constraints(init: L.Start, hyp: Tensor, hyp_lengths: Tensor) -> L.Start:
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
    key = first_occurrence(hyp, hyp_lengths, first_tok)  # (B, G)
    anchored = (closed_before[:, 0] if K else closed_end) | closed_end
    key = torch.where(anchored.unsqueeze(1), torch.arange(G, device=key.device).expand_as(key), key)
    perm = order_segments(segment, lengths, key)  # (B, K)
    return init._replace(tokens=canvas.gather(1, perm), closed_before=closed_before.gather(1, perm),
                         segment=segment.gather(1, perm))
