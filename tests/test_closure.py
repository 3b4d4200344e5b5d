"""The slot-closure head (fairseq_insertion.closure) on a tiny trained model: trained by
``python -m examples.train_closure``, loaded with the checkpoint, applied by the PyTorch generator and by the
exported pass graph alike (every test sentence's hypothesis and score, parallel and greedy, with constraints and
with several EOS penalties), a model without it decoded as before, and a head refused on another model."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import export_model
from tests.test_runtime import generator_hypotheses, runtime_hypotheses
from tests.utils import REPO, trained_reverse_model

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def with_head(tmp_path_factory):
    root, plain, task = trained_reverse_model(tmp_path_factory, "closure", 24)
    out = root / "with_head.pt"
    cmd = [sys.executable, "-m", "examples.train_closure", "--path", root / "ckpt" / "checkpoint_last.pt",
           "--data", root / "bin", "--out", out, "--eos-penalty", "0.5", "--sentences", "300", "--threshold", "0.6",
           "--post-process", "none"]
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(out)], arg_overrides={"data": str(root / "bin")})
    return root, plain, models[0].eval(), task


def rows(model, task, config):
    from fairseq_insertion.generator import InsertionGenerator

    ds, gen = task.dataset("test"), InsertionGenerator(task.target_dictionary, config)
    with torch.no_grad():
        gen.generate([model], ds.collater([ds[i] for i in range(len(ds))]))
    return gen.stats["vocabulary_rows"]


def test_the_head_skips_rows_and_the_plain_model_decodes_as_before(with_head):
    _, plain, head, task = with_head
    assert plain.decoder.closure is None and head.decoder.closure is not None
    config = DecodingConfig(eos_penalty=0.5)
    assert rows(head, task, config) < rows(plain, task, config)
    assert rows(head, task, config.replace(eos_penalty=1.5)) == rows(plain, task, config.replace(eos_penalty=1.5))
    with torch.no_grad():  # at another beta the head is not applied: the same decode
        assert generator_hypotheses(head, task, config.replace(eos_penalty=1.5), 5) == \
            generator_hypotheses(plain, task, config.replace(eos_penalty=1.5), 5)
        head.decoder.closure.threshold.fill_(float("inf"))  # closes nothing: the same decode
        try:
            assert generator_hypotheses(head, task, config, 5) == generator_hypotheses(plain, task, config, 5)
        finally:
            head.decoder.closure.threshold.fill_(float(np.log(0.6 / 0.4)))


@pytest.mark.parametrize("options", [{"decoding": "parallel"}, {"decoding": "greedy"},
                                     {"eos_penalties": (0.5, 1.5)}, {"block_neighbour_copies": True}])
@pytest.mark.parametrize("batch", [1, 5])
def test_the_runtime_gives_the_generators_hypotheses_with_the_head(with_head, tmp_path, options, batch):
    _, _, head, task = with_head
    runtime_matches_generator(head, task, DecodingConfig(eos_penalty=0.5, **options), batch, tmp_path / "e")


def runtime_matches_generator(model, task, config, batch, out):
    """The model exported to ``out`` translates every test sentence as the PyTorch generator does: the same
    hypotheses (not all empty) and scores. Returns the translator."""
    from fairseq_insertion.runtime import Translator

    with torch.no_grad():
        expected = generator_hypotheses(model, task, config, batch)
    translator = Translator(export_model(model, task.source_dictionary, task.target_dictionary, out), intra_threads=1)
    got = runtime_hypotheses(translator, task, config, batch)
    assert [g[0] for g in got] == [e[0] for e in expected] and any(len(e[0]) for e in expected)
    np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], rtol=1e-4, atol=1e-4)
    return translator


def test_a_head_trained_for_another_model_is_refused(with_head, tmp_path):
    root, plain, _, _ = with_head
    state = torch.load(root / "with_head.pt", map_location="cpu", weights_only=True)
    state["model"]["decoder.output_projection.weight"] = state["model"]["decoder.output_projection.weight"] + 0.01
    torch.save(state, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"slot-closure head .* was trained for another model") as e:
        checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "other.pt")],
                                                      arg_overrides={"data": str(root / "bin")})
    assert "\n" not in str(e.value)


def test_int8_with_the_head_translates_a_sentence_alike_at_every_batch_size(with_head, tmp_path):
    from fairseq_insertion.runtime import Translator

    _, _, head, task = with_head
    config = DecodingConfig(eos_penalty=0.5)
    translator = Translator(export_model(head, task.source_dictionary, task.target_dictionary, tmp_path / "q",
                                         int8="per-row"), intra_threads=1)
    got = {b: [t for t, _ in runtime_hypotheses(translator, task, config, b)] for b in (1, 5, 24)}
    assert got[1] == got[5] == got[24] and any(got[1])
