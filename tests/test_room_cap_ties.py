"""The room cap (at most ``room`` insertions into a canvas in one pass) keeps the highest-scoring slots and,
among equal scores, the leftmost ones: the one parallel step rule (fairseq_insertion.loop) on numpy arrays
(the runtime) and on torch tensors (the PyTorch generator), against a plain sort of each row."""

import numpy as np
import torch

from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.loop import state, steps

EOS = 2


def parallel(xp, wrap, insert: np.ndarray, score: np.ndarray, room: np.ndarray) -> np.ndarray:
    """The parallel step's slots on one backend, for a table whose slots are all open."""
    p = state.SlotScores(open=wrap(np.ones_like(insert)), tokens=wrap(np.where(insert, 7, EOS)), log_probs=wrap(score),
                     location=wrap(np.zeros_like(score)), final_eos=wrap(np.zeros(len(score), np.float32)))
    return np.asarray(steps.ParallelStep(xp, EOS)(p, wrap(room)).mask)


def by_sorting(insert: np.ndarray, score: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Each row's candidate slots sorted by (-score, slot), the first ``room`` kept."""
    kept = np.zeros_like(insert)
    for a in range(len(insert)):
        slots = sorted(np.flatnonzero(insert[a]).tolist(), key=lambda s: (-score[a, s], s))
        kept[a, slots[:room[a]]] = True
    return kept


BACKENDS = [(L.NUMPY, np.asarray), (TORCH, torch.from_numpy)]


def test_ties_at_the_cap_keep_the_leftmost_slots():
    insert = np.array([[True, True, True, True, False, True]])
    score = np.array([[-1.0, -0.5, -0.5, -0.5, 0.0, -0.5]], np.float32)
    for xp, wrap in BACKENDS:
        assert parallel(xp, wrap, insert, score, np.array([2])).tolist() == [[False, True, True, False, False, False]]


def test_both_backends_keep_the_same_slots_on_random_tables_with_ties():
    gen = np.random.default_rng(0)
    for _ in range(200):
        A, S = gen.integers(1, 6), gen.integers(1, 40)
        insert = gen.random((A, S)) < 0.8
        score = gen.choice([-3.0, -2.0, -1.0, -0.5], size=(A, S)).astype(np.float32)  # many ties
        room = gen.integers(0, S + 1, size=A)
        want = by_sorting(insert, score, room)
        for xp, wrap in BACKENDS:
            assert (parallel(xp, wrap, insert, score, room) == want).all()
        assert (want.sum(1) == np.minimum(insert.sum(1), room)).all()
