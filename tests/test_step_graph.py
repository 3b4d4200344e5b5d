"""The step graph (``export --step-graph``, ``Translator(..., step_graph=True)``): one onnxruntime run a pass, from
the active canvases to the next ones, the loop's own step emitted into the graph; and the loop graph
(``step_graph="loop"``): that step as the body of an ONNX Loop, one run a batch. A tiny trained model (d 64)
exported with them for each set of structural options decodes its test sentences as the pass-graph runtime and the
PyTorch generator do, token for token and scores close, at batch 1 and 7, with the repetition rules off and on, with
close-ended slots and an iteration bound, greedy, and with a length limit that many sentences reach; every pass is
then one run of the step graph (every batch one of the loop graph) and none of the pass graph; also with several EOS
penalties and first insertions, and int8. An export without them loads and decodes as before; options they were not
exported for take the pass graph."""

import json
from typing import Any, Dict

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from fairseq_insertion import loop as L  # noqa: E402
from fairseq_insertion.config import RUNTIME_OPTIONS, DecodingConfig  # noqa: E402
from fairseq_insertion.export import ExportError, export_model  # noqa: E402
from fairseq_insertion.export_format import CHECKED, LOOP_GRAPH, STEP  # noqa: E402
from fairseq_insertion.runtime import Translator, TranslatorError  # noqa: E402
from fairseq_insertion.slots import Shortlist  # noqa: E402
from tests.test_runtime import generator_hypotheses, run_module, sources  # noqa: E402
from tests.utils import trained_reverse_model  # noqa: E402

TEST_LINES = 24
# the structural options each export's step graph is built for; the rest are options of a call
EXPORTS = {"off": {}, "on": {"block_neighbour_copies": True, "no_repeat_ngram_size": 3},
           "closed": {"close_ended_slots": True}, "greedy": {"decoding": "greedy", "no_repeat_ngram_size": 2}}
LIMITS = {"default": {"eos_penalty": 0.5}, "short": {"max_len_a": 0.5, "max_len_b": 0, "eos_penalty": 2.0}}


class Counted:
    """An onnxruntime session that counts its runs."""

    def __init__(self, session: Any):
        self.session, self.runs = session, 0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.runs += 1
        return self.session.run(*args, **kwargs)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return trained_reverse_model(tmp_path_factory, "step_graph", TEST_LINES)


@pytest.fixture(scope="module")
def exports(model):
    """One export with the step graph per set of structural options, and one without (the ``off`` options)."""
    root, m, task = model
    out = {name: export_model(m, task.source_dictionary, task.target_dictionary, root / f"step_{name}",
                              config=DecodingConfig(eos_penalty=0.5, **options), step=True)
           for name, options in EXPORTS.items()}
    out["plain"] = export_model(m, task.source_dictionary, task.target_dictionary, root / "plain",
                                config=DecodingConfig(eos_penalty=0.5))
    return out


def counted(translator: Translator) -> Translator:
    for name in ("_pass", "_step", "_loop"):
        if getattr(translator, name) is not None:
            setattr(translator, name, Counted(getattr(translator, name)))
    return translator


def runs(translator: Translator) -> int:
    """The runs of the step or the loop graph, the one loaded."""
    return (translator._step or translator._loop).runs


def batches(batch: int) -> int:
    return -(-TEST_LINES // batch)


def decode_all(translator: Translator, task, config: DecodingConfig, batch: int):
    """Every test sentence's candidates: (ids, score, iterations), best first."""
    opts = translator.options(**{k: getattr(config, k) for k in RUNTIME_OPTIONS})
    return [[(c.ids.tolist(), c.score, c.iterations) for c in found]
            for found in translator.translate_ids([s.numpy() for s in sources(task)], batch, opts)]


def check_same(got, expected) -> None:
    assert [[c[0] for c in g] for g in got] == [[c[0] for c in e] for e in expected]
    assert [[c[2] for c in g] for g in got] == [[c[2] for c in e] for e in expected]
    np.testing.assert_allclose([c[1] for g in got for c in g], [c[1] for e in expected for c in e],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", [True, "loop"])
@pytest.mark.parametrize("limit", sorted(LIMITS))
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("which", sorted(EXPORTS))
def test_the_step_graph_gives_the_pass_graphs_and_the_generators_hypotheses(model, exports, which, batch, limit,
                                                                            mode):
    _, m, task = model
    config = DecodingConfig(max_iterations=3 if which == "closed" else 0, **EXPORTS[which], **LIMITS[limit])
    stepping = counted(Translator(exports[which], intra_threads=1, step_graph=mode))
    passing = counted(Translator(exports[which], intra_threads=1))
    got, expected = decode_all(stepping, task, config, batch), decode_all(passing, task, config, batch)
    check_same(got, expected)
    assert stepping._pass.runs == 0 and stepping.stats["passes"] == passing._pass.runs > 0
    assert runs(stepping) == (batches(batch) if mode == "loop" else passing._pass.runs)
    lengths = np.asarray([len(c[0][0]) for c in got])
    assert lengths.mean() > 1
    if limit == "short":
        max_len = L.length_limit(L.NUMPY, np.asarray([len(s) for s in sources(task)]), config, 1000)  # (B,)
        reached = (lengths == max_len).sum()
        assert reached >= (1 if which == "closed" else 5)  # with 3 iterations few reach it
    generated = generator_hypotheses(m, task, config, batch)
    assert [c[0][0] for c in got] == [e[0] for e in generated]
    np.testing.assert_allclose([c[0][1] for c in got], [e[1] for e in generated], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", [True, "loop"])
def test_candidates_decode_through_the_step_graph(model, exports, mode):
    """Several EOS penalties (each row its own) and first insertions (the first pass by the pass graph)."""
    _, _, task = model
    config = DecodingConfig(eos_penalties=(0.0, 0.5, 2.0), first_insertions=2, **EXPORTS["on"])
    stepping = counted(Translator(exports["on"], intra_threads=1, step_graph=mode))
    got = decode_all(stepping, task, config, 5)
    check_same(got, decode_all(Translator(exports["on"], intra_threads=1), task, config, 5))
    assert stepping._pass.runs == batches(5)  # one first-insertion pass a batch
    assert runs(stepping) == batches(5) if mode == "loop" else runs(stepping) > batches(5)
    assert all(len(c) == 6 for c in got) and np.mean([len(c[0][0]) for c in got]) > 1


def test_int8_step_and_loop_graphs_decode_as_the_int8_pass_graph(model, tmp_path):
    """Per-row int8 (the default): the step and the loop graph exactly, though the loop's batch keeps its finished
    rows (each row's activations are quantized on their own). onnxruntime's dynamic int8: the step graph exactly,
    the loop graph to the same tokens here and its scores within 0.1 (its activations' range is the batch's)."""
    root, m, task = model
    config = DecodingConfig(eos_penalty=0.5, **EXPORTS["on"])
    for scheme in ("per-row", "dynamic"):
        out = export_model(m, task.source_dictionary, task.target_dictionary, tmp_path / scheme, int8=scheme,
                           config=config, step=True)
        assert json.loads((out / "settings.json").read_text())["model"]["precision"] == "int8"
        expected = decode_all(Translator(out, intra_threads=1), task, config, 7)
        assert np.mean([len(c[0][0]) for c in expected]) > 1
        for mode in (True, "loop"):
            stepping = counted(Translator(out, intra_threads=1, step_graph=mode))
            got = decode_all(stepping, task, config, 7)
            if mode is True or scheme == "per-row":
                check_same(got, expected)
            else:
                assert [[c[0] for c in g] for g in got] == [[c[0] for c in e] for e in expected]
                np.testing.assert_allclose([g[0][1] for g in got], [e[0][1] for e in expected], atol=0.1)
            assert stepping._pass.runs == 0 and runs(stepping) > 0


def test_options_the_step_graph_was_not_exported_for_take_the_pass_graph(model, exports):
    _, _, task = model
    config = DecodingConfig(eos_penalty=0.5, no_repeat_ngram_size=2)
    expected = decode_all(Translator(exports["off"], intra_threads=1), task, config, 7)
    for mode in (True, "loop"):
        stepping = counted(Translator(exports["off"], intra_threads=1, step_graph=mode))
        check_same(decode_all(stepping, task, config, 7), expected)
        assert runs(stepping) == 0 and stepping._pass.runs > 0
        results = stepping.translate_batch([["w1", "w2", "w3"]], constraints=[[["w3"]]])  # constrained: the pass graph
        assert "w3" in results[0].hypotheses[0] and runs(stepping) == 0
        # the stats say which path decoded each batch, and why the others fell back
        path = "loop" if mode == "loop" else "step"
        assert stepping.stats["pass_batches"] == batches(7) + 1 and stepping.stats[f"{path}_batches"] == 0
        assert stepping.stats["fallbacks"] == {"no_repeat_ngram_size differ from the options it was exported for":
                                               batches(7), "the canvases start from constraints": 1}
        decode_all(stepping, task, DecodingConfig(eos_penalty=0.5), 7)
        assert stepping.stats[f"{path}_batches"] == batches(7) and stepping.stats["pass_batches"] == batches(7) + 1


def test_an_export_without_the_step_graph_loads_and_decodes_as_before(model, exports):
    _, _, task = model
    plain = exports["plain"]
    settings: Dict[str, Any] = json.loads((plain / "settings.json").read_text())
    assert not (plain / STEP).exists() and not (plain / LOOP_GRAPH).exists() and "step" not in settings
    assert set(settings["files"]) == set(CHECKED)
    with_step = json.loads((exports["off"] / "settings.json").read_text())
    assert with_step["step"] == {"graph": STEP, "loop": LOOP_GRAPH, "decoding": "parallel",
                                 "block_neighbour_copies": False, "no_repeat_ngram_size": 0, "close_ended_slots": False}
    assert set(with_step["files"]) == {*CHECKED, STEP, LOOP_GRAPH}
    for name in ("encoder.onnx", "pass.onnx"):  # the step graph adds a file and changes none
        assert with_step["files"][name] == settings["files"][name]
    config = DecodingConfig(eos_penalty=0.5)
    before = decode_all(Translator(plain, intra_threads=1), task, config, 7)
    check_same(decode_all(Translator(exports["off"], intra_threads=1, step_graph=True), task, config, 7), before)
    with pytest.raises(TranslatorError, match="holds no step graph"):
        Translator(plain, step_graph=True)
    with pytest.raises(TranslatorError, match="step_graph: expected True, False or 'loop'"):
        Translator(plain, step_graph="yes")


def test_export_again_without_the_step_graph_removes_it(model, tmp_path):
    _, m, task = model
    out = export_model(m, task.source_dictionary, task.target_dictionary, tmp_path / "out", step=True)
    assert (out / STEP).stat().st_size > 0 and (out / LOOP_GRAPH).stat().st_size > 0
    export_model(m, task.source_dictionary, task.target_dictionary, out)
    assert not (out / STEP).exists() and not (out / LOOP_GRAPH).exists()
    Translator(out, intra_threads=1).translate_batch([["w1", "w2"]])
    shortlist = Shortlist(np.arange(4, 10), np.zeros((len(task.source_dictionary), 2), np.int64),
                          len(task.target_dictionary))
    with pytest.raises(ExportError, match="without --shortlist"):
        export_model(m, task.source_dictionary, task.target_dictionary, tmp_path / "listed", shortlist=shortlist,
                     step=True)


def test_a_changed_step_record_is_refused(exports, tmp_path):
    import shutil

    out = shutil.copytree(exports["off"], tmp_path / "copy")
    settings = json.loads((out / "settings.json").read_text())
    settings["step"]["no_repeat_ngram_size"] = -1
    (out / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(TranslatorError, match="step.no_repeat_ngram_size"):
        Translator(out)
    (out / LOOP_GRAPH).write_bytes(b"")
    with pytest.raises(TranslatorError, match="loop.onnx: missing or empty"):
        Translator(out)


def test_the_command_line_exports_the_step_and_loop_graphs(model, tmp_path):
    root, _, task = model
    proc = run_module("fairseq_insertion.export", "--path", root / "ckpt" / "checkpoint_last.pt", "--data",
                      root / "bin", "--out", tmp_path / "out", "--step-graph", "--no-repeat-ngram-size", "2")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out" / "settings.json").read_text())["step"]
    assert record["no_repeat_ngram_size"] == 2 and record["loop"] == LOOP_GRAPH
    config = DecodingConfig(no_repeat_ngram_size=2)
    expected = decode_all(Translator(tmp_path / "out", intra_threads=1), task, config, 7)
    check_same(decode_all(Translator(tmp_path / "out", intra_threads=1, step_graph="loop"), task, config, 7), expected)
