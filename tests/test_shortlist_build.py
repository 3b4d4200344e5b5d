"""``python -m fairseq_insertion.shortlist``: the table built from a tiny data-bin against brute-force counts in
plain Python (sets per sentence, read from the raw text), its file, its coverage check and its errors."""

import random
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Set, Tuple

import numpy as np
import pytest
from fairseq.data import Dictionary

from fairseq_insertion import shortlist
from fairseq_insertion.slots import Shortlist
from tests.utils import REPO, preprocess, run

RARE = ("s_rare s0 s0", "t_rare t0")  # a source word of one sentence: fewer translations than K
# a tie of Dice broken by the co-occurrence count against the ids: c(s_tie) = 4; t_b: c = 1 of 2 sentences, Dice
# 2 / 6, and a lower id (more tokens); t_c: c = 2 of 8 sentences, Dice 4 / 12, first
TIE = [("s_tie", "t_c " + "t_b " * 10), ("s_tie", "t_c"), ("s_tie", "t_z"), ("s_tie", "t_z"), ("s0", "t_b " * 10),
       *[("s1", "t_c")] * 6]


def write_corpus(raw: Path, seed: int = 0) -> None:
    """Sources of 12 words, repeats included; targets: most of their words' images, a few noise words, shuffled,
    repeats included; in train one pair more with a rare source word."""
    rng = random.Random(seed)
    image = list(range(12))
    rng.shuffle(image)
    raw.mkdir(parents=True)
    for split, n in (("train", 80), ("valid", 12), ("test", 2)):
        src_lines, tgt_lines = [], []
        for _ in range(n):
            src = [f"s{rng.randrange(12)}" for _ in range(rng.randint(2, 9))]
            tgt = [f"t{image[int(w[1:])]}" for w in src if rng.random() < 0.8]
            tgt += [f"n{rng.randrange(5)}" for _ in range(rng.randint(0, 2))]
            rng.shuffle(tgt)
            src_lines.append(" ".join(src))
            tgt_lines.append(" ".join(tgt or ["n0"]))
        for s_line, t_line in [RARE, *TIE] if split == "train" else ():
            src_lines.append(s_line)
            tgt_lines.append(t_line.strip())
        (raw / f"{split}.src").write_text("".join(f"{line}\n" for line in src_lines))
        (raw / f"{split}.tgt").write_text("".join(f"{line}\n" for line in tgt_lines))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shortlist")
    write_corpus(root / "raw")
    preprocess(root / "raw", root / "bin")
    return root


def sentences(root: Path, split: str, lang: str, d: Dictionary) -> List[List[int]]:
    """The raw text's token ids, without eos: what the binarized split holds."""
    return [[d.index(w) for w in line.split()] for line in (root / "raw" / f"{split}.{lang}").read_text().splitlines()]


def brute_force(src: List[List[int]], tgt: List[List[int]], nspecial: int, k: int) -> Dict[int, List[int]]:
    """Each source id's k best target ids by Dice over sentence sets (ties: more sentences, then the lower id)."""
    c_s: Counter = Counter()
    c_t: Counter = Counter()
    c_st: Counter = Counter()
    for s_line, t_line in zip(src, tgt):
        ss: Set[int] = {s for s in s_line if s >= nspecial}
        ts: Set[int] = {t for t in t_line if t >= nspecial}
        c_s.update(ss)
        c_t.update(ts)
        c_st.update((s, t) for s in ss for t in ts)
    best: Dict[int, List[Tuple[Fraction, int, int]]] = {}
    for (s, t), c in c_st.items():
        best.setdefault(s, []).append((-Fraction(2 * c, c_s[s] + c_t[t]), -c, t))
    return {s: [t for _, _, t in sorted(keys)[:k]] for s, keys in best.items()}


@pytest.mark.parametrize("direction", [("src", "tgt"), ("tgt", "src")])
def test_the_table_is_brute_forces(data, direction):
    src_lang, tgt_lang = direction
    F, K = 7, 5
    given = {"source_lang": src_lang, "target_lang": tgt_lang} if src_lang == "tgt" else {}  # else read from the files
    table = shortlist.build(data / "bin", F, K, **given)
    sd, td = (Dictionary.load(str(data / "bin" / f"dict.{lang}.txt")) for lang in direction)
    src, tgt = sentences(data, "train", src_lang, sd), sentences(data, "train", tgt_lang, td)
    assert table.target_vocab == len(td)
    assert table.translations.shape == (len(sd), K) and table.translations.dtype == np.int64
    expected = np.zeros((len(sd), K), dtype=np.int64)
    for s, ts in brute_force(src, tgt, sd.nspecial, K).items():
        expected[s, :len(ts)] = ts
    np.testing.assert_array_equal(table.translations, expected)
    assert not table.translations[:sd.nspecial].any()  # the specials' rows
    counts = Counter(t for line in tgt for t in line if t >= td.nspecial)
    frequent = sorted(counts, key=lambda t: (-counts[t], t))[:F]
    assert table.frequent.tolist() == frequent and table.frequent.dtype == np.int64


def test_padding_and_unseen_rows(data):
    d = Dictionary.load(str(data / "bin" / "dict.src.txt"))  # joined: the target words are source ids too
    table = shortlist.build(data / "bin", 3, 5)
    rare = table.translations[d.index("s_rare")]
    assert rare.tolist() == [d.index("t_rare"), d.index("t0"), 0, 0, 0]  # Dice 1, then 2 / (1 + c(t0))
    assert not table.translations[[d.index("t_rare"), d.index("n0"), d.eos()]].any()
    assert d.index("t_b") < d.index("t_c")
    assert table.translations[d.index("s_tie")].tolist() == [d.index(w) for w in ("t_z", "t_c", "t_b")] + [0, 0]
    assert len(table.frequent) == 3 and min(table.frequent) >= d.nspecial
    everything = shortlist.build(data / "bin", 1000, 0)  # more than there are target words: the seen ones
    assert everything.translations.shape == (len(d), 0)
    seen = {d.index(w) for line in (data / "raw" / "train.tgt").read_text().split("\n") for w in line.split()}
    assert sorted(everything.frequent.tolist()) == sorted(seen)


def test_save_load_roundtrip(data, tmp_path):
    table = shortlist.build(data / "bin", 4, 3)
    V = table.target_vocab
    table.save(tmp_path / "table")
    back = Shortlist.load(tmp_path / "table", source_vocab=len(table.translations), target_vocab=V)
    np.testing.assert_array_equal(back.frequent, table.frequent)
    np.testing.assert_array_equal(back.translations, table.translations)
    assert back.target_vocab == V
    with pytest.raises(ValueError, match="target dictionary of"):
        Shortlist.load(tmp_path / "table", target_vocab=V + 1)
    with pytest.raises(ValueError, match="source dictionary of"):
        Shortlist.load(tmp_path / "table", source_vocab=V - 1)


def test_cli_writes_the_table_and_checks_coverage(data, tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert shortlist.main(["--data", str(data / "bin"), "--out", str(out), "--frequent", "2", "--translations", "1",
                           "--check", "valid"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].startswith(f"wrote {out}: 2 frequent words")
    d = Dictionary.load(str(data / "bin" / "dict.tgt.txt"))
    table = Shortlist.load(out, len(d), len(d))
    assert table.translations.shape == (len(d), 1)
    src, tgt = sentences(data, "valid", "src", d), sentences(data, "valid", "tgt", d)
    tokens = covered = full = size = 0
    for s_line, t_line in zip(src, tgt):
        allowed = set(range(d.nspecial)) | set(table.frequent.tolist())
        allowed |= {int(t) for s in s_line for t in table.translations[s]}
        hits = sum(t in allowed for t in t_line)
        tokens, covered, full, size = tokens + len(t_line), covered + hits, full + (hits == len(t_line)), \
            size + len(allowed)
    assert 0 < covered < tokens and 0 < full < len(tgt)  # the check can tell
    assert lines[1] == f"valid: tokens covered {covered / tokens:.2%} ({covered} of {tokens})"
    assert lines[2] == f"valid: sentences fully covered {full / len(tgt):.2%} ({full} of {len(tgt)})"
    assert lines[3] == f"valid: mean list size {size / len(tgt):.1f} of {len(d)}"
    c = shortlist.coverage_of(table, shortlist.open_data(data / "bin"), "valid")
    assert (c.tokens, c.covered, c.sentences, c.sentences_covered) == (tokens, covered, len(tgt), full)
    assert c.list_size == pytest.approx(size / len(tgt))


def test_missing_data_bin_is_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    proc = run(["python", "-m", "fairseq_insertion.shortlist", "--data", missing, "--out", tmp_path / "t.npz"],
               check=False, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == [f"python -m fairseq_insertion.shortlist: error: {missing}: no such directory "
                      "(a fairseq-preprocess data-bin is expected)"]
    assert not (tmp_path / "t.npz").exists()


@pytest.mark.parametrize("flags,message", [
    (["--split", "nosuch"], "no nosuch split"),
    (["--check", "nosuch"], "no nosuch split"),
    (["--frequent", "-1"], "--frequent must be an integer >= 0, got -1"),
    (["--translations", "-2"], "--translations must be an integer >= 0, got -2"),
    (["--source-lang", "src"], "give both --source-lang and --target-lang"),
    (["--source-lang", "de", "--target-lang", "en"], "dict.de.txt: no such file"),
])
def test_bad_input_is_one_line_naming_it(data, tmp_path, capsys, flags, message):
    out = tmp_path / "t.npz"
    assert shortlist.main(["--data", str(data / "bin"), "--out", str(out), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert captured.err.startswith("python -m fairseq_insertion.shortlist: error: ") and message in captured.err
    assert not out.exists()


def test_build_refuses_bad_input(data, tmp_path):
    for kwargs, message in [({"frequent": -1}, "--frequent must be"), ({"translations": -1}, "--translations must"),
                            ({"split": "nosuch"}, "no nosuch split")]:
        with pytest.raises(shortlist.ShortlistError, match=message):
            shortlist.build(data / "bin", **kwargs)
    with pytest.raises(shortlist.ShortlistError, match="no such directory"):
        shortlist.build(tmp_path / "nowhere")
