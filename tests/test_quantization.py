"""int8 with per-row activation scales (``fairseq_insertion.quantization``, ``export --int8``): every product by a
weight matrix rewritten, the graphs near the fp32 ones, and a sentence's outputs the same alone and inside a batch,
where onnxruntime's dynamic quantization (``--int8 dynamic``) moves them; exports of either scheme and those made
before the scheme was recorded load."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import ExportError, export_model
from fairseq_insertion.export import main as export_main
from fairseq_insertion.export_format import ENCODER, PASS, SETTINGS, source_names
from fairseq_insertion.quantization import WEIGHT_LEVELS, per_row
from fairseq_insertion.runtime import Translator, TranslatorError
from tests.utils import trained_reverse_model

TEST_LINES = 24


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root, model, task = trained_reverse_model(tmp_path_factory, "quantization", TEST_LINES)
    config = DecodingConfig(eos_penalty=0.5)
    out = {"fp32": export_model(model, task.source_dictionary, task.target_dictionary, root / "fp32", config=config)}
    for scheme in ("per-row", "dynamic"):
        out[scheme] = export_model(model, task.source_dictionary, task.target_dictionary, root / scheme, int8=scheme,
                                   config=config)
    return root, task, out


def sentences(task):
    """The test split's sources as pieces, of several lengths."""
    d = task.source_dictionary
    return [[d[i] for i in task.datasets["test"].src[k].tolist() if i != d.eos()] for k in range(TEST_LINES)]


def products(graph: "onnx.GraphProto"):
    """The graph's MatMul nodes by a weight matrix (an initializer with two dimensions over 1) and its Attention."""
    dims = {w.name: tuple(w.dims) for w in graph.initializer}
    matrices = {name for name, shape in dims.items() if len(shape) == 2 and min(shape) > 1}
    return [n for n in graph.node if n.op_type == "Attention" or (n.op_type == "MatMul" and n.input[1] in matrices)]


def test_every_product_by_a_weight_matrix_is_rewritten(exports):
    _, _, out = exports
    for name in (ENCODER, PASS):
        fp32 = onnx.load(str(out["fp32"] / name))
        assert products(fp32.graph), name
        rewritten = onnx.load(str(out["fp32"] / name))
        n = per_row(rewritten)
        onnx.checker.check_model(rewritten)
        ops = [node.op_type for node in rewritten.graph.node]
        assert not products(rewritten.graph) and "Relu" not in ops, (name, ops)
        attentions = sum(node.op_type == "Attention" for node in fp32.graph.node)
        # the fused self-attention becomes three products (q, k, v) of one quantized input
        assert ops.count("MatMulIntegerToFloat") == n + 2 * attentions, name
        assert ops.count("QuantizeLinear") < ops.count("MatMulIntegerToFloat"), name  # shared quantizations
        relus = sum(node.op_type == "Relu" for node in fp32.graph.node)
        assert ops.count("Clip") == relus and ops.count("Abs") == ops.count("QuantizeLinear") - relus, name
        int8 = [w for w in rewritten.graph.initializer if w.data_type == onnx.TensorProto.INT8]
        assert len(int8) == ops.count("MatMulIntegerToFloat"), name
    saved = onnx.load(str(out["per-row"] / PASS))
    assert [n.op_type for n in saved.graph.node] == ops  # the export writes the same rewrite
    location = [n for n in saved.graph.node if n.op_type == "MatMul"]  # the one-column location query stays fp32
    assert len(location) == 1


def encode(path, tokens):
    session = ort.InferenceSession(str(path / ENCODER), providers=["CPUExecutionProvider"])
    return session.run(None, {"src_tokens": tokens})


def test_a_sentences_encoding_is_the_same_alone_and_in_a_batch_per_row_not_dynamic(exports):
    """The encoder's keys and values of each sentence alone against its rows of the padded batch: per-row int8
    exactly; dynamic int8 not (its range is the batch's). Both against fp32 (mean error relative to the mean)."""
    _, task, out = exports
    d = task.source_dictionary
    rows = [task.datasets["test"].src[k].numpy() for k in range(6)]
    width = max(len(r) for r in rows)
    batch = np.full((len(rows), width), d.pad(), dtype=np.int64)
    for i, r in enumerate(rows):
        batch[i, :len(r)] = r
    assert len({len(r) for r in rows}) > 1
    same, error = {}, {}
    results = {scheme: encode(out[scheme], batch) for scheme in ("fp32", "per-row", "dynamic")}
    assert len(results["fp32"]) == len(source_names(2))  # keys and values of the two decoder layers
    for scheme in ("per-row", "dynamic"):
        together = results[scheme]
        same[scheme] = [all(np.array_equal(alone[0], whole[i, :, :len(r)])
                            for alone, whole in zip(encode(out[scheme], r[None]), together))
                        for i, r in enumerate(rows)]
        error[scheme] = max(float(np.abs(got - fp32).mean() / np.abs(fp32).mean())
                            for got, fp32 in zip(together, results["fp32"]))
    assert all(same["per-row"]), same
    assert not all(same["dynamic"]), same
    assert error["per-row"] < 0.03, error
    if cpu_has_vnni():  # exact int8 products: both schemes near fp32 (measured: per-row 1.3%, dynamic 1.2%)
        assert error["dynamic"] < 0.03, error
    else:
        # without VNNI onnxruntime's u8 x s8 products saturate; the rows' own ranges and 7-bit columns do not:
        # closer to fp32 (measured on an AVX2-only Zen 4: 1.4% against 10%)
        assert error["per-row"] < error["dynamic"], error


def cpu_has_vnni() -> bool:
    """Whether this CPU has VNNI (AVX512-VNNI or AVX-VNNI; Linux's /proc/cpuinfo; elsewhere assumed absent)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def test_per_row_int8_translates_the_same_at_every_batch_size(exports):
    _, task, out = exports
    lines = sentences(task)
    translator = Translator(out["per-row"], intra_threads=1)
    got = {b: [r.hypotheses[0] for r in translator.translate_batch(lines, max_batch_size=b)] for b in (1, 5, 24)}
    assert got[1] == got[5] == got[24]
    assert np.mean([len(h) for h in got[1]]) > 1
    fp32 = [r.hypotheses[0] for r in Translator(out["fp32"], intra_threads=1).translate_batch(lines)]
    dynamic = [r.hypotheses[0] for r in Translator(out["dynamic"], intra_threads=1).translate_batch(lines)]
    same = {name: sum(a == b for a, b in zip(hyps, fp32))
            for name, hyps in (("per-row", got[24]), ("dynamic", dynamic))}
    assert same["per-row"] >= 0.6 * len(lines), same
    if cpu_has_vnni():  # measured: 18 and 21 of 24
        assert same["dynamic"] >= 0.6 * len(lines), same
    else:  # the dynamic scheme's products saturate (measured on an AVX2-only Zen 4: 18 and 12 of 24)
        assert same["per-row"] >= same["dynamic"], same


def test_the_scheme_is_recorded_in_the_precision_and_an_unknown_one_refused(exports, tmp_path):
    root, _, out = exports
    for scheme in ("per-row", "dynamic"):
        assert json.loads((out[scheme] / SETTINGS).read_text())["model"]["precision"] == f"int8-{scheme}"
    assert json.loads((out["fp32"] / SETTINGS).read_text())["model"]["precision"] == "fp32"
    other = tmp_path / "other"
    other.mkdir()
    for f in out["dynamic"].iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    settings = json.loads((other / SETTINGS).read_text())
    for precision in ("int8", "int8-per-tensor"):  # the scheme must be named, and be one of the export's
        settings["model"]["precision"] = precision
        (other / SETTINGS).write_text(json.dumps(settings))
        with pytest.raises(TranslatorError, match=r"model\.precision.*must be one of "
                           r"\['fp32', 'int8-per-row', 'int8-dynamic'\]") as e:
            Translator(other)
        assert "\n" not in str(e.value)


def test_an_unknown_scheme_is_refused(exports, capsys):
    root, task, _ = exports
    with pytest.raises(ExportError, match=r"--int8 per-tensor: expected one of \['per-row', 'dynamic'\]"):
        export_model(None, task.source_dictionary, task.target_dictionary, root / "bad", int8="per-tensor")
    with pytest.raises(SystemExit):
        export_main(["--path", "x", "--data", "y", "--out", str(root / "bad"), "--int8", "per-tensor"])
    assert "--int8: invalid choice: 'per-tensor'" in capsys.readouterr().err


def test_weights_are_quantized_per_column(exports):
    """Each int8 weight column uses its range: its largest entry is +-WEIGHT_LEVELS."""
    _, _, out = exports
    graph = onnx.load(str(out["per-row"] / PASS)).graph
    for w in graph.initializer:
        if w.data_type == onnx.TensorProto.INT8:
            q = numpy_helper.to_array(w).astype(np.int32)  # (K, N)
            assert (np.abs(q).max(axis=0) == WEIGHT_LEVELS).all(), w.name


def test_a_product_is_the_exact_integer_sum_of_its_quantized_rows_and_columns():
    """x W rewritten against numpy's integer product of the same quantization: rows at full range against
    columns at full range (where int16 pair sums would saturate on a CPU without VNNI), one row of zeros, and a
    ReLU's output (255 levels from 0)."""
    rng = np.random.default_rng(0)
    K, N = 64, 48
    w = rng.standard_normal((K, N)).astype(np.float32)
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    x[0, 0] = np.sign(x[0, 0]) * 2.0  # every entry at the row's max: every level +-127
    x[1, 2] = 0.0
    init = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w.T.copy(), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"])]
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("y", "h", "z")]
    model = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [2, 3, K])], io, init), opset_imports=[helper.make_opsetid("", 17),
                                                                           helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    assert per_row(model) == 3
    y, h, z = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})

    def reference(a, m, levels):  # the same rounding in numpy, summed in int64
        amax = np.maximum(np.abs(a).max(-1, keepdims=True), 1e-30)
        qa = np.clip(np.rint(a / amax * levels), -levels if levels == 127 else 0, levels).astype(np.int64)
        scale = np.maximum(np.abs(m).max(axis=0), 1e-30) / WEIGHT_LEVELS
        qm = np.clip(np.rint(m / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int64)
        return (qa @ qm) * (amax / levels) * scale

    expected_y = reference(x, w, 127)
    np.testing.assert_allclose(y, expected_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, expected_y, rtol=1e-5, atol=1e-5)
    assert not y[1, 2].any()
    np.testing.assert_allclose(z, reference(np.maximum(h, 0), w.T, 255), rtol=1e-4, atol=1e-4)  # of the int8 h
    assert np.abs(y - x @ w).mean() < 0.02 * np.abs(x @ w).mean()
