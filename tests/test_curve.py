"""examples.multi30k.curve: the stages' valid BLEU at their rule's beta, read from results files."""

import json

from examples.multi30k.curve import main, points


def write(folder, name, beta, valid, machine="2-core AMD EPYC", **extra):
    scores = [{"subset": "valid", "beta": b, "bleu": v} for b, v in valid.items()]
    (folder / name).write_text(json.dumps({"eos_penalty_by_rule": beta, "scores": scores,
                                           "training_machine": machine, **extra}))


def test_each_stage_at_its_rules_beta_and_the_device_it_trained_on(tmp_path):
    write(tmp_path, "chain3600_stage2_seed15.json", 3.0, {2.5: 35.1, 3.0: 35.69},
          stage1={"valid": 34.43, "test": 34.46, "beta": 3, "seed": 13})
    write(tmp_path, "chain3600_stage5_seed19.json", 2.5, {2.5: 37.53, 3.0: 37.59}, machine="one NVIDIA H200")
    write(tmp_path, "chain3600_stage5_unscored.json", None, {})
    found = [(p["stage"], p["seed"], p["updates"], p["valid"], p["device"]) for p in points(tmp_path)]
    assert found == [(1, 13, 1800, 34.43, "cpu"), (2, 15, 3600, 35.69, "cpu"), (5, 19, 9000, 37.53, "gpu")]
    png = tmp_path / "curve.png"
    assert main(["--results", str(tmp_path), "--png", str(png), "--teacher", "teacher", "37.17"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_another_chain_with_its_valid_by_beta(tmp_path):
    """--chain 5400: that chain's files, their valid BLEU from ``valid_by_beta`` at the rule's beta; stage 1's own."""
    for stage, seed, beta, valid in ((1, 13, 3.0, {"2.5": 33.59, "3": 33.72}), (4, 17, 2.5, {"2.5": 36.71, "3": 36.7})):
        (tmp_path / f"chain5400_stage{stage}_seed{seed}.json").write_text(json.dumps(
            {"eos_penalty_by_rule": beta, "valid_by_beta": valid, "training_machine": "Zen 4"}))
    write(tmp_path, "chain3600_stage2_seed15.json", 3.0, {3.0: 35.69}, stage1={"valid": 34.43, "seed": 13})
    found = [(p["stage"], p["seed"], p["updates"], p["valid"]) for p in points(tmp_path, "5400")]
    assert found == [(1, 13, 1800, 33.72), (4, 17, 7200, 36.71)]
    png = tmp_path / "curve.png"
    assert main(["--results", str(tmp_path), "--png", str(png), "--chain", "3600", "5400"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_no_scored_stage_is_an_error(tmp_path, capsys):
    assert main(["--results", str(tmp_path), "--png", str(tmp_path / "x.png")]) == 1
    assert "no scored" in capsys.readouterr().err
