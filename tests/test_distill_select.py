"""Choosing the distilled target among the teacher's n-best: the candidate nearest the reference."""

import pytest

from examples.commands import RecipeError
from examples.generate_output import parse_generate_output
from examples.steps import choose_eos_penalty, closest_candidates, distill


def test_the_candidate_nearest_the_reference_is_chosen_bpe_removed():
    candidates = {0: ["ein Hund läuft", "ein Hund ren@@ nt im Park", "Hund"],
                  1: ["eine Frau", "ein Mann"]}
    references = {0: "ein Hund rennt im Park .", 1: "eine Frau singt"}
    assert closest_candidates(candidates, references) == {0: "ein Hund ren@@ nt im Park", 1: "eine Frau"}


def test_ties_go_to_the_earlier_candidate():
    assert closest_candidates({0: ["a b c", "a b c"], 1: ["x", "y"]}, {0: "a b c", 1: "z"}) == {0: "a b c", 1: "x"}


def test_nbest_output_keeps_every_candidate_best_first():
    text = "S-0\tsrc\nT-0\tref\nH-0\t-0.1\tfirst\nH-0\t-0.5\tsecond\nH-1\t-0.2\tonly\n"
    gen = parse_generate_output(text)
    assert gen.hypotheses == {0: "first", 1: "only"}
    assert gen.candidates == {0: ["first", "second"], 1: ["only"]}


def test_unknown_selection_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="select must be one of"):
        distill(tmp_path, tmp_path / "t.pt", tmp_path / "out", select="best")


def test_the_eos_penalty_is_the_smallest_within_a_tenth_of_valids_best():
    calls = []

    def bleu_at(beta: float) -> float:
        calls.append(beta)
        return {3.0: 34.02, 3.5: 34.24, 4.0: 34.29, 4.5: 33.1}[beta]

    beta, bleu = choose_eos_penalty([3.0, 3.5, 4.0, 4.5], bleu_at)
    assert beta == 3.5 and bleu == {"3": 34.02, "3.5": 34.24, "4": 34.29, "4.5": 33.1} and sorted(calls) == calls
    assert choose_eos_penalty([4.0, 3.0, 3.5], bleu_at)[0] == 3.5  # any order
    assert choose_eos_penalty([3.0, 3.5, 4.0], bleu_at, tolerance=0.0)[0] == 4.0  # the maximum
    assert choose_eos_penalty([3.0, 4.0], bleu_at)[0] == 4.0  # 3 lies 0.27 below: not within noise
    assert choose_eos_penalty([2.0, 3.0], {2.0: 30.0, 3.0: 30.1}.get)[0] == 2.0  # exactly 0.1 below counts
