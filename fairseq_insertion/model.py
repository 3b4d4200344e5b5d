"""Insertion Transformer model (paper: "Insertion Transformer Model"): a fairseq Transformer whose decoder has full
self-attention (no causal mask) and slot representations: each adjacent pair of the ``n + 2`` final states of
``[bos] canvas [eos]`` concatenated and projected to one of ``n + 1`` slot states; factorized ``p(c, l) = p(l)
p(c | l)`` by default. Decoding: :mod:`fairseq_insertion.fast_decoder`; warm start and the checkpoint checks:
:mod:`fairseq_insertion.checkpoints`.
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from fairseq import hub_utils
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
from fairseq.tasks import TASK_REGISTRY
from torch import Tensor, nn

from .checkpoints import (
    WARM_START_SLOTS,
    DictionaryFiles,
    check_checkpoint_file,
    check_dictionaries,
    decoder_embeddings_shared,
    dictionary_files,
    unreadable_checkpoint,
)
from .closure import LOOKAHEAD, PREFIX, LookAhead, SlotClosure, check_fingerprint
from .config import TERMINATIONS
from .fairseq_fixes import command_line_checkpoints, local_model_dir
from .fast_decoder import EncoderCache, FusedProjections, cached_slot_states, encoder_cache, fused_projections
from .hub_interface import InsertionHubInterface
from .pass_decoder import FractionalPositions, PassCache, check_layers, pass_states, start_cache, trajectory_output
from .slot_head import CONTENT_LOCATION, SlotHead
from .weights import slot_head, slot_states

logger = logging.getLogger(__name__)

MODEL_NAME = "insertion_transformer"


def _replace_fairseq_registration(name: str) -> None:
    """fairseq registers its own NAT model under our name, which ``register_model`` would hand back: remove it."""
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
    logger.info("fairseq_insertion: replaced fairseq's built-in model %r (%s.%s, archs %s) with the plugin's", name,
                existing.__module__, existing.__name__, archs)


_replace_fairseq_registration(MODEL_NAME)


class SlotPass(NamedTuple):
    """One decoding pass's scores (:meth:`InsertionTransformerModel.decode_slots`)."""

    content: Tensor  # (N', V) the raw content scores of the open slots the closure head left open (all without it)
    location: Tensor  # (A, S) log p(l), -inf at padding slots
    closed: Optional[Tensor] = None  # (N,) the open slots the closure head closed; None: no head applied
    close_log_probs: Optional[Tensor] = None  # (N,) the head's log-probability that each open slot closes
    states: Optional[Tensor] = None  # (N, C) the open slots' states, for the look-ahead closure (None: no look-ahead)
    cache: Optional[PassCache] = None  # the cached decoder's cache after the pass; None: no cached decoder


class InsertionDecoder(TransformerDecoderBase):
    """Non-causal Transformer decoder over a framed canvas, emitting slot scores (``head``: set by ``build_model``)."""

    def __init__(self, cfg: TransformerConfig, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        dim = self.output_embed_dim
        self.slot_proj = nn.Linear(2 * dim, dim)  # adjacent pair -> slot state
        nn.init.xavier_uniform_(self.slot_proj.weight)
        nn.init.zeros_(self.slot_proj.bias)
        self.head: Optional[SlotHead] = None
        self.closure: Optional[SlotClosure] = None  # optional: python -m examples.train_closure
        self.lookahead: Optional[LookAhead] = None  # optional, the same command
        self.fractional: Optional[FractionalPositions] = None  # --cached-decoder (pass_decoder.py)
        self.recomputed = 0  # --recomputed-layers: its top layers re-read the whole canvas each pass

    def slot_states(self, prev_output_tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]]) -> Tensor:
        """Framed canvas (B, T+2) -> slot states H (B, T+1, C) (decoding: :func:`~.fast_decoder.cached_slot_states`)."""
        x, _ = self.extract_features(prev_output_tokens, encoder_out, full_context_alignment=True)  # (B, T+2, C)
        return self.pair_slots(x)

    def pair_slots(self, x: Tensor) -> Tensor:
        """Final states of a framed canvas (B, T+2, C) -> slot states (B, T+1, C) (:func:`~.weights.slot_states`)."""
        return slot_states(x, slot_head(self))  # (B, T+1, C)

    def forward(  # type: ignore[override]
        self, prev_output_tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        levels: Optional[Tensor] = None, target_lengths: Optional[Tensor] = None, **kwargs
    ) -> Tuple[Tensor, Tensor]:
        """prev_output_tokens: framed canvas (B, T+2) -> content scores (B, T+1, V) and location logits (B, T+1) in
        fp32 (padding slots masked by :meth:`InsertionTransformerModel.slot_log_probs`).
        The cached decoder (``--cached-decoder``) in training: prev_output_tokens is the framed target, ``levels``
        (B, T+2) the pass that inserts each column (:func:`~fairseq_insertion.pass_decoder.framed_levels`),
        ``target_lengths`` (B,); returns every pass's slots (:class:`TrajectoryOutput`)."""
        if self.fractional is not None:
            return trajectory_output(self, prev_output_tokens, levels, target_lengths, encoder_out)  # type: ignore
        H = self.slot_states(prev_output_tokens, encoder_out)
        return self.head(H, prev_output_tokens[:, 1:].ne(self.padding_idx), self.output_layer)


@register_model(MODEL_NAME)
class InsertionTransformerModel(TransformerModel):
    """Encoder-decoder Insertion Transformer (Stern et al., 2019)."""

    termination: str = "slot"
    """The termination the model was trained with (``--termination``, kept in the checkpoint's args), ``slot`` or
    ``sequence``: how the generator stops a sentence. Set by :meth:`build_model`."""

    dictionary_files: Optional[DictionaryFiles] = None
    """The task's dictionary files, which :meth:`load_state_dict` names when a checkpoint does not fit (or None)."""

    _fused_projections: Optional[FusedProjections] = None
    """Built by :meth:`decoding_cache` on first use, rebuilt when a parameter they come from changes."""

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
        parser.add_argument("--cached-decoder", action="store_true", default=None,
                            help="each token's decoder states computed once and kept between passes: fractional "
                                 "positions (bos's and eos's learned, an inserted token's from its neighbours') "
                                 "and attention to the tokens of one's own pass or earlier; trained on every pass "
                                 "of the balanced-tree order at once")
        parser.add_argument("--recomputed-layers", type=int, metavar="K",
                            help="with --cached-decoder, the top K decoder layers are not cached: they run over "
                                 "the whole canvas each pass, with full attention, on the cached layers' states "
                                 "(0: every layer cached, default)")

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return InsertionDecoder(TransformerConfig.from_namespace(args), tgt_dict, embed_tokens)

    @classmethod
    def build_model(cls, args, task):
        insertion_task = TASK_REGISTRY.get("insertion_translation")
        if insertion_task is None or not isinstance(task, insertion_task):
            # e.g. an insertion checkpoint given to fairseq-generate --task translation, whose autoregressive
            # beam search would fail deep inside fairseq
            files = ", ".join(command_line_checkpoints(getattr(task, "cfg", None)))  # --path, when decoding
            raise ValueError(f"{files + ': ' if files else ''}an Insertion Transformer (--arch "
                             f"{getattr(args, 'arch', MODEL_NAME)}) is trained and decoded by the "
                             f"insertion_translation task, not {type(task).__name__}: add "
                             "--user-dir REPO/fairseq_insertion --task insertion_translation")
        base_architecture(args)
        if getattr(args, "share_decoder_input_output_embed", None) is None:  # the arch's default: the teacher's
            args.share_decoder_input_output_embed = decoder_embeddings_shared(args)
        output_dim = getattr(args, "decoder_output_dim", None)
        for flag, given in (("--adaptive-softmax-cutoff", getattr(args, "adaptive_softmax_cutoff", None)),
                            ("--decoder-output-dim", output_dim if output_dim != args.decoder_embed_dim else None)):
            if given:  # the slot head scores every slot's decoder state against the whole output embedding
                raise ValueError(f"{flag} {given}: the Insertion Transformer's slot head reads the decoder's "
                                 f"states (--decoder-embed-dim {args.decoder_embed_dim}) and scores the whole "
                                 f"vocabulary; train without {flag}")
        model = super().build_model(args, task)
        dec = model.decoder
        dec.head = SlotHead(dec.output_embed_dim, len(task.target_dictionary), args.content_location,
                            bool(args.context_bias), args.mixture_components)
        termination = str(args.termination)
        if termination not in TERMINATIONS:
            raise ValueError(f"--termination must be one of {TERMINATIONS}, got {termination!r}")
        K, layers = int(args.recomputed_layers), len(dec.layers)
        if K and not args.cached_decoder or not 0 <= K <= layers:
            raise ValueError(f"--recomputed-layers {K}: takes --cached-decoder and 0 to the decoder's {layers} layers")
        if args.cached_decoder:
            check_layers(dec)
            dec.recomputed = K
            dec.embed_positions = None  # no absolute positions: they would change as tokens are inserted
            dec.fractional = FractionalPositions(dec.embed_dim)
        model.termination = termination
        model.dictionary_files = dictionary_files(getattr(task, "cfg", None))
        return model

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        **kwargs) -> InsertionHubInterface:
        """fairseq's hub loader, returning an :class:`~fairseq_insertion.hub_interface.InsertionHubInterface`,
        on which ``translate(src, constraints=[...])`` works."""
        # an archive: extracted safely (local_model_dir); a file that is not a checkpoint: refused, named
        model_dir = local_model_dir(model_name_or_path)
        if data_name_or_path is not None and not str(data_name_or_path).startswith("."):
            data_name_or_path = local_model_dir(data_name_or_path)
        files = [os.path.join(model_dir, f) for f in checkpoint_file.split(os.pathsep)] \
            if os.path.isdir(model_dir) else []
        for f in files:
            check_checkpoint_file(f, "from_pretrained:")
        try:
            x = hub_utils.from_pretrained(model_dir, checkpoint_file, data_name_or_path,
                                          archive_map=cls.hub_models(), **kwargs)
        except pickle.UnpicklingError as e:  # torch's safe loader refused something in the file
            raise unreadable_checkpoint(", ".join(files) or str(model_name_or_path), "from_pretrained:", e) from e
        logger.info(x["args"])
        return InsertionHubInterface(x["args"], x["task"], x["models"])

    def forward(self, src_tokens, src_lengths, prev_output_tokens, canvases_per_sentence: int = 1,
                levels: Optional[Tensor] = None, target_lengths: Optional[Tensor] = None,
                **kwargs):  # type: ignore[override]
        """src_tokens: (B, T_src); prev_output_tokens: framed canvases (K B, T+2), canvas ``j`` of
        sentence ``b`` in row ``j B + b``. The encoder runs once; its output is repeated K times.
        ``levels``, ``target_lengths``: the cached decoder's training (:meth:`InsertionDecoder.forward`)."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        if levels is not None:
            return self.decoder(prev_output_tokens, encoder_out=encoder_out, levels=levels,
                                target_lengths=target_lengths)
        if canvases_per_sentence > 1:
            order = torch.arange(src_tokens.size(0), device=src_tokens.device).repeat(canvases_per_sentence)
            encoder_out = self.encoder.reorder_encoder_out(encoder_out, order)  # batch B -> K B
        return self.decoder(prev_output_tokens, encoder_out=encoder_out)

    def slot_log_probs(self, net_output: Tuple[Tensor, Tensor], canvas: Tensor) -> Tuple[Tensor, Tensor]:
        """log p(c | l) (B, S, V) and log p(l) (B, S), in fp32. canvas: the framed canvas (B, S+1) the output was
        computed from; its padding slots get log p(l) = -inf."""
        content, location = net_output
        real = canvas[:, 1:].ne(self.decoder.padding_idx)  # (B, S) slot l is left of column l+1
        location = location.float().masked_fill(~real, float("-inf")).log_softmax(-1)
        return content.float().log_softmax(-1), location

    # decoding (fairseq_insertion.generator): the encoder runs once, every pass reuses its keys/values
    def decoding_cache(self, encoder_out: Dict[str, List[Tensor]]) -> Union[EncoderCache, PassCache]:
        self._fused_projections = fused_projections(self.decoder, self._fused_projections)
        cache = encoder_cache(self.decoder, encoder_out, self._fused_projections)
        if self.decoder.fractional is None:
            return cache
        d = self.decoder.dictionary
        return start_cache(self.decoder, cache, encoder_out["encoder_out"][0].size(1), d.bos(), d.eos())

    @property
    def incremental(self) -> bool:
        """Whether decoding keeps the canvas tokens' states between passes (the cached decoder)."""
        return self.decoder.fractional is not None

    def reorder_decoding_cache(self, cache: Union[EncoderCache, PassCache], order: Tensor
                               ) -> Union[EncoderCache, PassCache]:
        """Keep the sentences ``order`` (A,) of the cache, in that order."""
        if not isinstance(cache, PassCache) and cache.encoder_out is not None:
            return cache._replace(encoder_out=self.encoder.reorder_encoder_out(cache.encoder_out, order))
        return cache.select(order)

    def decode_slots(self, framed: Tensor, cache: Union[EncoderCache, PassCache], select: Tensor,
                     may_close: Optional[Tensor] = None, fresh: Optional[Tensor] = None) -> SlotPass:
        """One decoding pass. framed: (A, S+1) canvases, trimmed to the longest (a single canvas has no padding);
        select: (A, S) the slots that may receive a token (real and open); may_close (N,): the selected slots the
        closure head may close (None: the head is not used); fresh (A, S+1): the cached decoder's, the canvas columns
        not in its cache yet (None: none). Returns the content log-scores (fp32, unnormalised: their softmax is
        p(c | l)) of the selected slots the head left open, and log p(l) (A, S) in fp32."""
        passed = None
        if isinstance(cache, PassCache):
            x, passed = pass_states(self.decoder, framed, framed.eq(-1) if fresh is None else fresh, cache)
            H = self.decoder.pair_slots(x)  # (A, S, C)
        else:
            H = cached_slot_states(self.decoder, framed, cache)  # (A, S, C)
        real = framed[:, 1:].ne(self.decoder.padding_idx)  # (A, S)
        closed = close_log_probs = None
        states = H[select] if self.decoder.lookahead is not None else None  # (N, C)
        if may_close is not None and self.decoder.closure is not None:
            logits = self.decoder.closure(H[select] if states is None else states)  # (N,)
            closed = may_close & (logits > self.decoder.closure.threshold)
            close_log_probs = nn.functional.logsigmoid(logits)
            select = select.masked_scatter(select, ~closed)  # (A, S) the open slots the head left open
        content, location = self.decoder.head(H, real, self.decoder.output_layer, select)
        return SlotPass(content, location.float().masked_fill(~real, float("-inf")).log_softmax(-1), closed,
                        close_log_probs, states, passed)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Refuse a checkpoint that does not fit this model: embedding tables that do not fit :attr:`dictionary_files`
        (:func:`~fairseq_insertion.checkpoints.check_dictionaries`), or any other shape that differs."""
        if self.dictionary_files is not None:
            check_dictionaries(self.dictionary_files, "the checkpoint", weights=state_dict)
        if any(k.startswith((PREFIX, LOOKAHEAD)) for k in state_dict):  # the optional closure heads
            check_fingerprint(state_dict, "the checkpoint")
        if self.decoder.closure is None and any(k.startswith(PREFIX) for k in state_dict):
            self.decoder.closure = SlotClosure(self.decoder.output_embed_dim)
        if self.decoder.lookahead is None and any(k.startswith(LOOKAHEAD) for k in state_dict):
            self.decoder.lookahead = LookAhead(self.decoder.output_embed_dim, len(self.decoder.dictionary),
                                               state_dict[LOOKAHEAD + "state.weight"].shape[0])
        own = self.state_dict()
        wrong = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state_dict.items()
                 if k in own and own[k].shape != v.shape]
        if wrong:
            details = "; ".join(f"{k}: checkpoint {a}, model {b}" for k, a, b in wrong[:4])
            raise ValueError(f"checkpoint does not match the model ({details})")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


# -------------------------------- Architectures
def _defaults(args, **values) -> None:
    for key, value in values.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


@register_model_architecture(MODEL_NAME, "insertion_transformer")
def base_architecture(args) -> None:
    """The paper's transformer_base: 6+6 layers, 512, 8 heads, FFN 2048."""
    _defaults(args, content_location="factorized", context_bias=False, mixture_components=1, termination="slot",
              cached_decoder=False, recomputed_layers=0)
    # not given: decided when the model is built (decoder_embeddings_shared), kept None through fairseq's defaults
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", None) or None
    transformer_base_architecture(args)


@register_model_architecture(MODEL_NAME, "insertion_transformer_big")
def big_architecture(args) -> None:
    """transformer_big sizes: 6+6 layers, 1024, 16 heads, FFN 4096, dropout 0.3."""
    _defaults(args, encoder_embed_dim=1024, encoder_ffn_embed_dim=4096, encoder_attention_heads=16,
              decoder_embed_dim=1024, decoder_ffn_embed_dim=4096, decoder_attention_heads=16, dropout=0.3)
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "insertion_transformer_small")
def small_architecture(args) -> None:
    """3+3 layers, 256, 4 heads, FFN 1024 (the Multi30k recipe's size)."""
    _defaults(args, encoder_layers=3, decoder_layers=3, encoder_embed_dim=256, encoder_ffn_embed_dim=1024,
              encoder_attention_heads=4, decoder_embed_dim=256, decoder_ffn_embed_dim=1024, decoder_attention_heads=4)
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "insertion_transformer_tiny")
def tiny_architecture(args) -> None:
    """2+2 layers, 64, 4 heads, FFN 256: for tests."""
    _defaults(args, encoder_layers=2, decoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=256,
              encoder_attention_heads=4, decoder_embed_dim=64, decoder_ffn_embed_dim=256, decoder_attention_heads=4,
              dropout=0.0)
    base_architecture(args)
