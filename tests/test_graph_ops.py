"""The decoding loop's functions (fairseq_insertion.loop) emitted as ONNX nodes through graph_ops.GraphOps, each
graph run in onnxruntime against the same function on numpy arrays (loop.NUMPY): one graph per function, its
dimensions symbolic, fed batches of 1 and 5 canvases with padding, empty and full rows, closed slots, ties in the
scores, word edges next to given tokens and repeated tokens; outputs equal (floats close), and non-trivial."""

from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import onnxruntime as ort  # noqa: E402

from fairseq_insertion import loop as L  # noqa: E402
from fairseq_insertion.config import DecodingConfig  # noqa: E402
from fairseq_insertion.export import Graph  # noqa: E402
from fairseq_insertion.graph_ops import GraphOps  # noqa: E402

BOS, PAD, EOS, UNK = 0, 1, 2, 3
V = 12  # vocabulary: the specials, then words 4 .. 11
INT, F, B = np.int64, np.float32, np.bool_
SIZES = [(seed, batch, width) for seed in range(3) for batch, width in ((1, 0), (1, 4), (5, 0), (5, 3), (5, 6))]


def leaves(x: Any) -> Iterator[Any]:
    """The arrays and scalars of nested results (NamedTuples, tuples), None dropped."""
    if isinstance(x, tuple):
        for item in x:
            yield from leaves(item)
    elif x is not None:
        yield x


class Emitted:
    """``fn(xp, **arrays)`` emitted once through GraphOps (inputs ``specs``: name -> (dtype, dims), a string dim
    symbolic), run in onnxruntime on one thread and checked against ``fn(loop.NUMPY, **arrays)``."""

    def __init__(self, fn: Callable[..., Any], **specs: Tuple[Any, List[Any]]):
        g = Graph("loop")
        ops = GraphOps(g)
        results = list(leaves(fn(ops, **{name: ops.input(name, dtype, dims) for name, (dtype, dims) in specs.items()})))
        for i, x in enumerate(results):
            ops.output(f"out_{i}", x)
        model = g.model(ops.inputs, ops.outputs, vocab_size=V)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.fn, self.names = fn, list(specs)

    def check(self, **arrays: np.ndarray) -> List[np.ndarray]:
        """The numpy results, after checking the graph's against them."""
        want = [np.asarray(w, F) if isinstance(w, float) else np.asarray(w)
                for w in leaves(self.fn(L.NUMPY, **{k: v.copy() for k, v in arrays.items()}))]
        got = self.session.run(None, {k: arrays[k] for k in self.names})
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype, w.dtype)
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"output {i}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        return want


def canvases(rng: np.random.Generator, batch: int, width: int, words: Tuple[int, ...] = tuple(range(4, V))
             ) -> Tuple[np.ndarray, np.ndarray]:
    """(B, K) tokens padded after each length, and the lengths (B,): with 5 rows an empty one and a full one."""
    lengths = rng.integers(0, width + 1, batch)
    if batch > 1:
        lengths[0], lengths[-1] = 0, width
    tokens = rng.choice(np.asarray(words), size=(batch, width))
    tokens[np.arange(width)[None, :] >= lengths[:, None]] = PAD
    return tokens.astype(INT), lengths.astype(INT)


def within(lengths: np.ndarray, columns: int) -> np.ndarray:
    return np.arange(columns)[None, :] < lengths[:, None]


def closures(rng: np.random.Generator, lengths: np.ndarray, width: int) -> Tuple[np.ndarray, np.ndarray]:
    """Random closed slots: (B, K) before real tokens, and (B,) the last slot."""
    return (rng.random((len(lengths), width)) < 0.4) & within(lengths, width), rng.random(len(lengths)) < 0.3


def slot_table(rng: np.random.Generator, open_: np.ndarray, real: np.ndarray) -> Dict[str, np.ndarray]:
    """A pass's SlotScores arrays with many ties: the best token (eos often, eos where closed), its log p(c | l),
    log p(l) (-inf beyond the real slots), the pass's final eos."""
    shape = open_.shape
    tokens = np.where(open_ & (rng.random(shape) < 0.7), rng.integers(4, V, shape), EOS).astype(INT)
    log_probs = np.where(open_, rng.choice([-1.0, -0.5, 0.0], shape), 0.0).astype(F)
    location = np.where(real, rng.choice([-1.0, -0.5], shape), -np.inf).astype(F)
    return dict(open_=open_, tokens=tokens, log_probs=log_probs, location=location,
                final_eos=rng.random(shape[0]).astype(F))


def scores_of(open_, tokens, log_probs, location, final_eos) -> L.SlotScores:
    return L.SlotScores(open=open_, tokens=tokens, log_probs=log_probs, location=location, final_eos=final_eos)


SLOT_SPECS = dict(open_=(B, ["A", "S"]), tokens=(INT, ["A", "S"]), log_probs=(F, ["A", "S"]),
                  location=(F, ["A", "S"]), final_eos=(F, ["A"]))


# ---------------------------------------------------------------- the canvas
def test_frame():
    emitted = Emitted(lambda xp, canvas, lengths: L.frame(xp, canvas, lengths, BOS, EOS, PAD),
                      canvas=(INT, ["B", "K"]), lengths=(INT, ["B"]))
    for seed, batch, width in SIZES:
        tokens, lengths = canvases(np.random.default_rng(seed), batch, width)
        framed = emitted.check(canvas=tokens, lengths=lengths)[0]
        assert (framed[np.arange(batch), lengths + 1] == EOS).all()


def test_slot_mask_closed_and_open_slots():
    def fn(xp, lengths, closed_before, closed_end):
        S = closed_before.shape[1] + 1
        state = L.Canvases(rows=None, tokens=None, scores=None, closed_before=closed_before, closed_end=closed_end,
                           lengths=lengths, iterations=None, final_eos=None, max_len=None)
        return (L.slot_mask(xp, lengths, S), L.closed_slots(xp, closed_before, closed_end, lengths, S),
                L.open_slots(xp, state, S), L.open_slots(xp, state._replace(closed_before=None), S))

    emitted = Emitted(fn, lengths=(INT, ["B"]), closed_before=(B, ["B", "K"]), closed_end=(B, ["B"]))
    seen = np.zeros(2, int)
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        _, lengths = canvases(rng, batch, width)
        closed_before, closed_end = closures(rng, lengths, width)
        real, closed, open_, _ = emitted.check(lengths=lengths, closed_before=closed_before, closed_end=closed_end)
        seen += [(real & closed).sum(), open_.sum()]
    assert (seen > 5).all()  # some slots closed, some open


def test_insertion_destinations_and_place():
    def fn(xp, canvas, scores, given, lengths, insert_mask, slot_tokens, slot_scores):
        width = xp.host((lengths + insert_mask.sum(1)).max())[0]
        dest = L.insertion_destinations(xp, lengths, insert_mask, canvas.shape[1], width)  # (B, K + S)
        return (dest, L.place(xp, dest, canvas, slot_tokens, width, PAD),
                L.place(xp, dest, scores, slot_scores, width, 0.0),
                L.place(xp, dest, given, insert_mask & False, width, False))

    emitted = Emitted(fn, canvas=(INT, ["B", "K"]), scores=(F, ["B", "K"]), given=(B, ["B", "K"]), lengths=(INT, ["B"]),
                      insert_mask=(B, ["B", "S"]), slot_tokens=(INT, ["B", "S"]), slot_scores=(F, ["B", "S"]))
    inserted = 0
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        tokens, lengths = canvases(rng, batch, width)
        S = width + 1
        insert_mask = (rng.random((batch, S)) < 0.5) & within(lengths + 1, S)
        _, new_tokens, _, _ = emitted.check(
            canvas=tokens, scores=rng.random((batch, width)).astype(F), given=within(lengths, width) & (tokens > 6),
            lengths=lengths, insert_mask=insert_mask, slot_tokens=rng.integers(4, V, (batch, S)),
            slot_scores=rng.random((batch, S)).astype(F))
        inserted += insert_mask.sum()
        assert ((new_tokens != PAD).sum(1) == lengths + insert_mask.sum(1)).all()
    assert inserted > 10


@pytest.mark.parametrize("sequence", [False, True])
def test_slot_scores(sequence):
    def fn(xp, open_, tokens, log_probs, eos_log_probs, location):
        return L.slot_scores(xp, open_, tokens, log_probs, eos_log_probs, location, EOS, sequence)

    emitted = Emitted(fn, open_=(B, ["A", "S"]), tokens=(INT, ["N"]), log_probs=(F, ["N"]), eos_log_probs=(F, ["N"]),
                      location=(F, ["A", "S"]))
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        _, lengths = canvases(rng, batch, width)
        real = within(lengths + 1, width + 1)
        open_ = real & (rng.random(real.shape) < 0.7)
        N = int(open_.sum())
        emitted.check(open_=open_, tokens=np.where(rng.random(N) < 0.3, EOS, rng.integers(4, V, N)).astype(INT),
                      log_probs=-rng.random(N).astype(F), eos_log_probs=-rng.random(N).astype(F),
                      location=np.where(real, -rng.random(real.shape), -np.inf).astype(F))


# ---------------------------------------------------------------- the step rules and the cap
def test_argsort_is_stable_with_ties():
    for descending in (False, True):
        emitted = {dtype: Emitted(lambda xp, x, d=descending: xp.argsort(x, d), x=(dtype, ["A", "S"]))
                   for dtype in (F, INT)}
        for seed in range(4):
            rng = np.random.default_rng(seed)
            x = rng.choice([-np.inf, -1.0, -0.5, 0.0, 2.0], size=(5, 9)).astype(F)
            emitted[F].check(x=x)
            emitted[F].check(x=np.zeros((1, 7), F))  # all tied
            emitted[INT].check(x=rng.integers(0, 3, (4, 11)))
            order = emitted[F].check(x=x)[0]
            sign = -1 if descending else 1
            assert order.tolist() == [sorted(range(len(r)), key=lambda j: (sign * r[j], j)) for r in x.tolist()]


def test_the_room_cap_keeps_the_best_and_leftmost():
    emitted = Emitted(lambda xp, insert, score, room: L.cap(xp, insert, score, room),
                      insert=(B, ["A", "S"]), score=(F, ["A", "S"]), room=(INT, ["A"]))
    capped = cut_in_a_tie = 0
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        _, lengths = canvases(rng, batch, width)
        insert = (rng.random((batch, width + 1)) < 0.7) & within(lengths + 1, width + 1)
        score = rng.choice([-1.0, -0.5, 0.0], insert.shape).astype(F)
        room = rng.integers(0, width + 2, batch)
        kept = emitted.check(insert=insert, score=score, room=room)[0]
        for a in range(batch):
            if insert[a].sum() > room[a]:
                capped += 1
                dropped, held = score[a][insert[a] & ~kept[a]], score[a][kept[a]]
                cut_in_a_tie += bool(len(held) and len(dropped) and dropped.max() == held.min())
    assert capped > 3 and cut_in_a_tie > 1


@pytest.mark.parametrize("rule", [L.ParallelStep, L.GreedySlotStep, L.GreedySequenceStep])
def test_step_rules(rule):
    emitted = Emitted(lambda xp, room, **p: rule(xp, EOS)(scores_of(**p), room), room=(INT, ["A"]), **SLOT_SPECS)
    inserted = idle_rows = 0
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        _, lengths = canvases(rng, batch, width)
        closed_before, closed_end = closures(rng, lengths, width)
        real = within(lengths + 1, width + 1)
        open_ = real & ~L.closed_slots(L.NUMPY, closed_before, closed_end, lengths, width + 1)
        mask = emitted.check(room=rng.integers(0, 3, batch), **slot_table(rng, open_, real))[0]
        inserted += mask.sum()
        idle_rows += (~mask.any(1)).sum()
    assert inserted > 5 and idle_rows > 3


# ---------------------------------------------------------------- repetition and word edges
@pytest.mark.parametrize("ngram,neighbours", [(0, True), (2, False), (2, True), (3, False), (3, True), (0, False)])
def test_repeated_tokens(ngram, neighbours):
    emitted = Emitted(lambda xp, framed: L.repeated_tokens(xp, framed, ngram, neighbours, (BOS, EOS), PAD),
                      framed=(INT, ["B", "W"]))
    blocked = 0
    for seed, batch, width in SIZES:
        tokens, lengths = canvases(np.random.default_rng(seed), batch, width, words=(4, 5, 6))  # many repeats
        framed = L.frame(L.NUMPY, tokens, lengths, BOS, EOS, PAD)
        repeats = emitted.check(framed=framed)[0]
        blocked += (repeats != PAD).sum()
    assert blocked > 10 or (ngram, neighbours) == (0, False)


def test_word_edges():
    def fn(xp, framed, given, joins_next, open_):
        return (L.word_edge_slots(xp, framed, given, joins_next, EOS),
                L.word_edge_bans(xp, framed, given, joins_next, EOS, open_, False),
                L.word_edge_bans(xp, framed, given, joins_next, EOS, open_, True))

    emitted = Emitted(fn, framed=(INT, ["B", "W"]), given=(B, ["B", "K"]), joins_next=(B, [V]), open_=(B, ["B", "S"]))
    joins_next = np.arange(V) % 2 == 1
    joins_next[:4] = False
    seen = np.zeros(3, int)
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        tokens, lengths = canvases(rng, batch, width)
        given = within(lengths, width) & (rng.random((batch, width)) < 0.6)
        open_ = within(lengths + 1, width + 1) & (rng.random((batch, width + 1)) < 0.8)
        no_next, no_prev, no_end = emitted.check(framed=L.frame(L.NUMPY, tokens, lengths, BOS, EOS, PAD), given=given,
                                                 joins_next=joins_next, open_=open_)[:3]
        seen += [no_next.sum(), no_prev.sum(), no_end.sum()]
    assert (seen > 2).all()


@pytest.mark.parametrize("given,penalties,listed", [(False, False, False), (True, True, False), (True, False, True),
                                                     (False, True, True)])
def test_slot_inputs(given, penalties, listed):
    config = DecodingConfig(block_neighbour_copies=True, no_repeat_ngram_size=2, eos_penalty=0.5)

    def fn(xp, tokens, lengths, closed_before, closed_end, joins_next, given=None, eos_penalty=None, shortlist=None):
        state = L.Canvases(rows=None, tokens=tokens, scores=None, closed_before=closed_before, closed_end=closed_end,
                           lengths=lengths, iterations=None, final_eos=None, max_len=None, eos_penalty=eos_penalty,
                           given=given, shortlist=shortlist)
        framed = L.frame(xp, tokens, lengths, BOS, EOS, PAD)
        open_ = L.open_slots(xp, state, tokens.shape[1] + 1)
        return L.slot_inputs(xp, state, framed, open_, config, False, joins_next, BOS, EOS, PAD)

    specs = dict(tokens=(INT, ["A", "K"]), lengths=(INT, ["A"]), closed_before=(B, ["A", "K"]), closed_end=(B, ["A"]),
                 joins_next=(B, [V]))
    specs.update({name: spec for name, spec, on in (("given", (B, ["A", "K"]), given),
                                                    ("eos_penalty", (F, ["A"]), penalties),
                                                    ("shortlist", (INT, ["A", "L"]), listed)) if on})
    emitted = Emitted(fn, **specs)
    blocked = 0
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        tokens, lengths = canvases(rng, batch, width, words=(4, 5, 6, 7))
        closed_before, closed_end = closures(rng, lengths, width)
        arrays = dict(tokens=tokens, lengths=lengths, closed_before=closed_before, closed_end=closed_end,
                      joins_next=(np.arange(V) % 2 == 1) & (np.arange(V) >= 4))
        if given:
            arrays["given"] = within(lengths, width) & (rng.random((batch, width)) < 0.6)
        if penalties:
            arrays["eos_penalty"] = rng.choice([0.0, 1.0, 2.0], batch).astype(F)
        if listed:  # the specials, the canvas's words, some others; ascending, padded with V
            member = (rng.random((batch, V)) < 0.5) | (np.arange(V) < 6)
            arrays["shortlist"] = np.sort(np.where(member, np.arange(V), V), axis=1)[:, :int(member.sum(1).max())]
        out = emitted.check(**arrays)
        blocked += (out[0] != PAD).sum()
    assert blocked > 10


# ---------------------------------------------------------------- one pass's state update
@pytest.mark.parametrize("rule", [L.ParallelStep, L.GreedySlotStep, L.GreedySequenceStep])
@pytest.mark.parametrize("close_ended", [False, True])
def test_step_and_the_rows_that_go_on(rule, close_ended):
    """The whole update of a pass from the model's values at the open slots: open slots, slot scores, the step
    rule with the room cap, the step, then the rows kept (in order) and trimmed as the loop keeps them."""
    max_iter = 3

    def fn(xp, rows, tokens, scores, closed_before, closed_end, lengths, iterations, final_eos, max_len, given,
           m_tokens, m_log_probs, m_eos, location):
        state = L.Canvases(rows=rows, tokens=tokens, scores=scores, closed_before=closed_before, closed_end=closed_end,
                           lengths=lengths, iterations=iterations, final_eos=final_eos, max_len=max_len, given=given)
        bounds = L.Bounds(rule=rule(xp, EOS), max_iterations=max_iter, close_ended=close_ended, eos=EOS, pad=PAD)
        open_ = L.open_slots(xp, state, tokens.shape[1] + 1)
        p = L.slot_scores(xp, open_, m_tokens, m_log_probs, m_eos, location, EOS, rule is L.GreedySequenceStep)
        after = L.step(xp, state, p, bounds.rule(p, state.max_len - state.lengths), max_iter, bounds)
        idx = xp.argsort(xp.long(after.keep), descending=True)[:after.n_keep]  # kept rows first, in order
        return after, after.state.take(idx).trimmed(after.kept_width)

    AK = ["A", "K"]
    emitted = Emitted(fn, rows=(INT, ["A"]), tokens=(INT, AK), scores=(F, AK), closed_before=(B, AK),
                      closed_end=(B, ["A"]),
                      lengths=(INT, ["A"]), iterations=(INT, ["A"]), final_eos=(F, ["A"]), max_len=(INT, ["A"]),
                      given=(B, AK), m_tokens=(INT, ["N"]), m_log_probs=(F, ["N"]), m_eos=(F, ["N"]),
                      location=(F, ["A", "S"]))
    grew = stopped = went_on = 0
    for seed, batch, width in SIZES:
        rng = np.random.default_rng(seed)
        tokens, lengths = canvases(rng, batch, width)
        closed_before, closed_end = closures(rng, lengths, width)
        real = within(lengths + 1, width + 1)
        open_ = real & ~L.closed_slots(L.NUMPY, closed_before, closed_end, lengths, width + 1)
        N = int(open_.sum())
        out = emitted.check(
            rows=np.arange(batch), tokens=tokens, scores=np.where(within(lengths, width), -rng.random(tokens.shape), 0)
            .astype(F), closed_before=closed_before, closed_end=closed_end, lengths=lengths,
            iterations=rng.integers(0, max_iter, batch), final_eos=np.zeros(batch, F),
            max_len=lengths + rng.integers(0, 4, batch),
            given=within(lengths, width) & (rng.random(tokens.shape) < 0.5),
            m_tokens=np.where(rng.random(N) < 0.3, EOS, rng.integers(4, V, N)).astype(INT),
            m_log_probs=rng.choice([-1.0, -0.5], N).astype(F), m_eos=rng.choice([-1.0, -0.5], N).astype(F),
            location=np.where(real, rng.choice([-1.0, -0.5], real.shape), -np.inf).astype(F))
        new_lengths, keep, n_keep = out[5], out[10], out[11]  # the state's 10 arrays, then keep, n_keep
        assert out[12 + 2].shape == (n_keep, out[12])  # the kept rows' tokens, trimmed to the longest
        grew += (new_lengths > lengths).sum()
        stopped += (~keep).sum()
        went_on += n_keep
    assert grew > 5 and stopped > 3 and went_on > 3
