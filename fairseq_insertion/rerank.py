"""Reranking insertion candidates with an autoregressive fairseq transformer
(``--rerank-with PATH``, e.g. the distillation teacher): the insertion analogue
of fairseq's ``--iter-decode-with-external-reranker``.

The candidates of a batch (each sentence decoded under several EOS penalties,
``--eos-penalties``) are scored in one teacher-forced forward pass; a
candidate's score is its length-normalised log-probability
``log p(y | x) / (n + 1) ** lenpen`` (the ``n`` tokens and end-of-sentence;
fairseq's ``--lenpen``, default 1: the mean token log-probability).
"""

from __future__ import annotations

import os
from typing import List

import torch
from fairseq.data import data_utils
from fairseq.tasks.translation import TranslationTask
from torch import Tensor

from .model import transformer_checkpoint

OPTION = "--rerank-with"


class AutoregressiveScorer:
    """Length-normalised log p(y | x) / (n + 1) ** lenpen under a fairseq autoregressive transformer."""

    def __init__(self, model: torch.nn.Module, pad: int, eos: int, lenpen: float = 1.0):
        self.model, self.pad, self.eos, self.lenpen = model.eval(), pad, eos, float(lenpen)

    @classmethod
    def load(cls, path: str, src_dict, tgt_dict, device: torch.device, lenpen: float = 1.0) -> "AutoregressiveScorer":
        """Load a transformer checkpoint trained with the same dictionaries as the insertion model.

        Refused, naming the files: another kind of model, or other dictionaries (the
        checkpoint's training data directory holds different dictionary files, or its
        embedding tables have other sizes).
        """
        state = transformer_checkpoint(path, OPTION)
        _check_dictionaries(path, state, src_dict, tgt_dict)
        cfg = state["cfg"]
        task = TranslationTask(cfg.task, src_dict, tgt_dict)
        model = task.build_model(cfg.model)
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
        return cls(model.to(device), tgt_dict.pad(), tgt_dict.eos(), lenpen)

    @torch.no_grad()
    def score(self, src_tokens: Tensor, src_lengths: Tensor, hyps: List[Tensor]) -> Tensor:
        """src_tokens: (N, S) the source of each candidate (left-padded, as fairseq batches
        it); hyps: N token tensors, each ending with eos. Returns (N,) scores, one
        teacher-forced forward pass for all of them."""
        target = torch.nn.utils.rnn.pad_sequence(hyps, batch_first=True, padding_value=self.pad)  # (N, T)
        target = target.to(src_tokens.device)
        prev = torch.cat([target.new_full((target.size(0), 1), self.eos), target[:, :-1]], 1)  # eos, y_1 .. y_n
        prev = prev.masked_fill(target.eq(self.pad), self.pad)
        lprobs = self.model.get_normalized_probs(self.model(src_tokens, src_lengths, prev), log_probs=True)
        real = target.ne(self.pad)  # (N, T)
        tok = lprobs.float().gather(-1, target.unsqueeze(-1)).squeeze(-1).masked_fill(~real, 0.0)  # (N, T)
        return tok.sum(1) / real.sum(1).clamp(min=1).float() ** self.lenpen


def _check_dictionaries(path: str, state: dict, src_dict, tgt_dict) -> None:
    weights = state["model"]
    for side, key, d in (("source", "encoder.embed_tokens.weight", src_dict),
                         ("target", "decoder.embed_tokens.weight", tgt_dict)):
        table = weights.get(key)
        if table is not None and table.size(0) != len(d):
            raise ValueError(f"{OPTION} {path}: its {side} embedding table has {table.size(0)} entries, but the "
                             f"insertion model's {side} dictionary has {len(d)}: the reranker must be trained with "
                             "the same dictionaries (the same data-bin directory)")
    task_cfg = state["cfg"].get("task") if state.get("cfg") is not None else None
    data = str(getattr(task_cfg, "data", None) or "").split(":")[0]
    if not os.path.isdir(data):
        return  # trained elsewhere: the embedding sizes above are all that can be checked
    langs = (getattr(task_cfg, "source_lang", None), getattr(task_cfg, "target_lang", None))
    if None in langs:  # fairseq reads them from the data file names then
        langs = data_utils.infer_language_pair(data)
    if None in langs:
        return
    for side, lang, d in (("source", langs[0], src_dict), ("target", langs[1], tgt_dict)):
        theirs = os.path.join(data, f"dict.{lang}.txt")
        if os.path.isfile(theirs) and _symbols(theirs) != d.symbols[d.nspecial:]:
            raise ValueError(f"{OPTION} {path}: it was trained with the {side} dictionary {theirs}, which differs "
                             "from the insertion model's: the reranker must share its dictionaries")


def _symbols(dict_file: str) -> List[str]:
    with open(dict_file, encoding="utf-8") as f:
        return [line.rstrip("\n").rsplit(" ", 1)[0] for line in f if line.strip()]
