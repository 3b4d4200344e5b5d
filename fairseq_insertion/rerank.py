"""Reranking insertion candidates with an autoregressive fairseq transformer (``--rerank-with PATH``, e.g. the
distillation teacher): the insertion analogue of fairseq's ``--iter-decode-with-external-reranker``. A batch's
candidates are scored in one teacher-forced pass, on one encoder output per source (docs/decoding.md).
"""

from __future__ import annotations

from typing import List

import torch
from fairseq.tasks.translation import TranslationTask
from torch import Tensor

from .checkpoints import DictionaryFiles, check_dictionaries, dictionary_files, transformer_checkpoint

OPTION = "--rerank-with"


class AutoregressiveScorer:
    """Length-normalised log p(y | x) / (n + 1) ** lenpen under a fairseq autoregressive transformer."""

    def __init__(self, model: torch.nn.Module, pad: int, eos: int, lenpen: float = 1.0):
        self.model, self.pad, self.eos, self.lenpen = model.eval(), pad, eos, float(lenpen)

    @classmethod
    def load(cls, path: str, src_dict, tgt_dict, device: torch.device, lenpen: float = 1.0, *,
             dictionaries: DictionaryFiles) -> "AutoregressiveScorer":
        """Load a transformer checkpoint trained with the same dictionaries as the insertion model (``src_dict``,
        ``tgt_dict``, read from the files ``dictionaries``); another kind of model or other dictionaries are refused."""
        state = transformer_checkpoint(path, OPTION)
        trained_with = dictionary_files(state["cfg"].get("task"))
        check_dictionaries(dictionaries, f"{OPTION} {path}", weights=state["model"], trained_with=trained_with)
        cfg = state["cfg"]
        task = TranslationTask(cfg.task, src_dict, tgt_dict)
        model = task.build_model(cfg.model)
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
        return cls(model.to(device), tgt_dict.pad(), tgt_dict.eos(), lenpen)

    @torch.no_grad()
    def score(self, src_tokens: Tensor, src_lengths: Tensor, hyps: List[Tensor], per_source: int = 1) -> Tensor:
        """src_tokens: (B, S) the sources (left-padded); hyps: B x ``per_source`` token tensors, each ending with eos,
        those of source b at rows b * per_source ... -> (B x per_source,) :meth:`log_probs` / (n + 1) ** lenpen."""
        target = torch.nn.utils.rnn.pad_sequence(hyps, batch_first=True, padding_value=self.pad)  # (N, T)
        real = target.ne(self.pad).sum(1).clamp(min=1).float()  # (N,) n + 1
        return self.log_probs(src_tokens, src_lengths, target, per_source) / real ** self.lenpen

    @torch.no_grad()
    def log_probs(self, src_tokens: Tensor, src_lengths: Tensor, target: Tensor, per_source: int = 1) -> Tensor:
        """(B x per_source,) log p(y | x) of each candidate ``target`` (B x per_source, T) (its tokens, eos, then
        pad), those of source b at rows b * per_source ...: the encoder runs once per source, the decoder
        once, teacher-forced, for all candidates."""
        target = target.to(src_tokens.device)
        if target.size(0) != src_tokens.size(0) * per_source:
            raise ValueError(f"{target.size(0)} candidates for {src_tokens.size(0)} sources x {per_source} each")
        prev = torch.cat([target.new_full((target.size(0), 1), self.eos), target[:, :-1]], 1)  # eos, y_1 .. y_n
        prev = prev.masked_fill(target.eq(self.pad), self.pad)
        encoder_out = self.model.encoder(src_tokens, src_lengths=src_lengths)
        if per_source > 1:
            order = torch.arange(src_tokens.size(0), device=src_tokens.device).repeat_interleave(per_source)
            encoder_out = self.model.encoder.reorder_encoder_out(encoder_out, order)
        lprobs = self.model.get_normalized_probs(self.model.decoder(prev, encoder_out=encoder_out), log_probs=True)
        real = target.ne(self.pad)  # (N, T)
        return lprobs.float().gather(-1, target.unsqueeze(-1)).squeeze(-1).masked_fill(~real, 0.0).sum(1)  # (N,)
