"""Export a trained insertion model for deployment: ONNX graphs, the dictionaries and the settings.

    python -m fairseq_insertion.export --path CHECKPOINT --data DATA-BIN --out DIR [--int8 [dynamic]] \
        [decoding options] [--tokenizer moses|none --bpe-codes CODES --source-lang SRC --target-lang TGT ...]

DIR then holds what :class:`fairseq_insertion.runtime.Translator` loads (no fairseq, no torch): ``encoder.onnx``
(source tokens -> each decoder layer's cross-attention keys and values, once a batch), ``pass.onnx`` (one pass
over the open slots: its inputs are :func:`~fairseq_insertion.export_format.graph_io`'s, the slot rules'
from :data:`~fairseq_insertion.loop.FEEDS`), the vocabularies, ``settings.json`` (ids, sizes, decoding
options, the preprocessing record and every file's size and sha256) and the preprocessing's ``bpe.codes`` or
``spm.model``. docs/deploy.md describes each file and flag.
"""

from .cli import build_parser, main
from .files import export, export_model, load, load_scorer
from .graph import ExportError, Graph
from .layers import encoder_graph, pass_graph, scorer_graph

__all__ = ["ExportError", "Graph", "build_parser", "encoder_graph", "export", "export_model", "load", "load_scorer",
           "main", "pass_graph", "scorer_graph"]
