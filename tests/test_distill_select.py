"""Choosing the distilled target among the teacher's n-best: the candidate nearest the reference."""

import pytest

from examples.commands import RecipeError
from examples.generate_output import parse_generate_output
from examples.steps import closest_candidates, distill


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
