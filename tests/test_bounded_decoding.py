"""Decoding stops within its bound for any weights and input (property test with
random tiny models, including one biased never to emit end-of-slot)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_insertion.generator import InsertionGenerator
from tests.utils import build_task, never_end_slot, random_source_batch, reverse_data

MAX_POSITIONS = 16  # so the position limit (16 - 2 boundary markers) binds before --max-len-b can


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "bounded", 20, 4, 4)
    return build_task(root / "bin", "--max-target-positions", MAX_POSITIONS)


@settings(max_examples=40, deadline=None, derandomize=True)  # same examples every run
@given(seed=st.integers(0, 2**16), decoding=st.sampled_from(["parallel", "greedy"]), never_stop=st.booleans(),
       max_len_b=st.integers(0, 30), max_iterations=st.integers(0, 20),
       src_lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_decoding_stops_within_the_bound(setup, seed, decoding, never_stop, max_len_b, max_iterations, src_lengths):
    task, args = setup
    torch.manual_seed(seed)
    model = task.build_model(args).eval()
    d = task.target_dictionary
    if never_stop:  # end-of-slot never wins
        never_end_slot(model, d)
    # n real tokens plus eos (empty lines: test_bad_input.py)
    sample = random_source_batch(d, src_lengths)
    B = len(src_lengths)
    gen = InsertionGenerator(d, decoding=decoding, max_len_a=0, max_len_b=max_len_b, max_iterations=max_iterations)
    hypos = gen.generate([model], sample)
    limit = min(max_len_b, MAX_POSITIONS - 2)
    assert len(hypos) == B
    for [h] in hypos:
        n = len(h["tokens"]) - 1
        assert n <= limit and h["tokens"][-1] == d.eos()
        assert d.eos() not in h["tokens"][:-1].tolist() and d.pad() not in h["tokens"].tolist()
        assert h["steps"] <= (max_iterations or limit)
        if never_stop and not max_iterations:
            assert n == limit  # it runs until the length limit, not forever
