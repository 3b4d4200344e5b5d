"""Export a trained insertion model for deployment: ONNX graphs, the dictionaries and the settings.

    python -m fairseq_insertion.export --path CHECKPOINT --data DATA-BIN --out DIR [--int8 [dynamic]] \
        [decoding options] [--tokenizer moses|none --bpe-codes CODES --source-lang SRC --target-lang TGT ...]

DIR then holds what :class:`fairseq_insertion.runtime.Translator` loads (no fairseq, no torch):

* ``encoder.onnx``: source tokens (B, S) -> every decoder layer's encoder-attention keys and
  values, ``keys_0``, ..., ``values_0``, ... (B, heads, S, head dim), computed once per batch;
* ``pass.onnx``: one decoding pass: framed canvases (A, T+2), the cached keys and values, the
  source mask (int32, 1 at real tokens), the open slots (N flat indices into the A x (T+1) slots),
  the tokens each open slot may not receive (N, M), each open slot's EOS penalty (N, 1) and the
  word-edge rule at constraints (``word_edges`` (N,): which subword pieces it may not receive;
  ``no_end`` (N, 1): whether it may not end; :func:`~fairseq_insertion.loop.word_edge_bans`) and ``k`` (1,)
  -> each open slot's k best tokens and their log p(c | l) (N, k; k is 1 but for the first insertions),
  its end-of-slot log-probability (N, 1), and log p(l)
  of every slot (A, T+1). Only the open slots go through the vocabulary projection, and no (N, V) table
  leaves the graph;
* ``source_vocab.txt``, ``target_vocab.txt``: one symbol per line, line i = token id i;
* ``settings.json``: the model's ids and sizes, the decoding's options
  (:class:`~fairseq_insertion.config.DecodingConfig`'s fields, as given here) and the size and
  sha256 of every other file, which the runtime checks when it loads them; and, when known, how raw
  text was prepared for the model (``preprocessing``: :class:`~fairseq_insertion.preprocess.Preprocessing`,
  which the runtime replays on raw text);
* ``bpe.codes``: the preprocessing's subword-nmt codes, or ``spm.model``: its SentencePiece model, when it has one
  (checked first: each symbol of the target dictionary must be one of the SentencePiece model's pieces).

The preprocessing is ``DATA-BIN/preprocess.json`` (``examples/multi30k/prepare.py`` writes it) when
there is one; ``--tokenizer moses|none`` with ``--bpe``, ``--bpe-codes`` (``--sentencepiece-model``),
``--source-lang``, ``--target-lang``,
``--[no-]normalize-punctuation``, ``--[no-]aggressive-dash-splits``, ... changes it, or gives it when
there is none.

Each graph's metadata holds its vocabulary size (``vocab_size``: the source's in the encoder, the
target's in the pass), which the runtime checks against the vocabulary files.

Batch, source length, canvas length and the number of open slots are dynamic axes. ``--int8``
runs the graphs' products by weight matrices in int8 with per-row activation scales
(:mod:`fairseq_insertion.quantization`: a sentence's translation does not depend on its batch); ``--int8 dynamic``
with onnxruntime's dynamic quantization instead (one activation range over the whole batch: faster at batch 1, and
its outputs move with the batch).
"""


from ..quantization import per_row
from .cli import build_parser, main
from .files import export, export_model, load, load_scorer
from .graph import IR_VERSION, OPSET, ExportError, Graph
from .layers import encoder_graph, pass_graph, scorer_graph

__all__ = ["ExportError", "Graph", "IR_VERSION", "OPSET", "build_parser", "encoder_graph", "export", "export_model",
           "load", "load_scorer", "main", "pass_graph", "per_row", "scorer_graph"]
