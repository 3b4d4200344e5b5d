"""``no_unk`` (``--no-unk``), the slot rule that never inserts the unknown word: one object in
``fairseq_insertion/loop/rules.py`` and one DecodingConfig field, applied by the PyTorch generator, carried by the
pass graph's ``blocked`` input and the runtime's feeds. The tiny model's output projection is pushed towards unk so
that, without the rule, unk fills many slots."""

import numpy as np
import pytest
import torch

from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import export_model
from tests.test_runtime import generator_hypotheses, runtime_hypotheses
from tests.utils import build_task, reverse_data

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def unk_loving(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "no_unk", 40, 4, 12)
    task, args = build_task(root / "bin", "--share-all-embeddings", "--decoder-learned-pos", "--encoder-learned-pos")
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    d = task.target_dictionary
    with torch.no_grad():  # unk's row of the (tied) output projection: the slots' mean state, scaled
        model.decoder.output_projection.weight[d.unk()] *= 0
        model.decoder.output_projection.weight[d.unk()] += 0.2 * model.decoder.output_projection.weight[4:].mean(0)
        model.decoder.output_projection.weight[d.unk()] += 0.5
    task.load_dataset("test")
    return model, task


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
def test_the_generator_and_the_runtime_never_insert_unk(unk_loving, tmp_path, decoding):
    from fairseq_insertion.runtime import Translator

    model, task = unk_loving
    unk = task.target_dictionary.unk()
    config = DecodingConfig(decoding=decoding, eos_penalty=0.5, max_iterations=6)
    with torch.no_grad():
        free = generator_hypotheses(model, task, config, 4)
        barred = generator_hypotheses(model, task, config.replace(no_unk=True), 4)
    assert sum(t.count(unk) for t, _ in free) >= 5  # without the rule unk is inserted
    assert not any(unk in t for t, _ in barred) and any(t for t, _ in barred)
    translator = Translator(export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "e"),
                            intra_threads=1)
    assert [t for t, _ in runtime_hypotheses(translator, task, config, 4)] == [t for t, _ in free]
    got = runtime_hypotheses(translator, task, config.replace(no_unk=True), 4)
    assert [t for t, _ in got] == [t for t, _ in barred]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in barred], rtol=1e-4, atol=1e-4)
    # recorded in the export as its default, switched off per call
    recorded = Translator(export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "r",
                                       config=config.replace(no_unk=True)), intra_threads=1)
    assert recorded.defaults["no_unk"] is True
    assert [t for t, _ in runtime_hypotheses(recorded, task, config.replace(no_unk=True), 4)] == \
        [t for t, _ in barred]


def test_the_flag_reaches_the_generator(unk_loving):
    from fairseq_insertion.config import FLAGS

    assert FLAGS["no_unk"] == "--no-unk"
    assert DecodingConfig.from_options(type("Args", (), {"no_unk": True})()).no_unk is True
