"""A user's existing fairseq Transformer in the standard shapes: 6+6 layers as ``transformer_wmt_en_de``
(8 heads, FFN 4 x d, post-norm, all embeddings shared) and as ``transformer_iwslt_de_en`` (4 heads, FFN 2 x d,
pre-norm, decoder input and output embeddings shared, separate source and target dictionaries) and as
``transformer`` with nothing shared (post-norm, separate dictionaries, the decoder's output projection its own),
with d made small (64). For each: the insertion model warm-started from it takes every layer's weights, and the
export run by the runtime gives the PyTorch generator's hypotheses. Then the flags a fairseq Transformer may carry:
the export carries the ones the PyTorch model decodes with (its hypotheses, token for token), and the others are
refused in one line naming the flag."""

import pytest
import torch

from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import export_model
from tests.test_runtime import generator_hypotheses, runtime_hypotheses
from tests.test_warm_start import teacher_weights
from tests.utils import build_task, reverse_data, train_once

pytest.importorskip("onnxruntime")

D = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64"]
SHAPES = {
    "wmt_en_de": {"arch": "transformer_wmt_en_de", "heads": 8, "ffn": 256, "flags": ["--share-all-embeddings"]},
    "iwslt_de_en": {"arch": "transformer_iwslt_de_en", "heads": 4, "ffn": 128,
                    "flags": ["--share-decoder-input-output-embed", "--encoder-normalize-before",
                              "--decoder-normalize-before"]},
    "transformer_unshared": {"arch": "transformer", "heads": 4, "ffn": 128, "flags": []},
}


def sizes(shape):
    s = SHAPES[shape]
    return ["--encoder-layers", "6", "--decoder-layers", "6", *D, "--encoder-ffn-embed-dim", str(s["ffn"]),
            "--decoder-ffn-embed-dim", str(s["ffn"]), "--encoder-attention-heads", str(s["heads"]),
            "--decoder-attention-heads", str(s["heads"]), *s["flags"]]


@pytest.fixture(scope="module", params=sorted(SHAPES))
def warm(request, tmp_path_factory):
    shape = request.param
    root = reverse_data(tmp_path_factory, f"sizes_{shape}", 200, 4, 10)
    joined = "--share-all-embeddings" in SHAPES[shape]["flags"]
    data = root / "bin"
    if not joined:  # its own dictionaries
        from tests.utils import run

        data = root / "bin2"
        run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "raw" /
             "train", "--validpref", root / "raw" / "valid", "--testpref", root / "raw" / "test", "--destdir", data,
             "--workers", "1"])
    teacher_dir = root / "teacher"
    train_once(["fairseq-train", data, "--task", "translation", "--arch", SHAPES[shape]["arch"], *sizes(shape),
                "--criterion", "label_smoothed_cross_entropy", "--optimizer", "adam", "--lr", "1e-3",
                "--max-tokens", "2000", "--max-update", "3", "--save-dir", teacher_dir, "--no-epoch-checkpoints",
                "--disable-validation",
                "--cpu", "--seed", "1"], data, teacher_dir)
    teacher = teacher_dir / "checkpoint_last.pt"
    task, args = build_task(data, *sizes(shape), "--init-from-transformer", teacher, "--save-dir", root / "ckpt")
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    task.load_dataset("test")
    return shape, teacher, model, task, root


def test_every_layer_comes_from_the_teacher(warm):
    shape, teacher, model, _, _ = warm
    theirs, own = teacher_weights(teacher), model.state_dict()
    assert len(model.encoder.layers) == 6 and len(model.decoder.layers) == 6
    for side in ("encoder", "decoder"):
        for layer in range(6):
            key = f"{side}.layers.{layer}.fc1.weight"
            assert torch.equal(own[key], theirs[key]), key
    assert model.decoder.layers[0].normalize_before == (shape == "iwslt_de_en")
    assert model.decoder.layers[0].self_attn.num_heads == SHAPES[shape]["heads"]
    projection, embedding = model.decoder.output_projection.weight, model.decoder.embed_tokens.weight
    assert (projection.data_ptr() == embedding.data_ptr()) == (shape != "transformer_unshared")
    assert torch.equal(own["decoder.output_projection.weight"], theirs["decoder.output_projection.weight"])


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
def test_the_runtime_gives_the_generators_hypotheses(warm, tmp_path, decoding):
    from fairseq_insertion.runtime import Translator

    _, _, model, task, _ = warm
    out = export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "export")
    config = DecodingConfig(decoding=decoding, eos_penalty=1.0, max_iterations=6)
    with torch.no_grad():
        expected = generator_hypotheses(model, task, config, 4)
    got = runtime_hypotheses(Translator(out, intra_threads=1), task, config, 4)
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert any(e[0] for e in expected)


CARRIED = [["--no-scale-embedding"], ["--no-token-positional-embeddings"], ["--layernorm-embedding"],
           ["--quant-noise-pq", "0.1", "--quant-noise-pq-block-size", "8"], ["--decoder-layerdrop", "0.1"]]


@pytest.fixture(scope="module")
def untrained_data(tmp_path_factory):
    return reverse_data(tmp_path_factory, "sizes_flags", 40, 4, 8) / "bin"


@pytest.mark.parametrize("flags", CARRIED, ids=lambda f: f[0])
def test_the_export_carries_what_the_model_decodes_with(untrained_data, tmp_path, flags):
    from fairseq_insertion.runtime import Translator

    task, args = build_task(untrained_data, "--share-all-embeddings", *flags)
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    task.load_dataset("test")
    out = export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "export")
    config = DecodingConfig(eos_penalty=0.5)
    with torch.no_grad():
        expected = generator_hypotheses(model, task, config, 4)
    got = runtime_hypotheses(Translator(out, intra_threads=1), task, config, 4)
    assert [g[0] for g in got] == [e[0] for e in expected] and any(e[0] for e in expected)


@pytest.mark.parametrize("flags, where", [(["--cross-self-attention"], "export"),
                                          (["--decoder-output-dim", "32"], "model"),
                                          (["--adaptive-softmax-cutoff", "10,20"], "model")], ids=lambda f: f[0])
def test_what_cannot_be_carried_is_refused_naming_the_flag(untrained_data, tmp_path, flags, where):
    from fairseq_insertion.export import ExportError

    task, args = build_task(untrained_data, "--share-all-embeddings", *flags)
    if where == "model":
        with pytest.raises(ValueError, match=f"^{flags[0]} .*train without {flags[0]}$"):
            task.build_model(args)
        return
    model = task.build_model(args).eval()
    with pytest.raises(ExportError, match=f"this model has {flags[0]}$") as info:
        export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "export")
    assert "\n" not in str(info.value)
