"""The paper's model variants ("Model Variants"): joint content-location
distribution, contextualized vocabulary bias, mixture of softmaxes, and all their
combinations."""

import itertools
import math
import re

import pytest
import torch

from fairseq_insertion import canvas as C
from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH
from tests.test_canvas import reference_loss
from tests.utils import (
    build_task,
    generate_args,
    parse_generate,
    reverse_data,
    run,
    train_args,
)

pytestmark = pytest.mark.heavy  # every variant trained through the CLIs: minutes

COMBOS = list(itertools.product([False, True], [False, True], [1, 2]))  # joint, context bias, K


def variant_flags(joint: bool, bias: bool, k: int):
    flags = ["--content-location", "joint" if joint else "factorized", "--mixture-components", str(k)]
    return flags + (["--context-bias"] if bias else [])


def combo_id(combo):
    joint, bias, k = combo
    return f"{'joint' if joint else 'factorized'}-{'bias' if bias else 'nobias'}-K{k}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return reverse_data(tmp_path_factory, "variants", 200, 16, 11)


def build(data, *flags):
    task, args = build_task(data / "bin", *flags)
    torch.manual_seed(0)
    return task, task.build_model(args).eval()


def random_framed(task, B=5, seed=0):
    """A batch of framed canvases of different lengths (so with padding slots)."""
    g = torch.Generator().manual_seed(seed)
    d = task.target_dictionary
    lengths = torch.tensor([0, 1, 4, 7, 2][:B])
    K = int(lengths.max())
    canvas = torch.randint(d.nspecial, len(d), (B, K), generator=g)
    canvas = canvas.masked_fill(torch.arange(K) >= lengths.unsqueeze(1), d.pad())
    src = torch.randint(d.nspecial, len(d), (B, 6), generator=g)
    src[:, -1] = d.eos()
    return src, L.frame(TORCH, canvas, lengths, d.bos(), d.eos(), d.pad()), lengths


def reference_joint_log_probs(model, H, real, joint, bias, k):
    """log p(c, l) for one example straight from the paper's definitions, slot by slot.

    H: (S, h) slot states; real: (S,) bool. Padding slots get -inf.
    """
    head = model.decoder.head
    W = model.decoder.output_projection.weight  # (V, h)
    S, h = H.shape
    b = torch.zeros(W.size(0), dtype=torch.float64)
    if bias:
        g = torch.stack([H[slot] for slot in range(S) if real[slot]]).max(0).values  # maxpool over real slots
        b = (head.context_bias.weight.double() @ g.double())  # g V
    scores = []  # per real slot: unnormalised log-score over content (joint) or log p(c | l) (factorized)
    for slot in range(S):
        hl = H[slot].double()
        if k == 1:
            z = W.double() @ hl + b
            scores.append(z if joint else z.log_softmax(0))
        else:
            P = head.mixture_latent.weight.double().view(k, h, h)
            Pb = head.mixture_latent.bias.double().view(k, h)
            pi = (head.mixture_prior.weight.double() @ hl).softmax(0)
            comps = [W.double() @ torch.tanh(P[i] @ hl + Pb[i]) + b for i in range(k)]
            if joint:
                scores.append(torch.log(sum(pi[i] * comps[i].exp() for i in range(k))))
            else:
                scores.append(torch.log(sum(pi[i] * comps[i].softmax(0) for i in range(k))))
    out = torch.full((S, W.size(0)), float("-inf"), dtype=torch.float64)
    idx = [slot for slot in range(S) if real[slot]]
    if joint:
        flat = torch.stack([scores[slot] for slot in idx]).flatten().log_softmax(0).view(len(idx), -1)
        out[idx] = flat
    else:
        loc = torch.stack([H[slot].double() @ head.location_query.double() for slot in idx]).log_softmax(0)
        out[idx] = torch.stack([scores[slot] + loc[j] for j, slot in enumerate(idx)])
    return out


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_distributions_are_normalised_and_match_the_definitions(data, combo):
    joint, bias, k = combo
    task, model = build(data, *variant_flags(*combo))
    src, framed, lengths = random_framed(task)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((src.size(0),), src.size(1)))
        content_lp, location_lp = model.slot_log_probs(model.decoder(framed, encoder_out=enc), framed)
        H = model.decoder.slot_states(framed, enc)
    real = L.slot_mask(TORCH, lengths, content_lp.size(1))
    joint_p = (content_lp + location_lp.unsqueeze(-1)).exp()  # (B, S, V)
    assert torch.allclose(joint_p.sum((1, 2)), torch.ones(len(lengths)), atol=1e-5)  # over (c, l) of real slots
    assert (joint_p[~real] == 0).all()  # padding slots get no mass
    assert torch.allclose(location_lp.exp().sum(-1), torch.ones(len(lengths)), atol=1e-5)
    assert torch.allclose(content_lp.exp().sum(-1)[real], torch.ones(int(real.sum())), atol=1e-5)
    assert (content_lp <= 1e-6).all()
    for b in range(len(lengths)):
        ref = reference_joint_log_probs(model, H[b], real[b], joint, bias, k)
        got = (content_lp[b] + location_lp[b].unsqueeze(-1)).double()
        assert torch.allclose(got[real[b]], ref[real[b]], atol=1e-4), (combo, b)


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
@pytest.mark.parametrize("order", C.ORDERS)
def test_variant_loss_matches_the_reference(data, combo, order):
    joint, bias, k = combo
    task, model = build(data, *variant_flags(*combo))
    d = task.target_dictionary
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([0, 3, 6, 9])
    N = int(lengths.max())
    target = torch.randint(d.nspecial, len(d), (4, N), generator=g)
    target = target.masked_fill(torch.arange(N) >= lengths.unsqueeze(1), d.pad())
    keep = C.sample_canvas(lengths, N, order, generator=g)
    canvas, kk = L.gather_canvas(TORCH, target, keep, d.pad())
    framed = L.frame(TORCH, canvas, kk, d.bos(), d.eos(), d.pad())
    src = torch.randint(d.nspecial, len(d), (4, 5), generator=g)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((4,), 5))
        content_lp, location_lp = model.slot_log_probs(model.decoder(framed, encoder_out=enc), framed)
        H = model.decoder.slot_states(framed, enc)
    for termination in C.TERMINATIONS:
        _, nll = C.insertion_loss(content_lp, location_lp, target, lengths, keep, order, termination, d.eos(), 1.0)
        for b in range(4):
            real = L.slot_mask(TORCH, kk[b:b + 1], H.size(1))[0]
            ref = reference_joint_log_probs(model, H[b], real, joint, bias, k)  # log p(c, l)
            loc = ref.logsumexp(-1)
            content = torch.where(real.unsqueeze(-1), ref - loc.unsqueeze(-1), torch.zeros_like(ref))
            n = int(lengths[b])
            _, ref_nll = reference_loss(content, loc, target[b, :n].tolist(), keep[b, :n].tolist(), order,
                                        termination, 1.0, 0.0)
            assert abs(float(nll[b]) - ref_nll) < 1e-4, (combo, order, termination, b)


def test_parameter_counts_differ_by_the_expected_extras(data):
    counts = {}
    for combo in COMBOS:
        task, model = build(data, *variant_flags(*combo))
        counts[combo] = sum(p.numel() for p in model.parameters())
    h, V = 64, len(task.target_dictionary)
    base = counts[(False, False, 1)]
    for (joint, bias, k), n in counts.items():
        extra = (-h if joint else 0) + (h * V if bias else 0) + ((k * h * h + k * h + k * h) if k > 1 else 0)
        assert n - base == extra, ((joint, bias, k), n - base, extra)


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_every_combination_trains_reloads_and_decodes_through_the_clis(data, combo, tmp_path):
    proc = run(train_args(data / "bin", tmp_path / "ckpt", *variant_flags(*combo), "--order", "uniform",
                          "--max-update", "3", "--no-epoch-checkpoints"))
    losses = [float(x) for x in re.findall(r"\| train \| .*? loss ([\d.]+)", proc.stdout + proc.stderr)]
    assert losses and all(math.isfinite(x) for x in losses)
    for decoding in ("greedy", "parallel"):
        out = run(generate_args(data / "bin", tmp_path / "ckpt" / "checkpoint_last.pt", "--decoding", decoding,
                                "--batch-size", "4", "--max-len-b", "30"))
        assert sorted(map(int, parse_generate(out.stdout, "H"))) == list(range(11))
