"""Lower-precision decoding, ``--decode-precision fp32|bf16|int8``: one model conversion for every model a
generator decodes with (the insertion model, or a transformer decoded through the same task): ``bf16``
casts every floating-point parameter and buffer (scores and softmaxes stay fp32; emulated and slow where
oneDNN reports no bf16, with a warning), ``int8`` is torch's dynamic quantization of every ``nn.Linear``
(CPU only). fairseq's own ``--fp16`` stays the GPU half-precision option.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from .config import PRECISIONS, offered

logger = logging.getLogger(__name__)


def for_decoding(model: nn.Module, precision: str) -> nn.Module:
    """Convert ``model`` (in eval mode) in place for decoding at ``precision``; returns it. Raises ``ValueError``
    naming the option where the precision cannot run here (int8 on a GPU or without a quantized engine, bf16 on a GPU
    without bf16). Converting twice is a no-op."""
    if precision not in PRECISIONS or not PRECISIONS[precision].torch:
        raise ValueError(f"--decode-precision must be one of {offered('torch')}, got {precision!r}")
    if precision == "fp32":
        return model
    device = next(model.parameters()).device
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(f"--decode-precision bf16: {torch.cuda.get_device_name(device)} has no bfloat16")
        if device.type == "cpu":
            try:  # whether oneDNN runs bfloat16 natively on this CPU
                native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
            except (AttributeError, RuntimeError):
                native = False
            if not native:
                logger.warning("--decode-precision bf16: this CPU has no native bfloat16 (oneDNN reports none): "
                               "it is emulated and likely slower than fp32")
        return model.to(torch.bfloat16)
    if device.type != "cpu":
        raise ValueError(f"--decode-precision int8 runs on the CPU only (dynamic quantization); the model is on "
                         f"{device}: use --cpu, or bf16 / fairseq's --fp16 on a GPU")
    if _quantized_engine() in (None, "none"):
        raise ValueError("--decode-precision int8: this torch build has no quantized engine "
                         f"(supported: {torch.backends.quantized.supported_engines})")
    for module in model.modules():
        # fairseq's MultiheadAttention reads its projections' .weight/.bias on a fast path (encoder
        # self-attention); a quantized Linear has none, so take the path that calls the modules
        skip = getattr(module, "_set_skip_embed_dim_check", None)
        if callable(skip):
            skip()
    with warnings.catch_warnings():  # torch's deprecation notice for eager-mode quantization
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


def _quantized_engine() -> str:
    return torch.backends.quantized.engine
