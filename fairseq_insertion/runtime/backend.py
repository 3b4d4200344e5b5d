"""The ONNX sessions as the loop's backend (:class:`~fairseq_insertion.loop.Backend`): the pass graph over the open
slots, the source side following the sentences that go on, and the export's scorer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .. import loop as L
from ..export_format import TranslatorError, cache_names
from ..loop.rules import fed

# a group of a pass's canvases runs its longer and its shorter ones apart where that drops at least this share of its
# canvas positions (Multi30k, batch 128: 0.02 about 2% faster than 0.1, 5.6% fewer positions for 2.6x the runs)
GROUPED = 0.02


def session(ort: Any, path: Path, options: Any, providers: List[str], unfused: Sequence[str] = ()) -> Any:
    """An onnxruntime session of one graph, without the ``unfused`` optimizations; a file it cannot load is named."""
    try:
        return ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=list(unfused))
    except Exception as exc:  # onnxruntime's errors (InvalidProtobuf, Fail, ...) share no base class but Exception
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TranslatorError(f"{path}: onnxruntime cannot load it ({reason}): export again") from None


class Source(NamedTuple):
    """What every pass reuses of the active sentences' source side, as the pass graph takes it."""

    inputs: Dict[str, np.ndarray]  # each decoder layer's keys and values (A, heads, S, d); src_mask (A, S) int32

    def take(self, idx: np.ndarray) -> "Source":  # np.take: numpy's fancy indexing copies ten times slower
        return Source({name: np.take(value, idx, axis=0) for name, value in self.inputs.items()})


class Constants:
    """Read-only arrays of one value, one per value and type, grown as needed and sliced (no allocation a pass)."""

    def __init__(self) -> None:
        self._arrays: Dict[Tuple[Any, str], np.ndarray] = {}

    def __call__(self, n: int, value: Any, dtype: Any) -> np.ndarray:
        """(n,) ``value``."""
        key = (value, np.dtype(dtype).str)
        have = self._arrays.get(key)
        if have is None or len(have) < n:
            have = self._arrays[key] = np.full(max(n, 2 * len(have) if have is not None else 64), value, dtype)
            have.flags.writeable = False
        return have[:n]


@dataclass(frozen=True)
class OnnxBackend:
    """ONNX Runtime's pass (``pass.onnx``, the slot rule inside it: :func:`fairseq_insertion.slots.choose_graph`)
    and scorer (``scorer.onnx``, or None) on the sources ``src`` (B, S) of one call."""

    session: Any
    scorer: Optional[Any]
    src: np.ndarray
    constant: Constants
    eos: int
    pad: int
    xp: Any = L.NUMPY
    incremental: bool = False

    def score_slots(self, source: Source, framed: np.ndarray, open_: np.ndarray, inputs: L.SlotInputs, k: int,
                    fresh: None = None) -> L.SlotChoice:
        """The longer and the shorter canvases apart where that saves enough padding (:func:`width_groups`)."""
        lengths = (framed != self.pad).sum(1) - 2  # (A,)
        groups = width_groups(lengths)
        if len(groups) == 1:
            out = self._run(source, framed, open_, inputs, slice(None), k)
            return L.SlotChoice(*out[:4], *(a.reshape(-1) for a in out[4:]))
        location = np.full(open_.shape, L.NEG_INF, np.float32)  # (A, S)
        ends = np.cumsum([int(open_[rows].sum()) for rows in groups])  # each group's open slots end here
        outs = []
        for rows, end, n in zip(groups, ends, np.diff(ends, prepend=0)):
            width = int(lengths[rows].max()) + 2  # the group's framed width
            tokens, log_probs, eos_log_probs, location[rows, :width - 1], *ahead = self._run(
                source, framed[rows, :width], open_[rows, :width - 1], L.some_slots(inputs, slice(end - n, end), rows),
                rows, k)  # the group's open slots: a range of the pass's, its rows being contiguous
            outs.append((tokens, log_probs, eos_log_probs, *(a.reshape(-1) for a in ahead)))
        values = [np.concatenate(v) for v in zip(*outs)]
        return L.SlotChoice(*values[:3], location, *values[3:])  # the look-ahead's ends and end_log_probs last

    def _run(self, source: Source, framed: np.ndarray, open_: np.ndarray, inputs: L.SlotInputs, rows: slice, k: int,
             more: Optional[Dict[str, np.ndarray]] = None) -> List[np.ndarray]:
        # (N,) the open slots' flat indices, row-major as torch's masks (none to find when all are open)
        open_slots = np.arange(open_.size) if open_.all() else np.flatnonzero(open_)
        sources = source.inputs if rows == slice(None) else {name: v[rows] for name, v in source.inputs.items()}
        feeds = fed(inputs, len(open_slots), self.pad, self.constant)  # the slot rules' inputs
        if inputs.shortlist is not None:
            feeds["shortlist"] = inputs.shortlist
        return self.session.run(None, {"framed": framed, **sources, "open_slots": open_slots, **feeds,
                                       "k": np.asarray([k], np.int64), **(more or {})})

    def reorder(self, memory: Any, keep: np.ndarray) -> Any:
        return memory.take(keep)  # a Source, or CachedBackend's Cache

    def score_candidates(self, tokens: np.ndarray, lengths: np.ndarray, per_source: int) -> Optional[np.ndarray]:
        """Each source encoded once and each distinct candidate of a sentence scored once."""
        if self.scorer is None:
            return None
        target = L.candidate_targets(L.NUMPY, tokens, lengths, self.eos, self.pad)  # (B n, W)
        sentence = np.repeat(np.arange(len(self.src)), per_source)  # (B n,)
        _, first, same = np.unique(np.concatenate([sentence[:, None], target], 1), axis=0, return_index=True,
                                   return_inverse=True)  # (U,) a row of each distinct candidate; (B n,) its index
        target = target[first]  # (U, W)
        prev = np.roll(target, 1, axis=1)  # (U, W) end-of-sentence first, as fairseq's decoder input
        prev[:, 0] = self.eos
        prev[target == self.pad] = self.pad
        (log_probs,) = self.scorer.run(None, {"src_tokens": self.src, "rows": sentence[first], "target": target,
                                              "prev_tokens": prev})
        return log_probs[same.reshape(-1)]


class Cache(NamedTuple):
    """The cached decoder's memory (:class:`fairseq_insertion.pass_decoder.PassCache` in numpy), one row per active
    sentence: the source side and M cached tokens (bos, eos, then each pass's insertions, padded) in cache order,
    which the canvas order maps to by ``index``."""

    source: Source
    kv: Tuple[np.ndarray, ...]  # each cached layer's keys (A, heads, M, d), then their values
    positions: np.ndarray  # (A, M, C) each cached token's position vector
    states: np.ndarray  # (A, M, C) its cached layers' states
    real: np.ndarray  # (A, M) int32 the cached tokens (0: padding)
    index: np.ndarray  # (A, T + 2) each column of the last framed canvas -> its cache column (-1: padding)

    @classmethod
    def start(cls, source: Source, encoded: Dict[str, np.ndarray], layers: int) -> "Cache":
        """The cache the encoder graph gives: bos and eos."""
        B = len(encoded["start_states"])
        return cls(source, tuple(encoded[name] for name in cache_names("start", layers)), encoded["start_positions"],
                   encoded["start_states"], np.ones((B, 2), np.int32), np.tile(np.arange(2), (B, 1)))

    def take(self, idx: np.ndarray) -> "Cache":
        t = lambda a: np.take(a, idx, axis=0)  # noqa: E731
        return Cache(self.source.take(idx), tuple(map(t, self.kv)), *map(t, self[2:]))


@dataclass(frozen=True)
class CachedBackend(OnnxBackend):
    """The cached decoder's pass graph: a pass computes the fresh tokens' states (those the last pass inserted)
    against the cache, which it returns grown by them (:func:`fairseq_insertion.export.cached.cached_pass_graph`)."""

    incremental: bool = True

    def score_slots(self, memory: Cache, framed: np.ndarray, open_: np.ndarray, inputs: L.SlotInputs, k: int,
                    fresh: Optional[np.ndarray] = None) -> L.SlotChoice:
        A, W = framed.shape
        fresh = np.zeros(framed.shape, bool) if fresh is None else fresh  # (A, W)
        M, layers = memory.real.shape[1], len(memory.kv) // 2
        index = np.full((A, W), -1, np.int64)
        index[(framed != self.pad) & ~fresh] = memory.index[memory.index >= 0]  # the cached tokens, in canvas order
        rank = np.cumsum(fresh, 1) - 1  # (A, W) each fresh token's column among its row's
        index = np.where(fresh, M + rank, index)  # the fresh ones appended in canvas order
        F = max(int(rank[:, -1].max(initial=-1)) + 1, 1)  # a pass without one runs a padding token
        rows, cols = np.nonzero(fresh)
        at = (rows, rank[rows, cols])
        tokens = np.full((A, F), self.pad, np.int64)
        tokens[at] = framed[rows, cols]
        neighbours = []  # the fresh tokens' left and right neighbours' position vectors (A, F, C), both cached
        for side in (cols - 1, cols + 1):
            p = np.zeros((A, F, memory.positions.shape[2]), np.float32)
            p[at] = memory.positions[rows, index[rows, side]]
            neighbours.append(p)
        more = {"fresh_tokens": tokens, "left_positions": neighbours[0], "right_positions": neighbours[1],
                **dict(zip(cache_names("past", layers), memory.kv)), "past_mask": memory.real,
                "past_states": memory.states, "index": np.maximum(index, 0)}
        out = dict(zip([o.name for o in self.session.get_outputs()],
                       self._run(memory.source, framed, open_, inputs, slice(None), k, more)))
        grown = Cache(memory.source, tuple(np.concatenate([a, out[name]], 2) for a, name in
                                           zip(memory.kv, cache_names("new", layers))),
                      np.concatenate([memory.positions, out["new_positions"]], 1),
                      np.concatenate([memory.states, out["new_states"]], 1),
                      np.concatenate([memory.real, (tokens != self.pad).astype(np.int32)], 1), index)
        ahead = [out[name].reshape(-1) for name in ("ends", "end_log_probs") if name in out]
        return L.SlotChoice(out["tokens"], out["log_probs"], out["eos_log_probs"], out["location"], *ahead,
                            memory=grown)


def width_groups(lengths: np.ndarray, start: int = 0) -> List[slice]:
    """The rows of a pass, canvas ``lengths`` (A,) longest first, as contiguous groups: each split in two where the
    positions (each group at its widest) are fewest, when that drops at least :data:`GROUPED` of its own."""
    A = len(lengths)
    if A < 2:
        return [slice(start, start + A)]
    head = np.maximum.accumulate(lengths)  # (A,) the longest of rows 0..i
    tail = np.maximum.accumulate(lengths[::-1])[::-1]  # (A,) the longest of rows i..A-1
    at = np.arange(1, A)  # a split before row i
    cost = at * (head[:-1] + 2) + (A - at) * (tail[1:] + 2)  # (A - 1,) framed positions of the two groups
    i = int(cost.argmin())
    whole = A * (int(head[-1]) + 2)
    if whole - int(cost[i]) < GROUPED * whole:
        return [slice(start, start + A)]
    return width_groups(lengths[:i + 1], start) + width_groups(lengths[i + 1:], start + i + 1)
