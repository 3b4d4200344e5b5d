"""Terminology in the runtime: ``constraints=`` of ``translate_batch`` and ``translate_text`` and the command
line's ``--constraints`` against the PyTorch generator, token for token.

The models are tiny and untrained, on dictionaries of whole words and glueing pieces (``x@@`` for
subword-nmt, a piece without ``▁`` for sentencepiece); a glue bias is written into their weights (a constant
slot-state dimension times a vocabulary column) so that the exported graphs carry it too, and the word-edge
rule has work at most constraints (checked: the same decodes with the rule off glue them)."""

import dataclasses
import random

import numpy as np
import pytest
import torch
from fairseq.token_generation_constraints import pack_constraints

from fairseq_insertion.config import RUNTIME_OPTIONS, DecodingConfig
from fairseq_insertion.decoding import WordEdges
from fairseq_insertion.export import export_model
from fairseq_insertion.generator import InsertionGenerator
from tests.test_word_edges import GAP, SCHEMES, _corpus, _none, edge_violations
from tests.utils import build_task, preprocess, random_source_batch

pytest.importorskip("onnxruntime")
from fairseq_insertion.runtime import Translator, TranslatorError  # noqa: E402

MAX_POSITIONS = 24
MODES = [("parallel", "slot"), ("greedy", "slot"), ("greedy", "sequence")]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    out = {}
    for scheme, vocab in SCHEMES.items():
        root = tmp_path_factory.mktemp(f"rc_{scheme}")
        _corpus(root / "raw", vocab)
        preprocess(root / "raw", root / "bin")
        out[scheme] = build_task(root / "bin", "--max-target-positions", MAX_POSITIONS)
    return out


def glued_model(task, args, termination: str, strength: float = 3.0, seed: int = 0, ending: float = 0.0):
    """An untrained model whose slot head favours the glueing pieces, in its weights: slot-state dimension 0
    is 1 everywhere and the output projection's column 0 adds ``strength`` to those pieces (and ``ending``
    to end-of-slot)."""
    torch.manual_seed(seed)
    model = task.build_model(args).eval()
    model.termination = termination
    edges = WordEdges.from_dictionary(task.target_dictionary)
    dec = model.decoder
    with torch.no_grad():
        dec.slot_proj.weight[0].zero_()
        dec.slot_proj.bias[0] = 1.0
        dec.output_projection.weight[:, 0] = strength * (edges.joins_next | edges.joins_prev).float()
        dec.output_projection.weight[task.target_dictionary.eos(), 0] = ending
    return model


@pytest.fixture(scope="module")
def exports(tasks, tmp_path_factory):
    """(model, export directory) per scheme and termination."""
    out = {}
    for scheme, (task, args) in tasks.items():
        for termination in ("slot", "sequence"):
            model = glued_model(task, args, termination)
            d = export_model(model, task.source_dictionary, task.target_dictionary,
                             tmp_path_factory.mktemp(f"rc_export_{scheme}_{termination}"))
            out[scheme, termination] = model, d
    return out


def random_constraints(d, rng, n, gaps=True):
    """Per sentence 0-3 constraints of 1-3 pieces, some with template gaps (pad)."""
    words = list(range(d.nspecial, len(d)))
    out = []
    for _ in range(n):
        cs = []
        for _ in range(rng.randint(0, 3)):
            c = [rng.choice(words) for _ in range(rng.randint(1, 3))]
            if gaps and rng.random() < 0.2:
                c.insert(rng.randint(0, len(c)), GAP)
            cs.append(c)
        out.append(cs)
    return out


def generator_outputs(model, d, sample, cons, config):
    packed = pack_constraints([[torch.tensor(c, dtype=torch.long) for c in cs] for cs in cons])
    hypos = InsertionGenerator(d, config).generate([model], sample, constraints=packed)
    return [(h["tokens"][:-1].tolist(), float(h["score"]), h) for [h] in hypos]


def runtime_outputs(translator, sample, cons, config, batch):
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    ids = [src[b, src.size(1) - int(n):].numpy() for b, n in enumerate(lengths)]  # left-padded
    opts = translator.options(**{k: getattr(config, k) for k in RUNTIME_OPTIONS})
    given = [[np.asarray(c, dtype=np.int64) for c in cs] for cs in cons]
    return [(c.ids.tolist(), c.score) for c, *_ in translator.translate_ids(ids, batch, opts, given)]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("decoding,termination", MODES)
@pytest.mark.parametrize("batch", [1, 16])
def test_the_runtime_places_constraints_as_the_generator(tasks, exports, scheme, decoding, termination, batch,
                                                         monkeypatch):
    task, _ = tasks[scheme]
    d = task.target_dictionary
    model, out = exports[scheme, termination]
    rng = random.Random(batch)
    cons = random_constraints(d, rng, 24)
    sample = random_source_batch(d, [rng.randint(0, 8) for _ in cons])  # some sources empty
    config = DecodingConfig(decoding=decoding, max_len_a=0, max_len_b=14, eos_penalty=0.5,
                            **({"block_neighbour_copies": True} if decoding == "parallel" else {}))
    expected = generator_outputs(model, d, sample, cons, config)
    got = runtime_outputs(Translator(out, intra_threads=1), sample, cons, config, batch)
    assert [g[0] for g in got] == [e[0] for e in expected]
    np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], rtol=1e-4, atol=1e-4)
    assert np.mean([len(e[0]) for e in expected]) > 3
    edges = WordEdges.from_dictionary(d)
    for (_, _, h), cs in zip(expected, cons):  # whole words (the generator's outputs, which the runtime's equal)
        assert edge_violations(h["tokens"], h["positional_scores"], cs, edges, 14) == []
    with monkeypatch.context() as m:  # the rule has work here: without it, constraints are glued
        m.setattr(WordEdges, "from_dictionary", classmethod(lambda cls, d, scheme=None: _none(d)))
        loose = generator_outputs(model, d, sample, cons, config)
    assert sum(bool(edge_violations(h["tokens"], h["positional_scores"], cs, edges, 14))
               for (_, _, h), cs in zip(loose, cons)) >= 3


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
def test_unordered_constraints_in_the_runtime_are_the_generators(tasks, exports, decoding):
    """``constraint_order="unordered"``: the loop orders the constraints by the unconstrained translation on numpy
    as on torch (token for token), and the order is not the given one in some lines."""
    task, _ = tasks["subword_nmt"]
    d = task.target_dictionary
    model, out = exports["subword_nmt", "slot"]
    rng = random.Random(11)
    torch.manual_seed(11)
    sample = random_source_batch(d, [rng.randint(1, 8) for _ in range(24)])
    plain = generator_outputs(model, d, sample, [[] for _ in range(24)], DecodingConfig(
        decoding=decoding, max_len_a=0, max_len_b=14, eos_penalty=0.5))
    # two or three pieces of each unconstrained translation, given in the reverse of their order there
    cons = [[[t] for t in reversed(sorted(set(h), key=h.index)[:rng.randint(2, 3)])] for h, _, _ in plain]
    config = DecodingConfig(decoding=decoding, max_len_a=0, max_len_b=14, eos_penalty=0.5,
                            constraint_order="unordered")
    expected = generator_outputs(model, d, sample, cons, config)
    translator = Translator(out, intra_threads=1)
    for batch in (1, 16):
        got = runtime_outputs(translator, sample, cons, config, batch)
        assert [g[0] for g in got] == [e[0] for e in expected]
        np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], rtol=1e-4, atol=1e-4)
    ordered = generator_outputs(model, d, sample, cons, dataclasses.replace(config, constraint_order="ordered"))
    assert sum(o[0] != e[0] for o, e in zip(ordered, expected)) >= 8  # of 24 (greedy: 11, parallel: 23)


@pytest.mark.parametrize("decoding,termination", MODES)
def test_an_unfinished_word_is_completed_when_the_model_would_end(tasks, decoding, termination, tmp_path):
    """A model that ends every slot: a constraint's last ``p@@`` piece is still completed before
    end-of-sentence or the next constraint, in the runtime as in the generator."""
    task, args = tasks["subword_nmt"]
    d = task.target_dictionary
    model = glued_model(task, args, termination, strength=0.0, ending=8.0)
    out = export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "x")
    w, p = d.index("w1"), d.index("p2@@")
    cons = [[[w, p]], [[p], [w]], [[w, p], [p]], [[w, GAP, p, GAP]], [[w]]]
    sample = random_source_batch(d, [3] * len(cons))
    config = DecodingConfig(decoding=decoding, max_len_a=0, max_len_b=12)
    expected = generator_outputs(model, d, sample, cons, config)
    got = runtime_outputs(Translator(out, intra_threads=1), sample, cons, config, 5)
    assert [g[0] for g in got] == [e[0] for e in expected]
    np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], rtol=1e-4, atol=1e-4)
    lengths = [len(e[0]) for e in expected]
    assert lengths == [3, 3, 5, 3, 1] if termination == "slot" else lengths[-1] == 1  # one piece after each p@@


@pytest.fixture(scope="module")
def words(exports):
    """The subword-nmt model's translator."""
    return Translator(exports["subword_nmt", "slot"][1], intra_threads=1)


def contains(hypothesis, constraint):
    n = len(constraint)
    return any(hypothesis[i:i + n] == constraint for i in range(len(hypothesis) - n + 1))


def test_translate_batch_takes_constraints_as_pieces(words):
    source = [["w1", "w2", "w3"], ["p1@@", "w4"], [], ["w5"]]
    constraints = [[["w7", "p2@@", "w8"]], [], [["w9"], ["w0", "w1"]], [["p3@@", "___", "w2"]]]
    results = words.translate_batch(source, constraints=constraints, max_len_a=0, max_len_b=10)
    hyps = [r.hypotheses[0] for r in results]
    assert contains(hyps[0], ["w7", "p2@@", "w8"])
    assert hyps[1] == words.translate_batch([source[1]], max_len_a=0, max_len_b=10)[0].hypotheses[0]
    assert contains(hyps[2], ["w9"]) and contains(hyps[2], ["w0", "w1"])  # an empty source, from its constraints
    assert hyps[2].index("w9") < hyps[2].index("w0")
    at = hyps[3].index("p3@@")
    assert "w2" in hyps[3][at + 1:] and hyps[3][-1] == "w2"  # a template: the gap filled, the end anchored
    # one constraint list per input, in order: the same as decoding each alone
    alone = [words.translate_batch([s], constraints=[c], max_len_a=0, max_len_b=10)[0].hypotheses[0]
             for s, c in zip(source, constraints)]
    assert alone == hyps


def test_constraints_over_the_length_limit_empty_that_output_alone(words, caplog):
    long = [f"w{i % 10}" for i in range(8)]
    with caplog.at_level("WARNING"):
        results = words.translate_batch([["w1"], ["w2"], []], constraints=[[long], [["w3"]], [long]], max_len_a=0,
                                        max_len_b=3)
    assert results[0].hypotheses[0] == [] and contains(results[1].hypotheses[0], ["w3"])
    assert contains(results[2].hypotheses[0], long)  # an empty source: decoded from its constraints
    assert "input 0: its constraints hold 8 tokens, over the length limit 3" in caplog.text
    assert "input 2" not in caplog.text


def test_an_unknown_piece_is_read_as_unk_with_a_warning(words, caplog):
    with caplog.at_level("WARNING"):
        [r] = words.translate_batch([["w1"]], constraints=[[["w2", "Fahrrad"]]])
    assert contains(r.hypotheses[0], ["w2", "<unk>"])
    assert "input 0: constraint 'w2 Fahrrad' holds 1 piece(s) not in the target vocabulary" in caplog.text


@pytest.mark.parametrize("constraints,message", [
    ([[["w1"]]], "constraints: 1 lists for 2 inputs"),
    ("w1", "constraints: expected a list"),
    ([["w1"], []], "constraints[0][0]: expected a list of str tokens, got a str 'w1'"),
    ([[["w1", "</s>"]], []], "constraints[0][0]: holds the special symbol(s) </s>"),
    ([[], [["___"]]], "constraints[1][0]: no piece besides template gaps"),
    ([[], [["w1 w2"]]], "constraints[1][0][0]: a token with whitespace"),
    ([[], "w1"], "constraints[1]: expected a list of token lists, got str"),
])
def test_bad_constraints_are_refused_naming_them(words, constraints, message):
    with pytest.raises(TranslatorError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        words.translate_batch([["w1"], ["w2"]], constraints=constraints)


def test_the_command_line_takes_tab_separated_constraints(exports):
    from tests.test_runtime_input import runtime

    out = exports["subword_nmt", "slot"][1]
    lines = ["w1 w2\tw7 p2@@ w8", "w3", "\tw9\tw0 w1", "w4 w5\tp3@@ ___ w2"]
    proc = runtime("translate", out, "--constraints", "--max-len-a", "0", "--max-len-b", "10", "--batch-size", "3",
                   stdin="".join(x + "\n" for x in lines))
    assert proc.returncode == 0, proc.stderr
    got = proc.stdout.split("\n")[:-1]
    translator = Translator(out, intra_threads=1)
    fields = [line.split("\t") for line in lines]
    expected = translator.translate_batch([f[0].split() for f in fields], constraints=[
        [c.split() for c in f[1:]] for f in fields], max_len_a=0, max_len_b=10)
    assert got == [" ".join(r.hypotheses[0]) for r in expected]
    assert "w7 p2@@ w8" in got[0] and "w9" in got[2]
    proc = runtime("translate", out, "--constraints", "unordered", "--max-len-a", "0", "--max-len-b", "10",
                   stdin="".join(x + "\n" for x in lines))
    assert proc.returncode == 0, proc.stderr
    expected = translator.translate_batch([f[0].split() for f in fields], constraints=[
        [c.split() for c in f[1:]] for f in fields], max_len_a=0, max_len_b=10, constraint_order="unordered")
    assert proc.stdout.split("\n")[:-1] == [" ".join(r.hypotheses[0]) for r in expected]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_first_insertions_on_subword_dictionaries_are_the_generators(tasks, exports, scheme):
    """First insertions are not constraints: on dictionaries of glueing pieces no word-edge rule applies next
    to them, in the generator as in the runtime (candidates, in order, token for token)."""
    task, _ = tasks[scheme]
    d = task.target_dictionary
    model, out = exports[scheme, "slot"]
    rng = random.Random(3)
    sample = random_source_batch(d, [rng.randint(1, 8) for _ in range(16)])
    config = DecodingConfig(max_len_a=0, max_len_b=14, eos_penalty=0.5, first_insertions=4, block_neighbour_copies=True)
    hypos = InsertionGenerator(d, config).generate([model], sample)
    expected = [[h["tokens"][:-1].tolist() for h in cands] for cands in hypos]
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    ids = [src[b, src.size(1) - int(n):].numpy() for b, n in enumerate(lengths)]  # left-padded
    translator = Translator(out, intra_threads=1)
    opts = translator.options(**{k: getattr(config, k) for k in RUNTIME_OPTIONS})
    got = [[c.ids.tolist() for c in cands] for cands in translator.translate_ids(ids, 16, opts)]
    assert got == expected and np.mean([len(c[0]) for c in expected]) > 3
    glued = [h for cands in hypos for h in cands if any(d[t].endswith("@@") or not d[t].startswith("\u2581")
                                                        for t in h["tokens"][:-1].tolist())]
    assert glued  # pieces that glue were inserted: a rule at the first insertion would have had work
