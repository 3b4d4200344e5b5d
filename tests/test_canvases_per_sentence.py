"""``--canvases-per-sentence K``: K canvases per sentence, one encoder pass, the
loss of a sentence the mean over its canvases."""

import pytest
import torch

from fairseq_insertion import canvas as C
from fairseq_insertion import criterion as criterion_module
from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH
from tests.test_canvas import reference_loss
from tests.utils import build_task, reverse_data

B = 6  # sentences in the test batch


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return reverse_data(tmp_path_factory, "kcanvas", 40, 8, 8)


def setup(data, tmp_path, *flags):
    task, args = build_task(data / "bin", "--save-dir", tmp_path, *flags)
    task.load_dataset("train")
    torch.manual_seed(0)
    model, criterion = task.build_model(args).eval(), task.build_criterion(args)
    ds = task.dataset("train")
    sample = ds.collater([ds[i] for i in range(B)])
    return task, model, criterion, sample


class Rows:
    """A (S, V) tensor as nested lists for :func:`reference_loss` (tensor indexing per element is slow)."""

    def __init__(self, t: torch.Tensor):
        self.rows, self.shape = t.double().tolist(), t.shape

    def size(self, dim: int) -> int:
        return self.shape[dim]

    def __getitem__(self, index):
        return self.rows[index[0]][index[1]] if isinstance(index, tuple) else self.rows[index]


def old_forward(criterion, model, sample):
    """The criterion's K = 1 computation as it was before --canvases-per-sentence: per-sentence (loss, nll)."""
    target = sample["target"]
    lengths = target.ne(criterion.pad).sum(1) - target.eq(criterion.eos).any(1).long()
    N = target.size(1)
    y = target.masked_fill(~(torch.arange(N).unsqueeze(0) < lengths.unsqueeze(1)), criterion.pad)
    keep = C.sample_canvas(lengths, N, criterion.order)
    canvas, k = L.gather_canvas(TORCH, y, keep, criterion.pad)
    framed = L.frame(TORCH, canvas, k, criterion.bos, criterion.eos, criterion.pad)
    net_output = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], framed)
    content_lp, location_lp = model.slot_log_probs(net_output, framed)
    return C.insertion_loss(content_lp, location_lp, y, lengths, keep, criterion.order, criterion.termination,
                            criterion.eos, criterion.tau, criterion.eps)


@pytest.mark.parametrize("order", ["binary_tree", "left_to_right"])
def test_one_canvas_is_the_previous_computation_bit_for_bit(data, tmp_path, order):
    _, model, criterion, sample = setup(data, tmp_path, "--order", order, "--label-smoothing", "0.1")
    assert criterion.canvases_per_sentence == 1  # the default
    torch.manual_seed(123)
    loss, sample_size, log = criterion(model, sample, reduce=False)
    torch.manual_seed(123)
    ref_loss, ref_nll = old_forward(criterion, model, sample)
    assert torch.equal(loss, ref_loss)
    assert torch.equal(log["nll_loss"], ref_nll.sum()) and sample_size == B


@pytest.mark.parametrize("order,termination", [("binary_tree", "slot"), ("uniform", "sequence"),
                                               ("left_to_right", "slot")])
def test_k_canvases_share_one_encoder_pass_and_average_the_per_canvas_losses(data, tmp_path, monkeypatch, order,
                                                                              termination):
    K = 3
    _, model, criterion, sample = setup(data, tmp_path, "--order", order, "--termination", termination,
                                        "--label-smoothing", "0.1", "--canvases-per-sentence", K)
    drawn, sample_canvas = [], C.sample_canvas

    def recording_sample_canvas(*args, **kwargs):
        keep = sample_canvas(*args, **kwargs)
        drawn.append(keep)
        return keep

    monkeypatch.setattr(criterion_module.C, "sample_canvas", recording_sample_canvas)
    calls = {"encoder": [], "decoder": []}
    model.encoder.register_forward_hook(lambda m, args, out: calls["encoder"].append(args[0].size(0)))
    model.decoder.register_forward_hook(lambda m, args, out: calls["decoder"].append(args[0].size(0)))
    torch.manual_seed(7)
    loss, sample_size, log = criterion(model, sample, reduce=False)
    assert calls == {"encoder": [B], "decoder": [K * B]}  # one encoder pass over B sentences
    assert sample_size == log["sample_size"] == log["nsentences"] == B and loss.shape == (B,)
    (keep,) = drawn
    assert keep.shape[0] == K * B

    # reference: K separate K = 1 computations (own encoder pass each) on the same canvases, scored with the
    # paper's per-example loss
    monkeypatch.undo()
    target = sample["target"]
    d = model.decoder.dictionary
    lengths = target.ne(d.pad()).sum(1) - 1  # without eos
    y = target.masked_fill(target.eq(d.eos()), d.pad())[:, : int(lengths.max())]
    ref_loss, ref_nll = torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    for j in range(K):
        keep_j = keep[j * B : (j + 1) * B, : y.size(1)]
        canvas, k = L.gather_canvas(TORCH, y, keep_j, d.pad())
        framed = L.frame(TORCH, canvas, k, d.bos(), d.eos(), d.pad())
        with torch.no_grad():
            net_output = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], framed)
            content, location = model.slot_log_probs(net_output, framed)
        for b in range(B):
            n = int(lengths[b])
            lo, nl = reference_loss(Rows(content[b]), Rows(location[b]), y[b, :n].tolist(), keep_j[b, :n].tolist(),
                                    order, termination, 1.0, 0.1)
            ref_loss[b] += lo / K
            ref_nll[b] += nl / K
    distinct = sum(len({tuple(keep[j * B + b].tolist()) for j in range(K)}) > 1 for b in range(B))
    assert distinct > 0  # the canvases of a sentence are independent draws
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log["nll_loss"].double(), ref_nll.sum(), rtol=1e-5, atol=1e-5)


def test_k_canvases_backpropagate_into_the_shared_encoder(data, tmp_path):
    _, model, criterion, sample = setup(data, tmp_path, "--canvases-per-sentence", 2)
    loss, _, _ = criterion(model.train(), sample)
    loss.backward()
    grads = [p.grad for p in model.encoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("k", [0, -2])
def test_k_below_one_is_refused(data, tmp_path, k):
    task, args = build_task(data / "bin", "--save-dir", tmp_path, "--canvases-per-sentence", k)
    with pytest.raises(ValueError, match=f"--canvases-per-sentence must be an integer >= 1, got {k}"):
        task.build_criterion(args)


def test_tree_canvas_prob_one_trains_on_tree_states_only(data, tmp_path, monkeypatch):
    """--tree-canvas-prob 1: every canvas the loss sees is a balanced-binary-tree state."""
    _, model, criterion, sample = setup(data, tmp_path, "--tree-canvas-prob", "1")
    used = []
    gather = L.gather_canvas

    def recording_gather(xp, y, keep, pad):
        used.append(keep)
        return gather(xp, y, keep, pad)

    monkeypatch.setattr(criterion_module.L, "gather_canvas", recording_gather)
    loss, _, _ = criterion(model, sample)
    assert torch.isfinite(loss)
    target = sample["target"]
    lengths = target.ne(criterion.pad).sum(1) - 1
    levels = C.tree_levels(lengths, target.size(1))
    for keep, lv in zip(used[0], levels):
        assert any(torch.equal(keep, lv < depth) for depth in range(target.size(1) + 1))
    with pytest.raises(ValueError, match="--tree-canvas-prob must be in"):
        setup(data, tmp_path, "--tree-canvas-prob", "1.5")
    with pytest.raises(ValueError, match="--tree-canvas-prob needs --order binary_tree or uniform"):
        setup(data, tmp_path, "--tree-canvas-prob", "0.5", "--order", "left_to_right")
