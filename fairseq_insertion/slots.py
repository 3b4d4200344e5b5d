"""What a slot may receive: the slot rule on a torch table (:func:`choose`) and in the exported pass graph
(:func:`choose_graph`), side by side (``tests/test_slots.py`` checks one against the other). Imports numpy and the loop.

The rule never inserts bos or pad; end-of-slot wins when its log-probability less the slot's EOS penalty is at least
the best token's; it bars each slot's ``blocked`` tokens and, next to constraints, the pieces its word-edge class says
(and end-of-slot under ``no_end``); a slot left with nothing ends. It keeps the k best tokens, the lowest id among
equal scores. With a :class:`Shortlist` a slot scores only its sentence's list, the log-normaliser included."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .loop import NEG_INF, SlotInputs

CLASSES = 4  # word-edge classes: 0 free, 1 no piece joining the next token, 2 none joining the previous, 3 neither


class SlotRule(NamedTuple):
    """What a slot may receive, for one dictionary and one set of options."""

    eos: int
    unk: int
    specials: Tuple[int, ...]  # never inserted: bos, pad, eos (end-of-slot is judged apart)
    excluded: np.ndarray  # (CLASSES, V) float32: 0 where a token may be inserted, -inf where not
    unkpen: float = 0.0

    @classmethod
    def build(cls, specials: Sequence[int], eos: int, unk: int, joins_next: np.ndarray, joins_prev: np.ndarray,
              unkpen: float = 0.0) -> "SlotRule":
        """``joins_next``, ``joins_prev`` (V,) bool: the pieces that glue onto the next or the previous token
        (:func:`fairseq_insertion.loop.word_edge_table`)."""
        table = np.zeros((CLASSES, len(joins_next)), dtype=np.float32)
        table[:, list(specials)] = NEG_INF
        for row, banned in ((1, joins_next), (2, joins_prev), (3, joins_next | joins_prev)):
            table[row, banned] = NEG_INF
        return cls(eos=eos, unk=unk, specials=tuple(specials), excluded=table, unkpen=float(unkpen))


class Shortlist(NamedTuple):
    """A lexical shortlist: what a sentence's slots may receive, besides the specials and its constraints' tokens:
    the ``frequent`` target words and, for each source word, its likeliest translations."""

    frequent: np.ndarray  # (F,) int64 target ids
    translations: np.ndarray  # (source V, K) int64 target ids of each source id, best first; padded with 0
    target_vocab: int  # the target dictionary's size

    def save(self, path: Union[str, Path]) -> None:
        with open(path, "wb") as f:  # np.savez would append .npz to a name without it
            np.savez(f, frequent=self.frequent, translations=self.translations,
                     target_vocab=np.asarray(self.target_vocab))

    @classmethod
    def load(cls, path: Union[str, Path], source_vocab: Optional[int] = None, target_vocab: Optional[int] = None
             ) -> "Shortlist":
        """Read a table written by :meth:`save`, checked against the dictionaries' sizes when given."""
        if not Path(path).is_file():
            raise ValueError(f"{path}: no such file")
        try:
            with np.load(path, allow_pickle=False) as f:
                table = cls(frequent=f["frequent"].astype(np.int64), translations=f["translations"].astype(np.int64),
                            target_vocab=int(f["target_vocab"]))
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: not a shortlist table ({e})") from None
        if table.translations.ndim != 2 or table.frequent.ndim != 1:
            raise ValueError(f"{path}: not a shortlist table (its arrays have the wrong shapes)")
        if target_vocab is not None and table.target_vocab != target_vocab:
            raise ValueError(f"{path}: made for a target dictionary of {table.target_vocab} entries, "
                             f"not {target_vocab}")
        if source_vocab is not None and len(table.translations) != source_vocab:
            raise ValueError(f"{path}: made for a source dictionary of {len(table.translations)} "
                             f"entries, not {source_vocab}")
        return table


def shortlist_rows(table: Shortlist, src_tokens: np.ndarray, specials: Sequence[int],
                   given: Optional[np.ndarray] = None) -> np.ndarray:
    """(B, L) each sentence's list from ``src_tokens`` (B, S) and its constraints' tokens ``given`` (B, X): every id
    up to the largest of ``specials`` (a special's position is its id), the frequent words, its source words'
    translations and ``given``, ascending, then V (the target vocabulary's size) as padding."""
    B, V = src_tokens.shape[0], table.target_vocab
    first = max(specials) + 1
    member = np.zeros((B, V + 1), dtype=bool)  # (B, V + 1)
    member[:, :first] = True
    member[:, table.frequent] = True
    rows = np.arange(B)[:, None]
    member[rows, table.translations[src_tokens].reshape(B, -1)] = True
    if given is not None:
        member[rows, given] = True
    member[:, V] = False
    counts = member.sum(1)  # (B,)
    L = int(counts.max()) if B else first
    out = np.argsort(~member, axis=1, kind="stable")[:, :L]  # (B, L) the members first, ascending
    out[np.arange(L)[None, :] >= counts[:, None]] = V
    return out


def choose(rule: SlotRule, content: Any, inputs: SlotInputs, k: int = 1) -> Tuple[Any, Any, Any]:
    """The rule on torch: ``content`` (N, V) the open slots' raw scores (changed in place). Returns each slot's
    k best tokens (N, k), their log p(c | l) (N, k) and log p(eos | l) (N, 1). With ``inputs.shortlist`` the
    slots score their lists alone (``inputs.blocked``: positions in them)."""
    eos, ids = rule.eos, None
    if inputs.shortlist is not None:
        ids = inputs.shortlist[inputs.slot_rows]  # (N, L) V where padded
        padded = content.new_full((content.shape[0], content.shape[1] + 1), NEG_INF)  # (N, V + 1): id V the padding
        padded[:, :-1] = content
        content = padded.gather(1, ids)  # (N, L) -inf where padded
    lse = content.logsumexp(-1, keepdim=True)  # (N, 1) log-normaliser
    eos_log_probs = content[:, eos:eos + 1] - lse  # (N, 1)
    if inputs.blocked is not None:
        content.scatter_(1, inputs.blocked, NEG_INF)
    penalised = content[:, eos] - inputs.eos_penalty  # (N,)
    if rule.unkpen:
        content[:, rule.unk] -= rule.unkpen
    if inputs.word_edges is None:  # every slot in class 0: only the specials barred
        content[:, list(rule.specials)] = NEG_INF
    elif ids is None:
        content += content.new_tensor(rule.excluded)[inputs.word_edges]  # (N, V)
    else:
        content += content.new_tensor(_padded(rule.excluded))[inputs.word_edges[:, None], ids]  # (N, L)
    content[:, eos] = penalised if inputs.no_end is None else penalised.masked_fill(inputs.no_end, NEG_INF)
    best, tokens = content.topk(k, -1) if k > 1 else content.max(-1, keepdim=True)  # (N, k) each; ties: lowest id
    stuck = best.isneginf()  # nothing left: the slot ends
    best = best.where(~stuck, penalised[:, None])
    if ids is not None:
        tokens = ids.gather(1, tokens)
    return tokens.masked_fill(stuck, eos), best - lse, eos_log_probs


def _padded(excluded: np.ndarray) -> np.ndarray:
    """(CLASSES, V + 1) the exclusions with the padding id V barred in every class."""
    return np.concatenate([excluded, np.full((len(excluded), 1), NEG_INF, np.float32)], 1)


def argmax_block(width: int) -> Optional[int]:
    """The block size the pass graph's best-token search reads a table of ``width`` columns in (a divisor of it,
    the closest to its square root: two short searches), or None for a prime width (one search)."""
    below = max(d for d in range(1, math.isqrt(width) + 1) if width % d == 0)  # the largest divisor <= the root
    size = min((below, width // below), key=lambda d: abs(d * d - width))
    return size if below > 1 else None


def choose_graph(g: Any, rule: SlotRule, content: str, inputs: Mapping[str, str], k: str, ids: Optional[str] = None,
                 names: Sequence[str] = ("tokens", "log_probs", "eos_log_probs")) -> Sequence[str]:
    """The rule in the pass graph ``g`` on ``content`` (N, V), the open slots' raw scores, with ``inputs`` (the graph's
    value of each :data:`~fairseq_insertion.loop.FEEDS` name: ``word_edges`` (N,), ``blocked`` (N, M), ``eos_penalty``
    (N, 1), ``no_end`` (N, 1)) and ``k`` (1,): outputs ``names`` (returned), as :func:`choose`. ``ids`` (N, L): each
    slot's shortlist; ``content`` (N, L) then scores it, ``blocked`` holds positions in it.

    The (N, V) table is read by few kernels: onnxruntime's fused ``LogSoftmax`` gives the log-probabilities, one
    scatter bars the blocked tokens and the specials on the raw scores (in the table's own buffer: it reads the
    table last), and the best of the rest is found in blocks (:func:`argmax_block`: a ``ReduceMax`` a block, then
    an ``ArgMax`` over the blocks' maxima and one inside the first block holding the row's); the word-edge classes'
    exclusion table and the k-best ``TopK`` (each a pass over the table, the top-k 3-4 times an ``ArgMax``'s) run
    only in the branch for a batch that has a slot of class > 0 or k > 1."""
    V = rule.excluded.shape[1]
    classes, blocked, eos_penalty, no_end = (inputs[n] for n in ("word_edges", "blocked", "eos_penalty", "no_end"))
    if ids is not None:  # the padding (id V) takes no part
        content = g.op("Where", g.op("Equal", ids, g.const(np.asarray(V, np.int64), "padding_id")),
                       g.scalar(NEG_INF), content)  # (N, L)
    log_probs = g.op("LogSoftmax", content, axis=1)  # (N, V) or (N, L)
    eos = g.const(np.asarray([rule.eos], dtype=np.int64), "eos")
    eos_score = g.op("Gather", content, eos, axis=1)  # (N, 1)
    eos_log_probs = g.output("Gather", names[2], log_probs, eos, axis=1)  # (N, 1)
    # the specials' rows counted from both reads of the table, so that the scatter below comes after them: its last
    # reader, onnxruntime then bars the tokens in the table's own buffer instead of a copy of it
    read = g.op("Concat", eos_score, eos_log_probs, axis=1)  # (N, 2)
    specials = g.op("Expand", g.const(np.asarray([rule.specials], np.int64), "specials"),
                    g.op("Concat", g.op("Shape", read, end=1), g.ints(len(rule.specials)), axis=0))  # (N, 3)
    barred = g.op("Concat", blocked, specials, axis=1)  # (N, M + 3): positions in the list too (a special's is its id)
    allowed = g.op("ScatterElements", content, barred, g.op("Expand", g.scalar(NEG_INF), g.op("Shape", barred)),
                   axis=1)  # (N, V) or (N, L)

    def k_best() -> List[Tuple[str, Any]]:  # the word-edge classes' exclusions, then the k best
        if ids is None:
            excluded = g.op("Gather", g.const(rule.excluded, "excluded"), classes, axis=0)  # (N, V)
        else:  # (N, L) the table's entries at (class, id), flat
            at = g.op("Add", g.op("Mul", g.op("Unsqueeze", classes, g.ints(1)),
                                  g.const(np.asarray(V + 1, np.int64), "classes_stride")), ids)
            excluded = g.op("Gather", g.const(_padded(rule.excluded).reshape(-1), "excluded"), at, axis=0)
        values, at = g.op("TopK", g.op("Add", allowed, excluded), k, axis=1, outputs=2)  # (N, k); ties: lower id
        return [(values, np.float32), (at, np.int64)]

    def best() -> List[Tuple[str, Any]]:  # every slot in class 0 and k = 1: the best one
        size = None if ids is not None else argmax_block(V)
        if size is None:
            at = g.op("ArgMax", allowed, axis=1, keepdims=1)  # (N, 1); ties: the first, the lower id
            return [(g.op("GatherElements", allowed, at, axis=1), np.float32), (at, np.int64)]
        # in two stages (onnxruntime's ArgMax takes ~7x a ReduceMax's time on a wide table): the first block holding
        # the row's max, then its first max there; the same index, ties included
        blocks = g.op("Reshape", allowed, g.ints(0, V // size, size))  # (N, V / size, size)
        block_max = g.op("ReduceMax", blocks, axes=[2], keepdims=0)  # (N, V / size)
        block = g.op("ArgMax", block_max, axis=1, keepdims=1)  # (N, 1); ties: the first
        within = g.op("ArgMax", g.op("GatherND", blocks, block, batch_dims=1), axis=1, keepdims=1)  # (N, 1)
        at = g.op("Add", g.op("Mul", block, g.const(np.asarray(size, np.int64), "block_size")), within)  # (N, 1)
        return [(g.op("GatherElements", block_max, block, axis=1), np.float32), (at, np.int64)]

    general = g.op("Or", g.op("Greater", g.op("ReduceMax", g.op("Concat", classes, g.ints(0), axis=0), keepdims=0),
                              g.const(np.asarray(0, np.int64), "class_free")),
                   g.op("Greater", g.op("Squeeze", k, g.ints(0)), g.const(np.asarray(1, np.int64), "one")))  # ()
    other, other_at = g.op("If", general, then_branch=g.branch("k_best", k_best), else_branch=g.branch("best", best),
                           outputs=2)  # (N, k) each: the best tokens other than end-of-slot, their positions
    other_id = other_at if ids is None else g.op("GatherElements", ids, other_at, axis=1)  # (N, k) ids
    eos_penalised = g.op("Sub", eos_score, eos_penalty)  # (N, 1)
    eos_allowed = g.op("Where", no_end, g.scalar(NEG_INF), eos_penalised)
    eos_wins = g.op("Not", g.op("Less", eos_allowed, other))  # ties: eos, the lower id; no token left: eos
    g.output("Where", names[0], eos_wins, g.const(np.asarray(rule.eos, np.int64), "eos_id"), other_id)
    g.output("Where", names[1], eos_wins, g.op("Sub", eos_log_probs, eos_penalty),
             g.op("GatherElements", log_probs, other_at, axis=1))
    return names


# The slot-closure head (fairseq_insertion.closure): a slot it closes takes end-of-slot without the vocabulary.

def may_close(inputs: SlotInputs, open_: Any, beta: float, k: int) -> Optional[Any]:
    """On torch: (N,) the open slots (``open_`` (A, S)) the closure head may close: those that may end, decoded at its
    EOS penalty ``beta`` (in float32); None for the k-best first insertions."""
    if k > 1:
        return None
    may, penalty, beta = open_[open_], inputs.eos_penalty, np.float32(beta)  # (N,) True
    may = may & (penalty == float(beta)) if hasattr(penalty, "shape") else may & bool(np.float32(penalty) == beta)
    return may if inputs.no_end is None else may & ~inputs.no_end.reshape(-1)


def closing(closed: Any, close_log_probs: Any, eos_penalty: Any, eos: int, chosen: Tuple[Any, Any, Any]
            ) -> Tuple[Any, Any, Any]:
    """On torch: every open slot's (N, k) tokens, log-probabilities and (N, 1) end-of-slot log-probabilities: ``chosen``
    (:func:`choose` of the slots left open), and where the head ``closed`` (N,) the slot end-of-slot at its
    ``close_log_probs`` (N,) (less the EOS penalty in the token's, as :func:`choose`)."""
    tokens, log_probs, eos_log_probs = chosen
    beta = eos_penalty.reshape(-1) if hasattr(eos_penalty, "shape") else eos_penalty  # (N,) or a float
    k, open_ = tokens.shape[1], ~closed
    out_tokens = tokens.new_full((closed.shape[0], k), eos).masked_scatter(open_[:, None], tokens)  # (N, k)
    out_log_probs = (close_log_probs - beta)[:, None].repeat(1, k).masked_scatter(open_[:, None], log_probs)
    out_eos = close_log_probs[:, None].masked_scatter(open_[:, None], eos_log_probs)  # (N, 1)
    return out_tokens, out_log_probs, out_eos


def closing_graph(g: Any, closure: Any, states: str, inputs: Mapping[str, str]) -> Tuple[str, str]:
    """In the pass graph, as :func:`may_close` and ``decode_slots``: the closure head on the open slots' ``states``
    (N, C): the slots it leaves open (N',) and its log-probability that each slot closes (N, 1)."""
    eos_penalty, no_end = inputs["eos_penalty"], inputs["no_end"]
    hidden = g.op("Relu", g.op("Add", g.op("MatMul", states, g.const(closure.hidden.weight.t(), "closure_hidden")),
                               g.const(closure.hidden.bias, "closure_hidden_bias")))  # (N, C): int8 in an int8 export
    logits = g.op("Gemm", hidden, g.const(closure.out.weight, "closure_out"), g.const(closure.out.bias,
                  "closure_out_bias"), transB=1)  # (N, 1)
    # no_end bars the k-best first insertions' slots from ending too
    opens = g.op("Or", g.op("Or", g.op("LessOrEqual", logits, g.const(closure.threshold.reshape(1, 1), "threshold")),
                            no_end), g.op("Not", g.op("Equal", eos_penalty, g.const(closure.eos_penalty.reshape(1, 1),
                                                                                      "closure_beta"))))  # (N, 1)
    rows = g.op("Gather", g.op("NonZero", opens), g.const(np.asarray(0, np.int64), "rows_axis"), axis=0)  # (N',)
    return rows, g.op("Log", g.op("Sigmoid", logits))  # (N, 1), accurate where it closes (a logit above 0)


def closing_outputs(g: Any, rows: str, close_log_probs: str, eos_penalty: str, eos: int, chosen: Sequence[str]) -> None:
    """The pass graph's outputs of every open slot from ``chosen`` (of the slots ``rows`` (N',)), as :func:`closing`."""
    tokens, log_probs, eos_log_probs = chosen
    at = g.op("Unsqueeze", rows, g.ints(1))  # (N', 1)
    shape = g.op("Concat", g.op("Shape", close_log_probs, end=1), g.op("Shape", tokens, start=1), axis=0)  # (N, k)
    g.output("ScatterND", "tokens", g.op("Expand", g.const(np.asarray([[eos]], np.int64), "eos_id"), shape), at, tokens)
    g.output("ScatterND", "log_probs", g.op("Expand", g.op("Sub", close_log_probs, eos_penalty), shape), at, log_probs)
    g.output("ScatterND", "eos_log_probs", close_log_probs, at, eos_log_probs)


# The look-ahead closure (fairseq_insertion.closure.LookAhead): a sentence whose slots the next pass would all close
# ends without that pass.

def ending(lookahead: Any, states: Any, tokens: Any, log_probs: Any, eos_log_probs: Any, may: Any, eos: int
           ) -> Tuple[Any, Any]:
    """On torch: from the open slots' ``states`` (N, C) and ``tokens`` (N, 1), (N,) the slots ``may`` select whose
    next-pass slots the head says all close (beside an inserted token, or the slot itself) and (N,) its log p."""
    w = tokens[:, 0]  # (N,)
    logits = lookahead(states, w, log_probs[:, 0], eos_log_probs[:, 0])  # (N, 3)
    at_end = w == eos
    lowest = logits[:, 2].where(at_end, logits[:, :2].amin(1))  # (N,)
    log_sig = logits.sigmoid().log()  # (N, 3) as the graph computes it: accurate where the slots close
    log_sig = log_sig[:, 2].where(at_end, log_sig[:, :2].sum(1))  # (N,)
    return may & (lowest > lookahead.threshold), log_sig


def ending_graph(g: Any, lookahead: Any, states: str, tokens: str, log_probs: str, eos_log_probs: str,
                 inputs: Mapping[str, str], k: str, eos: int) -> None:
    """In the pass graph, as :func:`ending` with :func:`may_close`: outputs ``ends`` (N, 1) bool, ``end_log_probs``."""
    eos_penalty, no_end = inputs["eos_penalty"], inputs["no_end"]
    w = g.op("Gather", tokens, g.const(np.asarray(0, np.int64), "first_column"), axis=1)  # (N,)
    first = g.op("Slice", log_probs, g.ints(0), g.ints(1), g.ints(1))  # (N, 1)
    scores = g.op("Concat", first, eos_log_probs, axis=1)  # (N, 2)
    hidden = g.op("Add", g.op("Add", g.op("MatMul", states, g.const(lookahead.state.weight.t(), "lookahead_state")),
                              g.const(lookahead.state.bias, "lookahead_state_bias")),
                  g.op("Add", g.op("Gather", g.const(lookahead.token.weight, "lookahead_token"), w, axis=0),
                       g.op("MatMul", scores, g.const(lookahead.scores.weight.t(), "lookahead_scores"))))  # (N, W)
    logits = g.op("Gemm", g.op("Relu", hidden), g.const(lookahead.out.weight, "lookahead_out"),
                  g.const(lookahead.out.bias, "lookahead_out_bias"), transB=1)  # (N, 3)
    left, right, stay = (g.op("Slice", logits, g.ints(i), g.ints(i + 1), g.ints(1)) for i in range(3))  # (N, 1) each
    at_end = g.op("Equal", g.op("Unsqueeze", w, g.ints(1)), g.const(np.asarray(eos, np.int64), "lookahead_eos"))
    lowest = g.op("Where", at_end, stay, g.op("Min", left, right))  # (N, 1)
    log_sig = lambda x: g.op("Log", g.op("Sigmoid", x))  # noqa: E731  accurate where it closes (a logit above 0)
    may = g.op("And", g.op("And", g.op("Not", no_end), g.op("Equal", eos_penalty, g.const(
        lookahead.eos_penalty.reshape(1, 1), "lookahead_beta"))), g.op("Equal", k, g.const(np.asarray([1], np.int64),
                                                                                          "lookahead_k")))  # (N, 1)
    g.output("And", "ends", may, g.op("Greater", lowest, g.const(lookahead.threshold.reshape(1, 1),
                                                                 "lookahead_threshold")))
    g.output("Where", "end_log_probs", at_end, log_sig(stay), g.op("Add", log_sig(left), log_sig(right)))
