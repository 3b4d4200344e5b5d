"""Greedy and parallel insertion decoding with the PyTorch model (paper: "Inference").

:class:`InsertionGenerator` is the task's generator; the loop is :mod:`fairseq_insertion.loop`'s, shared with the
deployment runtime, over :class:`ModelBackend` (the torch side of the backend's calls). docs/decoding.md describes the
options, the iterations counted and the scores.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol

import torch
from torch import Tensor

from . import loop as L
from . import slots as S
from .config import CONSTRAINT_ORDERS, DECODINGS, DecodingConfig, DecodingError
from .decoding import TORCH, WordEdges
from .loop import Canvases

logger = logging.getLogger(__name__)

__all__ = ["CONSTRAINT_ORDERS", "DECODINGS", "CandidateScorer", "InsertionGenerator"]


class CandidateScorer(Protocol):
    """Scores candidate translations, e.g. :class:`fairseq_insertion.rerank.AutoregressiveScorer`."""

    def log_probs(self, src_tokens: Tensor, src_lengths: Tensor, target: Tensor, per_source: int) -> Tensor:
        """(B x per_source,) log p(y | x) of each candidate ``target`` (B x per_source, T) (its tokens, the end,
        then pad), those of source b at rows b * per_source ..."""


@dataclass(frozen=True)
class ModelBackend:
    """The torch model as :func:`fairseq_insertion.loop.decode`'s :class:`~fairseq_insertion.loop.Backend`: a pass of
    the model over the open slots with the slot rule, the encoder cache following the sentences that go on, and
    the reranker's scores of the candidates."""

    model: Any
    slot_rule: S.SlotRule
    rerank: Optional[CandidateScorer]
    src_tokens: Tensor  # (B, S) for the reranker
    src_lengths: Tensor  # (B,)
    eos: int
    pad: int
    stats: Dict[str, int]  # its count of vocabulary rows scored ("vocabulary_rows")
    closure_beta: Optional[float] = None  # the EOS penalty of the model's slot-closure head; None: it has none
    lookahead_beta: Optional[float] = None  # the EOS penalty of its look-ahead closure; None: it has none
    incremental: bool = False  # the model keeps the canvas tokens' states between passes (the cached decoder)
    xp: Any = TORCH

    def score_slots(self, cache: Any, framed: Tensor, open_: Tensor, inputs: L.SlotInputs, k: int,
                    fresh: Optional[Tensor] = None) -> L.SlotChoice:
        """Only the open slots are projected onto the vocabulary, and only the log-normaliser (logsumexp) of each
        is computed: no (A, S, V) log-softmax."""
        may = None if self.closure_beta is None else S.may_close(inputs, open_, self.closure_beta, k)  # (N,)
        p = self.model.decode_slots(framed, cache, open_, may, fresh)  # (N', V), (A, S)
        self.stats["vocabulary_rows"] += p.content.shape[0]
        if p.closed is None:
            c = L.SlotChoice(*S.choose(self.slot_rule, p.content, inputs, k), p.location)
        else:
            chosen = S.choose(self.slot_rule, p.content, L.some_slots(inputs, ~p.closed), k)  # (N', k) (N', k) (N', 1)
            c = L.SlotChoice(*S.closing(p.closed, p.close_log_probs, inputs.eos_penalty, self.eos, chosen), p.location)
        c = c if p.cache is None else c._replace(memory=p.cache)
        ahead = None if p.states is None else S.may_close(inputs, open_, self.lookahead_beta, k)  # (N,)
        if ahead is None:
            return c
        ends, end_log_probs = S.ending(self.model.decoder.lookahead, p.states, c.tokens, c.log_probs,
                                       c.eos_log_probs, ahead, self.eos)  # (N,) each
        return c._replace(ends=ends, end_log_probs=end_log_probs)

    def reorder(self, cache: Any, keep: Tensor) -> Any:
        return self.model.reorder_decoding_cache(cache, keep)

    def score_candidates(self, tokens: Tensor, lengths: Tensor, per_source: int) -> Optional[Tensor]:
        if self.rerank is None:
            return None
        target = L.candidate_targets(TORCH, tokens, lengths, self.eos, self.pad)  # (B n, W)
        return self.rerank.log_probs(self.src_tokens, self.src_lengths, target, per_source)


class InsertionGenerator:
    """Builds fairseq hypothesis dicts by iterative insertion, as :class:`~fairseq_insertion.config.DecodingConfig` says
    (every option and its default lives there; ``InsertionGenerator(tgt_dict, eos_penalty=2)`` is
    ``InsertionGenerator(tgt_dict, DecodingConfig(eos_penalty=2))``).

    With ``eos_penalties`` (and ``first_insertions``) each sentence is decoded once per candidate in one batch and its
    candidates returned best first, by ``score`` or, with ``rerank``, by ``rerank_score`` (docs/decoding.md, which also
    defines ``positional_scores``). Hard constraints (``constraints=`` of :meth:`generate`) go on the initial canvas as
    whole words (:func:`~fairseq_insertion.loop.constraint_canvas`; docs/constraints.md). Decoding statistics:
    :meth:`summary`, logged once when the generator is freed or the process ends.
    """

    def __init__(self, tgt_dict, config: Optional[DecodingConfig] = None, *, src_dict=None,
                 rerank: Optional[CandidateScorer] = None, **options: Any):
        self.config = (config or DecodingConfig()).replace(**options) if options else (config or DecodingConfig())
        self.rerank = rerank
        self.tgt_dict = tgt_dict
        self.bos, self.eos, self.pad = tgt_dict.bos(), tgt_dict.eos(), tgt_dict.pad()
        self.src_dict = src_dict if src_dict is not None else tgt_dict
        self.src_pad, self.src_eos, self.src_unk = self.src_dict.pad(), self.src_dict.eos(), self.src_dict.unk()
        self.word_edges = WordEdges.from_dictionary(tgt_dict)  # which tokens glue onto a neighbour
        self.slot_rule = S.SlotRule.build((self.bos, self.pad, self.eos), self.eos, tgt_dict.unk(),
                                          self.word_edges.joins_next.numpy(), self.word_edges.joins_prev.numpy(),
                                          self.config.unkpen)  # what a slot may receive
        self.shortlist = None  # (--shortlist) the table of each sentence's list
        if self.config.shortlist is not None:
            try:
                self.shortlist = S.Shortlist.load(self.config.shortlist, len(self.src_dict), len(tgt_dict))
            except ValueError as exc:
                raise DecodingError(f"--shortlist (shortlist=) {exc}") from None
        self.stats = {**L.new_stats(), "vocabulary_rows": 0}
        # the summary line (see the class); the finalizer holds the statistics, not the generator
        weakref.finalize(self, _log_summary, self.config.decoding, self.stats)

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **kwargs) -> List[List[Dict]]:
        """Decode a batch. ``constraints``: fairseq's packed constraints (B, C) (``pack_constraints``); a ``pad`` token
        inside a constraint is a template gap. Without it, ``sample["constraints"]`` is used if present."""
        if len(models) != 1:
            raise NotImplementedError(f"insertion decoding takes one model; got an ensemble of {len(models)}")
        if prefix_tokens is not None:
            raise NotImplementedError("insertion decoding does not support --prefix-size")
        constraints = sample.get("constraints") if constraints is None else constraints
        cfg, model = self.config, models[0]
        if model.training:  # fairseq's CLIs and the hub already put it in eval mode
            model.eval()
        src_tokens, src_lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
        cache = model.decoding_cache(model.encoder(src_tokens, src_lengths=src_lengths))
        # each line's initial canvas and length limit (B,), naming the lines that cannot be decoded
        init = self._initial_canvas(constraints, src_tokens.size(0), src_tokens.device)
        p = L.prepare(TORCH, src_lengths, init, cfg, model.max_decoder_positions() - 2, self.pad,
                      constraints is not None, bool(getattr(model, "incremental", False)))
        self._report_inputs(sample, src_tokens, p.empty, src_tokens.eq(self.src_unk).sum(1), p.held.gt(0))
        if constraints is not None and "id" not in sample:  # fairseq-interactive's (the others name the words)
            unknown = constraints[:, 1:].eq(self.tgt_dict.unk()).sum(1)  # (B,) packed: the first column is a count
            for i in unknown.nonzero().flatten().tolist():
                logger.warning("%s: its constraints hold %d word(s) not in the target dictionary, read as <unk>",
                               self._line_name(sample, src_tokens, i), int(unknown[i]))
        if bool(p.unfit.any()):
            self._report_too_long(sample, src_tokens, p.unfit, p.held, p.limit)
        backend = self.backend(model, src_tokens, src_lengths)
        edges = self.word_edges.to(src_tokens.device)
        options = L.DecodeOptions(cfg, model.termination, self.bos, self.eos, self.pad, self.tgt_dict.unk(),
                                  edges.joins_next if edges.active else None)
        shortlist = None if self.shortlist is None else torch.from_numpy(S.shortlist_rows(
            self.shortlist, src_tokens.cpu().numpy(), (self.bos, self.pad, self.eos, self.tgt_dict.unk()),
            p.start.tokens.cpu().numpy())).to(src_tokens.device)
        found = L.decode(backend, cache, p.start, p.max_len, options, self._record if cfg.retain_history else None,
                         shortlist)
        # fairseq's hypothesis dicts of every sentence's candidates, best first
        out, n, betas = found.canvases, cfg.candidates, cfg.betas
        if found.teacher is not None:  # the scorer's normalised score and the ordering score of every row
            teacher = L.candidate_scores(found.teacher, out.lengths.float(), cfg.lenpen).tolist()
            rerank = found.score.tolist()
        rows = []
        for r in range(src_tokens.size(0) * n):
            h = self._hypo(out.tokens[r], out.scores[r], out.lengths[r], out.iterations[r], out.final_eos[r])
            h["eos_penalty"] = betas[r % len(betas)]
            if cfg.first_insertions > 1:
                h["first_insertion"] = (r // len(betas)) % cfg.first_insertions
            if out.history is not None:
                h["history"] = out.history[r]
            if found.teacher is not None:
                h["teacher_score"], h["rerank_score"] = teacher[r], rerank[r]
            rows.append(h)
        hypos = [[rows[b * n + c] for c in order] for b, order in enumerate(found.order.tolist())]
        L.tally(self.stats, found)
        return hypos

    def backend(self, model: Any, src_tokens: Tensor, src_lengths: Tensor) -> ModelBackend:
        """The loop's backend for a batch of these sources."""
        beta = lambda name: None if getattr(model.decoder, name, None) is None \
            else float(getattr(model.decoder, name).eos_penalty)  # noqa: E731  the optional heads'
        return ModelBackend(model, self.slot_rule, self.rerank, src_tokens, src_lengths, self.eos, self.pad, self.stats,
                            beta("closure"), beta("lookahead"), bool(getattr(model, "incremental", False)))

    def _initial_canvas(self, constraints, B: int, device) -> L.Start:
        """The empty canvas of every line, or the one holding its constraints."""
        if constraints is None:
            return L.Start.blank(TORCH, B, torch.zeros(0, dtype=torch.long, device=device), self.pad)
        if not torch.is_tensor(constraints) or constraints.dim() != 2 or constraints.size(0) != B:
            raise ValueError("constraints must be fairseq's packed constraints, a (batch, length) tensor "
                             f"(fairseq.token_generation_constraints.pack_constraints); got {constraints!r}")
        # a pad token inside a constraint is a template gap (___)
        return L.constraint_canvas(TORCH, constraints.to(device).long(), gap=self.pad, pad=self.pad)

    def _record(self, state: Canvases, inserted: Tensor) -> None:
        """--retain-iter-history: the canvas of every sentence that changed in this step."""
        for i in inserted.nonzero().flatten().tolist():
            state.history[int(state.rows[i])].append(
                self._hypo(state.tokens[i], state.scores[i], state.lengths[i], state.iterations[i], 0.0))

    # -------------------------------------------------------------- helpers
    def _line_name(self, sample, src_tokens: Tensor, i: int) -> str:
        """fairseq-generate passes sentence ids; fairseq-interactive does not: there the line is named by its text."""
        if "id" in sample:
            return f"sentence {int(sample['id'][i])}"
        return f"source line {self.src_dict.string(src_tokens[i][src_tokens[i].ne(self.src_pad)])!r}"

    def _report_inputs(self, sample, src_tokens: Tensor, empty: Tensor, unknown: Tensor, given: Tensor) -> None:
        """Name the lines that are empty (``given``: those with constraints) or hold unknown words."""
        flagged = (empty | unknown.gt(0)).nonzero().flatten().tolist()
        for i in flagged:
            line = self._line_name(sample, src_tokens, i)
            if empty[i]:
                logger.warning("%s: empty source line; %s", line,
                               "decoded from its constraints" if given[i] else "its translation is empty")
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
        return {"tokens": tokens, "score": L.candidate_scores(log_prob, n, self.config.lenpen), "log_prob": log_prob,
                "positional_scores": positional, "steps": int(steps), "attention": None, "alignment": None}

    def summary(self) -> str:
        return _summary(self.config.decoding, self.stats)


def _summary(decoding: str, s: Dict[str, int]) -> str:
    n, t, b = max(s["sentences"], 1), max(s["tokens"], 1), max(s["batches"], 1)
    return (f"insertion decoding ({decoding}): {s['sentences']} sentences, "
            f"mean iterations {s['iterations'] / n:.3f}, mean floor(log2 n)+1 {s['log2_bound'] / n:.3f}, "
            f"mean length {s['tokens'] / n:.2f}, batched forward passes {s['passes']} ({s['passes'] / b:.2f} per "
            f"batch of {n / b:.1f}), vocabulary rows per output token {s['vocabulary_rows'] / t:.2f}, "
            f"passes per sentence {s['sentence_passes'] / n:.2f} ({(s['sentence_passes'] - s['iterations']) / n:.2f} "
            f"inserting nothing), decoder positions per output token {s['positions'] / t:.2f} (framed canvases "
            f"{s['canvas'] / t:.2f})")


def _log_summary(decoding: str, stats: Dict[str, int]) -> None:
    if stats["sentences"]:
        logger.info(_summary(decoding, stats))
