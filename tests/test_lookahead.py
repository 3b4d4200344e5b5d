"""The look-ahead closure (fairseq_insertion.closure.LookAhead) on a tiny trained model: trained by
``python -m examples.train_closure`` beside the slot-closure head, its labels against a hand-worked pass, fewer
passes than without it, the runtime's hypotheses and scores the generator's, and a model decoded as before where the
look-ahead ends nothing or is not there."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils

from examples.train_closure import Pass, lookahead_examples
from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import export_model
from fairseq_insertion.generator import InsertionGenerator
from tests.test_closure import runtime_matches_generator
from tests.test_runtime import generator_hypotheses, runtime_hypotheses
from tests.utils import REPO, trained_reverse_model

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root, plain, task = trained_reverse_model(tmp_path_factory, "lookahead", 24)
    out, summary = root / "heads.pt", root / "heads.json"
    cmd = [sys.executable, "-m", "examples.train_closure", "--path", root / "ckpt" / "checkpoint_last.pt",
           "--data", root / "bin", "--out", out, "--eos-penalty", "0.5", "--sentences", "400", "--threshold", "0.6",
           "--lookahead-threshold", "0.6", "--post-process", "none", "--summary", summary]
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(out)], arg_overrides={"data": str(root / "bin")})
    return root, models[0].eval(), task, json.loads(summary.read_text())


def decoded(model, task, config):
    ds, gen = task.dataset("test"), InsertionGenerator(task.target_dictionary, config)
    with torch.no_grad():
        hypos = gen.generate([model], ds.collater([ds[i] for i in range(len(ds))]))
    return [h[0]["tokens"].tolist() for h in hypos], gen.stats


def test_labels_follow_each_slot_into_the_next_pass():
    eos, w = 2, 7
    # pass 1: one canvas of 2 tokens (slots 0 1 2): slot 0 takes w, slot 1 ends, slot 2 takes w
    first = Pass(ids=torch.tensor([0]), open_=torch.tensor([[True, True, True]]), may=torch.tensor([True, True, False]),
                 inputs=(torch.zeros(3, 4), torch.tensor([w, eos, w]), torch.zeros(3), torch.zeros(3)))
    # pass 2: 4 tokens (w a b w), slots 0..4; the next pass ends slots 0, 2 and 4 and fills 1 and 3
    second = Pass(ids=torch.tensor([0]), open_=torch.ones(1, 5, dtype=torch.bool), may=torch.ones(5, dtype=torch.bool),
                  inputs=(torch.zeros(5, 4), torch.tensor([eos, w, eos, w, eos]), torch.zeros(5), torch.zeros(5)))
    inputs, labels, applies = lookahead_examples([first, second], eos)
    # slot 0 -> next slots 0 and 1; slot 1 (ended) -> next slot 2; slot 2 -> next slots 3 and 4
    assert labels.tolist() == [[True, False, True], [True, False, True], [False, True, False]]  # (left, right, itself)
    assert applies.tolist() == [[True, True, False], [False, False, True], [False, False, False]]  # may: slot 2 not
    assert inputs[1].tolist() == [w, eos, w]
    # a sentence that ended after the pass gives nothing
    _, labels, _ = lookahead_examples([first, second._replace(ids=torch.tensor([3]))], eos)
    assert len(labels) == 0


def test_the_lookahead_ends_sentences_a_pass_early(heads):
    root, model, task, summary = heads
    assert model.decoder.lookahead is not None and summary["lookahead"]["threshold"] == 0.6
    config = DecodingConfig(eos_penalty=0.5)
    with_it, ahead = decoded(model, task, config)
    lookahead, model.decoder.lookahead = model.decoder.lookahead, None
    try:
        without, plain = decoded(model, task, config)
    finally:
        model.decoder.lookahead = lookahead
    idle = lambda s: s["sentence_passes"] - s["iterations"]  # noqa: E731
    assert idle(ahead) < idle(plain) and ahead["positions"] < plain["positions"]
    assert ahead["iterations"] <= plain["iterations"] and plain["tokens"] > 0
    assert sum(a == b for a, b in zip(with_it, without)) >= len(without) // 2


def test_a_lookahead_that_ends_nothing_or_another_beta_decodes_as_without(heads):
    _, model, task, _ = heads
    config = DecodingConfig(eos_penalty=0.5)
    head = model.decoder.lookahead
    with torch.no_grad():
        for other in (config.replace(eos_penalty=1.5), config):
            if other is config:
                head.threshold.fill_(float("inf"))
            try:
                got = generator_hypotheses(model, task, other, 5)
                model.decoder.lookahead = None
                assert got == generator_hypotheses(model, task, other, 5) and any(len(g[0]) for g in got)
            finally:
                model.decoder.lookahead = head
                head.threshold.fill_(float(np.log(0.6 / 0.4)))


@pytest.mark.parametrize("options", [{"decoding": "parallel"}, {"decoding": "greedy"},
                                     {"eos_penalties": (0.5, 1.5)}, {"block_neighbour_copies": True},
                                     {"first_insertions": 2}])
@pytest.mark.parametrize("batch", [1, 5])
def test_the_runtime_gives_the_generators_hypotheses_with_the_lookahead(heads, tmp_path, options, batch):
    _, model, task, _ = heads
    translator = runtime_matches_generator(model, task, DecodingConfig(eos_penalty=0.5, **options), batch,
                                           tmp_path / "e")
    assert translator.stats["sentence_passes"] > 0


def test_int8_with_the_lookahead_translates_a_sentence_alike_at_every_batch_size(heads, tmp_path):
    from fairseq_insertion.runtime import Translator

    _, model, task, _ = heads
    translator = Translator(export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "q",
                                         int8="per-row"), intra_threads=1)
    got = {b: [t for t, _ in runtime_hypotheses(translator, task, DecodingConfig(eos_penalty=0.5), b)]
           for b in (1, 5, 24)}
    assert got[1] == got[5] == got[24] and any(got[1])
