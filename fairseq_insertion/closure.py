"""The slot-closure head (:class:`SlotClosure`, ``decoder.closure.*``) and the look-ahead closure (:class:`LookAhead`,
``decoder.lookahead.*``), optional parts of a checkpoint trained with the model frozen (``python -m
examples.train_closure``; docs/decoding.md), tied to their model by a fingerprint of its slot and output projections.
Applied by :func:`fairseq_insertion.slots.closing` and :func:`~fairseq_insertion.slots.ending` (torch) and their
``_graph`` twins (the export). Torch only."""

from __future__ import annotations

import hashlib
from typing import Mapping

import torch
from torch import Tensor, nn

PREFIX = "decoder.closure."
LOOKAHEAD = "decoder.lookahead."
FINGERPRINTED = ("decoder.slot_proj.weight", "decoder.output_projection.weight")


class SlotClosure(nn.Module):
    """h (N, C) -> (N,) the logit that the model closes the slot: a ReLU layer of width C, then one column."""

    def __init__(self, dim: int):
        super().__init__()
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, 1)
        self.register_buffer("threshold", torch.tensor(float("inf")))  # a logit: above it, the slot closes
        self.register_buffer("eos_penalty", torch.tensor(0.0))  # the beta its decisions were made at
        self.register_buffer("body", torch.zeros(4, dtype=torch.int64))  # fingerprint(): the model it belongs to

    def forward(self, h: Tensor) -> Tensor:
        return self.out(torch.relu(self.hidden(h))).squeeze(-1).float()  # (N,)


class LookAhead(nn.Module):
    """(h (N, C), w (N,), log p(w | l) (N,), log p(eos | l) (N,)) -> (N, 3) logits that the next pass closes the
    slot before w, the slot after w (where w is inserted) and the slot itself (where w is end-of-slot): a ReLU
    layer of ``width`` over the state, w's own vector and the two scores, then three columns."""

    def __init__(self, dim: int, vocab: int, width: int = 64):
        super().__init__()
        self.state = nn.Linear(dim, width)
        self.token = nn.Embedding(vocab, width)
        self.scores = nn.Linear(2, width, bias=False)
        self.out = nn.Linear(width, 3)
        self.register_buffer("threshold", torch.tensor(float("inf")))  # a logit: above it, the slots close
        self.register_buffer("eos_penalty", torch.tensor(0.0))
        self.register_buffer("body", torch.zeros(4, dtype=torch.int64))

    def forward(self, h: Tensor, w: Tensor, log_probs: Tensor, eos_log_probs: Tensor) -> Tensor:
        scores = torch.stack([log_probs, eos_log_probs], -1).to(h.dtype)  # (N, 2)
        return self.out(torch.relu(self.state(h) + self.token(w) + self.scores(scores))).float()  # (N, 3)


def fingerprint(state: Mapping[str, Tensor]) -> Tensor:
    """(4,) int64: sha256 of the slot projection's and the output projection's weights of a model's state."""
    digest = hashlib.sha256()
    for key in FINGERPRINTED:
        digest.update(state[key].detach().float().cpu().contiguous().numpy().tobytes())
    return torch.frombuffer(bytearray(digest.digest()), dtype=torch.int64).clone()


def check_fingerprint(state: Mapping[str, Tensor], name: str) -> None:
    """Refuse, in one line naming ``name``, a state whose closure head was trained for another model."""
    for prefix, what in ((PREFIX, "slot-closure head"), (LOOKAHEAD, "look-ahead closure")):
        if prefix + "body" in state and not torch.equal(state[prefix + "body"].cpu(), fingerprint(state)):
            raise ValueError(f"{name}: its {what} ({prefix}*) was trained for another model (the slot and output "
                             "projections differ); train one for this model with python -m examples.train_closure")
