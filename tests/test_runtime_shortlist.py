"""The lexical shortlist (``--shortlist``, ``export --shortlist``): the PyTorch generator and the runtime, token
for token and score for score, on a tiny trained model. A list holding every token decodes as no list at all;
a short one keeps every output token in its sentence's list (the specials, the frequent words, the source
words' translations and the constraints' tokens), changes some outputs, and the runtime still matches the
generator: parallel and greedy, the repetition rules, first insertions, constraints, batch 1 and N. A table
of other dictionaries, or one changed after the export, is refused naming it."""

import json

import numpy as np
import pytest
import torch
from fairseq.token_generation_constraints import pack_constraints

from fairseq_insertion.config import RUNTIME_OPTIONS, DecodingConfig, DecodingError
from fairseq_insertion.export import ExportError, export_model
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.runtime import Translator, TranslatorError
from fairseq_insertion.slots import Shortlist
from tests.utils import trained_reverse_model

pytest.importorskip("onnxruntime")
TEST_LINES = 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root, model, task = trained_reverse_model(tmp_path_factory, "shortlist", TEST_LINES)
    src, tgt = task.source_dictionary, task.target_dictionary
    V, first = len(tgt), tgt.nspecial
    everything = Shortlist(frequent=np.arange(first, V), translations=np.zeros((len(src), 1), np.int64),
                           target_vocab=V)
    rng = np.random.default_rng(0)
    translations = np.zeros((len(src), 2), np.int64)
    for i in range(src.nspecial, len(src)):  # the word itself (the reverse task's translation) for most words
        own = tgt.index(src[i])
        translations[i] = [own if rng.random() < 0.7 else 0, rng.integers(first, V)]
    short = Shortlist(frequent=np.asarray([first, first + 1]), translations=translations, target_vocab=V)
    tables = {}
    for name, table in (("everything", everything), ("short", short)):
        tables[name] = root / f"{name}.npz"
        table.save(tables[name])
    exports = {name: export_model(model, src, tgt, root / f"export_{name}", config=DecodingConfig(eos_penalty=0.5),
                                  shortlist=Shortlist.load(path)) for name, path in tables.items()}
    return model, task, tables, exports, short


def decode_generator(model, task, config: DecodingConfig, batch: int, constraints=None):
    """Every test sentence's candidates (ids without eos, score), best first, in order."""
    ds, gen = task.dataset("test"), InsertionGenerator(task.target_dictionary, config, src_dict=task.source_dictionary)
    out = {}
    for start in range(0, len(ds), batch):
        ids = list(range(start, min(start + batch, len(ds))))
        sample = ds.collater([ds[i] for i in ids])
        packed = None if constraints is None else pack_constraints(
            [[torch.tensor(c) for c in constraints[i]] for i in sample["id"].tolist()])
        for i, hypos in zip(sample["id"].tolist(), gen.generate([model], sample, constraints=packed)):
            out[i] = [(h["tokens"][:-1].tolist(), float(h["score"])) for h in hypos]
    return [out[i] for i in range(len(ds))]


def decode_runtime(out, task, config: DecodingConfig, batch: int, constraints=None):
    translator = Translator(out, intra_threads=1)
    opts = translator.options(**{k: getattr(config, k) for k in RUNTIME_OPTIONS})
    ds = task.dataset("test")
    ids = [ds[i]["source"].numpy() for i in range(len(ds))]
    given = None if constraints is None else [[np.asarray(c) for c in cs] for cs in constraints]
    return [[(c.ids.tolist(), c.score) for c in cands] for cands in translator.translate_ids(ids, batch, opts, given)]


def same(got, want):
    assert [[c[0] for c in s] for s in got] == [[c[0] for c in s] for s in want]
    np.testing.assert_allclose([c[1] for s in got for c in s], [c[1] for s in want for c in s], rtol=1e-4, atol=1e-4)
    assert np.mean([len(s[0][0]) for s in want]) > 1  # not empty outputs


def listed(task, table: Shortlist, i: int, extra=()) -> set:
    src = task.dataset("test")[i]["source"].numpy()
    return set(range(task.target_dictionary.nspecial)) | set(table.frequent.tolist()) \
        | set(table.translations[src].reshape(-1).tolist()) | set(extra)


@pytest.mark.parametrize("batch", [1, 7])
def test_a_list_of_every_token_decodes_as_no_list(trained, batch):
    model, task, tables, exports, _ = trained
    config = DecodingConfig(eos_penalty=0.5, block_neighbour_copies=True, no_repeat_ngram_size=3)
    plain = decode_generator(model, task, config, batch)
    same(decode_generator(model, task, config.replace(shortlist=str(tables["everything"])), batch), plain)
    same(decode_runtime(exports["everything"], task, config, batch), plain)


@pytest.mark.parametrize("decoding,rules", [("parallel", {}), ("greedy", {}),
                                            ("parallel", {"block_neighbour_copies": True, "no_repeat_ngram_size": 3}),
                                            ("parallel", {"first_insertions": 2, "eos_penalties": (0.0, 1.0)})])
@pytest.mark.parametrize("batch", [1, 7])
def test_the_runtime_gives_the_generators_shortlisted_hypotheses(trained, decoding, rules, batch):
    model, task, tables, exports, short = trained
    config = DecodingConfig(decoding=decoding, eos_penalty=0.5, **rules)
    want = decode_generator(model, task, config.replace(shortlist=str(tables["short"])), batch)
    same(decode_runtime(exports["short"], task, config, batch), want)
    for i, cands in enumerate(want):
        assert all(set(ids) <= listed(task, short, i) for ids, _ in cands)
    plain = decode_generator(model, task, config, batch)
    assert [c[0][0] for c in want] != [c[0][0] for c in plain]  # the list changed some outputs


def test_constraints_enter_the_list(trained):
    model, task, tables, exports, short = trained
    d = task.target_dictionary
    rng = np.random.default_rng(3)
    unlisted = [[t for t in range(d.nspecial, len(d)) if t not in listed(task, short, i)] for i in range(TEST_LINES)]
    constraints = [[[int(rng.choice(u))]] if u and i % 2 else [] for i, u in enumerate(unlisted)]
    config = DecodingConfig(eos_penalty=0.5)
    want = decode_generator(model, task, config.replace(shortlist=str(tables["short"])), 4, constraints)
    same(decode_runtime(exports["short"], task, config, 4, constraints), want)
    for i, cands in enumerate(want):
        for c in constraints[i]:
            assert c[0] in cands[0][0]  # a token off the list, kept as a constraint
            assert set(cands[0][0]) <= listed(task, short, i, c)
    assert any(constraints)


def test_a_table_of_other_dictionaries_or_changed_after_the_export_is_refused(trained, tmp_path):
    model, task, tables, exports, short = trained
    src, tgt = task.source_dictionary, task.target_dictionary
    other = short._replace(target_vocab=len(tgt) + 1)
    with pytest.raises(ExportError, match="the shortlist's dictionaries have"):
        export_model(model, src, tgt, tmp_path / "x", shortlist=other)
    other.save(tmp_path / "other.npz")
    DecodingConfig(shortlist=str(tmp_path / "other.npz"))  # accepted as a path ...
    with pytest.raises(DecodingError, match=r"--shortlist \(shortlist=\) .*other.npz: made for a target dictionary"):
        InsertionGenerator(tgt, DecodingConfig(shortlist=str(tmp_path / "other.npz")), src_dict=src)  # ... refused
    with pytest.raises(DecodingError, match="missing.npz: no such file"):
        InsertionGenerator(tgt, DecodingConfig(shortlist=str(tmp_path / "missing.npz")), src_dict=src)
    out = export_model(model, src, tgt, tmp_path / "changed", shortlist=short)
    short._replace(frequent=short.frequent[:1]).save(out / "shortlist.npz")
    with pytest.raises(TranslatorError, match="shortlist.npz"):
        Translator(out)
    settings = json.loads((out / "settings.json").read_text())
    assert settings["shortlist"] == "shortlist.npz" and "shortlist.npz" in settings["files"]
