"""Candidates in the deployment runtime: each sentence decoded under several EOS penalties as rows of one
batch (``eos_penalties``), ordered by the model's score or, with a scorer exported beside the model
(``export --rerank-with``: an autoregressive transformer's teacher-forced log-probability, ``scorer.onnx``),
by the reranking score; ``translate_batch(num_hypotheses=k)`` returns the best k.

Checked against independent references: the scorer graph against the plugin's PyTorch scorer (itself
checked against fairseq's SequenceScorer in ``test_candidates.py``), and the runtime's candidates, in
order and with their scores, against the PyTorch generator's (``--eos-penalties``, ``--rerank-with``)."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from fairseq_insertion.checkpoints import dictionary_files
from fairseq_insertion.config import RUNTIME_OPTIONS, DecodingConfig, DecodingError
from fairseq_insertion.export import ExportError, export, load_scorer
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.rerank import AutoregressiveScorer
from fairseq_insertion.runtime import Translator, TranslatorError
from tests.test_warm_start import train_teacher
from tests.utils import reverse_data, train_args, train_once

BETAS = (1.0, 2.0, 3.0, 4.0)
BRANCHES = {"one": {}, "three": {"first_insertions": 3}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny insertion model (20 updates), a tiny teacher of the same dictionaries, and exports with and
    without the teacher as scorer (fp32) and with it (int8)."""
    root = reverse_data(tmp_path_factory, "runtime_candidates", 300, 8, 12)
    train_once(train_args(root / "bin", root / "ckpt", "--max-update", "20", "--no-epoch-checkpoints"), root / "bin",
               root / "ckpt")
    teacher = train_teacher(root / "bin", root / "teacher", "--share-all-embeddings")
    ckpt = root / "ckpt" / "checkpoint_last.pt"
    config = DecodingConfig(eos_penalties=BETAS, rerank_weight=0.5)
    exports = {"plain": export(ckpt, root / "bin", root / "plain", config=config),
               "scorer": export(ckpt, root / "bin", root / "scorer", config=config, scorer=teacher),
               "int8": export(ckpt, root / "bin", root / "int8", int8="per-row", config=config, scorer=teacher)}
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)],
                                                                    arg_overrides={"data": str(root / "bin")})
    task.load_dataset("test")
    return root, models[0].eval(), task, teacher, exports


def generator_candidates(model, task, config: DecodingConfig, teacher, batch: int):
    """Every test sentence's candidates from the PyTorch generator, best first: (ids without eos, the
    ordering score)."""
    d = task.target_dictionary
    rerank = None if teacher is None else AutoregressiveScorer.load(
        str(teacher), task.source_dictionary, d, "cpu", lenpen=config.lenpen, dictionaries=dictionary_files(task.cfg))
    gen = InsertionGenerator(d, config, src_dict=task.source_dictionary, rerank=rerank)
    ds, out = task.dataset("test"), {}
    for start in range(0, len(ds), batch):
        sample = ds.collater([ds[i] for i in range(start, min(start + batch, len(ds)))])
        for i, hypos in zip(sample["id"].tolist(), gen.generate([model], sample)):
            out[i] = [(h["tokens"][:-1].tolist(), float(h["rerank_score" if rerank else "score"])) for h in hypos]
    return [out[i] for i in range(len(ds))]


def runtime_candidates(translator: Translator, task, config: DecodingConfig, batch: int):
    opts = translator.options(**{k: getattr(config, k) for k in RUNTIME_OPTIONS})
    ds = task.dataset("test")
    ids = [ds[i]["source"].numpy() for i in range(len(ds))]
    return [[(c.ids.tolist(), c.score) for c in cands] for cands in translator.translate_ids(ids, batch, opts)]


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("which", ["plain", "scorer"])
@pytest.mark.parametrize("weight,lenpen", [(0.0, 1.0), (0.5, 2.0)])
@pytest.mark.parametrize("branches", sorted(BRANCHES))
def test_runtime_candidates_are_the_generators_in_its_order(setup, which, batch, weight, lenpen, branches):
    _, model, task, teacher, exports = setup
    config = DecodingConfig(eos_penalties=BETAS, rerank_weight=weight, lenpen=lenpen, **BRANCHES[branches])
    expected = generator_candidates(model, task, config, teacher if which == "scorer" else None, batch)
    got = runtime_candidates(Translator(exports[which], intra_threads=1), task, config, batch)
    assert [[ids for ids, _ in cands] for cands in got] == [[ids for ids, _ in cands] for cands in expected]
    np.testing.assert_allclose([s for cands in got for _, s in cands], [s for cands in expected for _, s in cands],
                               rtol=1e-4, atol=1e-4)
    assert np.mean([len(ids) for cands in expected for ids, _ in cands]) > 1  # not empty outputs
    distinct = [len({tuple(ids) for ids, _ in cands}) for cands in expected]
    assert max(distinct) > 1  # the order had candidates to choose between


def test_the_scorer_orders_otherwise_than_the_model(setup):
    """The scorer's order is not the model's on every sentence (so the parity above checks the scorer)."""
    _, _, task, _, exports = setup
    config = DecodingConfig(eos_penalties=BETAS)
    plain = runtime_candidates(Translator(exports["plain"], intra_threads=1), task, config, 5)
    scored = runtime_candidates(Translator(exports["scorer"], intra_threads=1), task, config, 5)
    assert [c[0][0] for c in plain] != [c[0][0] for c in scored]


def test_scorer_graph_is_the_pytorch_scorer(setup):
    """``scorer.onnx`` (fp32 and int8) against AutoregressiveScorer's summed log-probabilities, on random
    candidates of several lengths (the empty one included) of left-padded sources."""
    root, _, task, teacher, exports = setup
    d = task.target_dictionary
    reference = AutoregressiveScorer.load(str(teacher), task.source_dictionary, d, "cpu", lenpen=0.0,
                                          dictionaries=dictionary_files(task.cfg))
    g = torch.Generator().manual_seed(0)
    B, n, S = 3, 4, 7
    src = torch.randint(d.nspecial, len(d), (B, S), generator=g)
    src[:, -1] = d.eos()
    src[0, :3] = d.pad()  # left-padded, as fairseq batches sources
    hyps = [torch.cat([torch.randint(d.nspecial, len(d), (int(k),), generator=g), torch.tensor([d.eos()])])
            for k in [0, 1, 5, 9] * B]
    want = reference.score(src, src.ne(d.pad()).sum(1), hyps, n).numpy()  # (B n,)
    right = torch.full_like(src, d.pad())
    for b in range(B):
        real = src[b][src[b].ne(d.pad())]
        right[b, :len(real)] = real
    T = max(len(h) for h in hyps)
    target, prev = np.full((B * n, T), d.pad()), np.full((B * n, T), d.pad())
    for i, h in enumerate(hyps):
        target[i, :len(h)] = h.numpy()
        prev[i, :len(h)] = np.concatenate([[d.eos()], h.numpy()[:-1]])
    inputs = {"src_tokens": right.numpy(), "rows": np.repeat(np.arange(B), n), "target": target, "prev_tokens": prev}
    for name, tol in (("scorer", 1e-4), ("int8", 0.05)):
        session = ort.InferenceSession(str(exports[name] / "scorer.onnx"), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, inputs)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)
    assert np.ptp(want) > 1.0  # the candidates score differently


def test_num_hypotheses_returns_the_best_k(setup):
    _, _, task, _, exports = setup
    translator = Translator(exports["scorer"], intra_threads=1)
    source = [["w1", "w2", "w3"], ["w4"]]
    full = translator.translate_batch(source, num_hypotheses=len(BETAS))
    assert all(len(r.hypotheses) == len(r.scores) == len(BETAS) for r in full)
    assert all(r.scores == sorted(r.scores, reverse=True) for r in full)
    one = translator.translate_batch(source)
    assert [r.hypotheses for r in one] == [r.hypotheses[:1] for r in full]
    alone = translator.translate_batch(source, eos_penalties=(), eos_penalty=2.0)
    assert all(len(r.hypotheses) == 1 for r in alone)
    with pytest.raises(TranslatorError, match=r"num_hypotheses: 5, but the decode makes 4 candidate\(s\)"):
        translator.translate_batch(source, num_hypotheses=5)
    with pytest.raises(TranslatorError, match="num_hypotheses: expected an integer >= 1, got 0"):
        translator.translate_batch(source, num_hypotheses=0)


def test_a_scorer_recorded_but_missing_or_of_other_dictionaries_is_refused(setup, tmp_path):
    root, _, task, teacher, exports = setup
    import shutil

    broken = shutil.copytree(exports["scorer"], tmp_path / "broken")
    (broken / "scorer.onnx").unlink()
    with pytest.raises(TranslatorError, match=r"scorer.onnx: missing or empty"):
        Translator(broken)
    settings = json.loads((exports["scorer"] / "settings.json").read_text())
    assert settings["scorer"] == "scorer.onnx" and "scorer.onnx" in settings["files"]
    with pytest.raises(ExportError, match=r"--rerank-with .*not a fairseq model checkpoint|--rerank-with"):
        load_scorer(root / "bin" / "dict.src.txt", task)


def test_command_lines_export_the_scorer_and_translate_with_candidates(setup, tmp_path):
    from tests.test_runtime import run_module

    root, _, _, teacher, _ = setup
    out = tmp_path / "cli"
    proc = run_module("fairseq_insertion.export", "--path", root / "ckpt" / "checkpoint_last.pt", "--data",
                      root / "bin", "--out", out, "--rerank-with", teacher, "--eos-penalties", "1,2,3", "--lenpen", "2")
    assert proc.returncode == 0, proc.stderr
    settings = json.loads((out / "settings.json").read_text())
    assert settings["scorer"] == "scorer.onnx" and settings["decoding"]["eos_penalties"] == [1.0, 2.0, 3.0]
    lines = ["w1 w2 w3", "w4 w5 w6 w7", "w8"]
    proc = run_module("fairseq_insertion.runtime", "translate", out, "--eos-penalties", "2,4", stdin="\n".join(lines))
    assert proc.returncode == 0, proc.stderr
    translator = Translator(out, intra_threads=1)
    assert translator._scorer is not None
    expected = [" ".join(r.hypotheses[0]) for r in translator.translate_batch([x.split() for x in lines],
                                                                                 eos_penalties=(2.0, 4.0))]
    assert proc.stdout.split("\n")[:-1] == expected
    proc = run_module("fairseq_insertion.runtime", "translate", out, "--eos-penalties", "1,x", stdin="w1\n")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--eos-penalties" in proc.stderr
    proc = run_module("fairseq_insertion.export", "--path", root / "ckpt" / "checkpoint_last.pt", "--data",
                      root / "bin", "--out", tmp_path / "bad", "--rerank-with", root / "bin" / "dict.src.txt")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("python -m fairseq_insertion.export: error: --rerank-with")


def test_first_insertions_branch_from_the_best_first_tokens(setup):
    """K first insertions: the branch of the best first token is the plain decode (same tokens, score and
    iterations, wherever that decode's first pass inserted a token), the others start from the next best
    tokens, so the candidates are more diverse; with constraints they are refused, naming the option."""
    _, model, task, _, exports = setup
    plain = generator_candidates(model, task, DecodingConfig(eos_penalties=BETAS), None, 5)
    branched = generator_candidates(model, task, DecodingConfig(eos_penalties=BETAS, first_insertions=3), None, 5)
    assert all(len(b) == 3 * len(BETAS) for b in branched)
    for p, b in zip(plain, branched):
        for ids, score in p:
            if ids:
                assert any(ids == i and abs(score - s) < 1e-4 for i, s in b), (ids, b)
    assert sum(len({tuple(i) for i, _ in b}) for b in branched) > sum(len({tuple(i) for i, _ in p}) for p in plain)
    translator = Translator(exports["plain"], intra_threads=1)
    with pytest.raises(DecodingError, match=r"--first-insertions \(first_insertions=\) 3 branches from the empty"):
        translator.translate_batch([["w1"]], constraints=[[["w2"]]], first_insertions=3)
    with pytest.raises(ValueError, match=r"--first-insertions \(first_insertions=\) 3 branches"):
        ds = task.dataset("test")
        sample = ds.collater([ds[0]])
        InsertionGenerator(task.target_dictionary, first_insertions=3).generate(
            [model], sample, constraints=torch.tensor([[1, 5, 2]]))
