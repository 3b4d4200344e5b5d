"""The cached decoder (``--cached-decoder``, fairseq_insertion.pass_decoder) on tiny models: its training forward
(the whole target under the pass mask) against fairseq's own decoder layers run token by token with the same mask;
each decoding pass over the fresh tokens alone against that forward; the loss over real slots against the dense
loss; the generator's cached decode against a decode that re-runs every canvas whole under the pass mask; the CLIs;
and what it refuses."""

import copy
import re
from typing import Any, List, Optional

import pytest
import torch

from fairseq_insertion import canvas as C
from fairseq_insertion import loop as L
from fairseq_insertion import pass_decoder as PD
from fairseq_insertion import slots as S
from fairseq_insertion.config import RUNTIME_OPTIONS, DecodingConfig, DecodingError
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.export.files import export_model, load
from fairseq_insertion.generator import InsertionGenerator, ModelBackend
from fairseq_insertion.runtime import Translator
from tests.test_fast_decoder import build as build_model
from tests.utils import (
    canvas_positions_one_by_one,
    generate_args,
    parse_generate,
    random_source_batch,
    reverse_data,
    run,
    train_args,
    train_once,
)

PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before", "--layernorm-embedding")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return reverse_data(tmp_path_factory, "cached_decoder", 400, 16, 12) / "bin"


def build(data, *flags):
    """A tiny cached-decoder model in eval mode (its layer norms away from the identity) and its dictionary."""
    return build_model(data, "--cached-decoder", *flags)


def targets(d, lengths: List[int], seed: int = 0):
    """Random targets (B, N) without eos, padded, and their lengths (B,)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.tensor(lengths)
    N = max(lengths)
    y = torch.randint(d.nspecial, len(d), (len(lengths), N), generator=g)
    return y.masked_fill(torch.arange(N) >= n.unsqueeze(1), d.pad()), n


def canvas_states(decoder, framed, levels, enc):
    """The final states (A, T + 2, C) of framed canvases (A, T + 2) whose tokens were inserted by the passes
    ``levels`` (A, T + 2) (bos and eos -1, padding T + 1), computed whole: the cached layers under the pass mask,
    the recomputed ones over the canvas."""
    real = framed.ne(decoder.padding_idx)
    states = PD.trajectory_states(decoder, framed, levels, real.sum(1) - 2, enc)
    return PD.recomputed(decoder, states, real, enc)


def reference_states(model, src, y, n) -> List[torch.Tensor]:
    """Each sentence's final states of its framed target, computed alone by fairseq's decoder layers with an additive
    pass mask (none in the top ``--recomputed-layers``), the positions built token by token in Python: (n + 2, C)
    each."""
    dec, d = model.decoder, model.decoder.dictionary
    out = []
    for b in range(len(n)):
        length = int(n[b])
        tokens = [d.bos(), *y[b, :length].tolist(), d.eos()]
        levels = [-1, *C.tree_levels(n[b:b + 1], length)[0].tolist(), -1]
        pos: List[Optional[torch.Tensor]] = [dec.fractional.ends[0], *([None] * length), dec.fractional.ends[1]]
        for level in range(max(levels) + 1):
            for i in range(1, length + 1):
                if levels[i] == level:  # its neighbours: the nearest earlier-level tokens on either side
                    left = max(j for j in range(i) if levels[j] < level)
                    right = min(j for j in range(i + 1, length + 2) if levels[j] < level)
                    pos[i] = dec.fractional.between(pos[left], pos[right])
        x = dec.embed_scale * dec.embed_tokens(torch.tensor([tokens])) + torch.stack(pos).unsqueeze(0)
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        x = x.transpose(0, 1)  # (T, 1, C)
        mask = torch.tensor([[0.0 if levels[j] <= levels[i] else float("-inf") for j in range(length + 2)]
                             for i in range(length + 2)])
        enc = model.encoder(src["src_tokens"][b:b + 1], src_lengths=src["src_lengths"][b:b + 1])
        for i, layer in enumerate(dec.layers):
            top = i >= len(dec.layers) - dec.recomputed
            x, _, _ = layer(x, enc["encoder_out"][0], enc["encoder_padding_mask"][0],
                            self_attn_mask=None if top else mask)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        out.append(x[:, 0])
    return out


RECOMPUTED = ("--recomputed-layers", "1")
SETTINGS = pytest.mark.parametrize("flags", [(), PRE_NORM, RECOMPUTED, ("--recomputed-layers", "2", *PRE_NORM)],
                                   ids=["post-norm", "pre-norm", "top-layer-recomputed", "all-recomputed-pre-norm"])


@SETTINGS
def test_pass_mask_forward_matches_fairseq_layers(data, flags):
    model, d = build(data, *flags)
    src = random_source_batch(d, [5, 3, 8, 2])["net_input"]
    y, n = targets(d, [7, 1, 12, 0])
    with torch.no_grad():
        framed = L.frame(TORCH, y, n, d.bos(), d.eos(), d.pad())
        enc = model.encoder(src["src_tokens"], src_lengths=src["src_lengths"])
        states = canvas_states(model.decoder, framed, PD.framed_levels(n, y.size(1)),
                                  PD.encoder_side(model.decoder, enc))
        expected = reference_states(model, src, y, n)
    for b, ref in enumerate(expected):
        assert ref.abs().sum() > 0
        torch.testing.assert_close(states[b, :int(n[b]) + 2], ref, atol=2e-5, rtol=1e-4)


def canvas_at(y, n, levels, t: int, d):
    """The framed canvases before pass t (the levels below t) and their fresh columns (level t - 1)."""
    tok = levels[:, 1:-1]
    keep = (tok < t) & (torch.arange(y.size(1)) < n.unsqueeze(1))
    canvas, k = L.gather_canvas(TORCH, y, keep, d.pad())
    fresh, _ = L.gather_canvas(TORCH, (tok == t - 1).long(), keep, 0)
    return L.frame(TORCH, canvas, k, d.bos(), d.eos(), d.pad()), L.frame(TORCH, fresh, k, 0, 0, 0) == 1, k


@SETTINGS
@pytest.mark.parametrize("trajectory", PD.TRAJECTORIES)
def test_cached_passes_give_the_pass_mask_scores(data, flags, trajectory):
    """Pass t of a cached decode over the tree's canvases scores every slot as the training forward's row of that pass
    does (content and log p(l)), the cache holding only what earlier passes inserted."""
    model, d = build(data, *flags)
    src = random_source_batch(d, [5, 3, 8])["net_input"]
    y, n = targets(d, [7, 1, 12], seed=1)
    torch.manual_seed(4)
    levels = PD.framed_levels(n, y.size(1), trajectory)
    depth = levels[:, 1:-1].masked_fill(levels[:, 1:-1] > y.size(1), -1).amax(1) + 1  # (B,) passes less the last
    with torch.no_grad():
        out = model(src["src_tokens"], src["src_lengths"], L.frame(TORCH, y, n, d.bos(), d.eos(), d.pad()),
                    levels=levels, target_lengths=n)
        cache = model.decoding_cache(model.encoder(src["src_tokens"], src_lengths=src["src_lengths"]))
        rows = out.slots.real.flatten().long().cumsum(0).view(out.slots.real.shape) - 1  # (R, S) content row
        compared = 0
        for t in range(int(depth.max()) + 1):
            framed, fresh, k = canvas_at(y, n, levels, t, d)
            select = L.slot_mask(TORCH, k, framed.size(1) - 1)
            p = model.decode_slots(framed, cache, select, None, fresh)
            assert p.cache.real.sum(1).tolist() == (k + 2).tolist()  # bos, eos and the canvas, nothing more
            cache = p.cache
            first = select.sum(1).cumsum(0) - select.sum(1)  # (B,) each sentence's first content row
            for b in range(len(n)):
                r = ((out.slots.sentence == b).cumsum(0) == t + 1) & (out.slots.sentence == b)
                if not r.any():
                    continue
                r, S = int(r.nonzero()[0, 0]), int(k[b]) + 1
                torch.testing.assert_close(p.location[b, :S], out.location[r, :S].float().log_softmax(-1),
                                           atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(p.content[first[b]:first[b] + S], out.content[rows[r, :S]],
                                           atol=1e-5, rtol=1e-5)
                compared += 1
    assert compared == int((depth + 1).sum())
    if trajectory == "balanced":
        assert depth.tolist() == C.log2_bound(n).tolist()


def test_sampled_levels_are_a_parallel_order():
    """Each pass of a sampled order inserts exactly one token into every span still missing some; the centre is the
    likeliest first token."""
    g = torch.Generator().manual_seed(5)
    n = torch.tensor([9] * 300 + [1, 0, 2, 16])
    N = 16
    levels = C.sample_tree_levels(n, N, 1.0, g)
    real = torch.arange(N).unsqueeze(0) < n.unsqueeze(1)
    assert bool((levels[real] < N).all()) and bool((levels[~real] == N).all())
    for d in range(int(levels[real].max()) + 1):
        keep = real & (levels < d)
        slot, _, _ = C.slot_spans(keep, n)
        missing = real & ~keep
        spans = torch.zeros(len(n), N + 1).scatter_add_(1, slot, missing.float()) > 0  # (B, N + 1) nonempty spans
        inserted = torch.zeros(len(n), N + 1).scatter_add_(1, slot, (missing & (levels == d)).float())
        assert torch.equal(inserted, spans.float()), d
    roots = (levels[:300] == 0).float().argmax(1).bincount(minlength=9)
    assert int(roots.argmax()) == 4 and int(roots[4]) < 300  # the centre most often, not always


def test_trajectory_rows_are_the_tree_passes():
    n = torch.tensor([7, 0, 2])
    levels = PD.framed_levels(n, 7)
    slots = PD.trajectory_slots(levels, n)
    assert slots.sentence.tolist() == [0, 0, 0, 0, 1, 2, 2, 2]
    assert slots.keep.long().sum(1).tolist() == [0, 1, 3, 7, 0, 0, 1, 2]
    assert slots.real.sum(1).tolist() == [1, 2, 4, 8, 1, 1, 2, 3]
    # the canvas of sentence 0 before pass 2: its tree's levels 0 and 1 (target positions 1, 3, 5)
    assert slots.keep[2, :7].nonzero().flatten().tolist() == [1, 3, 5]
    assert slots.left[2, :4].tolist() == [0, 2, 4, 6]  # bos, then framed columns of y_1, y_3, y_5


@pytest.mark.parametrize("termination,eps", [("slot", 0.0), ("slot", 0.1), ("sequence", 0.1)])
@pytest.mark.parametrize("order", ["binary_tree", "uniform"])
def test_flat_loss_equals_the_dense_loss(termination, eps, order):
    g = torch.Generator().manual_seed(3)
    n = torch.tensor([6, 3, 0, 9])
    N, V = 9, 11
    keep = C.sample_canvas(n, N, "uniform", generator=g)
    y = torch.randint(4, V, (4, N), generator=g)
    k = keep.sum(1)
    S = int(k.max()) + 1
    real = L.slot_mask(TORCH, k, S)
    dense = torch.randn(4, S, V, generator=g).log_softmax(-1)
    location = torch.randn(4, S, generator=g).masked_fill(~real, float("-inf")).log_softmax(-1)
    expected = C.insertion_loss(dense, location, y, n, keep, order, termination, 2, 1.0, eps)
    got = C.flat_insertion_loss(dense[real], real, location, y, n, keep, order, termination, 2, 1.0, eps)
    assert expected[0].abs().sum() > 0
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


class Recompute(ModelBackend):
    """The cached model decoded without its cache: every pass runs the whole canvas under the pass mask, the passes
    that inserted its tokens followed in the memory (the encoder side, each column's pass, the pass count)."""

    @staticmethod
    def start(memory: Any):
        if isinstance(memory, PD.PassCache):  # the model's own cache: keep its encoder side, bos and eos at -1
            return memory.encoder, torch.full_like(memory.index, -1), 0
        return memory

    def score_slots(self, memory: Any, framed, open_, inputs, k: int, fresh=None) -> L.SlotChoice:
        enc, before, t = self.start(memory)
        fresh = framed.eq(-1) if fresh is None else fresh
        real = framed.ne(self.pad)
        width = framed.size(1) - 1  # the pad level of these canvases
        levels = torch.full_like(framed, width).masked_scatter(real & ~fresh, before[before.ge(-1)])
        levels = torch.where(fresh, torch.full_like(framed, t), levels)
        decoder = self.model.decoder
        states = canvas_states(decoder, framed, levels, enc)
        H = decoder.pair_slots(states)  # (A, S, C)
        content, location = decoder.head(H, real[:, 1:], decoder.output_layer, open_)
        location = location.masked_fill(~real[:, 1:], float("-inf")).log_softmax(-1)
        return L.SlotChoice(*S.choose(self.slot_rule, content, inputs, k), location,
                            memory=(enc, levels.masked_fill(~real, -9), t + 1))

    def reorder(self, memory: Any, keep):
        enc, levels, t = self.start(memory)
        return enc.select(keep), levels.index_select(0, keep), t


class RecomputeGenerator(InsertionGenerator):
    def backend(self, model, src_tokens, src_lengths):
        return Recompute(**vars(super().backend(model, src_tokens, src_lengths)))


def train(data, tmp_path_factory, *flags):
    save = tmp_path_factory.mktemp("cached_ckpt")
    cmd = train_args(data, save, "--cached-decoder", "--max-update", "60", "--disable-validation",
                     "--no-epoch-checkpoints", *flags)
    return train_once(cmd, data, save) / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    return train(data, tmp_path_factory)


@pytest.fixture(scope="module")
def trained_recomputed(data, tmp_path_factory):
    return train(data, tmp_path_factory, *RECOMPUTED)


def decode(generator, model, src, max_len_b: int = 6):
    sample = {"net_input": src, "id": torch.arange(len(src["src_lengths"]))}
    generator.config = generator.config.replace(max_len_a=0.0, max_len_b=max_len_b)
    return generator.generate([model], sample)


@pytest.mark.parametrize("options", [
    dict(decoding="parallel"), dict(decoding="parallel", eos_penalty=1.5, block_neighbour_copies=True),
    dict(decoding="greedy"), dict(decoding="parallel", eos_penalties=(0.0, 2.0), first_insertions=2),
], ids=["parallel", "parallel-beta-rules", "greedy", "candidates-first-insertions"])
def test_cached_decode_equals_recomputing_every_canvas(trained, data, options):
    model, task = load(trained, data)
    d = task.target_dictionary
    src = random_source_batch(d, [4, 9, 2, 12, 6, 7])["net_input"]
    cached = decode(InsertionGenerator(d, **options), model, src, 14)
    whole = decode(RecomputeGenerator(d, **options), copy.deepcopy(model), src, 14)
    assert sum(len(h[0]["tokens"]) for h in cached) > len(cached)  # more than the end alone
    for a, b in zip(cached, whole):
        assert len(a) == len(b)
        for x, z in zip(a, b):
            assert x["tokens"].tolist() == z["tokens"].tolist()
            assert x["steps"] == z["steps"]
            torch.testing.assert_close(x["positional_scores"], z["positional_scores"], atol=1e-4, rtol=1e-4)


def test_cached_decode_with_the_top_layer_recomputed(trained_recomputed, data):
    test_cached_decode_equals_recomputing_every_canvas(trained_recomputed, data, dict(
        decoding="parallel", eos_penalties=(0.0, 2.0), first_insertions=2, block_neighbour_copies=True))


def test_cli_and_hub_decode_counting_positions(trained, data):
    """fairseq-generate decodes the cached model, each token run once, and the hub gives the same translations."""
    proc = run(generate_args(data, trained, "--decoding", "parallel", "--batch-size", "5", "--print-step"))
    hyps, sources = parse_generate(proc.stdout, "H"), parse_generate(proc.stdout, "S")
    assert len(hyps) == 12 and any(h[1] for h in hyps.values())
    found = re.search(r"decoder positions per output token ([0-9.]+)", proc.stderr + proc.stdout)
    assert found, proc.stderr[-2000:]
    tokens = sum(len(h[1].split()) for h in hyps.values())
    # bos and eos once a sentence, then each token once (the end itself runs nothing)
    assert float(found.group(1)) == pytest.approx((tokens + 2 * 12) / tokens, abs=0.01)
    canvas = re.search(r"decoder positions per output token [0-9.]+ \(framed canvases ([0-9.]+)\)", proc.stderr)
    assert canvas and float(canvas.group(1)) > float(found.group(1)), proc.stderr[-2000:]
    from fairseq_insertion.model import InsertionTransformerModel

    hub = InsertionTransformerModel.from_pretrained(str(trained.parent), checkpoint_file=trained.name,
                                                    data_name_or_path=str(data), decoding="parallel")
    ids = sorted(hyps, key=int)
    assert hub.translate([sources[i][0] for i in ids]) == [hyps[i][1] for i in ids]


@pytest.fixture(scope="module")
def exported(trained, trained_recomputed, data, tmp_path_factory):
    """{fixture name: (model, task with its test split, the export's directory)} of both cached models."""
    out = {}
    for name, checkpoint in (("trained", trained), ("trained_recomputed", trained_recomputed)):
        model, task = load(checkpoint, data)
        task.load_dataset("test")
        out[name] = model, task, export_model(model, task.source_dictionary, task.target_dictionary,
                                              tmp_path_factory.mktemp(f"cached_export_{name}"))
    return out


RUNTIME_CONFIGS = {"parallel": dict(decoding="parallel", eos_penalty=0.5), "greedy": dict(decoding="greedy"),
                   "candidates": dict(decoding="parallel", eos_penalties=(0.0, 2.0), first_insertions=2,
                                      block_neighbour_copies=True)}


@pytest.mark.parametrize("which", ["trained", "trained_recomputed"])
@pytest.mark.parametrize("config", sorted(RUNTIME_CONFIGS))
@pytest.mark.parametrize("batch", [1, 8, 12])
def test_runtime_gives_the_generators_hypotheses(exported, which, config, batch):
    """The export (the encoder starting the cache, the pass taking and returning it) on onnxruntime decodes as the
    generator does, hypothesis for hypothesis and score for score, at batch 1, 8 and the whole test split."""
    model, task, out = exported[which]
    cfg = DecodingConfig(**RUNTIME_CONFIGS[config])
    ds, gen = task.dataset("test"), InsertionGenerator(task.target_dictionary, cfg)
    expected = {}
    for start in range(0, len(ds), batch):
        sample = ds.collater([ds[i] for i in range(start, min(start + batch, len(ds)))])
        for i, hypos in zip(sample["id"].tolist(), gen.generate([model], sample)):
            expected[i] = hypos[0]["tokens"][:-1].tolist(), float(hypos[0]["score"])
    translator = Translator(out, intra_threads=1)
    assert translator.cached_layers == len(PD.cached_layers(model.decoder))
    opts = translator.options(**{k: getattr(cfg, k) for k in RUNTIME_OPTIONS})
    got = translator.translate_ids([ds[i]["source"].numpy() for i in range(len(ds))], batch, opts)
    assert [c.ids.tolist() for c, *_ in got] == [expected[i][0] for i in range(len(ds))]
    assert any(len(expected[i][0]) > 1 for i in range(len(ds)))  # a second pass read the cache
    torch.testing.assert_close(torch.tensor([c.score for c, *_ in got]),
                               torch.tensor([expected[i][1] for i in range(len(ds))]), atol=1e-4, rtol=1e-4)
    assert translator.stats["positions"] == gen.stats["positions"]  # each token run once, on both


@pytest.mark.parametrize("which", ["trained", "trained_recomputed"])
def test_stats_count_fresh_tokens_and_the_framed_canvases_apart(exported, which):
    """The cached decoder's decoder positions are its fresh tokens (fewer); its framed canvas positions (what a
    recomputed layer reads) are what each sentence's history gives, as for a plain decoder."""
    model, task, out = exported[which]
    translator = Translator(out, intra_threads=1)
    ds = task.dataset("test")
    expected = canvas_positions_one_by_one(translator, [ds[i]["source"].numpy() for i in range(len(ds))],
                                           translator.options(max_iterations=4))
    assert translator.stats["canvas"] == expected > translator.stats["positions"] > 0


@pytest.mark.parametrize("scheme", ["per-row", "dynamic"])
def test_int8_exports_decode_as_fp32_mostly(exported, scheme, tmp_path):
    """int8 (either scheme) quantizes the cached pass's products too; it decodes every line, mostly as fp32."""
    model, task, out = exported["trained_recomputed"]
    ds = task.dataset("test")
    ids = [ds[i]["source"].numpy() for i in range(len(ds))]
    int8 = Translator(export_model(model, task.source_dictionary, task.target_dictionary, tmp_path, int8=scheme),
                      intra_threads=1)
    fp32 = Translator(out, intra_threads=1)
    got, expected = ([c.ids.tolist() for c, *_ in t.translate_ids(ids, 5, t.options())] for t in (int8, fp32))
    assert int8.settings["model"]["precision"] != "fp32" and any(len(e) > 1 for e in expected)
    assert sum(g == e for g, e in zip(got, expected)) >= len(ids) // 2


def test_runtime_refuses_constraints(exported):
    translator = Translator(exported["trained"][2], intra_threads=1)
    with pytest.raises(DecodingError, match="constraints: a model trained with --cached-decoder"):
        translator.translate_batch([["w1"]], constraints=[[["w2"]]])


def test_refusals(trained, data, tmp_path):
    model, task = load(trained, data)
    d = task.target_dictionary
    src = random_source_batch(d, [4, 5])["net_input"]
    constraints = torch.tensor([[d.nspecial + 1, d.eos()], [d.nspecial + 2, d.eos()]])
    with pytest.raises(DecodingError, match="constraints: a model trained with --cached-decoder"):
        InsertionGenerator(d).generate([model], {"net_input": src, "id": torch.arange(2)}, constraints=constraints)
    proc = run(train_args(data, tmp_path / "l2r", "--cached-decoder", "--order", "left_to_right", "--max-update", "1",
                          "--disable-validation"), check=False)
    assert proc.returncode != 0 and "--cached-decoder trains on every pass" in proc.stderr
    with pytest.raises(ValueError, match="--cached-decoder runs plain .* train without --cross-self-attention"):
        build(data, "--cross-self-attention")
    with pytest.raises(ValueError, match="--recomputed-layers 3: takes --cached-decoder and 0 to the decoder's 2"):
        build(data, "--recomputed-layers", "3")
    with pytest.raises(ValueError, match="--recomputed-layers 1: takes --cached-decoder"):
        build_model(data, "--recomputed-layers", "1")


def test_training_on_sampled_trajectories(data, tmp_path):
    proc = run(train_args(data, tmp_path / "sampled", "--cached-decoder", "--trajectory", "sampled",
                          "--max-update", "3", "--disable-validation", "--no-epoch-checkpoints"))
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+)", proc.stdout + proc.stderr)]
    assert losses and all(0 < x < 100 for x in losses)


@pytest.fixture(scope="module")
def with_heads(trained_recomputed, data, tmp_path_factory):
    """The top-layer-recomputed model with the slot-closure head and the look-ahead closure
    (``python -m examples.train_closure``), and its task with the test split."""
    import subprocess
    import sys

    from fairseq import checkpoint_utils

    from tests.utils import REPO

    out = tmp_path_factory.mktemp("cached_heads") / "heads.pt"
    cmd = [sys.executable, "-m", "examples.train_closure", "--path", trained_recomputed, "--data", data, "--out", out,
           "--eos-penalty", "0.5", "--sentences", "300", "--threshold", "0.6", "--lookahead-threshold", "0.6",
           "--post-process", "none"]
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(out)], arg_overrides={"data": str(data)})
    task.load_dataset("test")
    return models[0].eval(), task


@pytest.mark.parametrize("options", [dict(decoding="parallel"), dict(decoding="greedy"),
                                     dict(decoding="parallel", block_neighbour_copies=True, first_insertions=2)])
@pytest.mark.parametrize("batch", [1, 12])
def test_closure_heads_on_the_cached_decoder(with_heads, options, batch, tmp_path):
    """Both closure heads trained on a cached model close slots in its cached decode, and its export on the runtime
    decodes as the generator does with them."""
    from tests.test_closure import runtime_matches_generator

    model, task = with_heads
    assert model.decoder.closure is not None and model.decoder.lookahead is not None
    config = DecodingConfig(eos_penalty=0.5, **options)
    translator = runtime_matches_generator(model, task, config, batch, tmp_path / "e")
    assert translator.cached_layers == len(PD.cached_layers(model.decoder))


def test_closure_heads_cut_the_cached_decoders_work(with_heads):
    """The closure head scores fewer vocabulary rows, the look-ahead spends fewer idle passes."""
    model, task = with_heads
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(len(ds))])
    stats = []
    heads = model.decoder.closure, model.decoder.lookahead
    try:
        for closure, lookahead in (heads, (None, None)):
            model.decoder.closure, model.decoder.lookahead = closure, lookahead
            gen = InsertionGenerator(task.target_dictionary, DecodingConfig(eos_penalty=0.5))
            with torch.no_grad():
                gen.generate([model], sample)
            stats.append(gen.stats)
    finally:
        model.decoder.closure, model.decoder.lookahead = heads
    (ahead, plain), idle = stats, lambda s: s["sentence_passes"] - s["iterations"]  # noqa: E731
    assert ahead["vocabulary_rows"] < plain["vocabulary_rows"] and idle(ahead) < idle(plain) and plain["tokens"] > 0
