"""The deployment path: ``python -m fairseq_insertion.export`` and ``fairseq_insertion.runtime``.

The runtime (ONNX Runtime passes, numpy canvases) against the PyTorch generator, hypothesis for
hypothesis: a tiny trained model (post-norm, sinusoidal positions) and an untrained pre-norm one
(learned positions, embedding layer norm, gelu, sequence finalization), parallel and greedy,
with and without the repetition rules, with closed end-of-slot slots and an iteration bound, at
batch 1 and N. The loop's canvas operations on numpy arrays against
torch tensors; the runtime without torch or fairseq; the command lines."""

import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fairseq_insertion import loop as L
from fairseq_insertion.config import RUNTIME_OPTIONS, DecodingConfig, DecodingError
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.export import ExportError, export_model
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.loop import bans, geometry
from fairseq_insertion.runtime import Translator, TranslatorError
from fairseq_insertion.runtime import backend as RT
from tests.utils import REPO, build_task, canvas_positions_one_by_one, reverse_data, trained_reverse_model

pytest.importorskip("onnxruntime")
TEST_LINES = 24
RULES = {"off": {}, "on": {"block_neighbour_copies": True, "no_repeat_ngram_size": 3},
         "closed": {"close_ended_slots": True, "max_iterations": 3}, "capped": {"max_per_pass": 2}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root, model, task = trained_reverse_model(tmp_path_factory, "runtime", TEST_LINES)
    out = export_model(model, task.source_dictionary, task.target_dictionary, root / "export",
                       config=DecodingConfig(eos_penalty=0.5))
    return root, model, task, out


@pytest.fixture(scope="module")
def prenorm(tmp_path_factory):
    """An untrained pre-norm model with learned positions, an embedding layer norm, gelu and
    sequence finalization, its layer norms moved away from the identity."""
    root = reverse_data(tmp_path_factory, "runtime_prenorm", 40, 4, TEST_LINES)
    task, args = build_task(root / "bin", "--share-all-embeddings", "--encoder-normalize-before",
                            "--decoder-normalize-before", "--decoder-learned-pos", "--encoder-learned-pos",
                            "--layernorm-embedding", "--activation-fn", "gelu", "--termination", "sequence")
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    task.load_dataset("test")
    return root, model, task, export_model(model, task.source_dictionary, task.target_dictionary, root / "export")


def sources(task):
    """The test split's source token ids (with eos), in order."""
    ds = task.dataset("test")
    return [ds[i]["source"] for i in range(len(ds))]


def generator_hypotheses(model, task, config: DecodingConfig, batch: int):
    """The PyTorch generator's best hypothesis (ids without eos) and score of every test sentence."""
    ds, gen = task.dataset("test"), InsertionGenerator(task.target_dictionary, config)
    out = {}
    for start in range(0, len(ds), batch):
        sample = ds.collater([ds[i] for i in range(start, min(start + batch, len(ds)))])
        for i, hypos in zip(sample["id"].tolist(), gen.generate([model], sample)):
            out[i] = (hypos[0]["tokens"][:-1].tolist(), float(hypos[0]["score"]))
    return [out[i] for i in range(len(ds))]


def runtime_hypotheses(translator: Translator, task, config: DecodingConfig, batch: int):
    opts = translator.options(**{k: getattr(config, k) for k in RUNTIME_OPTIONS})
    ids = [s.numpy() for s in sources(task)]
    return [(c.ids.tolist(), c.score) for c, *_ in translator.translate_ids(ids, batch, opts)]


def test_stats_count_each_passs_framed_canvas(trained):
    """A plain decoder reads its whole framed canvas every pass: the decoder positions are the canvas positions,
    as each sentence's history counts them."""
    _, _, task, out = trained
    translator = Translator(out, intra_threads=1)
    opts = translator.options(max_iterations=4)  # some stop at the bound, others after a pass inserting nothing
    expected = canvas_positions_one_by_one(translator, [s.numpy() for s in sources(task)], opts)
    assert translator.stats["canvas"] == translator.stats["positions"] == expected > 2 * TEST_LINES


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
@pytest.mark.parametrize("rules", sorted(RULES))
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("which", ["trained", "prenorm"])
def test_runtime_gives_the_generators_hypotheses(request, which, decoding, rules, batch):
    _, model, task, out = request.getfixturevalue(which)
    config = DecodingConfig(decoding=decoding, eos_penalty=0.5, **RULES[rules])
    expected = generator_hypotheses(model, task, config, batch)
    got = runtime_hypotheses(Translator(out, intra_threads=1), task, config, batch)
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert any(len(e[0]) for e in expected)
    np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
@pytest.mark.parametrize("rules", sorted(RULES))
@pytest.mark.parametrize("which", ["trained", "prenorm"])
def test_passes_run_in_two_width_groups_give_the_generators_hypotheses(request, which, decoding, rules, monkeypatch):
    """Every pass of two or more canvases split into its longer and its shorter rows (GROUPED 0), each group at its
    own width: the generator's hypotheses and scores all the same, the pass graph run more often than the passes."""
    _, model, task, out = request.getfixturevalue(which)
    monkeypatch.setattr(RT, "GROUPED", 0.0)
    config = DecodingConfig(decoding=decoding, eos_penalty=0.5, **RULES[rules])
    translator = Translator(out, intra_threads=1)
    graph, runs = translator._pass, []
    monkeypatch.setattr(translator, "_pass", type("Counted", (), {"run": lambda self, *a: runs.append(1) or
                                                                  graph.run(*a)})())
    got = runtime_hypotheses(translator, task, config, 7)
    expected = generator_hypotheses(model, task, config, 7)
    assert [g[0] for g in got] == [e[0] for e in expected] and any(len(e[0]) for e in expected)
    np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], rtol=1e-4, atol=1e-4)
    assert len(runs) > translator.stats["passes"]


@pytest.mark.parametrize("lengths, groups", [
    ([5], [(0, 1)]), ([4, 4, 4], [(0, 3)]), ([9, 9, 8, 2, 2, 1], [(0, 3), (3, 6)]),
    ([9, 2, 2, 2, 2, 2, 2, 2], [(0, 1), (1, 8)]), ([7, 6, 6, 5], [(0, 4)]), ([3, 9, 1, 1], [(0, 1), (1, 2), (2, 4)]),
    ([30, 20, 20, 10, 10, 10, 2, 2, 2, 2], [(0, 1), (1, 3), (3, 6), (6, 10)])])
def test_width_groups_split_where_the_positions_are_fewest(lengths, groups, monkeypatch):
    """Contiguous groups covering every row, each split in two where that saves at least GROUPED of its positions: a
    canvas of 9 among 1s and 2s goes apart, lengths close together stay one group, several steps of lengths give
    several groups; rows out of order count at their group's widest (GROUPED 0.1)."""
    monkeypatch.setattr(RT, "GROUPED", 0.1)
    got = RT.width_groups(np.asarray(lengths))
    assert [(g.start, g.stop) for g in got] == groups


def test_int8_export_decodes_every_line(trained, tmp_path):
    _, model, task, fp32 = trained
    out = export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "int8", int8="per-row")
    assert (out / "pass.onnx").stat().st_size < (fp32 / "pass.onnx").stat().st_size
    assert json.loads((out / "settings.json").read_text())["model"]["precision"] == "int8-per-row"
    translator = Translator(out, intra_threads=1)
    results = translator.translate_batch([["w1", "w2", "w3"], [], ["w5"] * 3], max_batch_size=2)
    assert len(results) == 3 and results[1].hypotheses == [[]]
    assert all(set(tok for tok in r.hypotheses[0]) <= set(translator.target_symbols) for r in results)


def test_fp32_and_per_row_sessions_run_residual_and_layer_norm_apart_dynamic_int8_fused(trained, tmp_path):
    """An fp32 export's sessions leave out onnxruntime's SkipLayerNormalization fusion (slower in these graphs), as
    do a per-row int8 export's; an int8 export of onnxruntime's dynamic quantization keeps it (its rounding moves
    with it). Read from the kernels onnxruntime's profiler saw."""
    _, model, task, fp32 = trained
    exports = {"fp32": fp32}
    for scheme in ("per-row", "dynamic"):
        exports[scheme] = export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / scheme,
                                       int8=scheme)
    ops = {}
    for name, out in exports.items():
        translator = Translator(out, intra_threads=1, profile=str(tmp_path / f"{name}-profile"))
        translator.translate_batch([["w1", "w2", "w3"], ["w5"] * 3])
        trace = json.loads(Path(translator.end_profiling()["pass"]).read_text())
        ops[name] = {e["args"]["op_name"] for e in trace if e.get("cat") == "Node" and "op_name" in e.get("args", {})}
    for name in ("fp32", "per-row"):
        assert "LayerNormalization" in ops[name] and "SkipLayerNormalization" not in ops[name], ops[name]
    assert "MatMulIntegerToFloat" in ops["per-row"] and "DynamicQuantizeMatMul" not in ops["per-row"], ops["per-row"]
    assert "SkipLayerNormalization" in ops["dynamic"] and "DynamicQuantizeMatMul" in ops["dynamic"], ops["dynamic"]


def test_options_default_to_the_export_and_are_checked(trained):
    _, _, _, out = trained
    translator = Translator(out, intra_threads=1)
    assert translator.options().eos_penalty == 0.5
    assert translator.options(eos_penalty=2).eos_penalty == 2.0
    assert isinstance(translator.options(), DecodingConfig) and "lenpen" in RUNTIME_OPTIONS
    assert {k: getattr(translator.options(), k) for k in RUNTIME_OPTIONS} == translator.defaults
    with pytest.raises(DecodingError, match="max_len_b"):
        translator.options(max_len_b=-5)
    with pytest.raises(TypeError, match="rerank_with"):
        translator.options(rerank_with="x.pt")
    with pytest.raises(TranslatorError, match=r"source\[0\]: expected a list of str tokens"):
        translator.translate_batch(["w1 w2"])


def test_max_per_pass_reaches_the_runtime(trained):
    """One option, one field: ``max_per_pass`` given to translate_batch caps every pass's insertions."""
    _, _, task, out = trained
    translator = Translator(out, intra_threads=1)
    lines = [task.source_dictionary.string(s[:-1]).split() for s in sources(task)]
    free = translator.translate_batch(lines)
    assert any(r.iterations[0] < len(r.hypotheses[0]) for r in free)  # some pass inserted several tokens
    one = translator.translate_batch(lines, max_per_pass=1)
    assert all(r.iterations[0] == len(r.hypotheses[0]) for r in one) and any(r.hypotheses[0] for r in one)
    with pytest.raises(DecodingError, match="max_per_pass"):
        translator.translate_batch(lines, max_per_pass=-1)


def test_translate_batch_keeps_the_input_order(trained):
    _, _, task, out = trained
    translator = Translator(out, intra_threads=1)
    lines = [task.source_dictionary.string(s[:-1]).split() for s in sources(task)]
    alone = [translator.translate_batch([line])[0].hypotheses for line in lines]
    together = translator.translate_batch(lines, max_batch_size=5)
    assert [r.hypotheses for r in together] == alone
    assert translator.stats["sentences"] == 2 * len(lines) and translator.stats["passes"] > 0


def test_the_garbage_collector_is_paused_while_decoding_and_restored(trained, monkeypatch):
    """Python's cyclic collector is off inside the decode, and after it as it was before: on, off, and on again
    when the decode raises."""
    _, _, task, out = trained
    translator = Translator(out, intra_threads=1)
    lines = [task.source_dictionary.string(s[:-1]).split() for s in sources(task)[:3]]
    decode, seen = translator._decode_batch, []

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return decode(*args, **kwargs)

    monkeypatch.setattr(translator, "_decode_batch", watched)
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert translator.translate_batch(lines, max_batch_size=1)[0].hypotheses[0]
            assert gc.isenabled() is enabled and seen == [False] * 3
            seen.clear()
        gc.enable()
        monkeypatch.setattr(translator, "_decode_batch", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            translator.translate_batch(lines)
        assert gc.isenabled()
    finally:
        gc.enable()


def test_export_refuses_what_it_does_not_cover(tmp_path_factory, tmp_path):
    root = reverse_data(tmp_path_factory, "joint", 20, 2, 2)
    task, args = build_task(root / "bin", "--share-all-embeddings", "--content-location", "joint")
    model = task.build_model(args).eval()
    with pytest.raises(ExportError, match="content-location joint"):
        export_model(model, task.source_dictionary, task.target_dictionary, tmp_path / "out")


# ---------------------------------------------------------------- the numpy twins of canvas.py
def random_framed(rng, B, W, vocab=(4, 9)):
    f = rng.integers(*vocab, size=(B, W))
    f[:, 0] = 0
    lengths = rng.integers(0, W - 1, size=B)
    for b in range(B):
        f[b, lengths[b] + 1] = 2
        f[b, lengths[b] + 2:] = 1
    return f, lengths


def test_the_loops_canvas_operations_agree_on_numpy_and_torch():
    """The loop's canvas code runs on both backends' arrays (loop.NUMPY, decoding.TORCH): the same results."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        B, W = int(rng.integers(1, 4)), int(rng.integers(2, 12))
        framed, lengths = random_framed(rng, B, W)
        n, neighbours = int(rng.choice([0, 2, 3, 4])), bool(rng.integers(0, 2))
        both = [(L.NUMPY, np.asarray), (TORCH, torch.tensor)]
        got = [bans.repeated_tokens(xp, wrap(framed), n, neighbours, (0, 2), 1) for xp, wrap in both]
        assert np.array_equal(got[0], got[1].numpy())
        canvas = framed[:, 1:-1].copy()
        canvas[canvas == 2] = 1
        got = [L.frame(xp, wrap(canvas), wrap(lengths), 0, 2, 1) for xp, wrap in both]
        assert np.array_equal(got[0], got[1].numpy()) and np.array_equal(got[0], framed)
        S = W - 1
        mask = (rng.random((B, S)) < 0.4) & L.slot_mask(L.NUMPY, lengths, S)
        width = int((lengths + mask.sum(1)).max())
        values = rng.integers(10, 20, size=(B, S))
        got = []
        for xp, wrap in both:
            dest = geometry.insertion_destinations(xp, wrap(lengths), wrap(mask), W - 2, width)
            got.append((dest, geometry.place(xp, dest, wrap(canvas), wrap(values), width, 1)))
        assert np.array_equal(got[0][0], got[1][0].numpy()) and np.array_equal(got[0][1], got[1][1].numpy())
        assert ((got[0][1] != 1).sum(1) == lengths + mask.sum(1)).all()  # every token lands


# ---------------------------------------------------------------- deployment and command lines
BLOCK_TORCH = ("import sys\nfor m in ('torch', 'fairseq'): sys.modules[m] = None\n")


def test_runtime_runs_without_torch_or_fairseq(trained):
    _, _, _, out = trained
    code = BLOCK_TORCH + (
        "from fairseq_insertion.runtime import Translator\n"
        f"r = Translator({str(out)!r}, intra_threads=1).translate_batch([['w1', 'w2', 'w3', 'w4']])\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
        "print(' '.join(r[0].hypotheses[0]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = Translator(out, intra_threads=1).translate_batch([["w1", "w2", "w3", "w4"]])[0].hypotheses[0]
    assert proc.stdout.split() == expected


def run_module(module, *args, stdin=""):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_command_line_writes_one_line_per_input_in_order(trained):
    _, _, _, out = trained
    lines = ["w1 w2 w3", "", "w4 w5 w6 w7 w8", "w9"]
    proc = run_module("fairseq_insertion.runtime", "translate", out, "--batch-size", "2", stdin="\n".join(lines))
    assert proc.returncode == 0, proc.stderr
    translator = Translator(out, intra_threads=1)
    expected = [" ".join(r.hypotheses[0]) for r in translator.translate_batch([x.split() for x in lines])]
    assert proc.stdout.split("\n")[:-1] == expected
    assert "input line 2: empty" in proc.stderr


def test_command_line_errors_are_one_line(trained, tmp_path):
    _, _, _, out = trained
    proc = run_module("fairseq_insertion.runtime", "translate", out, "--max-len-b=-5", stdin="w1\n")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("error: --max-len-b must be an integer >= 0, got -5")
    proc = run_module("fairseq_insertion.runtime", "translate", tmp_path, stdin="w1\n")
    assert proc.returncode == 2 and "not an exported insertion model" in proc.stderr
    proc = run_module("fairseq_insertion.export", "--path", tmp_path / "missing.pt", "--data", tmp_path,
                      "--out", tmp_path / "o")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("missing.pt: not found")
