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
import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Type

import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils, hub_utils
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


CONTENT_LOCATION = ("factorized", "joint")
WARM_START_SLOTS = ("left", "random")


class SlotHead(nn.Module):
    """Slot states H (B, S, h) -> content scores (B, S, V) and location logits (B, S).

    Content scores are log-scores whose softmax over the vocabulary is p(c | l);
    location logits' softmax over the real slots is p(l) (see
    :meth:`InsertionTransformerModel.slot_log_probs`). Paper, "Model Variants":

    * factorized: p(l) = softmax(H q), p(c | l) = softmax(h_l W);
    * joint: p(c, l) = softmax(flatten(H W)), i.e. location logits are the
      log-sum-exp of each slot's content scores;
    * context bias: b = maxpool(H) V (padding slots excluded) added to every
      slot's vocabulary logits;
    * mixture of softmaxes (K > 1, Yang et al. 2018): K latent contexts
      tanh(P_k h_l) with weights pi = softmax(h_l M); factorized:
      p(c | l) = sum_k pi_k softmax(tanh(P_k h_l) W + b); joint:
      p(c, l) proportional to sum_k pi_k exp(tanh(P_k h_l) W + b), which is
      softmax(flatten(H W + B)) at K = 1. Always combined in log space.
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

        select: (B, S) bool, decoding only: score the content of these slots
        alone; content is then (N, V) for the N selected slots in row-major
        order, and in the joint variant the location logits of the other
        slots are -inf.
        """
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
            location = H.matmul(self.location_query.to(H.dtype)).float()  # (B, S)
        elif select is None:
            location = content.logsumexp(-1)  # (B, S)
        else:
            location = content.new_full((B, S), float("-inf")).masked_scatter(select, content.logsumexp(-1))
        return content, location


class EncoderCache(NamedTuple):
    """What every decoding pass reuses of a batch's source side (one entry per sentence).

    Either the encoder-attention keys and values of every decoder layer,
    computed once (``keys``/``values``: per layer (B, heads, S_src, head dim);
    ``padding_mask``: (B, S_src) True at source padding; ``positions``: the
    decoder's position embeddings of a canvas without padding, (1, max target
    positions, C)), or, for decoder layers this fast path does not cover,
    fairseq's ``encoder_out``.
    """

    encoder_out: Optional[Dict[str, List[Tensor]]]
    keys: List[Tensor]
    values: List[Tensor]
    padding_mask: Optional[Tensor]
    positions: Optional[Tensor] = None


class InsertionDecoder(TransformerDecoderBase):
    """Non-causal Transformer decoder over a framed canvas, emitting slot scores.

    ``head`` (a :class:`SlotHead`) is attached by the model's ``build_model``.
    """

    def __init__(self, cfg: TransformerConfig, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        dim = self.output_embed_dim
        self.slot_proj = nn.Linear(2 * dim, dim)  # adjacent pair -> slot state
        nn.init.xavier_uniform_(self.slot_proj.weight)
        nn.init.zeros_(self.slot_proj.bias)
        self.head: Optional[SlotHead] = None

    def slot_states(self, prev_output_tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]]) -> Tensor:
        """Framed canvas (B, T+2) -> slot states H (B, T+1, C)."""
        x, _ = self.extract_features(prev_output_tokens, encoder_out, full_context_alignment=True)  # (B, T+2, C)
        return self.slot_proj(torch.cat([x[:, :-1], x[:, 1:]], dim=-1))  # (B, T+1, C)

    # ------------------------------------------------------------ decoding
    def _cacheable(self) -> bool:
        """Whether :meth:`cached_slot_states` covers these layers (plain pre- or post-norm
        layers with encoder attention; not NormFormer, cross-self-attention, bias_kv, or
        attention dropout kept at inference)."""
        def plain(attn) -> bool:
            return (attn is not None and attn.bias_k is None and not attn.add_zero_attn
                    and not attn.dropout_module.apply_during_inference)

        return not self.training and not self.cross_self_attention and all(
            plain(layer.self_attn) and plain(layer.encoder_attn) and not layer.cross_self_attention
            and layer.c_attn is None and layer.attn_ln is None and layer.ffn_layernorm is None
            and layer.w_resid is None
            for layer in self.layers
        )

    def encoder_cache(self, encoder_out: Dict[str, List[Tensor]]) -> EncoderCache:
        """Project the encoder output to every layer's encoder-attention keys and values once."""
        if not self._cacheable():
            return EncoderCache(encoder_out, [], [], None)
        enc = encoder_out["encoder_out"][0]  # (S_src, B, C)
        mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        S_src, B, _ = enc.shape
        keys, values = [], []
        for layer in self.layers:
            attn = layer.encoder_attn
            for proj, out in ((attn.k_proj, keys), (attn.v_proj, values)):
                x = proj(enc).view(S_src, B, attn.num_heads, attn.head_dim)
                out.append(x.permute(1, 2, 0, 3).contiguous())  # (B, heads, S_src, head dim)
        positions = None
        if self.embed_positions is not None:  # fairseq's make_positions numbers the real tokens 1, 2, ...
            positions = self.embed_positions(enc.new_full((1, self.max_positions()), self.dictionary.bos(),
                                                          dtype=torch.long))  # (1, P, C)
        return EncoderCache(None, keys, values, mask, positions)

    def cached_slot_states(self, framed: Tensor, cache: EncoderCache) -> Tensor:
        """:meth:`slot_states` in inference, reusing the encoder-attention keys and values
        of ``cache``. framed: (A, T+2) -> slot states (A, T+1, C)."""
        if cache.encoder_out is not None:
            return self.slot_states(framed, cache.encoder_out)
        x = self.embed_scale * self.embed_tokens(framed)  # (A, T+2, C), as in extract_features
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if cache.positions is not None:  # canvases are right-padded: a prefix of the table, zero at padding
            positions = cache.positions[:, : framed.size(1)]  # (1, T+2, C)
            x = x + (positions if framed.size(0) == 1 else positions * framed.ne(self.padding_idx).unsqueeze(-1))
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x).transpose(0, 1)  # (T+2, A, C)
        # a single canvas has no padding (the generator trims the batch to its longest canvas);
        # fairseq's extract_features passes no mask then either
        keep = framed.ne(self.padding_idx)[:, None, None, :] if framed.size(0) > 1 else None  # (A, 1, 1, T+2)
        src_keep = None if cache.padding_mask is None else ~cache.padding_mask[:, None, None, :]  # (A, 1, 1, S_src)
        for layer, k, v in zip(self.layers, cache.keys, cache.values):
            x = _cached_layer(layer, x, keep, k, v, src_keep)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return self.slot_proj(torch.cat([x[:, :-1], x[:, 1:]], dim=-1))  # (A, T+1, C)

    def forward(  # type: ignore[override]
        self, prev_output_tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]] = None, **kwargs
    ) -> Tuple[Tensor, Tensor]:
        """prev_output_tokens: framed canvas (B, T+2).

        Returns content scores (B, T+1, V) and location logits (B, T+1) in fp32;
        padding slots are masked by :meth:`InsertionTransformerModel.slot_log_probs`.
        """
        H = self.slot_states(prev_output_tokens, encoder_out)
        return self.head(H, prev_output_tokens[:, 1:].ne(self.padding_idx), self.output_layer)


def _cached_layer(layer, x: Tensor, keep: Optional[Tensor], k: Tensor, v: Tensor,
                  src_keep: Optional[Tensor]) -> Tensor:
    """One fairseq decoder layer in inference (full self-attention over the canvas), with
    the encoder-attention keys and values given. x: (T, A, C); k, v: (A, heads, S_src, d)."""
    x = _residual(layer, layer.self_attn_layer_norm, x, lambda h: _attention(layer.self_attn, h, h, keep))
    x = _residual(layer, layer.encoder_attn_layer_norm, x,
                  lambda h: _attention(layer.encoder_attn, h, (k, v), src_keep))
    return _residual(layer, layer.final_layer_norm, x,
                     lambda h: layer.fc2(layer.activation_dropout_module(layer.activation_fn(layer.fc1(h)))))


def _residual(layer, norm: nn.Module, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """fairseq's residual block: layer norm before (pre-norm) or after (post-norm) the sum."""
    y = sublayer(norm(x) if layer.normalize_before else x)
    x = layer.residual_connection(layer.dropout_module(y), x)
    return x if layer.normalize_before else norm(x)


def _attention(attn, x: Tensor, kv, keep: Optional[Tensor]) -> Tensor:
    """A fairseq ``MultiheadAttention`` in inference, as one scaled_dot_product_attention call.

    x: (T, A, C) queries; kv: the canvas itself (T, A, C) for self-attention, or the cached
    encoder keys and values, each (A, heads, S_src, d); keep: (A, 1, 1, S) True where
    attending is allowed (None: everywhere)."""
    T, A, C = x.shape

    def heads(y: Tensor) -> Tensor:  # (L, A, C) -> (A, heads, L, d)
        return y.view(y.size(0), A, attn.num_heads, attn.head_dim).permute(1, 2, 0, 3)

    k, v = (heads(attn.k_proj(kv)), heads(attn.v_proj(kv))) if torch.is_tensor(kv) else kv
    x = F.scaled_dot_product_attention(heads(attn.q_proj(x)), k, v, attn_mask=keep, scale=attn.scaling)
    return attn.out_proj(x.permute(2, 0, 1, 3).reshape(T, A, C))


@register_model(MODEL_NAME)
class InsertionTransformerModel(TransformerModel):
    """Encoder-decoder Insertion Transformer (Stern et al., 2019)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--content-location", choices=CONTENT_LOCATION,
                            help="factorized: p(c,l) = p(l) p(c|l) (default); joint: one softmax over all "
                                 "(slot, token) pairs (paper: Model Variants)")
        parser.add_argument("--context-bias", action="store_true", default=None,
                            help="add a contextualized vocabulary bias maxpool(H) V to every slot's logits")
        parser.add_argument("--mixture-components", type=int, metavar="K",
                            help="mixture-of-softmaxes output layer with K components (1: off, default)")
        parser.add_argument("--init-from-transformer", metavar="PATH",
                            help="warm start: copy the encoder, decoder layers and embeddings from this fairseq "
                                 "transformer checkpoint (same dictionary and sizes) when training starts; "
                                 "ignored when resuming and when loading a trained insertion checkpoint")
        parser.add_argument("--warm-start-slots", choices=WARM_START_SLOTS,
                            help="with --init-from-transformer, how the new slot layers start. left (default): "
                                 "a slot's state is its left neighbour's (slot projection [I | 0], bias 0) and "
                                 "p(l) is uniform (location query 0), so each slot scores its content with the "
                                 "teacher's next-token predictor; random: Xavier slot projection and random "
                                 "location query, as without a warm start")

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return InsertionDecoder(TransformerConfig.from_namespace(args), tgt_dict, embed_tokens)

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        model = super().build_model(args, task)
        dec = model.decoder
        dec.head = SlotHead(dec.output_embed_dim, len(task.target_dictionary), args.content_location,
                            bool(args.context_bias), args.mixture_components)
        # the training termination decides how the generator stops; the saved
        # model args carry the criterion's options (fairseq keeps one namespace)
        model.termination = getattr(args, "termination", "slot")
        return model

    # the class from_pretrained returns; fairseq_insertion.hub sets its InsertionHubInterface here when imported
    # (the package imports it), so that this module need not import the hub
    hub_interface: Type[hub_utils.GeneratorHubInterface] = hub_utils.GeneratorHubInterface

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        **kwargs) -> hub_utils.GeneratorHubInterface:
        """fairseq's hub loader, returning a :attr:`hub_interface`: the
        :class:`~fairseq_insertion.hub.InsertionHubInterface`, on which
        ``translate(src, constraints=[...])`` works."""
        x = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                      archive_map=cls.hub_models(), **kwargs)
        logger.info(x["args"])
        return cls.hub_interface(x["args"], x["task"], x["models"])

    def forward(self, src_tokens, src_lengths, prev_output_tokens, canvases_per_sentence: int = 1,
                **kwargs):  # type: ignore[override]
        """src_tokens: (B, T_src); prev_output_tokens: framed canvases (K B, T+2), canvas ``j`` of
        sentence ``b`` in row ``j B + b``. The encoder runs once; its output is repeated K times."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        if canvases_per_sentence > 1:
            order = torch.arange(src_tokens.size(0), device=src_tokens.device).repeat(canvases_per_sentence)
            encoder_out = self.encoder.reorder_encoder_out(encoder_out, order)  # batch B -> K B
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

    # decoding (fairseq_insertion.generator): the encoder runs once, every pass reuses its keys/values
    def decoding_cache(self, encoder_out: Dict[str, List[Tensor]]) -> EncoderCache:
        return self.decoder.encoder_cache(encoder_out)

    def reorder_decoding_cache(self, cache: EncoderCache, order: Tensor) -> EncoderCache:
        """Keep the sentences ``order`` (A,) of the cache, in that order."""
        if cache.encoder_out is not None:
            return cache._replace(encoder_out=self.encoder.reorder_encoder_out(cache.encoder_out, order))
        mask = cache.padding_mask
        return cache._replace(keys=[k.index_select(0, order) for k in cache.keys],
                              values=[v.index_select(0, order) for v in cache.values],
                              padding_mask=None if mask is None else mask.index_select(0, order))

    def decode_slots(self, framed: Tensor, cache: EncoderCache, select: Tensor) -> Tuple[Tensor, Tensor]:
        """One decoding pass. framed: (A, S+1) canvases, trimmed to the longest (a single
        canvas has no padding); select: (A, S) the slots that may receive a token (real and open).

        Returns the content log-scores of the selected slots (N, V) in fp32, whose softmax
        over the vocabulary is p(c | l) (unnormalised: callers normalise only what they
        need), and log p(l) (A, S) in fp32, -inf at padding slots.
        """
        H = self.decoder.cached_slot_states(framed, cache)  # (A, S, C)
        real = framed[:, 1:].ne(self.decoder.padding_idx)  # (A, S)
        content, location = self.decoder.head(H, real, self.decoder.output_layer, select)
        return content, location.float().masked_fill(~real, float("-inf")).log_softmax(-1)

    def max_decoder_positions(self) -> int:
        return self.decoder.max_positions()

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Refuse a checkpoint whose shapes differ from this model's, naming the
        dictionaries when the embedding tables disagree (the usual cause: a data
        directory other than the one the model was trained with)."""
        own = self.state_dict()
        wrong = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state_dict.items()
                 if k in own and own[k].shape != v.shape]
        if wrong:
            files = getattr(self, "dictionary_files", {})
            details = "; ".join(f"{k}: checkpoint {a}, model {b}" for k, a, b in wrong[:4])
            hint = ""
            if any("embed_tokens" in k or "output_projection" in k for k, _, _ in wrong):
                hint = (f" The dictionaries ({', '.join(files.values()) or 'of the data directory'}) have "
                        f"{len(self.encoder.dictionary)} source / {len(self.decoder.dictionary)} target entries, "
                        "not the ones the checkpoint was trained with: use the data directory it was trained on.")
            raise ValueError(f"checkpoint does not match the model ({details}).{hint}")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


# ----------------------------------------------------------------------------
# Warm start from an autoregressive fairseq Transformer (--init-from-transformer)
# ----------------------------------------------------------------------------
def _restore_checkpoint(args: Any) -> Optional[str]:
    """The checkpoint fairseq-train will restore after building the model, if one exists.

    Mirrors ``fairseq.checkpoint_utils.load_checkpoint``: ``--restore-file`` (default
    ``<save-dir>/checkpoint_last<suffix>.pt``).
    """
    restore, save_dir = getattr(args, "restore_file", None), getattr(args, "save_dir", None)
    if restore is None or save_dir is None:
        return None
    if restore == "checkpoint_last.pt":
        restore = os.path.join(save_dir, f"checkpoint_last{getattr(args, 'checkpoint_suffix', '') or ''}.pt")
    return restore if os.path.exists(restore) else None


def warm_start(model: "InsertionTransformerModel", args: Any) -> None:
    """Apply ``--init-from-transformer`` to a freshly built model at the start of training.

    Skipped when fairseq-train is about to restore a checkpoint (resuming): the
    restored weights replace these anyway, and the teacher file is not needed.
    Never called for a model loaded from a checkpoint (generate, interactive, hub).
    """
    path = getattr(args, "init_from_transformer", None)
    if not path:
        return
    restored = _restore_checkpoint(args)
    if restored is not None:
        logger.info("--init-from-transformer %s not applied: resuming from %s", path, restored)
        return
    for other in ("finetune_from_model", "continue_once"):
        if getattr(args, other, None):
            raise ValueError(f"--init-from-transformer {path} and --{other.replace('_', '-')} "
                             f"{getattr(args, other)} both set the initial weights; pass only one")
    init_from_transformer(model, path, getattr(args, "warm_start_slots", None) or "left")


def transformer_checkpoint(path: str, option: str) -> Dict[str, Any]:
    """A fairseq ``transformer`` checkpoint (model weights and ``cfg``), loaded with the safe
    loader; errors name the command-line ``option`` that gave ``path``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{option} {path}: no such file")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # unpickling, not a torch file, refused by the safe loader, ...
        raise ValueError(f"{option} {path}: cannot be read as a fairseq checkpoint "
                         f"({type(e).__name__}: {e})") from e
    cfg = state.get("cfg") if isinstance(state, dict) else None
    model_cfg = cfg.get("model") if cfg is not None else None
    arch = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)
    if not isinstance(state.get("model"), dict) or arch is None:
        raise ValueError(f"{option} {path}: not a fairseq model checkpoint (no model weights and architecture)")
    name = ARCH_MODEL_NAME_REGISTRY.get(arch, arch)
    if name != "transformer":
        raise ValueError(f"{option} {path}: trained with --arch {arch} (model {name!r}), not "
                         "fairseq's autoregressive transformer (--arch transformer or transformer_*)")
    return state


def _teacher_state(path: str) -> Dict[str, Tensor]:
    """The model state dict of a fairseq ``transformer`` checkpoint, loaded with the safe loader."""
    return transformer_checkpoint(path, "--init-from-transformer")["model"]


def init_from_transformer(model: "InsertionTransformerModel", path: str,
                          slots: str = "left") -> Dict[str, List[str]]:
    """Copy every tensor of a fairseq ``transformer`` checkpoint whose name and shape match.

    Raises ``ValueError`` listing every tensor whose shape differs (typically:
    another dictionary or other layer sizes). Tensors new in the insertion model
    (``decoder.slot_proj``, ``decoder.head.*``, ...) keep their fresh
    initialisation (but see ``slots``) and are named in one log line; teacher
    tensors the insertion model lacks are named in a warning. Where the insertion model ties tensors
    the teacher keeps separate (shared embeddings), the first name's value is
    used and a warning says so. Returns the names: copied, new, unused.

    slots: ``left`` starts the slot projection as [I | 0] (bias 0), so a slot's
    state is its left neighbour's decoder state, and the location query at 0
    (uniform p(l)): a slot's content scores are then the teacher's output layer
    applied to its left neighbour's state, i.e. the teacher's prediction of the
    token that follows it. ``random`` keeps the fresh initialisation.
    """
    if slots not in WARM_START_SLOTS:
        raise ValueError(f"--warm-start-slots must be one of {WARM_START_SLOTS}, got {slots!r}")
    theirs = _teacher_state(path)
    own = model.state_dict(keep_vars=True)  # name -> the Parameter / buffer itself (tied: same object)
    wrong = [(k, tuple(theirs[k].shape), tuple(v.shape)) for k, v in own.items()
             if k in theirs and theirs[k].shape != v.shape]
    if wrong:
        details = "; ".join(f"{k}: teacher {a}, insertion model {b}" for k, a, b in wrong)
        hint = ""
        if any("embed_tokens" in k or "output_projection" in k for k, _, _ in wrong):
            hint = (f" The data directory's dictionaries have {len(model.encoder.dictionary)} source / "
                    f"{len(model.decoder.dictionary)} target entries: train the insertion model on the teacher's "
                    "data directory.")
        raise ValueError(f"--init-from-transformer {path}: {len(wrong)} tensor(s) differ in shape from the "
                         f"insertion model's ({details}).{hint} Use the teacher's dictionary and sizes.")
    copied: List[str] = []
    new = [k for k in own if k not in theirs]
    unused = [k for k in theirs if k not in own]
    groups: Dict[int, List[str]] = {}  # tied tensors share one object
    for k, v in own.items():
        groups.setdefault(id(v), []).append(k)
    n_params = 0
    with torch.no_grad():
        for names in groups.values():
            sources = [k for k in names if k in theirs]
            if not sources:
                continue
            target = own[sources[0]]
            differ = [k for k in sources[1:] if not torch.equal(theirs[k], theirs[sources[0]])]
            if differ:
                logger.warning("--init-from-transformer: %s are one tensor in the insertion model but differ in the "
                               "teacher; initialised from the teacher's %s", ", ".join(sources), sources[0])
            target.copy_(theirs[sources[0]].to(dtype=target.dtype))
            copied.extend(sources)
            if isinstance(target, nn.Parameter):
                n_params += target.numel()
    if not any(isinstance(own[k], nn.Parameter) for k in copied):
        raise ValueError(f"--init-from-transformer {path}: no parameter of the teacher matches the insertion "
                         "model's by name")
    if slots == "left":
        _start_slots_at_left_neighbour(model)
    logger.info("--init-from-transformer %s: copied %d tensors (%d parameters); new in the insertion model, "
                "%s: %s", path, len(copied), n_params,
                "slots started at the left neighbour (--warm-start-slots left)" if slots == "left"
                else "freshly initialised", ", ".join(new) or "none")
    if unused:
        logger.warning("--init-from-transformer %s: teacher tensors the insertion model has no place for, not "
                       "used: %s", path, ", ".join(unused))
    return {"copied": copied, "new": new, "unused": unused}


def _start_slots_at_left_neighbour(model: "InsertionTransformerModel") -> None:
    """Slot state h_l = x_l, the left neighbour's state: slot projection [I | 0], bias 0;
    uniform p(l): location query 0 (factorized variant)."""
    proj, head = model.decoder.slot_proj, model.decoder.head
    dim = proj.weight.size(0)  # weight: (C, 2C)
    with torch.no_grad():
        proj.weight.zero_()
        proj.weight[:, :dim].copy_(torch.eye(dim, dtype=proj.weight.dtype))
        proj.bias.zero_()
        if head is not None and head.location_query is not None:
            head.location_query.zero_()


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
    _defaults(args, share_decoder_input_output_embed=True, content_location="factorized", context_bias=False,
              mixture_components=1)
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
