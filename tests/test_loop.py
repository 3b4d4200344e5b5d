"""The one decoding loop (fairseq_insertion.loop) with an oracle in place of a model, on both backends'
arrays (numpy for the runtime, torch for the PyTorch generator): the oracle proposes the middle token
of every slot's missing span, so a parallel decode rebuilds each target in floor(log2 n) + 1
iterations, greedy in n; the length limit and the room cap hold; the torch loop waits for the device
once a pass."""

from typing import List

import numpy as np
import pytest
import torch

from fairseq_insertion import loop as L
from fairseq_insertion.canvas import log2_bound
from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.loop import driver

BOS, PAD, EOS = 0, 1, 2
BACKENDS = {"numpy": (L.NUMPY, np.asarray), "torch": (TORCH, torch.tensor)}


def options_(config: DecodingConfig) -> L.DecodeOptions:
    return L.DecodeOptions(config, "slot", BOS, EOS, PAD, unk=3)


class Oracle:
    """A backend whose pass knows the targets: each open slot's token is the (left) middle of the target
    tokens still missing there, end-of-slot where none is; every score 0."""

    def __init__(self, xp, wrap, targets: List[List[int]]):
        self.xp, self.wrap, self.targets = xp, wrap, targets

    incremental = False

    def score_slots(self, rows, framed, open_, inputs, k: int, fresh=None) -> L.SlotChoice:
        """``rows``: the memory, each active canvas's target."""
        tokens = []
        for a, row in enumerate(np.asarray(rows).tolist()):
            canvas = [t for t in np.asarray(framed[a]).tolist()[1:] if t != PAD][:-1]
            target = self.targets[row]
            cuts, j = [0], 0
            for tok in canvas:  # the canvas is a subsequence of the target
                j = target.index(tok, j) + 1
                cuts.append(j)
            cuts.append(len(target) + 1)
            spans = [target[cuts[i]:cuts[i + 1] - 1] for i in range(len(canvas) + 1)]
            row_tokens = [span[(len(span) - 1) // 2] if span else EOS for span in spans]
            tokens += row_tokens + [EOS] * (open_.shape[1] - len(row_tokens))  # (S,) each row's slots
        tokens = np.asarray(tokens, np.int64)[np.asarray(open_).reshape(-1)][:, None]  # (N, 1) the open slots'
        location = self.wrap(np.where(np.asarray(open_), 0.0, -np.inf).astype(np.float32))
        zeros = self.wrap(np.zeros((len(tokens), 1), np.float32))
        return L.SlotChoice(self.wrap(tokens), zeros, zeros, location)

    def reorder(self, rows, keep):
        return rows[keep]

    def score_candidates(self, tokens, lengths, per_source):
        return None


def decode(backend: str, targets: List[List[int]], decoding: str, max_len: List[int], record=None, **options):
    xp, wrap = BACKENDS[backend]
    B = len(targets)
    state = L.Canvases(rows=wrap(np.arange(B)), tokens=wrap(np.zeros((B, 0), np.int64)),
                       scores=wrap(np.zeros((B, 0), np.float32)), closed_before=None,
                       closed_end=wrap(np.zeros(B, bool)), lengths=wrap(np.zeros(B, np.int64)),
                       iterations=wrap(np.zeros(B, np.int64)), final_eos=wrap(np.zeros(B, np.float32)),
                       max_len=wrap(np.asarray(max_len, np.int64)))
    opts = options_(DecodingConfig(decoding=decoding, **options))
    out, work = driver.run(Oracle(xp, wrap, targets), state, wrap(np.arange(B)), opts, record)
    lengths = np.asarray(out.lengths).tolist()
    return [np.asarray(out.tokens[b])[:lengths[b]].tolist() for b in range(B)], np.asarray(out.iterations), \
        work.passes


def random_targets(seed: int, B: int = 6) -> List[List[int]]:
    rng = np.random.default_rng(seed)
    return [rng.choice(np.arange(4, 60), size=int(rng.integers(0, 20)), replace=False).tolist()  # no repeats
            for _ in range(B)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_parallel_rebuilds_every_target_in_log2_iterations(backend):
    for seed in range(5):
        targets = random_targets(seed)
        hyps, iterations, passes = decode(backend, targets, "parallel", [2 * len(t) + 10 for t in targets])
        assert hyps == targets
        n = np.asarray([len(t) for t in targets])
        assert (iterations == log2_bound(torch.tensor(n)).numpy()).all()
        assert passes == iterations.max() + 1  # the last pass only finds end-of-slot


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_inserts_one_token_a_pass(backend):
    targets = random_targets(7)
    hyps, iterations, _ = decode(backend, targets, "greedy", [2 * len(t) + 10 for t in targets])
    assert hyps == targets and iterations.tolist() == [len(t) for t in targets]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_length_limit_stops_a_canvas_exactly_there(backend):
    targets = [list(range(4, 24)), list(range(30, 37)), []]
    hyps, _, _ = decode(backend, targets, "parallel", [5, 3, 4])
    assert [len(h) for h in hyps] == [5, 3, 0]
    for hyp, target in zip(hyps, targets):  # the room cap kept a subsequence of the target
        it = iter(target)
        assert all(tok in it for tok in hyp)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cap", [1, 3])
def test_max_per_pass_caps_each_passs_insertions(backend, cap):
    targets = random_targets(5, B=8)
    limits = [2 * len(t) + 10 for t in targets]
    lengths = []  # every row's length after every pass
    hyps, iterations, _ = decode(backend, targets, "parallel", limits, max_per_pass=cap,
                                 record=lambda state, inserted: lengths.append(dict(zip(
                                     np.asarray(state.rows).tolist(), np.asarray(state.lengths).tolist()))))
    assert hyps == targets  # the slots left out propose their tokens again the next pass
    before = dict.fromkeys(range(len(targets)), 0)
    for after in lengths:
        assert all(0 <= after[r] - before[r] <= cap for r in after)
        before.update(after)
    n = np.asarray([len(t) for t in targets])
    assert (iterations >= -(-n // cap)).all()
    if cap == 1:
        assert (iterations == n).all()
    uncapped = decode(backend, targets, "parallel", limits)[1]
    assert (iterations > uncapped).any()
    assert decode(backend, targets, "parallel", limits, max_per_pass=20)[1].tolist() == uncapped.tolist()


def test_both_backends_decode_alike():
    targets = random_targets(11, B=9)
    limits = [max(1, len(t) - 3) for t in targets]
    assert decode("numpy", targets, "parallel", limits)[0] == decode("torch", targets, "parallel", limits)[0]


def test_the_torch_loop_makes_one_host_round_trip_a_pass(monkeypatch):
    calls = []
    host = TORCH.host
    monkeypatch.setattr(type(TORCH), "host", lambda self, *scalars: calls.append(len(scalars)) or host(*scalars))
    _, _, passes = decode("torch", random_targets(3), "parallel", [40] * 6)
    assert passes > 2 and len(calls) == passes + 1  # one a pass, and one before the first


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_predict_scores_the_open_slots(backend):
    """loop.predict hands the backend's scorer the framed canvases, the open slots and their slot-rule inputs,
    and builds the slot scores from what it returns (a padding slot stays shut)."""
    xp, wrap = BACKENDS[backend]
    state = L.Canvases(rows=wrap(np.arange(2)), tokens=wrap(np.asarray([[5, 6], [7, PAD]], np.int64)),
                       scores=wrap(np.zeros((2, 2), np.float32)), closed_before=None,
                       closed_end=wrap(np.zeros(2, bool)), lengths=wrap(np.asarray([2, 1], np.int64)),
                       iterations=wrap(np.zeros(2, np.int64)), final_eos=wrap(np.zeros(2, np.float32)),
                       max_len=wrap(np.asarray([9, 9], np.int64)))
    opts = options_(DecodingConfig(block_neighbour_copies=True))
    seen = {}

    class Scorer:
        def score_slots(self, memory, framed, open_, inputs, k, fresh=None):
            seen.update(framed=np.asarray(framed), open=np.asarray(open_), blocked=np.asarray(inputs.blocked), k=k)
            n = int(np.asarray(open_).sum())
            return L.SlotChoice(wrap(np.arange(10, 10 + n, dtype=np.int64)[:, None]),
                                wrap(np.full((n, 1), -1.0, np.float32)), wrap(np.full((n, 1), -2.0, np.float32)),
                                wrap(np.zeros((2, 3), np.float32)))

    scorer = Scorer()
    scorer.xp = xp
    p, _ = driver.predict(scorer, state, None, opts)
    assert seen["k"] == 1
    assert seen["framed"].tolist() == [[BOS, 5, 6, EOS], [BOS, 7, EOS, PAD]]
    assert seen["open"].tolist() == [[True, True, True], [True, True, False]]
    # each open slot's neighbours, row-major, bos and eos not
    assert seen["blocked"][:, :2].tolist() == [[PAD, 5], [5, 6], [6, PAD], [PAD, 7], [7, PAD]]
    assert np.asarray(p.tokens).tolist() == [[10, 11, 12], [13, 14, EOS]]
    assert np.asarray(p.log_probs).tolist() == [[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]]


def test_first_insertions_take_every_slot_rule(monkeypatch):
    """A barring rule added to RULES applies on the first insertions' pass too, beside unk and end-of-slot."""
    from fairseq_insertion.loop import driver, rules

    class BarNine:
        feeds = (rules.BLOCKED,)

        def values(self, p):
            return {"blocked": p.xp.where(p.open_, 9, PAD)[p.open_][:, None]}

    monkeypatch.setattr(rules, "RULES", (*rules.RULES, BarNine()))
    seen = {}

    class Scorer:
        xp, incremental = L.NUMPY, False

        def score_slots(self, memory, framed, open_, inputs, k, fresh=None):
            seen.update(framed=np.asarray(framed), blocked=np.asarray(inputs.blocked), no_end=np.asarray(inputs.no_end))
            n = int(np.asarray(open_).sum())
            return L.SlotChoice(np.tile(np.arange(10, 10 + k), (n, 1)), np.zeros((n, k), np.float32),
                                np.zeros((n, 1), np.float32), np.zeros((n, 1), np.float32))

    opts = options_(DecodingConfig(first_insertions=2))
    tokens, _ = driver.first_tokens(Scorer(), None, 2, opts, np.asarray([5, 7]), None)
    assert np.asarray(tokens).tolist() == [[10, 11], [10, 11]]
    assert seen["framed"].tolist() == [[BOS, EOS], [BOS, EOS]]
    assert [sorted(set(row) - {PAD}) for row in seen["blocked"].tolist()] == [[3, 9], [3, 9]]  # unk and the rule's
    assert seen["no_end"].all()
