"""python -m fairseq_insertion.visualize: the alignment of consecutive canvases, and the
pictures of real fairseq-generate histories of a tiny trained model (parallel, greedy
and constrained decoding): one row per iteration plus the initial canvas, each row the
canvas fairseq printed."""

import random
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from fairseq_insertion.visualize import (
    VisualizeError,
    align,
    decode_of,
    insertion_iterations,
    layout,
    read_generate_output,
    text_rows,
    to_svg,
)
from tests.utils import REPO, generate_args, reverse_data, run, train_args, train_once

SVG = "{http://www.w3.org/2000/svg}"


# ---------------------------------------------------------------- alignment
def test_align_takes_the_leftmost_copy_of_a_repeated_token():
    assert align(["a", "b"], ["x", "a", "y", "b", "z"]) == [1, 3]
    assert align(["a"], ["a", "a"]) == [0]  # the right copy is the new one
    assert align(["a", "a"], ["a", "b", "a"]) == [0, 2]
    assert align([], ["a"]) == []
    with pytest.raises(VisualizeError, match="not a subsequence"):
        align(["b", "a"], ["a", "b"])


def _random_decode(rng: random.Random, parallel: bool, vocab: int = 4):
    """A decode under the decoder's default rule: a slot never inserts a copy of either
    neighbour. Returns the canvases after each iteration and the true iteration of each token."""
    canvas, born, history = [], [], []
    for t in range(1, rng.randint(1, 7) + 1):
        slots = list(range(len(canvas) + 1))
        chosen = [s for s in slots if rng.random() < 0.6] if parallel else []
        for s in sorted(chosen or [rng.choice(slots)], reverse=True):  # right to left: slot indices stay valid
            banned = set(canvas[max(s - 1, 0):s + 1])
            canvas.insert(s, rng.choice([f"w{v}" for v in range(vocab) if f"w{v}" not in banned]))
            born.insert(s, t)
        history.append(list(canvas))
    return history, born


@pytest.mark.parametrize("parallel", [True, False])
def test_alignment_recovers_the_true_iterations_under_the_neighbour_rule(parallel):
    """Few distinct tokens, so canvases are full of repeats; the leftmost alignment is still the truth."""
    rng = random.Random(0)
    repeats = 0
    for _ in range(500):
        history, born = _random_decode(rng, parallel)
        assert insertion_iterations(history) == born
        repeats += len(set(history[-1])) < len(history[-1])
    assert repeats > 250  # most cases hold repeated tokens


def test_without_the_rule_a_repeat_is_drawn_as_the_right_copy():
    # ["a"] -> ["a", "a"]: either copy can be the new one; the right one is drawn as new
    assert insertion_iterations([["a"], ["a", "a"]]) == [1, 2]


def test_the_module_imports_neither_torch_nor_fairseq():
    """Loaded on its own (not through the package, whose __init__ registers the plugin)."""
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('v', sys.argv[1]); "
            "m = sys.modules['v'] = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(sorted({'torch', 'fairseq', 'numpy', 'matplotlib'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code, str(REPO / "fairseq_insertion" / "visualize.py")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# ---------------------------------------------------------------- real generate outputs
@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """fairseq-generate outputs with --print-step --retain-iter-history: parallel (two candidates
    each, --nbest 2), greedy, and parallel with a constraints file."""
    root = reverse_data(tmp_path_factory, "visualize", 100, 4, 6)
    train_once(train_args(root / "bin", root / "ckpt", "--max-update", "3", "--no-epoch-checkpoints",
                          "--disable-validation"), root / "bin", root / "ckpt")
    refs = (root / "raw" / "test.tgt").read_text().splitlines()
    lines = [" ".join(refs[0].split()[1:3]),
             "\t".join(refs[1].split()[i] for i in (3, 0)),
             "",
             f"{refs[3].split()[0]} ___ {refs[3].split()[-1]}",
             refs[4].split()[2],
             f"{refs[5].split()[0]} {refs[5].split()[0]}"]
    cfile = root / "constraints.txt"
    cfile.write_text("\n".join(lines) + "\n")
    # the neighbour rule makes the drawn alignment the true one (see visualize's docstring)
    common = ("--print-step", "--retain-iter-history", "--batch-size", "4", "--max-len-a", "0", "--max-len-b", "12",
              "--block-neighbour-copies")
    ckpt = root / "ckpt" / "checkpoint_last.pt"
    out = {}
    for name, extra in [("parallel", ("--eos-penalties", "1,3", "--nbest", "2")),
                        ("greedy", ("--decoding", "greedy", "--eos-penalty", "3")),
                        ("constrained", ("--eos-penalty", "3", "--constraints-file", cfile))]:
        proc = run(generate_args(root / "bin", ckpt, *common, *extra))
        (root / f"{name}.out").write_text(proc.stdout)
        out[name] = root / f"{name}.out"
    return out, [[w for c in line.split("\t") for w in c.split() if w != "___"] for line in lines]


def _history(text: str):
    """{(sentence id, hypothesis index): (iterations, [canvas of each E- line])}, straight from the lines."""
    seen, out = {}, {}
    for line in text.splitlines():
        head, _, rest = line.partition("\t")
        if head.startswith("H-"):
            sid = int(head[2:])
            seen[sid] = seen.get(sid, -1) + 1
            out[sid, seen[sid]] = [None, []]
        elif head.startswith("I-"):
            out[int(head[2:]), seen[int(head[2:])]][0] = int(rest)
        elif head.startswith("E-"):
            sid = int(head[2:].split("_")[0])
            out[sid, seen[sid]][1].append(rest.split())
    return out


def _svg_rows(svg: str):
    """{row: [(kind, text)]} and the output row's [(kind, text, iteration label)] of a picture."""
    root = ET.fromstring(svg)
    rows, output = {}, []
    for g in root.iter(SVG + "g"):
        kind, text = g.get("class").split()[1], g.find(SVG + "text").text
        if g.get("data-row") is None:
            output.append((kind, text))
        else:
            rows.setdefault(int(g.get("data-row")), []).append((kind, text))
    return rows, output


@pytest.mark.parametrize("name", ["parallel", "greedy", "constrained"])
def test_rows_are_the_printed_canvases(outputs, name):
    files, constraints = outputs
    text = files[name].read_text()
    history = _history(text)
    sentences = read_generate_output(text.splitlines())
    assert sorted(sentences) == list(range(6))
    assert len(history) == (12 if name == "parallel" else 6)
    for (sid, k), (iterations, canvases) in history.items():
        d = decode_of(sentences[sid], k)
        assert len(d.rows) == iterations + 1 == len(canvases) + 1
        assert d.rows[1:] == canvases  # so tokens per row = canvas lengths
        assert d.rows[0] == (constraints[sid] if name == "constrained" else [])
        for t in range(1, len(d.rows)):
            new = d.new_in_row(t)
            assert sum(new) == len(d.rows[t]) - len(d.rows[t - 1]) > 0
            if name == "greedy":
                assert sum(new) == 1
            else:  # parallel: at most one token per slot, so two new tokens are never neighbours
                assert not any(a and b for a, b in zip(new, new[1:])), (sid, t, d.rows[t - 1], d.rows[t])
        assert sorted(set(d.iteration)) == list(range(1 if not d.rows[0] else 0, len(d.rows)))

        rows, output = _svg_rows(to_svg(layout(d)))
        assert set(rows) <= set(range(len(d.rows)))
        for t in range(len(d.rows)):
            cells = rows.get(t, [])  # an empty initial canvas draws nothing
            assert [c[1] for c in cells] == d.rows[t]
            assert [c[0] == "new" for c in cells] == (d.new_in_row(t) if t else [False] * len(cells))
            assert [c[0] == "constraint" for c in cells] == [it == 0 for it in d.iteration if it <= t]
        assert [c[1] for c in output] == d.tokens
        lines = text_rows(d)
        assert len(lines) == len(d.rows) + 1


def test_constrained_history_is_drawn_with_its_template(outputs):
    files, constraints = outputs
    d = decode_of(read_generate_output(files["constrained"].read_text().splitlines())[3])
    assert d.tokens[0] == constraints[3][0] and d.tokens[-1] == constraints[3][-1]  # infilled template
    rows, output = _svg_rows(to_svg(layout(d)))
    assert [kind for kind, _ in output].count("constraint") == 2
    assert all(rows[t][0] == ("constraint", constraints[3][0]) for t in rows)
    # a repeated constraint word: both copies are given, in every row
    d5 = decode_of(read_generate_output(files["constrained"].read_text().splitlines())[5])
    assert d5.rows[0] == constraints[5] and sum(d5.given) >= 2


def test_command_line_writes_svg_png_and_text(outputs, tmp_path):
    files, _ = outputs
    svg, png = tmp_path / "d.svg", tmp_path / "d.png"
    proc = subprocess.run([sys.executable, "-m", "fairseq_insertion.visualize", str(files["constrained"]), "--id", "3",
                           "--svg", str(svg), "--png", str(png), "--text"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = decode_of(read_generate_output(files["constrained"].read_text().splitlines())[3])
    assert proc.stdout.splitlines() == text_rows(d)
    assert proc.stdout.splitlines()[0].startswith("  0 | {")  # the constraint tokens, in braces
    assert ET.fromstring(svg.read_text()).tag == SVG + "svg"
    pytest.importorskip("matplotlib")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_output_without_history_is_refused_by_name(outputs):
    files, _ = outputs
    text = "\n".join(line for line in files["greedy"].read_text().splitlines() if not line.startswith("E-"))
    with pytest.raises(VisualizeError, match="--retain-iter-history"):
        decode_of(read_generate_output(text.splitlines())[0])
    with pytest.raises(VisualizeError, match="no hypothesis 1"):
        decode_of(read_generate_output(files["greedy"].read_text().splitlines())[0], 1)


def test_the_readme_picture_is_what_the_committed_command_draws():
    """docs/decode.svg == python -m fairseq_insertion.visualize docs/decode.out --id 0 (docs/visualize.md)."""
    out = (REPO / "docs" / "decode.out").read_text(encoding="utf-8")
    d = decode_of(read_generate_output(out.splitlines())[0])
    assert (REPO / "docs" / "decode.svg").read_text(encoding="utf-8") == to_svg(layout(d))
    assert len(d.rows) == 4 + 1 and len(d.tokens) == 11 and max(d.iteration) == 4  # as the docs say
