"""A model with its own source and target dictionaries (fairseq-preprocess without --joined-dictionary, no
--share-all-embeddings: the default of a fairseq translation setup): it trains, and fairseq-generate,
fairseq-interactive, the hub, the export and the runtime translate with it, the runtime giving the generator's
hypotheses. The target words are not the source's (a source word ``w7`` becomes ``t7``), so mixing the two
dictionaries up cannot pass."""

import random

import pytest
import torch

from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import export_model
from tests.test_runtime import generator_hypotheses, runtime_hypotheses
from tests.utils import PLUGIN, run, train_once

pytest.importorskip("onnxruntime")
TEST_LINES = 12


def write_corpus(raw, sizes=(("train", 800), ("valid", 8), ("test", TEST_LINES)), vocab=20, seed=0):
    """Source: distinct words w0..w19; target: the same positions reversed, as t0..t19."""
    rng = random.Random(seed)
    raw.mkdir(parents=True)
    for split, n in sizes:
        src, tgt = [], []
        for _ in range(n):
            ids = rng.sample(range(vocab), rng.randint(3, 12))
            src.append(" ".join(f"w{i}" for i in ids))
            tgt.append(" ".join(f"t{i}" for i in reversed(ids)))
        (raw / f"{split}.src").write_text("\n".join(src) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt) + "\n")


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    from fairseq import checkpoint_utils

    root = tmp_path_factory.mktemp("separate_dicts")
    write_corpus(root / "raw")
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "raw" / "train",
         "--validpref", root / "raw" / "valid", "--testpref", root / "raw" / "test", "--destdir", root / "bin",
         "--workers", "1"])
    cmd = ["fairseq-train", root / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
           "--arch", "insertion_transformer_tiny", "--share-decoder-input-output-embed",
           "--criterion", "insertion_loss", "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
           "--warmup-updates", "50", "--max-tokens", "2000", "--save-dir", root / "ckpt", "--cpu", "--seed", "1",
           "--max-update", "150", "--no-epoch-checkpoints"]
    train_once(cmd, root / "bin", root / "ckpt")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(root / "ckpt" / "checkpoint_last.pt")], arg_overrides={"data": str(root / "bin")})
    task.load_dataset("test")
    return root, models[0].eval(), task


def test_the_data_bin_and_the_model_keep_two_dictionaries(separate):
    root, model, task = separate
    src, tgt = (root / "bin" / "dict.src.txt").read_text(), (root / "bin" / "dict.tgt.txt").read_text()
    assert src.startswith("w") and tgt.startswith("t")
    assert task.source_dictionary is not task.target_dictionary
    assert model.encoder.embed_tokens.weight.data_ptr() != model.decoder.embed_tokens.weight.data_ptr()


def test_generate_and_interactive_translate_into_the_target_words(separate):
    root, _, _ = separate
    common = ["--user-dir", PLUGIN, "--task", "insertion_translation", "--path", root / "ckpt" / "checkpoint_last.pt",
              "--decoding", "parallel", "--eos-penalty", "0.5", "--cpu"]
    out = run(["fairseq-generate", root / "bin", *common, "--batch-size", "5"]).stdout
    hyps = [line.split("\t")[2].split() for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == TEST_LINES and any(hyps)
    assert all(w.startswith("t") for h in hyps for w in h)
    line = (root / "raw" / "test.src").read_text().splitlines()[0]
    out = run(["fairseq-interactive", root / "bin", *common, "--source-lang", "src", "--target-lang", "tgt"],
              input=line + "\n").stdout
    words = [w for ln in out.splitlines() if ln.startswith("H-") for w in ln.split("\t")[2].split()]
    assert words and all(w.startswith("t") for w in words)


def test_the_hub_translates_with_the_two_dictionaries(separate):
    from fairseq_insertion.model import InsertionTransformerModel

    root, _, _ = separate
    hub = InsertionTransformerModel.from_pretrained(str(root / "ckpt"), checkpoint_file="checkpoint_last.pt",
                                                    data_name_or_path=str(root / "bin"))
    line = (root / "raw" / "test.src").read_text().splitlines()[0]
    words = hub.translate([line], decoding="parallel", eos_penalty=0.5)[0].split()
    assert words and all(w.startswith("t") for w in words)


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
def test_the_runtime_gives_the_generators_hypotheses(separate, tmp_path, decoding):
    from fairseq_insertion.runtime import Translator

    _, model, task = separate
    out = export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "export")
    config = DecodingConfig(decoding=decoding, eos_penalty=0.5)
    with torch.no_grad():
        expected = generator_hypotheses(model, task, config, 5)
    got = runtime_hypotheses(Translator(out, intra_threads=1), task, config, 5)
    assert [g[0] for g in got] == [e[0] for e in expected] and any(e[0] for e in expected)
    target = task.target_dictionary
    assert all(target[i].startswith("t") for e in expected for i in e[0])
