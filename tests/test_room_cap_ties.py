"""The room cap (at most ``room`` insertions into a canvas in one pass) keeps the highest-scoring slots and,
among equal scores, the leftmost ones, the same in the PyTorch generator and the numpy runtime."""

import numpy as np
import torch

from fairseq_insertion.decoding import _cap
from fairseq_insertion.runtime import SlotScores, parallel_step

EOS = 2


def runtime_cap(insert: np.ndarray, score: np.ndarray, room: np.ndarray) -> np.ndarray:
    tokens = np.where(insert, 7, EOS)
    p = SlotScores(open=np.ones_like(insert), tokens=tokens, log_probs=score, location=np.zeros_like(score),
                   final_eos=np.zeros(len(score), bool))
    return parallel_step(p, room, EOS).mask


def test_ties_at_the_cap_keep_the_leftmost_slots():
    insert = torch.tensor([[True, True, True, True, False, True]])
    score = torch.tensor([[-1.0, -0.5, -0.5, -0.5, 0.0, -0.5]])
    kept = _cap(insert, score, torch.tensor([2]))
    assert kept.tolist() == [[False, True, True, False, False, False]]
    assert runtime_cap(insert.numpy(), score.numpy(), np.array([2])).tolist() == kept.tolist()


def test_torch_and_numpy_caps_agree_on_random_tables_with_ties():
    gen = np.random.default_rng(0)
    for _ in range(200):
        A, S = gen.integers(1, 6), gen.integers(1, 40)
        insert = gen.random((A, S)) < 0.8
        score = gen.choice([-3.0, -2.0, -1.0, -0.5], size=(A, S)).astype(np.float32)  # many ties
        room = gen.integers(0, S + 1, size=A)
        want = _cap(torch.from_numpy(insert), torch.from_numpy(score), torch.from_numpy(room)).numpy()
        got = runtime_cap(insert, score, room) if (insert.sum(1) > room).any() else insert & True
        assert (got == want).all()
        assert (want.sum(1) == np.minimum(insert.sum(1), room)).all()
