"""Checkpoints and dictionaries: loading a fairseq Transformer checkpoint, warm start (``--init-from-transformer``), and
:func:`check_dictionaries`, the one check that a checkpoint or a data directory fits a model's dictionaries
(docs/design.md).
"""

from __future__ import annotations

import logging
import os
import zipfile
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary, data_utils
from fairseq.models import ARCH_MODEL_NAME_REGISTRY
from torch import Tensor, nn

logger = logging.getLogger(__name__)

WARM_START_SLOTS = ("left", "random")


# -------------------------------- Dictionaries
class DictionaryFiles(NamedTuple):
    """The source and target dictionary files of a data directory (fairseq-preprocess's ``dict.<lang>.txt``)."""

    source: str
    target: str


def dictionary_files(cfg: Any) -> Optional[DictionaryFiles]:
    """The dictionary files a translation task config reads (``data``: its first directory, as fairseq reads it;
    ``source_lang``/``target_lang``, inferred from the file names when unset); None when the directory, its languages or
    either file are not there. ``cfg``: a task's config, or the ``cfg.task`` saved in a checkpoint."""
    data = str(getattr(cfg, "data", None) or "").split(":")[0]
    if not data or not os.path.isdir(data):
        return None
    langs = (getattr(cfg, "source_lang", None), getattr(cfg, "target_lang", None))
    if None in langs:  # fairseq reads them from the data file names then
        langs = data_utils.infer_language_pair(data)
    if None in langs:
        return None
    files = DictionaryFiles(*(os.path.join(data, f"dict.{lang}.txt") for lang in langs))
    return files if all(os.path.isfile(f) for f in files) else None


# each embedding table and the side whose dictionary gives its rows
EMBEDDINGS = (("source", "encoder.embed_tokens.weight"), ("target", "decoder.embed_tokens.weight"),
              ("target", "decoder.output_projection.weight"))
ADVICE = "a model must be used with the dictionaries it was trained with (the same data-bin directory)"


def check_dictionaries(dictionaries: DictionaryFiles, name: str, weights: Optional[Mapping[str, Tensor]] = None,
                       trained_with: Optional[DictionaryFiles] = None) -> None:
    """Refuse ``name`` (a checkpoint or data directory, as the user gave it) unless it fits ``dictionaries``:
    ``weights``, its state dict, has one embedding (and output projection) row per dictionary entry;
    ``trained_with``, the dictionary files it was trained with, has the same entries in the same order.
    ``ValueError`` names ``name``, the files and the first difference (``FileNotFoundError``: a missing file)."""
    ours = {side: _load_dictionary(path) for side, path in dictionaries._asdict().items()}
    for side, key in EMBEDDINGS if weights is not None else ():
        table = weights.get(key)
        if table is None:
            if key.endswith("embed_tokens.weight"):
                raise ValueError(f"{name}: no {key} (a fairseq encoder-decoder checkpoint is expected)")
            continue
        d, path = ours[side], getattr(dictionaries, side)
        if table.size(0) != len(d):
            raise ValueError(f"{name}: {key} has {table.size(0)} rows, but the {side} dictionary {path} gives "
                             f"{len(d)} entries ({d.nspecial} special symbols + its lines): {ADVICE}")
    for side, theirs_path in trained_with._asdict().items() if trained_with is not None else ():
        theirs, d, path = _load_dictionary(theirs_path), ours[side], getattr(dictionaries, side)
        a, b = d.symbols[d.nspecial:], theirs.symbols[theirs.nspecial:]
        line = next((i for i, (x, y) in enumerate(zip(a, b), start=1) if x != y), None)
        if line is not None:
            raise ValueError(f"{name}: its {side} dictionary {theirs_path} differs from {path} at line {line}: "
                             f"{b[line - 1]!r} instead of {a[line - 1]!r}: {ADVICE}")
        if len(a) != len(b):
            raise ValueError(f"{name}: its {side} dictionary {theirs_path} has {len(b)} entries, {path} has "
                             f"{len(a)}: {ADVICE}")


def _load_dictionary(path: str) -> Dictionary:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (a fairseq-preprocess dictionary is expected)")
    return Dictionary.load(path)


# -------------------------------- Any checkpoint file
def check_checkpoint_file(path: str, option: str) -> None:
    """Refuse ``path`` (given by ``option``) unless it is a file in one of torch's save formats (zip or the legacy
    pickle), naming it and what to do; torch's safe loader checks the content when fairseq loads it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{option} {path}: no such file")
    with open(path, "rb") as f:
        head = f.read(2)
    if not (zipfile.is_zipfile(path) or head[:1] == b"\x80"):
        raise ValueError(f"{option} {path}: cannot be read as a fairseq checkpoint: not a PyTorch file "
                         "(neither torch.save's zip format nor its legacy pickle; empty, truncated or another "
                         "kind of file): give a checkpoint fairseq-train wrote (checkpoint_best.pt, "
                         "checkpoint_last.pt), copied whole")


def unreadable_checkpoint(path: str, option: str, error: BaseException) -> ValueError:
    """The error for a checkpoint file torch's safe loader refused (``error``), naming ``path``."""
    return ValueError(f"{option} {path}: cannot be read as a fairseq checkpoint ({type(error).__name__}: "
                      f"{str(error).splitlines()[0] if str(error) else ''}); only fairseq checkpoints (weights, "
                      "config and training state) are loaded, and nothing else in a file is run: give a "
                      "checkpoint fairseq-train wrote, from a source you trust")


# -------------------------------- A fairseq Transformer checkpoint (the warm-start teacher, the reranker)
def transformer_checkpoint(path: str, option: str) -> Dict[str, Any]:
    """A fairseq ``transformer`` checkpoint (model weights and ``cfg``), loaded with the safe
    loader; errors name the command-line ``option`` that gave ``path``."""
    check_checkpoint_file(path, option)
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # unpickling, refused by the safe loader, ...
        raise unreadable_checkpoint(path, option, e) from e
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


# -------------------------------- Warm start from an autoregressive fairseq Transformer (--init-from-transformer)
def _restore_checkpoint(args: Any) -> Optional[str]:
    """The checkpoint fairseq-train will restore after building the model, if one exists, as
    ``fairseq.checkpoint_utils.load_checkpoint`` finds it (``--restore-file``, ``--save-dir``)."""
    restore, save_dir = getattr(args, "restore_file", None), getattr(args, "save_dir", None)
    if restore is None or save_dir is None:
        return None
    if restore == "checkpoint_last.pt":
        restore = os.path.join(save_dir, f"checkpoint_last{getattr(args, 'checkpoint_suffix', '') or ''}.pt")
    return restore if os.path.exists(restore) else None


def decoder_embeddings_shared(args: Any) -> bool:
    """Whether the insertion model's decoder input and output embeddings are one table when the command line
    does not say (no ``--share-decoder-input-output-embed``, ``--share-all-embeddings``): as the teacher's with
    ``--init-from-transformer`` (as the checkpoint fairseq-train resumes from, when it resumes), else one."""
    path = getattr(args, "init_from_transformer", None)
    if not path or getattr(args, "share_all_embeddings", False):
        return True
    restored = _restore_checkpoint(args)
    if restored is None:
        state = transformer_checkpoint(path, "--init-from-transformer")
    else:
        try:
            state = checkpoint_utils.load_checkpoint_to_cpu(restored)
        except Exception as e:  # noqa: BLE001 -- unpickling, refused by the safe loader, ...
            raise unreadable_checkpoint(restored, "--restore-file", e) from e
    cfg = state["cfg"]["model"]
    shared = bool(getattr(cfg, "share_decoder_input_output_embed", False) or getattr(cfg, "share_all_embeddings",
                                                                                       False))
    if not shared:
        logger.info("%s: its decoder's output projection is its own table, and so is the insertion model's",
                    restored or path)
    return shared


def warm_start(model: nn.Module, args: Any, dictionaries: Optional[DictionaryFiles]) -> None:
    """Apply ``--init-from-transformer`` to a freshly built insertion model at the start of training (skipped when
    fairseq-train resumes); ``dictionaries``: the model's, checked against the teacher's embedding tables."""
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
    init_from_transformer(model, path, getattr(args, "warm_start_slots", None) or "left", dictionaries)


def init_from_transformer(model: nn.Module, path: str, slots: str = "left",
                          dictionaries: Optional[DictionaryFiles] = None) -> Dict[str, List[str]]:
    """Copy every tensor of a fairseq ``transformer`` checkpoint whose name and shape match into an insertion model
    (docs/training.md, warm start); ``slots``: ``--warm-start-slots``. Refuses teacher embedding tables that do not
    fit ``dictionaries`` and lists every tensor whose shape differs. Returns the names: copied, new, unused."""
    if slots not in WARM_START_SLOTS:
        raise ValueError(f"--warm-start-slots must be one of {WARM_START_SLOTS}, got {slots!r}")
    theirs = transformer_checkpoint(path, "--init-from-transformer")["model"]
    if dictionaries is not None:
        check_dictionaries(dictionaries, f"--init-from-transformer {path}", weights=theirs)
    own = model.state_dict(keep_vars=True)  # name -> the Parameter / buffer itself (tied: same object)
    wrong = [(k, tuple(theirs[k].shape), tuple(v.shape)) for k, v in own.items()
             if k in theirs and theirs[k].shape != v.shape]
    if wrong:
        details = "; ".join(f"{k}: teacher {a}, insertion model {b}" for k, a, b in wrong)
        raise ValueError(f"--init-from-transformer {path}: {len(wrong)} tensor(s) differ in shape from the "
                         f"insertion model's ({details}). Use the teacher's dictionary and sizes.")
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
    if slots == "left":  # h_l = x_l, the left neighbour's state (slot projection [I | 0], bias 0); q = 0: uniform p(l)
        proj, head = model.decoder.slot_proj, model.decoder.head
        dim = proj.weight.size(0)  # weight: (C, 2C)
        with torch.no_grad():
            proj.weight.zero_()
            proj.weight[:, :dim].copy_(torch.eye(dim, dtype=proj.weight.dtype))
            proj.bias.zero_()
            if head is not None and head.location_query is not None:
                head.location_query.zero_()
    logger.info("--init-from-transformer %s: copied %d tensors (%d parameters); new in the insertion model, "
                "%s: %s", path, len(copied), n_params,
                "slots started at the left neighbour (--warm-start-slots left)" if slots == "left"
                else "freshly initialised", ", ".join(new) or "none")
    if unused:
        logger.warning("--init-from-transformer %s: teacher tensors the insertion model has no place for, not "
                       "used: %s", path, ", ".join(unused))
    return {"copied": copied, "new": new, "unused": unused}
