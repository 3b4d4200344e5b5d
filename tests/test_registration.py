"""The plugin replaces fairseq's own ``insertion_transformer`` registration."""

import argparse
import logging

import pytest
import torch
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_INV_REGISTRY,
    ARCH_MODEL_NAME_REGISTRY,
    ARCH_MODEL_REGISTRY,
    MODEL_DATACLASS_REGISTRY,
    MODEL_REGISTRY,
)
from fairseq.models.nat.insertion_transformer import InsertionTransformerModel as FairseqNATInsertion

import fairseq_insertion  # noqa: F401
from fairseq_insertion import model as M
from tests.utils import build_task, reverse_data

ARCHS = {
    # arch: (encoder layers, decoder layers, dim, heads, ffn)
    "insertion_transformer": (6, 6, 512, 8, 2048),
    "insertion_transformer_big": (6, 6, 1024, 16, 4096),
    "insertion_transformer_small": (3, 3, 256, 4, 1024),
    "insertion_transformer_tiny": (2, 2, 64, 4, 256),
}


def test_registries_point_at_the_plugin():
    assert MODEL_REGISTRY["insertion_transformer"] is M.InsertionTransformerModel
    for arch in ARCHS:
        assert ARCH_MODEL_REGISTRY[arch] is M.InsertionTransformerModel
        assert ARCH_MODEL_NAME_REGISTRY[arch] == "insertion_transformer"
    assert sorted(ARCH_MODEL_INV_REGISTRY["insertion_transformer"]) == sorted(ARCHS)


@pytest.fixture
def registries():
    saved = [(r, dict(r)) for r in (MODEL_REGISTRY, ARCH_MODEL_REGISTRY, ARCH_MODEL_NAME_REGISTRY,
                                      ARCH_MODEL_INV_REGISTRY, ARCH_CONFIG_REGISTRY, MODEL_DATACLASS_REGISTRY)]
    yield
    for registry, copy in saved:
        registry.clear()
        registry.update(copy)


def test_replacing_fairseq_registration_is_explicit_and_logged(caplog, registries):
    # put fairseq's NAT model back the way fairseq registers it, then replace it again
    MODEL_REGISTRY["insertion_transformer"] = FairseqNATInsertion
    ARCH_MODEL_INV_REGISTRY["insertion_transformer"] = ["insertion_transformer", "fake_arch"]
    ARCH_MODEL_REGISTRY["fake_arch"] = FairseqNATInsertion
    ARCH_MODEL_NAME_REGISTRY["fake_arch"] = "insertion_transformer"
    ARCH_CONFIG_REGISTRY["fake_arch"] = lambda args: None
    MODEL_DATACLASS_REGISTRY["insertion_transformer"] = object
    with caplog.at_level(logging.INFO):
        M._replace_fairseq_registration("insertion_transformer")
    assert "insertion_transformer" not in MODEL_REGISTRY and "insertion_transformer" not in MODEL_DATACLASS_REGISTRY
    for arch in ("fake_arch", "insertion_transformer"):
        assert arch not in ARCH_MODEL_REGISTRY and arch not in ARCH_CONFIG_REGISTRY
        assert arch not in ARCH_MODEL_NAME_REGISTRY
    assert "insertion_transformer" not in ARCH_MODEL_INV_REGISTRY
    assert any("replaced fairseq's built-in model 'insertion_transformer'" in r.message for r in caplog.records)
    # the plugin's own registration is left alone
    MODEL_REGISTRY["insertion_transformer"] = M.InsertionTransformerModel
    M._replace_fairseq_registration("insertion_transformer")
    assert MODEL_REGISTRY["insertion_transformer"] is M.InsertionTransformerModel


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "reg", 20, 4, 4)
    return root / "bin"


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_arch_builds_the_plugin_model_with_its_sizes(data, arch):
    task, args = build_task(data, "--arch", arch)
    model = task.build_model(args)
    assert type(model) is M.InsertionTransformerModel
    enc_layers, dec_layers, dim, heads, ffn = ARCHS[arch]
    assert len(model.encoder.layers) == enc_layers and len(model.decoder.layers) == dec_layers
    assert model.decoder.embed_dim == dim and model.decoder.layers[0].self_attn.num_heads == heads
    assert model.decoder.layers[0].fc1.out_features == ffn
    assert model.termination == "slot"
    # a forward pass gives one score per slot: canvas of T tokens framed to T+2 -> T+1 slots
    src = torch.tensor([[5, 6, 7, 2]])
    framed = torch.tensor([[0, 5, 6, 2, 1]])  # [bos] 5 6 [eos] pad: 3 real slots, one padding slot
    content, location = model.slot_log_probs(model(src, torch.tensor([4]), framed), framed)
    assert content.shape == (1, 4, len(task.target_dictionary)) and location.shape == (1, 4)
    assert torch.allclose(location.exp().sum(-1), torch.ones(1)) and location[0, 3] == float("-inf")
    assert torch.allclose(content.exp().sum(-1), torch.ones(1, 4), atol=1e-5)


def test_decoder_self_attention_is_not_causal(data):
    """Changing a canvas token to the right changes the leftmost slot's scores."""
    task, args = build_task(data)
    model = task.build_model(args).eval()
    src = torch.tensor([[5, 6, 7, 2]])
    a = model(src, torch.tensor([4]), torch.tensor([[0, 5, 6, 2]]))[0][0, 0]
    b = model(src, torch.tensor([4]), torch.tensor([[0, 5, 8, 2]]))[0][0, 0]
    assert not torch.allclose(a, b)


def test_safe_globals_registered():
    assert argparse.Namespace in torch.serialization.get_safe_globals()
