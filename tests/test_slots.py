"""The slot rule's two applications (fairseq_insertion.slots: choose on torch, choose_graph in the exported
pass) against each other and against an independent reference over the whole table (bos, pad and the
blocked tokens excluded, end-of-slot penalised, the lowest id among equal scores), on random tables with
many ties, with the same log-probabilities; with the word-edge rule, a slot left with no token at all
ending; unkpen on torch; the export refuses unkpen."""

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto  # noqa: E402

from fairseq_insertion.decoding import TORCH  # noqa: E402
from fairseq_insertion.export import ExportError, Graph, export_model  # noqa: E402
from fairseq_insertion.export.graph import _io  # noqa: E402
from fairseq_insertion.loop import FEEDS, NUMPY, SlotInputs
from fairseq_insertion.loop.rules import shortlist_positions  # noqa: E402
from fairseq_insertion.slots import (  # noqa: E402
    Shortlist,
    SlotRule,
    argmax_block,
    choose,
    choose_graph,
    shortlist_rows,
)

BOS, PAD, EOS, UNK = 0, 1, 2, 3


def rule_of(joins_next: np.ndarray, joins_prev: np.ndarray, unkpen: float = 0.0) -> SlotRule:
    return SlotRule.build((BOS, PAD, EOS), EOS, UNK, joins_next, joins_prev, unkpen)


def step_session(V: int, joins_next: np.ndarray, joins_prev: np.ndarray) -> "ort.InferenceSession":
    return ort.InferenceSession(step_model(V, joins_next, joins_prev).SerializeToString(),
                                providers=["CPUExecutionProvider"])


def step_model(V: int, joins_next: np.ndarray, joins_prev: np.ndarray) -> "onnx.ModelProto":
    g = Graph("step")
    choose_graph(g, rule_of(joins_next, joins_prev), "content", {f.name: f.name for f in FEEDS}, "k")
    model = g.model([_io("content", TensorProto.FLOAT, ["open", V]), _io("blocked", TensorProto.INT64, ["open", "m"]),
                     _io("eos_penalty", TensorProto.FLOAT, ["open", 1]), _io("word_edges", TensorProto.INT64, ["open"]),
                     _io("no_end", TensorProto.BOOL, ["open", 1]), _io("k", TensorProto.INT64, [1])],
                    [_io(name, dtype, ["open", k]) for name, dtype, k in (("tokens", TensorProto.INT64, "k"),
                                                                           ("log_probs", TensorProto.FLOAT, "k"),
                                                                           ("eos_log_probs", TensorProto.FLOAT, 1))],
                    vocab_size=V)
    return model


def full_table(content, blocked, penalty, no_next, no_prev, no_end, joins_next, joins_prev, unkpen=0.0):
    """The rule written out on the whole (N, V) table, step by step (the reference)."""
    c = torch.from_numpy(content.copy())
    lse = c.logsumexp(-1)
    eos_lp = c[:, EOS] - lse
    c.scatter_(1, torch.from_numpy(blocked), float("-inf"))
    c[:, EOS] -= torch.from_numpy(penalty)
    c[:, UNK] -= unkpen
    c[:, BOS] = float("-inf")
    c[:, PAD] = float("-inf")
    end = c[:, EOS].clone()
    c.masked_fill_(torch.from_numpy(no_next[:, None] & joins_next), float("-inf"))
    c.masked_fill_(torch.from_numpy(no_prev[:, None] & joins_prev), float("-inf"))
    c[:, EOS].masked_fill_(torch.from_numpy(no_end), float("-inf"))
    best, tok = c.max(-1)
    stuck = best.isneginf()  # no token left: the slot ends
    best, tok = torch.where(stuck, end, best), tok.masked_fill(stuck, EOS)
    return tok.numpy(), (best - lse).numpy(), eos_lp.numpy()


@pytest.mark.parametrize("V", [5, 12, 40])
@pytest.mark.parametrize("edges", [False, True])
def test_the_step_rule_chooses_as_the_whole_table_with_ties(V, edges):
    gen = np.random.default_rng(V)
    joins_next, joins_prev = (np.arange(V) >= 4) & (gen.random(V) < 0.5), (np.arange(V) >= 4) & (gen.random(V) < 0.3)
    session = step_session(V, joins_next, joins_prev)
    chosen, stuck = set(), 0
    for _ in range(80):
        N, M = int(gen.integers(1, 9)), int(gen.integers(1, 6))
        content = gen.choice([-1.0, 0.0, 0.5, 1.0], size=(N, V)).astype(np.float32)  # many ties
        blocked = gen.integers(3, V, size=(N, M))
        blocked[gen.random((N, M)) < 0.3] = PAD  # pad: nothing blocked in that column
        penalty = gen.choice([0.0, 0.5, 1.0], size=N).astype(np.float32)
        no_next, no_prev, no_end = (gen.random((3, N)) < (0.5 if edges else 0.0))
        tokens, log_probs, eos_log_probs = session.run(None, {
            "content": content, "blocked": blocked, "eos_penalty": penalty[:, None],
            "word_edges": no_next.astype(np.int64) + 2 * no_prev, "no_end": no_end[:, None], "k": np.ones(1, np.int64)})
        want_tok, want_lp, want_eos = full_table(content, blocked, penalty, no_next, no_prev, no_end, joins_next,
                                                 joins_prev)
        assert tokens[:, 0].tolist() == want_tok.tolist()
        np.testing.assert_allclose(log_probs[:, 0], want_lp, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(eos_log_probs[:, 0], want_eos, rtol=1e-5, atol=1e-5)
        t_tok, t_lp, t_eos = choose(rule_of(joins_next, joins_prev), torch.from_numpy(content.copy()), SlotInputs(
            blocked=torch.from_numpy(blocked), eos_penalty=torch.from_numpy(penalty),
            word_edges=torch.from_numpy(no_next.astype(np.int64) + 2 * no_prev) if edges else None,
            no_end=torch.from_numpy(no_end) if edges else None))
        assert t_tok[:, 0].tolist() == want_tok.tolist()
        np.testing.assert_allclose(t_lp[:, 0].numpy(), want_lp, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(t_eos[:, 0].numpy(), want_eos, rtol=1e-5, atol=1e-5)
        chosen.update(tokens[:, 0].tolist())
        stuck += int((no_end & (want_tok == EOS)).sum())
    assert EOS in chosen and len(chosen) > 2  # both end-of-slot and tokens were chosen
    assert stuck > 0 if edges and V == 5 else True  # a slot with nothing left ends


@pytest.mark.parametrize("V, size", [(5, None), (12, 3), (40, 5), (7968, 83), (7919, None)])
def test_the_best_token_is_searched_in_blocks_of_a_divisor_of_the_width(V, size):
    """The branch of a batch in class 0 (the one the parity test above runs at V = 12 and 40) finds the best token
    in blocks of a divisor of V near its root, or in one search for a prime V."""
    assert argmax_block(V) == size and (size is None or V % size == 0)
    (branch,) = [n for n in step_model(V, np.zeros(V, bool), np.zeros(V, bool)).graph.node if n.op_type == "If"]
    best = {a.name: a.g for a in branch.attribute}["else_branch"]
    ops = [n.op_type for n in best.node]
    assert ops.count("ArgMax") == (1 if size is None else 2) and ("GatherND" in ops) == (size is not None)


def test_the_bars_scatter_onto_the_table_after_its_other_reads():
    """Every other reader of the table (N, V) is an ancestor of the scatter that bars tokens on it, so the scatter
    is its last reader and onnxruntime may bar them in the table's own buffer."""
    graph = step_model(12, np.zeros(12, bool), np.zeros(12, bool)).graph
    producer = {out: node for node in graph.node for out in node.output}
    readers = [n for n in graph.node if "content" in n.input]
    (scatter,) = [n for n in readers if n.op_type == "ScatterElements"]
    above, todo = set(), list(scatter.input)
    while todo:
        node = producer.get(todo.pop())
        if node is not None and node.name not in above:
            above.add(node.name)
            todo.extend(node.input)
    assert len(readers) >= 3 and {n.name for n in readers if n is not scatter} <= above


def test_k_best_tokens_with_the_end_barred_are_the_tables_top_k():
    """The first insertions' pass (k > 1, end-of-slot barred by no_end): the k best tokens of the whole table
    once the specials and the blocked ones are excluded, best first, and their log p(c | l)."""
    V, k = 12, 4
    gen = np.random.default_rng(1)
    session = step_session(V, np.zeros(V, bool), np.zeros(V, bool))
    for _ in range(20):
        N = int(gen.integers(1, 6))
        content = gen.normal(size=(N, V)).astype(np.float32)
        content[:, EOS] += 3.0  # end-of-slot would win: it is barred
        blocked = np.full((N, 1), PAD)
        tokens, log_probs, _ = session.run(None, {
            "content": content, "blocked": blocked, "eos_penalty": np.zeros((N, 1), np.float32),
            "word_edges": np.zeros(N, np.int64), "no_end": np.ones((N, 1), bool), "k": np.asarray([k])})
        c = torch.from_numpy(content.copy())
        lse = c.logsumexp(-1, keepdim=True)
        c[:, [BOS, PAD, EOS]] = float("-inf")
        want, want_ids = c.topk(k, -1)
        assert tokens.shape == (N, k) and tokens.tolist() == want_ids.tolist()
        np.testing.assert_allclose(log_probs, (want - lse).numpy(), rtol=1e-5, atol=1e-5)
        t_tok, t_lp, _ = choose(rule_of(np.zeros(V, bool), np.zeros(V, bool)), torch.from_numpy(content.copy()),
                                SlotInputs(blocked=torch.from_numpy(blocked), eos_penalty=0.0, word_edges=None,
                                           no_end=torch.ones(N, dtype=torch.bool)), k)
        assert t_tok.tolist() == want_ids.tolist()
        np.testing.assert_allclose(t_lp.numpy(), (want - lse).numpy(), rtol=1e-5, atol=1e-5)


def test_unkpen_on_torch_is_the_whole_tables_and_the_export_refuses_it(tmp_path):
    V = 12
    gen = np.random.default_rng(2)
    none = np.zeros(V, bool)
    for unkpen in (0.5, 2.0):
        N = 40
        content = gen.choice([-1.0, 0.0, 0.5, 1.0], size=(N, V)).astype(np.float32)
        content[:, UNK] += 2.5  # unk often best, even after its penalty
        blocked = np.full((N, 1), PAD)
        penalty = np.full(N, 0.5, np.float32)
        off = np.zeros(N, bool)
        want_tok, want_lp, _ = full_table(content, blocked, penalty, off, off, off, none, none, unkpen)
        t_tok, t_lp, _ = choose(rule_of(none, none, unkpen), torch.from_numpy(content.copy()), SlotInputs(
            blocked=None, eos_penalty=0.5, word_edges=None, no_end=None))
        assert t_tok[:, 0].tolist() == want_tok.tolist() and UNK in want_tok.tolist()
        np.testing.assert_allclose(t_lp[:, 0].numpy(), want_lp, rtol=1e-5, atol=1e-5)
    with pytest.raises(ExportError, match="unkpen 1.0"):
        from fairseq_insertion.config import DecodingConfig

        export_model(None, None, None, tmp_path / "out", config=DecodingConfig(unkpen=1.0))


def shortlist_session(V: int, joins_next: np.ndarray, joins_prev: np.ndarray) -> "ort.InferenceSession":
    g = Graph("step")
    choose_graph(g, rule_of(joins_next, joins_prev), "content", {f.name: f.name for f in FEEDS}, "k",
                 ids="ids")
    model = g.model([_io("content", TensorProto.FLOAT, ["open", "L"]), _io("ids", TensorProto.INT64, ["open", "L"]),
                     _io("blocked", TensorProto.INT64, ["open", "m"]),
                     _io("eos_penalty", TensorProto.FLOAT, ["open", 1]),
                     _io("word_edges", TensorProto.INT64, ["open"]), _io("no_end", TensorProto.BOOL, ["open", 1]),
                     _io("k", TensorProto.INT64, [1])],
                    [_io(name, dtype, ["open", k]) for name, dtype, k in (("tokens", TensorProto.INT64, "k"),
                                                                           ("log_probs", TensorProto.FLOAT, "k"),
                                                                           ("eos_log_probs", TensorProto.FLOAT, 1))],
                    vocab_size=V)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_shortlist_rows_hold_the_specials_frequent_translations_and_constraints_ascending():
    V, Vs = 30, 9
    gen = np.random.default_rng(5)
    table = Shortlist(frequent=np.asarray([7, 5]), translations=gen.integers(4, V, size=(Vs, 3)), target_vocab=V)
    table.translations[[0, 1, 2, 3]] = 0  # the specials translate to nothing
    src = gen.integers(4, Vs, size=(4, 5))
    src[1, 3:] = PAD  # a shorter sentence, right-padded
    given = np.asarray([[9, 9], [PAD, PAD], [29, 4], [PAD, 11]])
    rows = shortlist_rows(table, src, (BOS, PAD, EOS, UNK), given)
    for b in range(4):
        want = sorted({0, 1, 2, 3, 5, 7} | {int(t) for s in src[b] for t in table.translations[s]}
                      | {int(t) for t in given[b]})
        assert rows[b, :len(want)].tolist() == want and (rows[b, len(want):] == V).all()
    assert (rows == V).any()  # the rows differ in length: some are padded


def test_blocked_tokens_find_their_positions_in_each_slots_list():
    gen = np.random.default_rng(6)
    V = 50
    rows = np.sort(np.stack([gen.choice(np.arange(4, V), 12, replace=False) for _ in range(5)]), 1)
    rows[:, :4] = np.arange(4)
    rows[2, 9:] = V  # padded
    slot_rows = gen.integers(0, 5, size=20)
    tokens = gen.integers(0, V, size=(20, 3))
    tokens[:, 0] = rows[slot_rows, 6]  # present for sure
    for xp, conv in ((NUMPY, np.asarray), (TORCH, torch.from_numpy)):
        got = np.asarray(shortlist_positions(xp, conv(rows), conv(slot_rows), conv(tokens), PAD))
        for n in range(20):
            listed = rows[slot_rows[n]].tolist()
            want = [listed.index(t) if t in listed else PAD for t in tokens[n].tolist()]
            assert got[n].tolist() == want
        assert (got[:, 0] == 6).all()


@pytest.mark.parametrize("edges", [False, True])
def test_the_rule_on_a_shortlist_is_the_whole_tables_rule_on_the_listed_tokens(edges):
    """Torch (the whole table, gathered) and the graph (only the listed scores) against the reference on the
    table whose unlisted tokens score -inf: the list is the slot's vocabulary, its log-normaliser included."""
    V, A, L = 40, 4, 14
    gen = np.random.default_rng(7 + edges)
    joins_next, joins_prev = (np.arange(V) >= 4) & (gen.random(V) < 0.5), (np.arange(V) >= 4) & (gen.random(V) < 0.3)
    session = shortlist_session(V, joins_next, joins_prev)
    chosen = set()
    for _ in range(40):
        rows = np.full((A, L), V)
        for a in range(A):
            n = int(gen.integers(5, L + 1))
            rows[a, :n] = np.concatenate([np.arange(4), np.sort(gen.choice(np.arange(4, V), n - 4, replace=False))])
        N, M = int(gen.integers(1, 9)), int(gen.integers(1, 4))
        slot_rows = gen.integers(0, A, size=N)
        content = gen.choice([-1.0, 0.0, 0.5, 1.0], size=(N, V)).astype(np.float32)  # many ties
        blocked = gen.integers(3, V, size=(N, M))
        blocked[gen.random((N, M)) < 0.3] = PAD
        penalty = gen.choice([0.0, 0.5, 1.0], size=N).astype(np.float32)
        no_next, no_prev, no_end = (gen.random((3, N)) < (0.5 if edges else 0.0))
        ids = rows[slot_rows]  # (N, L)
        listed = np.zeros((N, V + 1), bool)
        listed[np.arange(N)[:, None], ids] = True
        masked = np.where(listed[:, :V], content, -np.inf).astype(np.float32)
        want_tok, want_lp, want_eos = full_table(masked, blocked, penalty, no_next, no_prev, no_end, joins_next,
                                                 joins_prev)
        positions = shortlist_positions(NUMPY, rows, slot_rows, blocked, PAD)
        tokens, log_probs, eos_log_probs = session.run(None, {
            "content": np.take_along_axis(np.pad(content, ((0, 0), (0, 1))), ids, 1), "ids": ids,
            "blocked": positions, "eos_penalty": penalty[:, None], "word_edges": no_next.astype(np.int64) + 2 * no_prev,
            "no_end": no_end[:, None], "k": np.ones(1, np.int64)})
        t_tok, t_lp, t_eos = choose(rule_of(joins_next, joins_prev), torch.from_numpy(content.copy()), SlotInputs(
            blocked=torch.from_numpy(positions), eos_penalty=torch.from_numpy(penalty),
            word_edges=torch.from_numpy(no_next.astype(np.int64) + 2 * no_prev) if edges else None,
            no_end=torch.from_numpy(no_end) if edges else None, shortlist=torch.from_numpy(rows),
            slot_rows=torch.from_numpy(slot_rows)))
        for tok, lp, eos_lp in ((tokens, log_probs, eos_log_probs), (t_tok.numpy(), t_lp.numpy(), t_eos.numpy())):
            assert tok[:, 0].tolist() == want_tok.tolist()
            np.testing.assert_allclose(lp[:, 0], want_lp, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(eos_lp[:, 0], want_eos, rtol=1e-5, atol=1e-5)
        assert all(t in rows[r] for t, r in zip(want_tok.tolist(), slot_rows))
        chosen.update(want_tok.tolist())
    assert EOS in chosen and len(chosen) > 5
