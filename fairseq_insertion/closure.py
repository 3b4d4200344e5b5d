"""The slot-closure head: one logit a slot from its state h (the vocabulary projection's input), trained with the
model frozen (``python -m examples.train_closure``) to say whether the model's own decision at the head's
EOS penalty closes the slot. At decoding, an open slot whose logit is above the head's threshold, whose EOS
penalty is the head's and that may end takes end-of-slot without the vocabulary projection
(:func:`fairseq_insertion.slots.closing` on torch, :func:`~fairseq_insertion.slots.closing_graph` in the export);
the others are scored as without the head. An optional part of a checkpoint (``decoder.closure.*``), tied to the
model it was trained for by a fingerprint of its slot and output projections. Torch only."""

from __future__ import annotations

import hashlib
from typing import Mapping

import torch
from torch import Tensor, nn

PREFIX = "decoder.closure."
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


def fingerprint(state: Mapping[str, Tensor]) -> Tensor:
    """(4,) int64: sha256 of the slot projection's and the output projection's weights of a model's state."""
    digest = hashlib.sha256()
    for key in FINGERPRINTED:
        digest.update(state[key].detach().float().cpu().contiguous().numpy().tobytes())
    return torch.frombuffer(bytearray(digest.digest()), dtype=torch.int64).clone()


def check_fingerprint(state: Mapping[str, Tensor], name: str) -> None:
    """Refuse, in one line naming ``name``, a state whose closure head was trained for another model."""
    if PREFIX + "body" in state and not torch.equal(state[PREFIX + "body"].cpu(), fingerprint(state)):
        raise ValueError(f"{name}: its slot-closure head ({PREFIX}*) was trained for another model (the slot and "
                         "output projections differ); train one for this model with python -m "
                         "examples.train_closure")
