"""The README's plot (python -m benchmarks.speed_plot): one point an engine, precision and batch size of the
results files, its times those of the files, the PNG written; files with no row in common refused."""

import json

import pytest

from benchmarks.speed_plot import main, points
from tests.utils import REPO

RESULTS = [REPO / "benchmarks" / "results" / f"engines_cpu_d256_chain4_groups_sitting{i}.json" for i in (1, 2)]


def test_points_are_the_files_rows(tmp_path):
    pytest.importorskip("matplotlib")
    found = points(RESULTS)
    rows = [{r["name"]: r for r in json.loads(f.read_text())["rows"]} for f in RESULTS]
    assert len(found) == len(rows[0]) == 8
    for p in found:
        assert p["ms"] == [round(1000 * r[p["name"]]["seconds"] / r[p["name"]]["sentences"], 2) for r in rows]
        assert p["bleu"] == round(rows[0][p["name"]]["bleu"], 2)
    assert main(["--png", str(tmp_path / "plot.png"), *map(str, RESULTS)]) == 0
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_files_without_a_common_row_are_refused(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [{"name": "x", "engine": "runtime", "precision": "fp32", "batch": 1,
                                          "bleu": 1.0, "seconds": 1.0, "sentences": 1}]}))
    with pytest.raises(SystemExit, match="no row found in every file"):
        points([RESULTS[0], other])
