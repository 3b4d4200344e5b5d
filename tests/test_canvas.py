"""Unit tests of the pure canvas functions, and the vectorised loss against a
plain per-example implementation written straight from the paper's formulas."""

import math

import pytest
import torch

from fairseq_insertion import canvas as C
from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.loop import geometry

PAD, BOS, EOS = 1, 0, 2


def random_batch(gen: torch.Generator, B: int = 6, max_n: int = 9, V: int = 11):
    lengths = torch.randint(0, max_n + 1, (B,), generator=gen)
    N = int(lengths.max()) if B else 0
    target = torch.randint(4, V, (B, N), generator=gen)
    target = target.masked_fill(torch.arange(N).unsqueeze(0) >= lengths.unsqueeze(1), PAD)
    return target, lengths


# ---------------------------------------------------------------- sampling
@pytest.mark.parametrize("order", C.ORDERS)
def test_sample_canvas_keeps_a_subsequence(order):
    gen = torch.Generator().manual_seed(0)
    target, lengths = random_batch(gen, B=50)
    keep = C.sample_canvas(lengths, target.size(1), order, generator=gen)
    N = target.size(1)
    valid = torch.arange(N).unsqueeze(0) < lengths.unsqueeze(1)
    assert not (keep & ~valid).any()
    if order == "left_to_right":
        # a prefix: no kept position after a dropped one
        assert ((keep.long().cummin(1).values) == keep.long()).all()
    canvas, k = L.gather_canvas(TORCH, target, keep, PAD)
    for b in range(target.size(0)):
        kept = [int(t) for t, m in zip(target[b], keep[b]) if m]
        assert canvas[b, : k[b]].tolist() == kept
        assert (canvas[b, k[b]:] == PAD).all()


@pytest.mark.parametrize("order", ["binary_tree", "uniform", "left_to_right"])
def test_canvas_length_is_uniform_over_0_to_n(order):
    """k ~ Uniform{0..n}: not a per-token coin flip (which would peak at n/2)."""
    n, trials = 6, 21000
    lengths = torch.full((trials,), n)
    keep = C.sample_canvas(lengths, n, order, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(keep.sum(1), minlength=n + 1).float() / trials
    assert torch.allclose(counts, torch.full((n + 1,), 1 / (n + 1)), atol=0.015), counts


def test_subset_is_uniform_given_k():
    """Given k, every k-subset is equally likely (shuffle, keep the first k)."""
    n, trials = 4, 40000
    keep = C.sample_canvas(torch.full((trials,), n), n, "uniform", generator=torch.Generator().manual_seed(2))
    k2 = keep[keep.sum(1) == 2]
    codes = (k2.long() * torch.tensor([1, 2, 4, 8])).sum(1)
    freq = torch.bincount(codes, minlength=16)[[3, 5, 6, 9, 10, 12]].float()
    assert (freq / freq.mean() - 1).abs().max() < 0.08, freq


# ---------------------------------------------------------------- spans
def test_slot_spans_and_frame_by_hand():
    # target A B C D E F G, canvas [B, F] -> slots: 0:{A}, 1:{C,D,E}, 2:{G}
    keep = torch.tensor([[0, 1, 0, 0, 0, 1, 0]], dtype=torch.bool)
    slot, start, end = C.slot_spans(keep, torch.tensor([7]))
    missing = ~keep[0]
    assert slot[0][missing].tolist() == [0, 1, 1, 1, 2]
    assert start[0][missing].tolist() == [0, 2, 2, 2, 6]
    assert end[0][missing].tolist() == [0, 4, 4, 4, 6]
    framed = L.frame(TORCH, torch.tensor([[5, 6], [7, PAD]]), torch.tensor([2, 1]), BOS, EOS, PAD)
    assert framed.tolist() == [[BOS, 5, 6, EOS], [BOS, 7, EOS, PAD]]


def test_binary_tree_weights_by_hand():
    keep = torch.tensor([[1, 0, 0, 0, 0, 0]], dtype=torch.bool)  # span 1..5, centre 3
    _, start, end = C.slot_spans(keep, torch.tensor([6]))
    tau = 0.7
    w = C.slot_weights(start, end, "binary_tree", tau)[0, 1:]
    raw = torch.tensor([math.exp(-abs(3 - i) / tau) for i in range(1, 6)])
    assert torch.allclose(w, raw / raw.sum(), atol=1e-6)
    # tiny temperatures stay finite and put all mass on the centre (two centres if even)
    w = C.slot_weights(start, end, "binary_tree", 1e-4)[0, 1:]
    assert torch.allclose(w, torch.tensor([0.0, 0, 1, 0, 0]))
    u = C.slot_weights(start, end, "uniform")[0, 1:]
    assert torch.allclose(u, torch.full((5,), 0.2))


# ---------------------------------------------------------------- insertion
def insert(xp, canvas, lengths, slot_tokens, insert_mask, pad):
    """The loop's insertion of ``slot_tokens[l]`` into every slot l where ``insert_mask`` (B, S): the new canvas
    trimmed to the longest row, and the new lengths."""
    new_lengths = lengths + insert_mask.sum(1)
    width = int(new_lengths.max()) if canvas.shape[0] > 0 else 0
    dest = geometry.insertion_destinations(xp, lengths, insert_mask, canvas.shape[1], width)
    return geometry.place(xp, dest, canvas, slot_tokens, width, pad), new_lengths


def test_insert_parallel_and_single():
    canvas = torch.tensor([[10, 11, 12], [20, PAD, PAD]])
    lengths = torch.tensor([3, 1])
    toks = torch.tensor([[5, 6, 7, 8], [9, 4, 0, 0]])
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    out, new = insert(TORCH, canvas, lengths, toks, mask, PAD)
    assert new.tolist() == [6, 3]
    assert out.tolist() == [[5, 10, 11, 7, 12, 8], [9, 20, 4, PAD, PAD, PAD]]
    # greedy: one insertion into an empty canvas
    out, new = insert(TORCH, torch.zeros(1, 0, dtype=torch.long), torch.tensor([0]), torch.tensor([[42]]),
                        torch.tensor([[True]]), PAD)
    assert out.tolist() == [[42]] and new.tolist() == [1]


def test_insert_matches_list_insertion_on_random_cases():
    gen = torch.Generator().manual_seed(3)
    for _ in range(30):
        B = 5
        lengths = torch.randint(0, 6, (B,), generator=gen)
        K = int(lengths.max())
        canvas = torch.randint(4, 50, (B, K), generator=gen)
        canvas = canvas.masked_fill(torch.arange(K) >= lengths.unsqueeze(1), PAD)
        S = K + 1
        toks = torch.randint(50, 99, (B, S), generator=gen)
        mask = (torch.rand(B, S, generator=gen) < 0.5) & L.slot_mask(TORCH, lengths, S)
        out, new = insert(TORCH, canvas, lengths, toks, mask, PAD)
        for b in range(B):
            ref = []
            for slot in range(int(lengths[b]) + 1):
                if mask[b, slot]:
                    ref.append(int(toks[b, slot]))
                if slot < lengths[b]:
                    ref.append(int(canvas[b, slot]))
            assert out[b, : new[b]].tolist() == ref
            assert (out[b, new[b]:] == PAD).all()


# ---------------------------------------------------------------- loss reference
def reference_loss(content_lp, location_lp, y, keep, order, termination, tau, eps):
    """One example, straight from the paper's formulas, with Python lists.

    content_lp: (S, V) log p(c | l); location_lp: (S,) log p(l); y: list of
    target tokens; keep: list of bools. Returns (loss, nll) as floats.
    """
    V = content_lp.size(1)

    def logp(c, slot):  # log p(c, l)
        return float(content_lp[slot, c] + location_lp[slot])

    def smooth(slot):  # -(1/V) sum_c log p(c, l)
        return -sum(logp(c, slot) for c in range(V)) / V

    n = len(y)
    kept = [i for i in range(n) if keep[i]]
    k = len(kept)
    if order == "left_to_right":
        nxt = y[k] if k < n else EOS
        nll = -logp(nxt, k)
        return (1 - eps) * nll + eps * smooth(k), nll
    bounds = [-1] + kept + [n]
    slot_nlls, slot_smooths = [], []
    for slot in range(k + 1):
        i_l, j_l = bounds[slot] + 1, bounds[slot + 1] - 1
        span = list(range(i_l, j_l + 1))
        if not span:
            if termination == "sequence" and k < n:
                continue  # undefined for empty spans: excluded
            slot_nlls.append(-logp(EOS, slot))
        else:
            if order == "uniform":
                w = [1 / len(span)] * len(span)
            else:
                d = [abs((i_l + j_l) / 2 - i) for i in span]
                z = sum(math.exp(-di / tau) for di in d)
                w = [math.exp(-di / tau) / z for di in d]
            slot_nlls.append(sum(-logp(y[i], slot) * wi for i, wi in zip(span, w)))
        slot_smooths.append(smooth(slot))
    nll = sum(slot_nlls) / len(slot_nlls)
    return (1 - eps) * nll + eps * sum(slot_smooths) / len(slot_smooths), nll


@pytest.mark.parametrize("order", C.ORDERS)
@pytest.mark.parametrize("termination", C.TERMINATIONS)
@pytest.mark.parametrize("seed", range(4))
def test_vectorised_loss_matches_reference(order, termination, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    V = 13
    target, lengths = random_batch(gen, B=8, max_n=10, V=V)
    keep = C.sample_canvas(lengths, target.size(1), order, generator=gen)
    if seed == 0:  # include complete and empty canvases explicitly
        keep[0] = torch.arange(target.size(1)) < lengths[0]
        keep[1] = False
    k = keep.sum(1)
    S = int(k.max()) + 1 + seed  # extra padding slots must not matter
    sm = L.slot_mask(TORCH, k, S)
    logits = torch.randn(target.size(0), S, V, generator=gen, dtype=torch.float64) * 2
    content = logits.log_softmax(-1)
    loc_logits = torch.randn(target.size(0), S, generator=gen, dtype=torch.float64)
    location = loc_logits.masked_fill(~sm, float("-inf")).log_softmax(-1)
    tau = [0.5, 1.0, 2.0, 3.3][seed]
    eps = [0.0, 0.1, 0.0, 0.2][seed]
    loss, nll = C.insertion_loss(content, location, target, lengths, keep, order, termination, EOS, tau, eps)
    assert torch.isfinite(loss).all()
    for b in range(target.size(0)):
        n = int(lengths[b])
        ref_loss, ref_nll = reference_loss(content[b], location[b], target[b, :n].tolist(),
                                           keep[b, :n].tolist(), order, termination, tau, eps)
        assert abs(float(nll[b]) - ref_nll) < 1e-5, (b, float(nll[b]), ref_nll)
        assert abs(float(loss[b]) - ref_loss) < 1e-5, (b, float(loss[b]), ref_loss)


def test_loss_gradient_is_finite_with_padded_slots():
    gen = torch.Generator().manual_seed(7)
    target, lengths = random_batch(gen, B=4, V=9)
    keep = C.sample_canvas(lengths, target.size(1), "binary_tree", generator=gen)
    k = keep.sum(1)
    S = int(k.max()) + 3
    logits = torch.randn(4, S, 9, requires_grad=True)
    loc = torch.randn(4, S, requires_grad=True)
    location = loc.masked_fill(~L.slot_mask(TORCH, k, S), float("-inf")).log_softmax(-1)
    loss, _ = C.insertion_loss(logits.log_softmax(-1), location, target, lengths, keep,
                               "binary_tree", "slot", EOS, 1.0, 0.1)
    loss.sum().backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(loc.grad).all()


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="order"):
        C.sample_canvas(torch.tensor([3]), 3, "random")
    with pytest.raises(ValueError, match="tau"):
        C.slot_weights(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), "binary_tree", 0.0)


def test_tree_canvases_are_the_states_of_a_perfect_parallel_decode():
    """Levels < d of tree_levels = the canvas after d iterations of the forced binary-tree decode
    (the decoder's own history on a model that forces the target)."""
    from fairseq_insertion.generator import InsertionGenerator
    from tests.test_decoding import OracleModel, batch_for, make_dict, random_targets

    d = make_dict()
    lengths = [1, 2, 3, 4, 5, 7, 8, 12, 16, 21, 33]
    targets = random_targets(d, lengths, seed=7)
    gen = InsertionGenerator(d, retain_history=True, max_len_a=0, max_len_b=200)
    hypos = gen.generate([OracleModel(d, targets)], batch_for(d, targets))
    levels = C.tree_levels(torch.tensor(lengths), max(lengths))
    for b, (y, [h]) in enumerate(zip(targets, hypos)):
        states = [e["tokens"][:-1].tolist() for e in h["history"]]
        assert len(states) == int(levels[b, : len(y)].max()) + 1 == math.floor(math.log2(len(y))) + 1
        for depth, state in enumerate(states, start=1):
            assert state == [t for t, lv in zip(y, levels[b].tolist()) if lv < depth]


def test_sample_tree_canvas_draws_every_depth():
    lengths = torch.full((400,), 12)
    levels = C.tree_levels(lengths, 12)
    keep = C.sample_tree_canvas(lengths, 12, generator=torch.Generator().manual_seed(0))
    depths = set()
    for row, lv in zip(keep, levels):
        k = int(row.sum())
        depth = next(dd for dd in range(5) if int((lv < dd).sum()) == k)
        assert torch.equal(row, lv < depth)  # a tree state, not just any subset of that size
        depths.add(depth)
    assert depths == {0, 1, 2, 3, 4}  # floor(log2 12) + 1 = 4 levels; depth 4 is the whole target
