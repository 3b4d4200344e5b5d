"""The cached inference path (fairseq_insertion.fast_decoder) against fairseq's own decoder:
slot states equal ``extract_features(..., full_context_alignment=True)`` on tiny models
(post-norm; pre-norm with learned positions and an embedding layer norm), for batches of
padded canvases and for one canvas; the fused projections give what the projections give one
by one, and the model rebuilds them when its weights change; layers the path does not cover
fall back to fairseq."""

import copy

import pytest
import torch

from fairseq_insertion import loop as L
from fairseq_insertion import precision as P
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.fast_decoder import cacheable, cached_slot_states, encoder_cache, fused_projections
from tests.utils import build_task, random_source_batch, reverse_data

POST_NORM = ()
PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before", "--decoder-learned-pos",
            "--layernorm-embedding")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return reverse_data(tmp_path_factory, "fast_decoder", 40, 4, 4) / "bin"


def build(data, *flags):
    task, args = build_task(data, "--share-all-embeddings", *flags)
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    with torch.no_grad():  # layer norms away from the identity, so that pre- and post-norm differ
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model, task.target_dictionary


def inputs(d, src_lengths, canvas_lengths, seed=0):
    """Encoder input (left-padded sources) and framed canvases (B, T+2), right-padded."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    src = random_source_batch(d, src_lengths)["net_input"]
    k = torch.tensor(canvas_lengths)
    canvas = torch.randint(d.nspecial, len(d), (len(canvas_lengths), max(canvas_lengths)), generator=g)
    canvas = canvas.masked_fill(torch.arange(canvas.size(1)) >= k.unsqueeze(1), d.pad())
    return src, L.frame(TORCH, canvas, k, d.bos(), d.eos(), d.pad())


def both_paths(model, src, framed):
    """(fairseq's slot states, the cached path's, the cache, real slots (B, T+1))."""
    with torch.no_grad():
        enc = model.encoder(src["src_tokens"], src_lengths=src["src_lengths"])
        cache = encoder_cache(model.decoder, enc)
        full = model.decoder.slot_states(framed, enc)  # extract_features(..., full_context_alignment=True)
        fast = cached_slot_states(model.decoder, framed, cache)
    return full, fast, cache, framed[:, 1:].ne(model.decoder.padding_idx)


@pytest.mark.parametrize("flags", [POST_NORM, PRE_NORM], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("src_lengths,canvas_lengths", [((5, 9, 2), (0, 6, 3)), ((7,), (4,))],
                         ids=["padded_batch", "one_canvas"])
def test_cached_slot_states_equal_fairseqs_decoder(data, flags, src_lengths, canvas_lengths):
    model, d = build(data, *flags)
    src, framed = inputs(d, src_lengths, canvas_lengths)
    full, fast, cache, real = both_paths(model, src, framed)
    assert cache.encoder_out is None and len(cache.keys) == len(model.decoder.layers)  # the cached path ran
    assert fast.shape == full.shape
    torch.testing.assert_close(fast[real], full[real], atol=1e-5, rtol=1e-5)


def test_the_comparison_sees_the_cached_keys(data):
    """Encoder-attention keys changed after the cache was built: the cached path keeps the old ones,
    and the comparison above would fail."""
    model, d = build(data)
    src, framed = inputs(d, (5, 9, 2), (0, 6, 3))
    with torch.no_grad():
        enc = model.encoder(src["src_tokens"], src_lengths=src["src_lengths"])
        cache = encoder_cache(model.decoder, enc)
        model.decoder.layers[0].encoder_attn.k_proj.weight.mul_(3.0)
        full = model.decoder.slot_states(framed, enc)
        fast = cached_slot_states(model.decoder, framed, cache)
    real = framed[:, 1:].ne(d.pad())
    assert not torch.allclose(fast[real], full[real], atol=1e-3)


def test_decoding_pass_equals_the_training_forward(data):
    """The model's decode_slots (cached path, selected slots, reordered cache) against its forward
    and slot_log_probs on the same canvases."""
    model, d = build(data, *PRE_NORM)
    src, framed = inputs(d, (5, 9, 2), (0, 6, 3), seed=1)
    order = torch.tensor([2, 0])
    with torch.no_grad():
        content, location = model.slot_log_probs(model(src["src_tokens"], src["src_lengths"], framed), framed)
        cache = model.decoding_cache(model.encoder(src["src_tokens"], src_lengths=src["src_lengths"]))
        kept = framed[order][:, : int(framed[order].ne(d.pad()).sum(1).max())]  # trimmed to the longest canvas
        select = kept[:, 1:].ne(d.pad())  # (A, S) every real slot
        got_content, got_location, *_ = model.decode_slots(kept, model.reorder_decoding_cache(cache, order), select)
    S = select.size(1)
    torch.testing.assert_close(got_content.log_softmax(-1), content[order][:, :S][select], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_location[select], location[order][:, :S][select], atol=1e-5, rtol=1e-5)
    assert torch.isinf(got_location[~select]).all()


def test_fused_projections_give_what_the_projections_give_one_by_one(data):
    """The self-attention's q, k and v in one product and every layer's
    encoder-attention keys and values in one product, against the modules called one by one."""
    model, d = build(data, *PRE_NORM)
    src, framed = inputs(d, (5, 9, 2), (0, 6, 3))
    with torch.no_grad():
        enc = model.encoder(src["src_tokens"], src_lengths=src["src_lengths"])
        cache = encoder_cache(model.decoder, enc)
        assert cache.fused is not None
        fused = cached_slot_states(model.decoder, framed, cache)
        one_by_one = cached_slot_states(model.decoder, framed, cache._replace(fused=None))
        x = enc["encoder_out"][0]  # (S_src, B, C)
        for layer, keys, values in zip(model.decoder.layers, cache.keys, cache.values):
            a = layer.encoder_attn
            for proj, got in ((a.k_proj, keys), (a.v_proj, values)):
                want = proj(x).view(x.size(0), x.size(1), a.num_heads, a.head_dim).permute(1, 2, 0, 3)
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fused, one_by_one, atol=1e-6, rtol=1e-6)


def test_the_model_builds_its_fused_projections_once_and_again_when_its_weights_change(data):
    model, d = build(data)
    src, framed = inputs(d, (5, 9, 2), (0, 6, 3))
    real = framed[:, 1:].ne(d.pad())
    with torch.no_grad():
        enc = model.encoder(src["src_tokens"], src_lengths=src["src_lengths"])
        first = model.decoding_cache(enc).fused
        assert first is not None and model.decoding_cache(enc).fused is first  # built once, reused
        model.decoder.layers[1].self_attn.q_proj.weight.mul_(3.0)  # changed in place (training, loading)
        cache = model.decoding_cache(enc)
        assert cache.fused is not first
        torch.testing.assert_close(cached_slot_states(model.decoder, framed, cache)[real],
                                   model.decoder.slot_states(framed, enc)[real], atol=1e-5, rtol=1e-5)
        model.double()  # another dtype: rebuilt in it
        assert model.decoding_cache(model.encoder(src["src_tokens"], src_lengths=src["src_lengths"])).fused \
            .self_attention[0][0].dtype == torch.float64


def test_quantized_projections_run_one_by_one(data):
    """int8 dynamic quantization replaces the projections with quantized modules: nothing is fused,
    and the cached path calls them as fairseq's decoder does."""
    model, d = build(data, *PRE_NORM)
    if torch.backends.quantized.engine in (None, "none"):
        pytest.skip("no quantized engine")
    model = P.for_decoding(copy.deepcopy(model), "int8")
    assert fused_projections(model.decoder) is None
    src, framed = inputs(d, (5, 9, 2), (0, 6, 3))
    full, fast, cache, real = both_paths(model, src, framed)
    assert cache.fused is None and cache.encoder_out is None
    torch.testing.assert_close(fast[real], full[real], atol=1e-5, rtol=1e-5)


def test_uncovered_layers_fall_back_to_fairseq(data):
    model, d = build(data, "--cross-self-attention")
    assert not cacheable(model.decoder)
    src, framed = inputs(d, (5, 9, 2), (0, 6, 3))
    full, fast, cache, _ = both_paths(model, src, framed)
    assert cache.encoder_out is not None and not cache.keys
    assert torch.equal(fast, full)

    model, _ = build(data)
    assert cacheable(model.decoder)
    model.decoder.layers[1].self_attn.dropout_module.apply_during_inference = True  # --retain-dropout
    assert not cacheable(model.decoder)
    model.decoder.layers[1].self_attn.dropout_module.apply_during_inference = False
    model.train()
    assert not cacheable(model.decoder)
