"""fairseq_insertion: the Insertion Transformer (Stern et al., 2019) as a fairseq ``--user-dir`` plugin.

Importing the package registers the ``insertion_transformer`` model and architectures, the ``insertion_loss``
criterion and the ``insertion_translation`` task, and allows fairseq checkpoints to load under torch's safe
loader (``weights_only=True``). Without fairseq installed (a deployment) it registers nothing and imports only
the standard library: :mod:`fairseq_insertion.runtime` runs exported models with numpy and onnxruntime.
"""

import importlib.util

try:
    _FAIRSEQ = importlib.util.find_spec("fairseq") is not None
except (ImportError, ValueError):  # e.g. sys.modules["fairseq"] = None
    _FAIRSEQ = False

if _FAIRSEQ:
    import argparse

    import torch

    # fairseq checkpoints pickle their config as an argparse.Namespace (legacy
    # model args); allow exactly that instead of disabling the safe loader
    torch.serialization.add_safe_globals([argparse.Namespace])

    # fairseq's command lines (the plugin is imported while they read their options): an option refused by
    # the plugin or by fairseq's own checks ends the run in one line, `prog: error: ...`, status 2
    from .config import DecodingError
    from .fairseq_fixes import exit_on_option_errors

    exit_on_option_errors((DecodingError,), DecodingError.command_line)

    # registration side effects (model, criterion, task); hub: fairseq_insertion.hub.from_pretrained
    from . import criterion, hub, model, task  # noqa: F401

    __all__ = ["criterion", "hub", "model", "task"]
else:  # a deployment: only the torch-free parts (fairseq_insertion.runtime, fairseq_insertion.config)
    __all__ = []
