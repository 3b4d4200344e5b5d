"""The export's files: the checkpoint loaded, the graphs written, quantized and recorded in ``settings.json``."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import onnx
import torch
from torch import nn

from .. import preprocess as P
from ..config import INT8_SCHEMES, RUNTIME_OPTIONS, DecodingConfig
from ..export_format import (
    BPE_CODES,
    CHECKED,
    ENCODER,
    FORMAT_VERSION,
    PASS,
    SCORER,
    SETTINGS,
    SHORTLIST,
    SPECIAL_IDS,
    SPM_MODEL,
    VOCABS,
    file_digests,
)
from ..fast_decoder import uncovered
from ..pass_decoder import cached_layers
from ..quantization import REWRITES
from ..slots import Shortlist
from .cached import cached_encoder_graph, cached_pass_graph
from .graph import ExportError
from .layers import encoder_graph, pass_graph, scorer_graph


def check_exportable(model: nn.Module) -> None:
    """Refuse what the graphs do not cover, naming it."""
    head = model.decoder.head
    unsupported = []
    if head.joint:
        unsupported.append("--content-location joint")
    if head.K > 1:
        unsupported.append(f"--mixture-components {head.K}")
    if head.context_bias is not None:
        unsupported.append("--context-bias")
    if getattr(model.decoder, "adaptive_softmax", None) is not None:
        unsupported.append("--adaptive-softmax-cutoff")
    model.eval()
    unsupported += uncovered(model.decoder)
    if unsupported:
        raise ExportError("the export covers the factorized slot head of plain pre- or post-norm Transformer layers; "
                          "this model has " + ", ".join(unsupported))


def load(path: Path, data: Path) -> Tuple[nn.Module, object]:
    """The insertion model of ``path`` with the dictionaries of ``data`` (fairseq's loader)."""
    from fairseq import checkpoint_utils

    from ..model import InsertionTransformerModel

    for flag, p in (("--path", path), ("--data", data)):
        if not Path(p).exists():
            raise ExportError(f"{flag} {p}: not found")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    model = models[0]
    if not isinstance(model, InsertionTransformerModel):
        raise ExportError(f"--path {path}: a {type(model).__name__}, not an insertion_transformer model")
    return model.eval(), task


class ExportFile(NamedTuple):
    """One of an export's optional files: its name, its writer, whether ``--int8`` quantizes it, its settings entry."""

    name: str
    write: Callable[[Path], None]
    quantized: bool = False
    setting: Optional[Tuple[str, Any]] = None


def subword_file(preprocessing: Optional[P.Preprocessing]) -> Optional[str]:
    """The export's name for the preprocessing's subword model, if it has one."""
    if preprocessing is None or preprocessing.bpe_codes is None:
        return None
    return SPM_MODEL if preprocessing.bpe == "sentencepiece" else BPE_CODES


def optional_files(scorer: Optional[nn.Module], shortlist: Optional[Shortlist],
                   preprocessing: Optional[P.Preprocessing]) -> List[ExportFile]:
    """The optional files of an export (scorer, shortlist, subword model), in ``settings.json``'s order."""
    def write_scorer(out: Path) -> None:
        with torch.no_grad():
            onnx.save(scorer_graph(scorer.float().eval()), str(out / SCORER))

    files = []
    if scorer is not None:
        files.append(ExportFile(SCORER, write_scorer, True, ("scorer", SCORER)))
    if shortlist is not None:
        files.append(ExportFile(SHORTLIST, lambda out: shortlist.save(out / SHORTLIST), False,
                                ("shortlist", SHORTLIST)))
    name = subword_file(preprocessing)
    if name:
        files.append(ExportFile(name, lambda out: shutil.copyfile(preprocessing.bpe_codes, out / name)))
    return files


def recorded_preprocessing(data: Path) -> Optional[P.Preprocessing]:
    """``data``'s ``preprocess.json``, if it has one."""
    return P.read_record(data / P.RECORD) if (data / P.RECORD).is_file() else None


def load_scorer(path: Path, task) -> nn.Module:
    """``--rerank-with``: an autoregressive transformer of the same dictionaries (``AutoregressiveScorer.load``)."""
    from ..checkpoints import dictionary_files
    from ..rerank import AutoregressiveScorer

    try:
        scorer = AutoregressiveScorer.load(str(path), task.source_dictionary, task.target_dictionary,
                                           torch.device("cpu"), dictionaries=dictionary_files(task.cfg))
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    return scorer.model.float().eval()


def export(path: Path, data: Path, out: Path, int8: Optional[str] = None, config: Optional[DecodingConfig] = None,
           preprocessing: Optional[P.Preprocessing] = None, scorer: Optional[Path] = None,
           shortlist: Optional[Path] = None) -> Path:
    """Export the checkpoint ``path`` (its dictionaries in ``data``) into ``out``: :func:`export_model` of the loaded
    model, ``scorer`` checkpoint and ``shortlist`` table; ``preprocessing`` defaults to ``data``'s record."""
    preprocessing = preprocessing or recorded_preprocessing(data)
    if preprocessing is not None:
        P.load(preprocessing)  # its codes checked before the model is loaded
    model, task = load(path, data)
    teacher = load_scorer(scorer, task) if scorer is not None else None
    table = None
    if shortlist is not None:
        try:
            table = Shortlist.load(shortlist, len(task.source_dictionary), len(task.target_dictionary))
        except ValueError as exc:
            raise ExportError(f"--shortlist: {exc}") from None
    return export_model(model, task.source_dictionary, task.target_dictionary, out, int8, config, preprocessing,
                        teacher, table)


def export_model(model: nn.Module, src_dict, tgt_dict, out: Path, int8: Optional[str] = None,
                 config: Optional[DecodingConfig] = None, preprocessing: Optional[P.Preprocessing] = None,
                 scorer: Optional[nn.Module] = None, shortlist: Optional[Shortlist] = None) -> Path:
    """Export a loaded insertion model with its dictionaries into ``out``; ``int8``: the scheme (None: fp32); the
    ``preprocessing`` recorded (its codes copied), ``scorer`` as ``scorer.onnx``, ``shortlist`` as ``shortlist.npz``."""
    config = config or DecodingConfig()
    if int8 is not None and int8 not in INT8_SCHEMES:
        raise ExportError(f"--int8 {int8}: expected one of {list(INT8_SCHEMES)}")
    if config.unkpen:
        raise ExportError(f"unkpen {config.unkpen}: the exported pass applies no unknown-word penalty; export with "
                          "unkpen 0")
    if preprocessing is not None:
        try:  # the codes are subword-nmt's or the model SentencePiece's, matching the dictionary, before any writing
            P.load(preprocessing)
            P.check_vocabulary(preprocessing, tgt_dict.symbols[tgt_dict.nspecial:], "the target dictionary")
        except P.PreprocessError as exc:
            raise ExportError(str(exc)) from None
    if shortlist is not None and (shortlist.target_vocab, len(shortlist.translations)) != (len(tgt_dict),
                                                                                           len(src_dict)):
        raise ExportError(f"the shortlist's dictionaries have {len(shortlist.translations)} source and "
                          f"{shortlist.target_vocab} target entries, the model's {len(src_dict)} and {len(tgt_dict)}")
    out.mkdir(parents=True, exist_ok=True)
    check_exportable(model)
    model, cached = model.float().eval(), model.incremental  # --cached-decoder: the pass takes the cache
    with torch.no_grad():  # fp32, taking each sentence's list with a shortlist
        onnx.save((cached_encoder_graph if cached else encoder_graph)(model, shortlist is not None), str(out / ENCODER))
        onnx.save((cached_pass_graph if cached else pass_graph)(model, shortlist is not None), str(out / PASS))
    files = optional_files(scorer, shortlist, preprocessing)
    for name in (SCORER, SHORTLIST, BPE_CODES, SPM_MODEL):  # a previous export's optional files are removed
        (out / name).unlink(missing_ok=True)
    for f in files:
        f.write(out)
    if int8:
        for name in (ENCODER, PASS, *(f.name for f in files if f.quantized)):
            REWRITES[int8](out, name)  # the graph in int8, in place
    for side, dictionary in (("source", src_dict), ("target", tgt_dict)):
        (out / VOCABS[side]).write_text("".join(f"{s}\n" for s in dictionary.symbols), encoding="utf-8")
    values = {  # settings.json: the model's ids, sizes, limits and precision, and the decoding options
        "format_version": FORMAT_VERSION,
        "model": {
            "termination": model.termination,
            **{key: getattr(tgt_dict, key)() for key in SPECIAL_IDS},
            "source": {key: getattr(src_dict, key)() for key in SPECIAL_IDS},
            "max_source_positions": int(model.encoder.max_positions()),
            "max_target_positions": int(model.max_decoder_positions()),
            "decoder_layers": len(model.decoder.layers),
            "precision": INT8_SCHEMES[int8].name if int8 else "fp32",
            **({"cached_layers": len(cached_layers(model.decoder))} if model.incremental else {}),
        },
        "decoding": {k: v for k, v in dataclasses.asdict(config).items() if k in RUNTIME_OPTIONS},
    }
    values.update(f.setting for f in files if f.setting is not None)
    if preprocessing is not None:
        values["preprocessing"] = dataclasses.replace(preprocessing, bpe_codes=subword_file(preprocessing)).record()
    values["files"] = file_digests(out, (*CHECKED, *(f.name for f in files)))
    (out / SETTINGS).write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
    return out
