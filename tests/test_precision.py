"""--decode-precision (fp32, bf16, int8): one conversion for every model a generator decodes
with, the insertion model and an autoregressive transformer decoded through the plugin's task
(fairseq's own generator), so that speed comparisons are like with like."""

import copy

import pytest
import torch
from fairseq import options, tasks
from fairseq.sequence_generator import SequenceGenerator
from torch import nn

from fairseq_insertion import precision as P
from fairseq_insertion.config import INT8_SCHEMES, PRECISIONS, offered
from fairseq_insertion.generator import InsertionGenerator
from tests.utils import PLUGIN, trained_reverse_model

TEST_LINES = 40
# a tiny model (d=64, 150 updates) decoded at lower precision: some argmaxes are near ties
# (measured on an AMD EPYC with AVX512-BF16, torch 2.13: int8 6, bf16 1 of the 40 hypotheses differ)
MAX_DIFFERENT = {"int8": 10, "bf16": 6}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_reverse_model(tmp_path_factory, "precision", TEST_LINES)


def _decode(model, task) -> dict:
    gen = InsertionGenerator(task.target_dictionary, src_dict=task.source_dictionary, eos_penalty=0.5,
                             max_len_a=1.0, max_len_b=6, no_repeat_ngram_size=3)
    itr = task.get_batch_iterator(task.dataset("test"), max_sentences=16, disable_iterator_cache=True)
    out = {}
    for sample in itr.next_epoch_itr(shuffle=False):
        for i, [h] in zip(sample["id"].tolist(), gen.generate([model], sample)):
            out[i] = h
    return out


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_lower_precision_decodes_the_test_set(trained, precision):
    _, model, task = trained
    want = _decode(model, task)
    low = P.for_decoding(copy.deepcopy(model), precision)
    if precision == "int8":  # every linear layer quantized, the embeddings not
        assert not any(type(m) is nn.Linear for m in low.modules())
        assert low.decoder.embed_tokens.weight.dtype == torch.float32
    else:
        assert {p.dtype for p in low.parameters()} == {torch.bfloat16}
    got = _decode(low, task)
    assert sorted(got) == sorted(want) == list(range(TEST_LINES))
    different = [i for i in want if got[i]["tokens"].tolist() != want[i]["tokens"].tolist()]
    assert len(different) <= MAX_DIFFERENT[precision], different
    for h in got.values():  # scores stay fp32 log-probabilities
        assert h["positional_scores"].dtype == torch.float32 and bool((h["positional_scores"] <= 1e-4).all())
    assert P.for_decoding(low, precision) is low  # converting twice changes nothing


def _transformer(data, precision: str):
    """The plugin's task with a tiny (untrained) autoregressive transformer, as fairseq-generate builds them."""
    gen_args = options.parse_args_and_arch(options.get_generation_parser(), [
        str(data), "--user-dir", PLUGIN, "--task", "insertion_translation", "--cpu", "--decode-precision", precision,
        "--beam", "1", "--max-len-b", "8"])
    model_args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", PLUGIN, "--task", "insertion_translation", "--arch", "transformer", "--cpu",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"])
    task = tasks.setup_task(gen_args)
    torch.manual_seed(0)
    return task, task.build_model(model_args).eval(), gen_args


def test_an_autoregressive_transformer_decodes_through_the_task_at_each_precision(trained):
    root, insertion, _ = trained
    outputs = {}
    for precision in offered("torch"):
        task, model, args = _transformer(root / "bin", precision)
        task.load_dataset("test")
        gen = task.build_generator([model], args)
        assert isinstance(gen, SequenceGenerator)  # fairseq's beam search, not the insertion generator
        if precision == "int8":  # the encoder's self-attention too (fairseq's fast path reads .weight)
            assert not any(type(m) is nn.Linear for m in model.modules())
        sample = next(task.get_batch_iterator(task.dataset("test"), max_sentences=8).next_epoch_itr(shuffle=False))
        outputs[precision] = [h[0]["tokens"].tolist() for h in task.inference_step(gen, [model], sample)]
        assert len(outputs[precision]) == 8
        if precision == "fp32":  # the same as fairseq's own translation task
            plain = tasks.TASK_REGISTRY["translation"].build_generator(task, [model], args)
            assert [h[0]["tokens"].tolist() for h in plain.generate([model], sample)] == outputs["fp32"]
    with pytest.raises(ValueError, match="insertion and autoregressive"):
        task.build_generator([insertion, model], args)


def test_precision_errors(trained, monkeypatch):
    _, model, _ = trained
    with pytest.raises(ValueError, match=r"--decode-precision must be one of .*'fp8'"):
        P.for_decoding(model, "fp8")
    monkeypatch.setattr(P, "_quantized_engine", lambda: "none")
    with pytest.raises(ValueError, match="--decode-precision int8: this torch build has no quantized engine"):
        P.for_decoding(copy.deepcopy(model), "int8")


def test_every_precision_name_comes_from_the_one_table():
    """--decode-precision's choices, export --int8's, the rewrites and an export's model.precision are the table's."""
    from fairseq_insertion import quantization as quantize
    from fairseq_insertion.export.cli import build_parser

    assert set(offered("torch")) == {"fp32", "bf16", "int8"}
    assert set(quantize.REWRITES) == set(INT8_SCHEMES) == {"per-row", "dynamic"}
    assert {p.name for p in INT8_SCHEMES.values()} | {"fp32"} == set(offered("exported"))
    int8 = next(a for a in build_parser()._actions if "--int8" in a.option_strings)
    assert tuple(int8.choices) == tuple(INT8_SCHEMES)
    assert PRECISIONS["int8-dynamic"].unfused == () and PRECISIONS["int8-per-row"].unfused
    with pytest.raises(ValueError, match=r"--decode-precision must be one of \('fp32', 'bf16', 'int8'\), got "
                                         r"'int8-per-row'"):
        P.for_decoding(nn.Linear(2, 2), "int8-per-row")
