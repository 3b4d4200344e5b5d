"""Insertion decoding for deployment: ONNX Runtime runs the passes, numpy keeps the canvases.

    from fairseq_insertion.runtime import Translator

    translator = Translator("DIR", intra_threads=1)  # DIR: python -m fairseq_insertion.export ... --out DIR
    results = translator.translate_batch([["ein", "Hund", "."], ...], eos_penalty=3)
    results[0].hypotheses[0], results[0].scores[0]

The interface is CTranslate2's ``Translator.translate_batch``; ``translate_text`` takes raw lines and
replays the export's recorded preprocessing. The loop is the PyTorch generator's
(:mod:`fairseq_insertion.loop`) over :class:`~fairseq_insertion.runtime.backend.OnnxBackend`; its options
are :class:`~fairseq_insertion.config.DecodingConfig`'s runtime fields, their defaults the export's.
docs/deploy.md describes the options, candidates, constraints and the checks made at load. This package
imports numpy and onnxruntime only (and, for raw text, sacremoses, subword-nmt or sentencepiece).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from .. import export_format as F
from .. import loop as L
from ..config import PRECISIONS, RUNTIME_OPTIONS, DecodingConfig
from ..export_format import TranslatorError
from ..preprocess import (
    GAP,
    PreprocessError,
    Preprocessing,
    check_vocabulary,
    detokenize,
    prepare_constraint,
    prepare_line,
)
from ..slots import Shortlist, shortlist_rows
from .backend import Cache, CachedBackend, Constants, OnnxBackend, Source, session

logger = logging.getLogger(__name__)

__all__ = ["RUNTIME_OPTIONS", "Preprocessing", "TranslatorError", "TranslationResult", "Translator"]


@dataclass(frozen=True)
class TranslationResult:
    """One input's result, as CTranslate2 gives it: ``hypotheses`` (token lists, best first) and
    their ``scores`` (log-probability of the decode / (n + 1) ** lenpen; with a scorer, the reranking
    score: (scorer's + rerank_weight x the decode's log-probability) / (n + 1) ** lenpen);
    ``iterations``: the steps that inserted at least one token; ``passes`` (with ``return_passes``): each
    hypothesis's canvas after every step that inserted a token, the last its hypothesis."""

    hypotheses: List[List[str]]
    scores: List[float]
    iterations: List[int] = field(default_factory=list)
    passes: List[List[List[str]]] = field(default_factory=list)


class Candidate(NamedTuple):
    """One decode of a sentence: its target ids, its score (as :class:`TranslationResult`'s) and iterations."""

    ids: np.ndarray
    score: float
    iterations: int
    passes: Optional[Sequence[np.ndarray]] = None  # its canvas after each step that inserted a token (return_passes)


class Translator:
    """An exported insertion model (``python -m fairseq_insertion.export``) on ONNX Runtime.

    model_dir: the export's directory. intra_threads: threads per pass (0: onnxruntime's
    default, all cores); inter_threads: onnxruntime's inter-op threads. providers: onnxruntime
    execution providers (default: CPU). profile: a path prefix: onnxruntime's profiler records every
    run of the graphs, written by :meth:`end_profiling` (it slows the runs: read shares, not times)."""

    def __init__(self, model_dir: str | Path, intra_threads: int = 0, inter_threads: int = 1,
                 providers: Optional[Sequence[str]] = None, profile: Optional[str] = None):
        import onnxruntime as ort

        so = ort.SessionOptions()
        if profile is not None:
            so.enable_profiling, so.profile_file_prefix = True, str(profile)
        so.intra_op_num_threads = count(intra_threads, "intra_threads", 0)
        so.inter_op_num_threads = count(inter_threads, "inter_threads", 0)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = check_providers(providers, ort.get_available_providers())
        self.model_dir = Path(model_dir)
        F.check_present(self.model_dir)
        self.settings = F.read_settings(self.model_dir)
        self.preprocessing = F.check_preprocessing(self.settings, self.model_dir)
        """How raw text was prepared for the model (the export's record), or None."""
        codes = self.preprocessing.bpe_codes if self.preprocessing else None
        scorer = F.optional_file(self.settings, self.model_dir, "scorer", F.SCORER)
        shortlist = F.optional_file(self.settings, self.model_dir, "shortlist", F.SHORTLIST)
        F.check_digests(self.model_dir, self.settings, [Path(p).name for p in (scorer, codes, shortlist) if p])
        self.source_symbols = F.read_vocab(self.model_dir / F.VOCABS["source"])
        self.target_symbols = F.read_vocab(self.model_dir / F.VOCABS["target"])
        settings_path = self.model_dir / F.SETTINGS
        m = F.check_model(self.settings, settings_path, len(self.source_symbols), len(self.target_symbols))
        self.defaults = F.check_decoding(self.settings, settings_path)
        self.bos, self.eos, self.pad, self.unk = m["bos"], m["eos"], m["pad"], m["unk"]
        self.src_eos, self.src_pad, self.src_unk = m["source"]["eos"], m["source"]["pad"], m["source"]["unk"]
        self.termination = m["termination"]
        self.max_source_positions, self.max_target_positions = m["max_source_positions"], m["max_target_positions"]
        # a symbol's first id wins
        self.source_index = {s: i for i, s in reversed(list(enumerate(self.source_symbols)))}
        self.target_index = {s: i for i, s in reversed(list(enumerate(self.target_symbols)))}
        # which target pieces glue onto a neighbour, as the export's graph has them (bos, pad, eos, unk first)
        self.word_scheme, self._joins_next, _ = L.word_edge_table(self.target_symbols,
                                                                  1 + max(self.bos, self.eos, self.pad, self.unk))
        unfused = PRECISIONS[m["precision"]].unfused
        self._encoder = session(ort, self.model_dir / F.ENCODER, so, providers, unfused)
        self._pass = session(ort, self.model_dir / F.PASS, so, providers, unfused)
        self.cached_layers: Optional[int] = m.get("cached_layers")
        """The cached decoder's layers kept between passes (``--cached-decoder``); None: a plain decoder."""
        F.check_graphs(self.model_dir, self._encoder, self._pass, m["decoder_layers"],
                       (len(self.source_symbols), len(self.target_symbols)), shortlist is not None, self.cached_layers)
        self._shortlist: Optional[Shortlist] = None  # export --shortlist: each sentence's slots choose from its list
        if shortlist is not None:
            try:
                self._shortlist = Shortlist.load(shortlist, len(self.source_symbols), len(self.target_symbols))
            except ValueError as exc:
                raise TranslatorError(str(exc)) from None
        self._scorer = None  # the export's scorer (export --rerank-with): it orders each sentence's candidates
        if scorer is not None:
            self._scorer = session(ort, scorer, so, providers, unfused)
            F.check_scorer_graph(scorer, self._scorer, len(self.target_symbols))
        self._source_names = (*F.source_names(m["decoder_layers"]), "shortlist_weights")  # the latter: a shortlist's
        self._encoder_outputs = [o.name for o in self._encoder.get_outputs()]
        self._constants = Constants()
        self._checked: set = set()  # the preprocessings translate_text has checked against the vocabulary
        self.stats: Dict[str, int] = L.new_stats()
        """Counts since the translator was made (:func:`fairseq_insertion.loop.driver.new_stats`)."""

    # ------------------------------------------------------------------ API
    def end_profiling(self) -> Dict[str, str]:
        """With ``profile``: write the profiler's traces (onnxruntime's JSON) and return their paths, by graph."""
        traces = {"encoder": self._encoder.end_profiling(), "pass": self._pass.end_profiling()}
        if self._scorer is not None:
            traces["scorer"] = self._scorer.end_profiling()
        return traces

    def translate_batch(self, source: Sequence[Sequence[str]], max_batch_size: int = 0,
                        constraints: Optional[Sequence[Sequence[Sequence[str]]]] = None, num_hypotheses: int = 1,
                        return_passes: bool = False, **options: Any) -> List[TranslationResult]:
        """Translate token lists (the model's subword pieces, no end-of-sentence marker): one :class:`TranslationResult`
        per input, in input order. max_batch_size: at most this many sentences decoded together (0: all; sentences of
        similar length go together). constraints: per input, its hard constraints, each a list of target pieces
        (``___``: a template gap), in the order they must appear. num_hypotheses: how many of each input's candidates to
        return, best first (at most first_insertions x eos_penalties). return_passes: each hypothesis's canvas after
        every pass too (:attr:`TranslationResult.passes`). options: decoding options (see the module), the export's
        values by default. A source or constraints that are not lists of token lists (non-empty strings without
        whitespace), or a max_batch_size that is not an integer >= 0, is refused with a TranslatorError naming it."""
        if not isinstance(source, (list, tuple)):
            raise TranslatorError(f"source: expected a list of token lists, got {type(source).__name__}")
        for i, tokens in enumerate(source):
            check_tokens(tokens, f"source[{i}]")
        max_batch_size = count(max_batch_size, "max_batch_size", 0)
        opts = self.options(**options)
        k = count(num_hypotheses, "num_hypotheses", 1)
        if k > opts.candidates:
            raise TranslatorError(f"num_hypotheses: {k}, but the decode makes {opts.candidates} candidate(s) a "
                                  "sentence (first_insertions x eos_penalties values)")
        given = None if constraints is None else self.encode_constraints(constraints, len(source))
        ids = [self.encode(tokens) for tokens in source]
        return [self._result(candidates[:k]) for candidates in self.translate_ids(ids, max_batch_size, opts, given,
                                                                                  bool(return_passes))]

    def translate_text(self, lines: Sequence[str], max_batch_size: int = 0,
                       preprocessing: Optional[Preprocessing] = None,
                       constraints: Optional[Sequence[Sequence[str]]] = None, **options: Any) -> List[str]:
        """Translate raw lines: each prepared as the training data was (:func:`~fairseq_insertion.preprocess.
        prepare_line` with ``preprocessing``, default the export's record), its best hypothesis detokenised (BPE joins
        removed, Moses-detokenised in the target language); an empty line, or one that tokenises to nothing, gives an
        empty string. constraints: per line, its raw target phrases, prepared as the target side was
        (:func:`~fairseq_insertion.preprocess.prepare_constraint`). Needs sacremoses and subword-nmt."""
        check_lines(lines, "lines")
        if constraints is not None:
            check_rows(constraints, len(lines))
            for i, phrases in enumerate(constraints):
                check_lines(phrases, f"constraints[{i}]")
        settings = preprocessing or self.preprocessing
        if settings is None:
            raise TranslatorError(f"{self.model_dir / F.SETTINGS}: records no preprocessing (export with "
                                  "--tokenizer moses ... or pass preprocessing=Preprocessing(...))")
        try:
            if settings not in self._checked:  # once per preprocessing: the SentencePiece model's pieces
                check_vocabulary(settings, self.words(), "the export's target vocabulary")
                self._checked.add(settings)
            source = [prepare_line(line, settings).split() for line in lines]
            pieces = None if constraints is None else [
                [prepare_constraint(c, settings).split() for c in phrases] for phrases in constraints]
            results = self.translate_batch(source, max_batch_size, constraints=pieces, **options)
            return [detokenize(r.hypotheses[0], settings) for r in results]
        except PreprocessError as exc:
            raise TranslatorError(str(exc)) from None

    def words(self) -> List[str]:
        """The target vocabulary without its special symbols."""
        specials = {self.bos, self.eos, self.pad, self.unk}
        return [s for i, s in enumerate(self.target_symbols) if i not in specials]

    def options(self, **options: Any) -> DecodingConfig:
        """The options of a call: the export's, with ``options`` (DecodingConfig's field names) applied."""
        unknown = sorted(set(options) - set(RUNTIME_OPTIONS))
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; the runtime's options are {list(RUNTIME_OPTIONS)}")
        return DecodingConfig(**{**self.defaults, **options})  # a DecodingError names the option

    def encode(self, tokens: Sequence[str]) -> np.ndarray:
        """Source token ids with the end-of-sentence marker (unknown pieces: unk), as fairseq encodes a line."""
        if isinstance(tokens, str):
            raise TypeError(f"translate_batch takes token lists, got a string {tokens[:40]!r} (split it first)")
        return np.asarray([self.source_index.get(t, self.src_unk) for t in tokens] + [self.src_eos], dtype=np.int64)

    def encode_constraints(self, constraints: Sequence[Sequence[Sequence[str]]], n: int,
                           names: Optional[Sequence[str]] = None) -> List[List[np.ndarray]]:
        """Every input's constraints (lists of target pieces) as target ids, ``___`` as the gap (pad); one
        list per input, ``n`` of them. A special symbol is refused and an unknown piece read as unk with a
        warning, each naming the constraint (``names``: how each input is called, default ``input i``)."""
        check_rows(constraints, n)
        special = {self.target_symbols[i]: i for i in (self.bos, self.eos, self.pad)}
        out = []
        for i, cs in enumerate(constraints):
            name = names[i] if names is not None else f"input {i}"
            if not isinstance(cs, (list, tuple)) or isinstance(cs, str):
                raise TranslatorError(f"constraints[{i}]: expected a list of token lists, got {type(cs).__name__}")
            row = []
            for j, tokens in enumerate(cs):
                where = f"constraints[{i}][{j}]"
                check_tokens(tokens, where)
                found = [t for t in tokens if t in special]
                if found:
                    raise TranslatorError(f"{where}: holds the special symbol(s) {' '.join(found)}; a constraint is "
                                          f"pieces of the target text (a template gap is {GAP})")
                if all(t == GAP for t in tokens):
                    raise TranslatorError(f"{where}: no piece besides template gaps ({GAP})")
                unknown = [t for t in tokens if t != GAP and t not in self.target_index]
                if unknown:
                    logger.warning("%s: constraint %r holds %d piece(s) not in the target vocabulary, read as "
                                   "<unk>: %s", name, " ".join(tokens), len(unknown), " ".join(map(repr, unknown)))
                row.append(np.asarray([self.pad if t == GAP else self.target_index.get(t, self.unk) for t in tokens],
                                      dtype=np.int64))
            out.append(row)
        return out

    def prepare(self, ids: Sequence[np.ndarray], opts: DecodingConfig,
                constraints: Optional[Sequence[Sequence[np.ndarray]]] = None) -> L.Prepared:
        """Every source id array's start and length limit, and its problems (:func:`fairseq_insertion.loop.prepare`);
        ``constraints``: each input's constraints as target ids (pad: a template gap)."""
        lengths = np.asarray([len(x) for x in ids], dtype=np.int64)  # (B,)
        start = L.Start.blank(L.NUMPY, len(ids), lengths, self.pad)
        if constraints is not None and any(len(cs) for cs in constraints):
            start = L.constraint_canvas(L.NUMPY, L.pack(constraints), gap=self.pad, pad=self.pad)
        return L.prepare(L.NUMPY, lengths, start, opts, self.max_target_positions - 2, self.pad,
                         constraints is not None, self.cached_layers is not None)

    def too_long(self, ids: Sequence[np.ndarray]) -> np.ndarray:
        """(B,) whether each source id array is over the model's source positions (translated as empty)."""
        return np.asarray([len(x) > self.max_source_positions for x in ids], dtype=bool)

    def translate_ids(self, ids: Sequence[np.ndarray], max_batch_size: int, opts: DecodingConfig,
                      constraints: Optional[Sequence[Sequence[np.ndarray]]] = None, passes: bool = False
                      ) -> List[List[Candidate]]:
        """Every source id array's candidates (``opts.candidates``: per first insertion, one per EOS penalty),
        best first, in input order; ``constraints``: each input's constraints as target ids (pad: a template
        gap); ``passes``: with each candidate's canvas after every pass."""
        p, too_long = self.prepare(ids, opts, constraints), self.too_long(ids)
        lengths = np.asarray([len(x) for x in ids], dtype=np.int64)
        for i in np.flatnonzero(too_long).tolist():
            logger.warning("input %d: %d source tokens, over the model's %d; its translation is empty",
                           i, lengths[i], self.max_source_positions)
        for i in np.flatnonzero(p.unfit & ~too_long).tolist():
            logger.warning("input %d: its constraints hold %d tokens, over the length limit %d (min(max_len_a * "
                           "source length + max_len_b, max target positions - 2)); its translation is empty",
                           i, p.held[i], p.limit[i])
        order = np.argsort(-lengths, kind="stable")
        size = max_batch_size if max_batch_size > 0 else max(len(ids), 1)
        empty = Candidate(np.zeros(0, np.int64), 0.0, 0, [] if passes else None)  # too long a source
        results: List[List[Candidate]] = [[empty] * opts.candidates] * len(ids)
        # the cyclic garbage collector paused for the decodes: the loop's short-lived objects form no reference cycle,
        # and its passes over the heap (large where torch is imported) would land inside the decodes
        was = gc.isenabled()
        gc.disable()
        try:
            for b in range(0, len(ids), size):
                batch = [int(i) for i in order[b:b + size] if not too_long[i]]
                if batch:
                    start = p.start.take(np.asarray(batch))
                    width = int(start.lengths.max())  # the batch's canvases as wide as its longest
                    start = L.Start(*(t[:, :width] if t.ndim == 2 else t for t in start))
                    decoded = self._decode_batch([ids[i] for i in batch], opts, start, p.max_len[batch], passes)
                    for i, r in zip(batch, decoded):
                        results[i] = r
        finally:
            if was:
                gc.enable()
        return results

    # ------------------------------------------------------------------ the loop
    def _decode_batch(self, ids: List[np.ndarray], opts: DecodingConfig, start: L.Start, max_len: np.ndarray,
                      passes: bool = False) -> List[List[Candidate]]:
        """Decode one batch of source ids from ``start``, each within its length limit ``max_len`` (B,): each
        sentence's candidates, best first; ``passes``: with their canvases after every pass."""
        B, n = len(ids), opts.candidates
        src_len = np.asarray([len(x) for x in ids], dtype=np.int64)
        src = np.full((B, int(src_len.max())), self.src_pad, dtype=np.int64)
        src[np.arange(src.shape[1])[None, :] < src_len[:, None]] = np.concatenate(ids)  # right-padded
        feeds, shortlist = {"src_tokens": src}, None
        if self._shortlist is not None:
            shortlist = feeds["shortlist"] = shortlist_rows(self._shortlist, src, (self.bos, self.pad, self.eos,
                                                                                  self.unk), start.tokens)  # (B, L)
        encoded = dict(zip(self._encoder_outputs, self._encoder.run(None, feeds)))
        source: Any = Source({**{name: encoded[name] for name in self._source_names if name in encoded},
                              "src_mask": (src != self.src_pad).astype(np.int32)})
        kind = OnnxBackend if self.cached_layers is None else CachedBackend
        backend = kind(self._pass, self._scorer, src, self._constants, self.eos, self.pad)
        if self.cached_layers is not None:  # the memory: the source side and the cache of bos and eos
            source = Cache.start(source, encoded, self.cached_layers)
        options = L.DecodeOptions(opts, self.termination, self.bos, self.eos, self.pad, self.unk,
                                  self._joins_next if self.word_scheme != "none" else None)
        found = L.decode(backend, source, start, max_len, options, record=_record if passes else None,
                         shortlist=shortlist)
        out = found.canvases
        order = (found.order + n * np.arange(B)[:, None]).reshape(-1)  # (B n,) best first
        L.tally(self.stats, found)
        candidates = [Candidate(out.tokens[r, :out.lengths[r]], float(found.score[r]), int(out.iterations[r]),
                                out.history[r] if passes else None) for r in order.tolist()]
        return [candidates[b * n:(b + 1) * n] for b in range(B)]

    def _result(self, candidates: Sequence[Candidate]) -> TranslationResult:
        symbols = lambda ids: [self.target_symbols[i] for i in ids.tolist()]  # noqa: E731
        return TranslationResult(hypotheses=[symbols(c.ids) for c in candidates], scores=[c.score for c in candidates],
                                 iterations=[c.iterations for c in candidates],
                                 passes=[[symbols(p) for p in c.passes] for c in candidates if c.passes is not None])


def _record(state: L.Canvases, inserted: np.ndarray) -> None:
    """``return_passes``: the canvas of every row that inserted a token in this step, kept in its history."""
    for i in np.flatnonzero(inserted).tolist():
        state.history[int(state.rows[i])].append(state.tokens[i, :state.lengths[i]].copy())


# ------------------------------------------------------------------ the checks of what a caller gives
def count(value: Any, name: str, minimum: int) -> int:
    """An integer argument >= minimum (not a bool, a float or a string)."""
    if (type(value) is not int and not isinstance(value, np.integer)) or value < minimum:
        raise TranslatorError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def check_providers(providers: Optional[Sequence[str]], available: Sequence[str]) -> List[str]:
    """onnxruntime's execution providers to use (default: CPU), each one this onnxruntime has."""
    if providers is None:
        return ["CPUExecutionProvider"]
    if isinstance(providers, str) or not isinstance(providers, (list, tuple)) or not providers:
        raise TranslatorError(f"providers: expected a non-empty list of provider names, got {providers!r}")
    unknown = [p for p in providers if p not in available]
    if unknown:
        raise TranslatorError(f"providers: {unknown} not available; this onnxruntime has {list(available)}")
    return list(providers)


def check_tokens(tokens: Any, name: str) -> None:
    """A list (or tuple) of non-empty str tokens without whitespace, called ``name``."""
    if isinstance(tokens, str):
        raise TranslatorError(f"{name}: expected a list of str tokens, got a str {tokens[:40]!r} "
                              "(split it into the model's pieces first)")
    if not isinstance(tokens, (list, tuple)):
        raise TranslatorError(f"{name}: expected a list of str tokens, got {type(tokens).__name__}")
    for j, token in enumerate(tokens):
        if not isinstance(token, str):
            raise TranslatorError(f"{name}[{j}]: expected a str token, got {type(token).__name__}")
        if not token:
            raise TranslatorError(f"{name}[{j}]: an empty token")
        if token.split() != [token]:
            raise TranslatorError(f"{name}[{j}]: a token with whitespace {token[:40]!r} (one subword piece per token)")


def check_rows(constraints: Any, n: int) -> None:
    """``constraints``: a list (or tuple) of one entry per input, ``n`` of them."""
    if isinstance(constraints, str) or not isinstance(constraints, (list, tuple)):
        raise TranslatorError(f"constraints: expected a list with one list of constraints per input, got "
                              f"{type(constraints).__name__}")
    if len(constraints) != n:
        raise TranslatorError(f"constraints: {len(constraints)} lists for {n} inputs; give one per input "
                              "(an empty list: none)")


def check_lines(lines: Any, name: str) -> None:
    """A list (or tuple) of str lines, called ``name``."""
    if isinstance(lines, str) or not isinstance(lines, (list, tuple)) or not all(isinstance(x, str) for x in lines):
        raise TranslatorError(f"{name}: expected a list of str lines, got {type(lines).__name__}"
                              + (f" {lines[:40]!r}" if isinstance(lines, str) else ""))
