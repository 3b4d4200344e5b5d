"""The slot head of the Insertion Transformer (paper: "Model Variants"): slot states -> content scores and location
logits, factorized or joint, with the optional context bias and mixture of softmaxes."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import Tensor, nn

CONTENT_LOCATION = ("factorized", "joint")


class SlotHead(nn.Module):
    """Slot states H (B, S, h) -> content scores (B, S, V), whose softmax over the vocabulary is p(c | l), and location
    logits (B, S), whose softmax over the real slots is p(l). Paper, "Model Variants" (docs/training.md):

    * factorized: p(l) = softmax(H q), p(c | l) = softmax(h_l W); joint: p(c, l) = softmax(flatten(H W)), i.e.
      location logits are the log-sum-exp of each slot's content scores;
    * context bias: b = maxpool(H) V (padding slots excluded) added to every slot's vocabulary logits;
    * mixture of softmaxes (K > 1, Yang et al. 2018): K latent contexts tanh(P_k h_l) with weights
      pi = softmax(h_l M), combined in log space.
    """

    def __init__(self, dim: int, vocab_size: int, content_location: str = "factorized", context_bias: bool = False,
                 mixture_components: int = 1):
        super().__init__()
        if content_location not in CONTENT_LOCATION:
            raise ValueError(f"--content-location must be one of {CONTENT_LOCATION}, got {content_location!r}")
        if mixture_components < 1:
            raise ValueError(f"--mixture-components must be >= 1, got {mixture_components}")
        self.joint = content_location == "joint"
        self.K = mixture_components
        self.location_query = None if self.joint else nn.Parameter(torch.empty(dim).normal_(std=dim**-0.5))  # q
        self.context_bias = nn.Linear(dim, vocab_size, bias=False) if context_bias else None  # V
        # the variants start out close to the base model: zero bias, uniform mixture
        # weights, and latent contexts tanh(P_k h) with P_k near the identity
        if self.context_bias is not None:
            nn.init.zeros_(self.context_bias.weight)
        if self.K > 1:
            self.mixture_latent = nn.Linear(dim, self.K * dim)  # P_1..P_K
            self.mixture_prior = nn.Linear(dim, self.K, bias=False)  # M
            with torch.no_grad():
                eye = torch.eye(dim).repeat(self.K, 1)  # (K h, h)
                self.mixture_latent.weight.copy_(eye + 0.02 * torch.randn_like(eye))
                self.mixture_latent.bias.zero_()
                self.mixture_prior.weight.zero_()

    def forward(self, H: Tensor, real: Tensor, project: Callable[[Tensor], Tensor],
                select: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """H: (B, S, h) slot states; real: (B, S) True at real slots; project: x -> x W.

        select: (B, S) bool, decoding only: score the content of these slots alone; content is then (N, V) for the N
        selected slots in row-major order, and in the joint variant the location logits of the other slots are -inf."""
        B, S, h = H.shape
        bias = None
        if self.context_bias is not None:
            g = H.masked_fill(~real.unsqueeze(-1), float("-inf")).max(1).values  # (B, h) maxpool over real slots
            bias = self.context_bias(g).float().unsqueeze(1)  # (B, 1, V)
            if select is not None:
                rows = torch.arange(B, device=H.device).unsqueeze(1).expand(B, S)[select]  # (N,)
                bias = bias.squeeze(1).index_select(0, rows)  # (N, V)
        Hc = H if select is None else H[select]  # (B, S, h) or (N, h)
        if self.K == 1:
            content = project(Hc).float()  # (..., V)
            if bias is not None:
                content = content + bias
        else:
            latent = torch.tanh(self.mixture_latent(Hc)).unflatten(-1, (self.K, h))  # (..., K, h)
            z = project(latent).float()  # (..., K, V)
            if bias is not None:
                z = z + bias.unsqueeze(-2)
            log_pi = self.mixture_prior(Hc).float().log_softmax(-1).unsqueeze(-1)  # (..., K, 1)
            if not self.joint:
                z = z.log_softmax(-1)  # each component normalised per slot
            content = (log_pi + z).logsumexp(-2)  # (..., V)
        if not self.joint:
            location = H.matmul(self.location_query.to(H.dtype)).float()  # (B, S) H q, in fp32
        elif select is None:
            location = content.logsumexp(-1)  # (B, S)
        else:
            location = content.new_full((B, S), float("-inf")).masked_scatter(select, content.logsumexp(-1))
        return content, location
