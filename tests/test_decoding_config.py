"""One DecodingConfig holds every insertion decoding option and its default: Python, the
command line and the hub decode the same way by default, fairseq's "off" values switch the
rules off, and every value that means nothing is refused with the option and the value named."""

import argparse
import dataclasses
import math

import pytest
from fairseq.dataclass.configs import GenerationConfig
from omegaconf import OmegaConf, open_dict

from fairseq_insertion.config import FLAGS, TASK_OPTIONS, DecodingConfig, DecodingError, check_search_options
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.task import InsertionTranslationConfig
from tests.test_decoding import OracleModel, decode, make_dict, random_targets


def _generation(**values):
    """fairseq's generation options as the CLI and the hub hand them to the task (a DictConfig)."""
    cfg = OmegaConf.structured(GenerationConfig())
    with open_dict(cfg):
        for k, v in values.items():
            setattr(cfg, k, v)
    return cfg


def test_python_cli_and_hub_defaults_are_the_same():
    python = InsertionGenerator(make_dict()).config
    cli = DecodingConfig.from_options(InsertionTranslationConfig(), _generation())
    assert python == cli == DecodingConfig()
    assert not python.block_neighbour_copies and python.no_repeat_ngram_size == 0  # no output made impossible
    assert (python.max_len_a, python.max_len_b) == (2.0, 10)  # fairseq's 0/200 become the insertion default


def test_task_fields_take_their_defaults_from_the_config():
    task, d = InsertionTranslationConfig(), DecodingConfig()
    for name in ("decoding", "eos_penalty", "max_iterations", "block_neighbour_copies", "close_ended_slots"):
        assert getattr(task, name) == getattr(d, name), name
    assert str(task.decode_precision) == d.precision


def test_every_option_has_one_flag_the_task_fields_are_made_from_the_config():
    """An option is the task's field (its flag, help and default from DecodingConfig's field) or one of
    fairseq's generation options, never both, never neither."""
    task = {f.name: f for f in dataclasses.fields(InsertionTranslationConfig)}
    fairseq = {f.name for f in dataclasses.fields(GenerationConfig)}
    for option in dataclasses.fields(DecodingConfig):
        name = option.metadata["flag"][2:].replace("-", "_")
        assert (name in task) != (name in fairseq), option.name
        assert (name in task) == (option.name in TASK_OPTIONS), option.name
        if name in task:
            assert option.metadata["help"] and task[name].metadata["help"] == option.metadata["help"]
            expected = None if option.default is None or isinstance(option.default, tuple) else option.default
            assert task[name].default == expected, option.name


def test_fairseq_flags_switch_the_rules_on_and_off():
    task = InsertionTranslationConfig()
    assert DecodingConfig.from_options(task, _generation(no_repeat_ngram_size=0)).no_repeat_ngram_size == 0
    assert DecodingConfig.from_options(task, _generation(no_repeat_ngram_size=3)).no_repeat_ngram_size == 3
    on = InsertionTranslationConfig(block_neighbour_copies=True)
    assert DecodingConfig.from_options(on, _generation()).block_neighbour_copies


def test_hub_keywords_override_the_task_options():
    task = InsertionTranslationConfig(eos_penalty=1.0)
    cfg = DecodingConfig.from_options(task, _generation(eos_penalty=2.5, eos_penalties="0,1", decoding="greedy",
                                                        lenpen=0.5, max_len_a=1.2, max_len_b=5))
    assert (cfg.eos_penalty, cfg.betas, cfg.decoding, cfg.lenpen, cfg.max_len_a, cfg.max_len_b) == (
        2.5, (0.0, 1.0), "greedy", 0.5, 1.2, 5)


def test_generator_keywords_are_config_fields():
    gen = InsertionGenerator(make_dict(), DecodingConfig(eos_penalty=1.0), eos_penalty=2.0, decoding="greedy")
    assert gen.config == DecodingConfig(eos_penalty=2.0, decoding="greedy")
    with pytest.raises(TypeError, match="unknown insertion decoding option.*'eos_penality'"):
        InsertionGenerator(make_dict(), eos_penality=2.0)


NONSENSE = [
    ("eos_penalty", math.nan), ("eos_penalty", math.inf), ("eos_penalty", -math.inf), ("eos_penalty", "x"),
    ("eos_penalties", "nan,1"), ("eos_penalties", "1,inf"), ("eos_penalties", "0,,1"), ("eos_penalties", "a"),
    ("lenpen", math.nan), ("lenpen", math.inf),
    ("max_len_a", math.nan), ("max_len_a", math.inf), ("max_len_a", -1.0),
    ("max_len_b", -1), ("max_len_b", 2.5), ("max_len_b", math.nan), ("max_len_b", math.inf),
    ("max_iterations", -1), ("max_iterations", 1.5), ("max_iterations", math.nan),
    ("no_repeat_ngram_size", 1), ("no_repeat_ngram_size", -2), ("no_repeat_ngram_size", math.inf),
    ("unkpen", math.nan), ("unkpen", -math.inf),
    ("decoding", "beam"), ("constraint_order", "sorted"), ("precision", "fp8"),
    ("block_neighbour_copies", "yes"), ("close_ended_slots", 2),
]


@pytest.mark.parametrize("field,value", NONSENSE)
def test_nonsense_values_are_refused_naming_option_and_value(field, value):
    with pytest.raises(DecodingError) as err:
        DecodingConfig(**{field: value})
    message = str(err.value)
    assert FLAGS[field] in message and f"{field}=" in message
    assert (repr(value) in message) or (str(value) in message)


def test_rerank_needs_candidates():
    with pytest.raises(DecodingError, match="--rerank-with .* --eos-penalties"):
        DecodingConfig(rerank_with="teacher.pt")
    assert DecodingConfig(rerank_with="teacher.pt", eos_penalties=(0, 1)).betas == (0.0, 1.0)


def test_the_cli_refuses_nonsense_before_decoding(tmp_path):
    """--eos-penalty nan through fairseq's parser: the task refuses it when it is set up."""
    from tests.utils import build_task, preprocess, write_reverse_corpus

    write_reverse_corpus(tmp_path / "raw", sizes=(("train", 20), ("valid", 4), ("test", 4)))
    preprocess(tmp_path / "raw", tmp_path / "bin")
    with pytest.raises(DecodingError, match=r"--eos-penalty \(eos_penalty=\) must be a finite number, got nan"):
        build_task(tmp_path / "bin", "--eos-penalty", "nan")
    task, _ = build_task(tmp_path / "bin", "--eos-penalty", "1.5")
    with pytest.raises(DecodingError, match=r"--lenpen \(lenpen=\) must be a finite number, got inf"):
        task.build_generator([], argparse.Namespace(lenpen=math.inf))


def test_command_line_messages_name_the_flag_and_the_value():
    with pytest.raises(DecodingError) as err:
        DecodingConfig(max_len_b=-5)
    assert str(err.value) == "--max-len-b (max_len_b=) must be an integer >= 0, got -5"  # the hub's
    assert err.value.command_line() == "--max-len-b must be an integer >= 0, got -5"
    with pytest.raises(DecodingError) as err:
        DecodingConfig(rerank_with="t.pt", eos_penalties=(1,))
    assert err.value.command_line().startswith("--rerank-with t.pt chooses among candidates: give several with "
                                               "--eos-penalties")


@pytest.mark.parametrize("name,value", [("nbest", 0), ("nbest", -1), ("beam", 0), ("nbest", 1.5), ("beam", True)])
def test_nbest_and_beam_must_be_counts(name, value):
    with pytest.raises(DecodingError, match=rf"--{name} \({name}=\) must be an integer >= 1, got {value!r}"):
        check_search_options(argparse.Namespace(**{name: value}))
    check_search_options(_generation(nbest=3, beam=1))


def test_unkpen_is_honoured():
    """fairseq's --unkpen: subtracted from <unk>'s log-probability when choosing (0: off)."""
    d = make_dict()
    targets = random_targets(d, [5], seed=5)

    class FondOfUnk(OracleModel):
        def _decode(self, framed, encoder_out=None):
            content, location = super()._decode(framed, encoder_out)
            content[..., d.unk()] = 10.5  # beats every right token (10) and end-of-slot
            return content, location

    _, [[h]] = decode(FondOfUnk(d, targets), d, targets, max_iterations=1)  # (the oracle reads no <unk>)
    assert h["tokens"].tolist() == [d.unk(), d.eos()]
    _, [[h]] = decode(FondOfUnk(d, targets), d, targets, unkpen=1.0)
    assert h["tokens"].tolist() == targets[0] + [d.eos()]
    assert DecodingConfig.from_options(InsertionTranslationConfig(), _generation(unkpen=2)).unkpen == 2.0
