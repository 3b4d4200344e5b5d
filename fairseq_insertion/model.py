"""Insertion Transformer model (paper: "Insertion Transformer Model").

An ordinary fairseq Transformer encoder and decoder layers, with two changes
to the decoder:

* full self-attention: no causal mask, every canvas position sees the whole
  canvas;
* slot representations: the canvas is framed as ``[bos] canvas [eos]``; the
  ``n + 2`` final states give ``n + 1`` slot states by concatenating each
  adjacent pair (projected back to model width).

Content-location distribution: factorized, ``p(c, l) = p(l) p(c | l)`` with
``p(l) = softmax(H q)`` and ``p(c | l) = softmax(h_l W)``.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_INV_REGISTRY,
    ARCH_MODEL_NAME_REGISTRY,
    ARCH_MODEL_REGISTRY,
    MODEL_DATACLASS_REGISTRY,
    MODEL_REGISTRY,
    register_model,
    register_model_architecture,
)
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerModel
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from torch import Tensor, nn

logger = logging.getLogger(__name__)

MODEL_NAME = "insertion_transformer"


def _replace_fairseq_registration(name: str) -> None:
    """fairseq registers its own NAT model under our name; remove it first.

    ``register_model`` would otherwise silently hand back fairseq's class, and
    re-registering its architecture raises.
    """
    existing = MODEL_REGISTRY.get(name)
    if existing is None or existing.__module__.startswith(__package__ or "fairseq_insertion"):
        return
    archs = ARCH_MODEL_INV_REGISTRY.pop(name, [])
    for arch in archs:
        ARCH_MODEL_REGISTRY.pop(arch, None)
        ARCH_MODEL_NAME_REGISTRY.pop(arch, None)
        ARCH_CONFIG_REGISTRY.pop(arch, None)
    MODEL_REGISTRY.pop(name, None)
    MODEL_DATACLASS_REGISTRY.pop(name, None)
    logger.info(
        "fairseq_insertion: replaced fairseq's built-in model %r (%s.%s, archs %s) with the plugin's",
        name, existing.__module__, existing.__name__, archs,
    )


_replace_fairseq_registration(MODEL_NAME)


class InsertionDecoder(TransformerDecoderBase):
    """Non-causal Transformer decoder over a framed canvas, emitting slot scores."""

    def __init__(self, cfg: TransformerConfig, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        dim = self.output_embed_dim
        self.slot_proj = nn.Linear(2 * dim, dim)  # adjacent pair -> slot state
        self.location_query = nn.Parameter(torch.empty(dim))  # q in p(l) = softmax(H q)
        nn.init.xavier_uniform_(self.slot_proj.weight)
        nn.init.zeros_(self.slot_proj.bias)
        nn.init.normal_(self.location_query, std=dim**-0.5)

    def forward(  # type: ignore[override]
        self, prev_output_tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]] = None, **kwargs
    ) -> Tuple[Tensor, Tensor]:
        """prev_output_tokens: framed canvas (B, T+2).

        Returns content logits (B, T+1, V) and location logits (B, T+1);
        padding slots are masked later, by :meth:`slot_log_probs`.
        """
        x, _ = self.extract_features(prev_output_tokens, encoder_out, full_context_alignment=True)  # (B, T+2, C)
        slots = self.slot_proj(torch.cat([x[:, :-1], x[:, 1:]], dim=-1))  # (B, T+1, C)
        content = self.output_layer(slots)  # (B, T+1, V)
        location = slots.matmul(self.location_query.to(slots.dtype))  # (B, T+1)
        return content, location


@register_model(MODEL_NAME)
class InsertionTransformerModel(TransformerModel):
    """Encoder-decoder Insertion Transformer (Stern et al., 2019)."""

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return InsertionDecoder(TransformerConfig.from_namespace(args), tgt_dict, embed_tokens)

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        # the training termination decides how the generator stops; the saved
        # model args carry the criterion's options (fairseq keeps one namespace)
        model.termination = getattr(args, "termination", "slot")
        model.tgt_dict = task.target_dictionary
        return model

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):  # type: ignore[override]
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out)

    def slot_log_probs(self, net_output: Tuple[Tensor, Tensor], canvas: Tensor) -> Tuple[Tensor, Tensor]:
        """log p(c | l) (B, S, V) and log p(l) (B, S), in fp32.

        canvas: the framed canvas (B, S+1) the output was computed from; its
        padding marks the padding slots, which get log p(l) = -inf.
        """
        content, location = net_output
        real = canvas[:, 1:].ne(self.decoder.padding_idx)  # (B, S) slot l is left of column l+1
        location = location.float().masked_fill(~real, float("-inf")).log_softmax(-1)
        return content.float().log_softmax(-1), location

    def max_decoder_positions(self) -> int:
        return self.decoder.max_positions()


# ----------------------------------------------------------------------------
# Architectures
# ----------------------------------------------------------------------------
def _defaults(args, **values) -> None:
    for key, value in values.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


@register_model_architecture(MODEL_NAME, "insertion_transformer")
def base_architecture(args) -> None:
    """The paper's transformer_base: 6+6 layers, 512, 8 heads, FFN 2048."""
    _defaults(args, share_decoder_input_output_embed=True)
    transformer_base_architecture(args)


@register_model_architecture(MODEL_NAME, "insertion_transformer_big")
def big_architecture(args) -> None:
    """transformer_big sizes: 6+6 layers, 1024, 16 heads, FFN 4096, dropout 0.3."""
    _defaults(
        args, encoder_embed_dim=1024, encoder_ffn_embed_dim=4096, encoder_attention_heads=16,
        decoder_embed_dim=1024, decoder_ffn_embed_dim=4096, decoder_attention_heads=16, dropout=0.3,
    )
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "insertion_transformer_small")
def small_architecture(args) -> None:
    """3+3 layers, 256, 4 heads, FFN 1024 (the Multi30k recipe's size)."""
    _defaults(
        args, encoder_layers=3, decoder_layers=3, encoder_embed_dim=256, encoder_ffn_embed_dim=1024,
        encoder_attention_heads=4, decoder_embed_dim=256, decoder_ffn_embed_dim=1024, decoder_attention_heads=4,
    )
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "insertion_transformer_tiny")
def tiny_architecture(args) -> None:
    """2+2 layers, 64, 4 heads, FFN 256: for tests."""
    _defaults(
        args, encoder_layers=2, decoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=256,
        encoder_attention_heads=4, decoder_embed_dim=64, decoder_ffn_embed_dim=256, decoder_attention_heads=4,
        dropout=0.0,
    )
    base_architecture(args)
