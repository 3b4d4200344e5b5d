"""The exported pass chooses each open slot's token from a shortlist of its best raw scores
(export.shortlist_step): on random tables with many ties it chooses what the PyTorch generator's rule
chooses over the whole table (bos, pad and the blocked tokens excluded, end-of-slot penalised, the
lowest id among equal scores), with the same log-probabilities."""

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import onnxruntime as ort  # noqa: E402
from onnx import TensorProto  # noqa: E402

from fairseq_insertion.export import Graph, _io, shortlist_step  # noqa: E402

BOS, PAD, EOS = 0, 1, 2


def shortlist_session(V: int) -> "ort.InferenceSession":
    g = Graph("shortlist")
    shortlist_step(g, "content", "blocked", "eos_penalty", (BOS, PAD, EOS), V)
    model = g.model([_io("content", TensorProto.FLOAT, ["open", V]), _io("blocked", TensorProto.INT64, ["open", "m"]),
                     _io("eos_penalty", TensorProto.FLOAT, ["open"])],
                    [_io(name, dtype, ["open"]) for name, dtype in (("tokens", TensorProto.INT64),
                                                                     ("log_probs", TensorProto.FLOAT),
                                                                     ("eos_log_probs", TensorProto.FLOAT))],
                    vocab_size=V)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def full_table(content: np.ndarray, blocked: np.ndarray, penalty: np.ndarray):
    """The generator's rule (InsertionGenerator._predict) on the whole (N, V) table."""
    c = torch.from_numpy(content.copy())
    lse = c.logsumexp(-1)
    eos_lp = c[:, EOS] - lse
    c.scatter_(1, torch.from_numpy(blocked), float("-inf"))
    c[:, EOS] -= torch.from_numpy(penalty)
    c[:, BOS] = float("-inf")
    c[:, PAD] = float("-inf")
    best, tok = c.max(-1)
    return tok.numpy(), (best - lse).numpy(), eos_lp.numpy()


@pytest.mark.parametrize("V", [5, 12, 40])
def test_the_shortlist_chooses_as_the_whole_table_with_ties(V):
    session = shortlist_session(V)
    gen = np.random.default_rng(V)
    chosen = set()
    for _ in range(60):
        N, M = int(gen.integers(1, 9)), int(gen.integers(1, 6))
        content = gen.choice([-1.0, 0.0, 0.5, 1.0], size=(N, V)).astype(np.float32)  # many ties
        blocked = gen.integers(3, V, size=(N, M))
        blocked[gen.random((N, M)) < 0.3] = PAD  # pad: nothing blocked in that column
        penalty = gen.choice([0.0, 0.5, 1.0], size=N).astype(np.float32)
        tokens, log_probs, eos_log_probs = session.run(None, {"content": content, "blocked": blocked,
                                                              "eos_penalty": penalty})
        want_tok, want_lp, want_eos = full_table(content, blocked, penalty)
        assert tokens.tolist() == want_tok.tolist()
        np.testing.assert_allclose(log_probs, want_lp, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(eos_log_probs, want_eos, rtol=1e-5, atol=1e-5)
        chosen.update(tokens.tolist())
    assert EOS in chosen and len(chosen) > 2  # both end-of-slot and tokens were chosen
