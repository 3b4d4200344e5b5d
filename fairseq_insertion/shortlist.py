"""Build a lexical shortlist table (:class:`fairseq_insertion.slots.Shortlist`) from a fairseq data-bin:

    python -m fairseq_insertion.shortlist --data DATA-BIN --out TABLE.npz [--frequent 200] [--translations 50] \
        [--split train] [--source-lang SRC --target-lang TGT] [--check valid]

The table holds the F most frequent target words (``frequent``) and each source word's K best target words
by Dice over the split's sentence pairs (``translations`` (source V, K), padded with 0; ties: more sentences,
then the lower id), the specials aside. ``--check SPLIT`` reports the share of that split's reference tokens
found in their sentence's list (:func:`fairseq_insertion.slots.shortlist_rows`). docs/decoding.md has more.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from fairseq.data import Dictionary, data_utils, indexed_dataset

from .errors import InsertionError
from .slots import Shortlist, shortlist_rows

PROG = "python -m fairseq_insertion.shortlist"
CHECK_BATCH = 1024  # sentences per shortlist_rows call in --check: a (B, V) table each


class ShortlistError(InsertionError):
    """Input that cannot give a table: the message names it."""


class Side(NamedTuple):
    """One side of a split: every sentence's tokens, concatenated."""

    tokens: np.ndarray  # (N,) int64 token ids, eos included
    lengths: np.ndarray  # (B,) int64 each sentence's length

    @property
    def sentence(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.lengths)), self.lengths)  # (N,) each token's sentence


class DataBin(NamedTuple):
    """A data-bin's directory, language pair and dictionaries."""

    path: Path
    source_lang: str
    target_lang: str
    source: Dictionary
    target: Dictionary


class Coverage(NamedTuple):
    """``--check``: how a table covers a split's references."""

    tokens: int  # reference tokens, eos aside
    covered: int  # of them in their sentence's list
    sentences: int
    sentences_covered: int  # sentences whose tokens are all in their list
    list_size: float  # mean list size per sentence


def open_data(data: Path, source_lang: Optional[str] = None, target_lang: Optional[str] = None) -> DataBin:
    """``data``'s language pair (read from its file names, as fairseq does, when not given) and dictionaries."""
    if not data.is_dir():
        raise ShortlistError(f"{data}: no such directory (a fairseq-preprocess data-bin is expected)")
    if (source_lang is None) != (target_lang is None):
        raise ShortlistError("give both --source-lang and --target-lang, or neither")
    if source_lang is None:
        source_lang, target_lang = data_utils.infer_language_pair(str(data))
        if source_lang is None:
            raise ShortlistError(f"{data}: no SPLIT.SRC-TGT.LANG.idx file to read the language pair from "
                                 "(give --source-lang and --target-lang)")
    dicts = []
    for lang in (source_lang, target_lang):
        path = data / f"dict.{lang}.txt"
        if not path.is_file():
            raise ShortlistError(f"{path}: no such file (the data-bin's {lang} dictionary)")
        dicts.append(Dictionary.load(str(path)))
    return DataBin(data, source_lang, target_lang, *dicts)


def split_prefix(d: DataBin, split: str) -> str:
    """The path prefix of ``split``'s files, ``SPLIT.SRC-TGT.`` or ``SPLIT.TGT-SRC.``, as fairseq looks for them."""
    for pair in (f"{d.source_lang}-{d.target_lang}", f"{d.target_lang}-{d.source_lang}"):
        prefix = str(d.path / f"{split}.{pair}.")
        if all(indexed_dataset.dataset_exists(prefix + lang, impl=None) for lang in (d.source_lang, d.target_lang)):
            return prefix
    raise ShortlistError(f"{d.path}: no {split} split ({split}.{d.source_lang}-{d.target_lang}."
                         f"{{{d.source_lang},{d.target_lang}}}.{{idx,bin}})")


def read_split(d: DataBin, split: str) -> Tuple[Side, Side]:
    """``split``'s source and target sides, read by fairseq's ``load_indexed_dataset``."""
    prefix = split_prefix(d, split)
    sides: List[Side] = []
    for lang, dictionary in ((d.source_lang, d.source), (d.target_lang, d.target)):
        dataset = data_utils.load_indexed_dataset(prefix + lang, dictionary)
        if dataset is None:
            raise ShortlistError(f"{prefix + lang}: not a fairseq indexed dataset")
        items = [dataset[i].numpy() for i in range(len(dataset))]
        tokens = np.concatenate(items).astype(np.int64) if items else np.zeros(0, np.int64)  # (N,)
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= len(dictionary)):
            raise ShortlistError(f"{prefix + lang}: token ids outside dict.{lang}.txt's {len(dictionary)} entries "
                                 "(binarized with another dictionary?)")
        sides.append(Side(tokens, np.fromiter((len(x) for x in items), np.int64, len(items))))
    if len(sides[0].lengths) != len(sides[1].lengths):
        raise ShortlistError(f"{prefix}*: {len(sides[0].lengths)} source sentences but {len(sides[1].lengths)} "
                             "target ones")
    return sides[0], sides[1]


def sentence_types(side: Side, vocab: int, nspecial: int) -> Tuple[np.ndarray, np.ndarray]:
    """Each sentence's distinct non-special tokens: (sentence (M,), token (M,)), by sentence then id."""
    codes = np.unique(side.sentence * vocab + side.tokens)  # (M,) sentence * V + token, each once
    sentence, token = codes // vocab, codes % vocab
    keep = token >= nspecial
    return sentence[keep], token[keep]


def cooccurrences(src: Side, tgt: Side, vs: int, vt: int, s_special: int, t_special: int
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sentence counts: (pair source ids (P,), pair target ids (P,), c(s, t) (P,), c(s) (vs,), c(t) (vt,)),
    the pairs those seen, by source then target id; specials aside."""
    s_sent, s_tok = sentence_types(src, vs, s_special)  # (Ms,) each
    t_sent, t_tok = sentence_types(tgt, vt, t_special)  # (Mt,) each
    B = len(src.lengths)
    t_count = np.bincount(t_sent, minlength=B)  # (B,) distinct target words per sentence
    t_start = np.cumsum(t_count) - t_count  # (B,) where a sentence's target words begin in t_tok
    repeat = t_count[s_sent]  # (Ms,) each source word meets its sentence's target words
    ends = np.cumsum(repeat)  # (Ms,)
    within = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - repeat, repeat)  # (P0,)
    pair_s = np.repeat(s_tok, repeat)  # (P0,)
    pair_t = t_tok[np.repeat(t_start[s_sent], repeat) + within]  # (P0,)
    codes, counts = np.unique(pair_s * vt + pair_t, return_counts=True)  # (P,) each
    return (codes // vt, codes % vt, counts.astype(np.int64), np.bincount(s_tok, minlength=vs),
            np.bincount(t_tok, minlength=vt))


def best_translations(pair_s: np.ndarray, pair_t: np.ndarray, pair_count: np.ndarray, s_count: np.ndarray,
                      t_count: np.ndarray, k: int) -> np.ndarray:
    """(vs, k) each source id's k best target ids by Dice (ties: the higher c(s, t), then the lower id), 0 after."""
    table = np.zeros((len(s_count), k), dtype=np.int64)  # (vs, K)
    if not len(pair_s) or not k:
        return table
    dice = 2.0 * pair_count / (s_count[pair_s] + t_count[pair_t])  # (P,) exact ties stay ties: one rounding each
    order = np.lexsort((pair_t, -pair_count, -dice, pair_s))  # by source, then best first
    s, t = pair_s[order], pair_t[order]  # (P,) each
    rank = np.arange(len(s)) - np.searchsorted(s, s, side="left")  # (P,) the place in its source's list
    keep = rank < k
    table[s[keep], rank[keep]] = t[keep]
    return table


def check_sizes(frequent: int, translations: int) -> None:
    for name, value in (("--frequent", frequent), ("--translations", translations)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ShortlistError(f"{name} must be an integer >= 0, got {value!r}")


def build(data: Union[Path, DataBin], frequent: int = 200, translations: int = 50, split: str = "train",
          source_lang: Optional[str] = None, target_lang: Optional[str] = None) -> Shortlist:
    """The shortlist table of ``data``'s ``split`` (the module's docstring), ``data`` a data-bin's path or one
    :func:`open_data` opened; :class:`ShortlistError` names bad input."""
    d = data if isinstance(data, DataBin) else open_data(Path(data), source_lang, target_lang)
    check_sizes(frequent, translations)
    src, tgt = read_split(d, split)
    vs, vt = len(d.source), len(d.target)
    pair_s, pair_t, pair_count, s_count, t_count = cooccurrences(src, tgt, vs, vt, d.source.nspecial, d.target.nspecial)
    counts = np.bincount(tgt.tokens, minlength=vt)  # (vt,) the frequent: the target ids of most tokens, specials aside
    counts[:d.target.nspecial] = 0
    ids = np.lexsort((np.arange(vt), -counts))[:frequent]  # most tokens first, then the lower id
    return Shortlist(frequent=ids[counts[ids] > 0].astype(np.int64),  # unseen ids aside
                     translations=best_translations(pair_s, pair_t, pair_count, s_count, t_count, translations),
                     target_vocab=vt)


def coverage_of(table: Shortlist, d: DataBin, split: str) -> Coverage:
    """How ``table`` covers ``split``'s references: each sentence's list from its source (no constraints)."""
    src, tgt = read_split(d, split)
    held = (d.target.bos(), d.target.pad(), d.target.eos(), d.target.unk())  # every list holds them
    V, B = table.target_vocab, len(src.lengths)
    s_sent, t_sent = src.sentence, tgt.sentence  # (Ns,), (Nt,)
    width = int(src.lengths.max()) if B else 0
    padded = np.full((B, width), d.source.pad(), dtype=np.int64)  # (B, S) right-padded sources
    padded[s_sent, np.arange(len(s_sent)) - np.repeat(np.cumsum(src.lengths) - src.lengths, src.lengths)] = src.tokens
    words = tgt.tokens != d.target.eos()  # (Nt,) the reference's tokens, eos aside
    covered = np.zeros(len(tgt.tokens), dtype=bool)  # (Nt,)
    size = 0
    for start in range(0, B, CHECK_BATCH):
        rows = shortlist_rows(table, padded[start:start + CHECK_BATCH], held)  # (b, L), V after the list
        member = np.zeros((len(rows), V + 1), dtype=bool)  # (b, V + 1)
        member[np.arange(len(rows))[:, None], rows] = True
        member[:, V] = False
        size += int((rows < V).sum())
        here = (t_sent >= start) & (t_sent < start + CHECK_BATCH)  # (Nt,)
        covered[here] = member[t_sent[here] - start, tgt.tokens[here]]
    missed = np.bincount(t_sent[words & ~covered], minlength=B)  # (B,) tokens outside the list per sentence
    return Coverage(tokens=int(words.sum()), covered=int((words & covered).sum()), sentences=B,
                    sentences_covered=int((missed == 0).sum()), list_size=size / B if B else 0.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", type=Path, required=True, help="a fairseq-preprocess data-bin")
    p.add_argument("--out", type=Path, required=True, help="the table to write (.npz)")
    p.add_argument("--frequent", type=int, default=200, metavar="F", help="the most frequent target words kept")
    p.add_argument("--translations", type=int, default=50, metavar="K", help="target words kept per source word")
    p.add_argument("--split", default="train", help="the split to count")
    p.add_argument("--source-lang", default=None, metavar="SRC", help="read from the file names when not given")
    p.add_argument("--target-lang", default=None, metavar="TGT", help="read from the file names when not given")
    p.add_argument("--check", default=None, metavar="SPLIT", help="report the table's coverage of SPLIT's references")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_sizes(args.frequent, args.translations)
        d = open_data(args.data, args.source_lang, args.target_lang)
        for split in (args.split, args.check) if args.check is not None else (args.split,):
            split_prefix(d, split)  # a missing split refused before any work
        if not args.out.parent.is_dir():
            raise ShortlistError(f"--out {args.out}: no such directory {args.out.parent}")
        started = time.perf_counter()
        table = build(d, args.frequent, args.translations, args.split)
        table.save(args.out)
        seconds = time.perf_counter() - started
        c = coverage_of(table, d, args.check) if args.check is not None else None
    except (InsertionError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    rows = int(table.translations.any(1).sum())  # source words with a translation
    print(f"wrote {args.out}: {len(table.frequent)} frequent words and {int((table.translations > 0).sum())} "
          f"translations of {rows} of {len(table.translations)} source words (up to {table.translations.shape[1]} "
          f"each; target vocabulary {table.target_vocab}) from {d.path}'s {args.split} in {seconds:.1f}s")
    if c is not None:
        print(f"{args.check}: tokens covered {c.covered / max(c.tokens, 1):.2%} ({c.covered} of {c.tokens})")
        print(f"{args.check}: sentences fully covered {c.sentences_covered / max(c.sentences, 1):.2%} "
              f"({c.sentences_covered} of {c.sentences})")
        print(f"{args.check}: mean list size {c.list_size:.1f} of {table.target_vocab}")
    return 0


__all__: List[str] = ["Coverage", "ShortlistError", "build", "coverage_of", "main"]

if __name__ == "__main__":
    sys.exit(main())
