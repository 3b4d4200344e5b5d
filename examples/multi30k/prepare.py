#!/usr/bin/env python3
"""Prepare Multi30k (task 1) for fairseq: Moses and joint BPE, or a joint SentencePiece model; binarisation.

Example::

    python examples/multi30k/prepare.py --out data/multi30k_en_de \
        --raw-dir ../shared/data/multi30k --src en --tgt de

Without ``--raw-dir`` the raw files are downloaded from the public
multi30k/dataset GitHub repository into ``OUT/raw_download``.

Outputs under ``--out``:

* ``bpe.codes``                         joint BPE codes (subword-nmt); with ``--spm N`` instead
  ``spm.model`` and ``spm.vocab``, a joint SentencePiece model of N pieces (unigram), on the raw lines
* ``tok/{train,valid,test}.{src,tgt}``  tokenised + BPE'd text
* ``raw/{valid,test}.{src,tgt}``        original lines (references for detokenised BLEU)
* ``data-bin/``                         ``fairseq-preprocess`` output (joined dictionary)
* ``data-bin/preprocess.json``          how the text was prepared (``fairseq_insertion.preprocess``),
  which ``python -m fairseq_insertion.export`` records in an export for the runtime to replay

Every line is prepared by ``fairseq_insertion.preprocess.prepare_line``'s steps: Moses punctuation
normalisation and tokenisation (no XML escaping, dashes kept within words), then the joint BPE; with
``--spm`` the raw line (stripped) goes to the SentencePiece model as it is, as fairseq's ``--bpe
sentencepiece`` encodes it (no Moses step).

``--train-lines`` limits the training split, ``--test-lines`` limits both the
valid and the test split (first N lines); both are meant for tests and quick runs.
Empty lines are kept so that every split stays line-aligned with its raw references.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import io
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from subword_nmt.learn_bpe import learn_bpe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, when run as a script
from examples.commands import preprocess_command  # noqa: E402
from fairseq_insertion.preprocess import (  # noqa: E402
    RECORD,
    Preprocessing,
    apply_bpe_line,
    tokenize_line,
    write_record,
)

DOWNLOAD_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"
# (raw file stem, output split name)
SPLITS: tuple[tuple[str, str], ...] = (
    ("train", "train"),
    ("val", "valid"),
    ("test_2016_flickr", "test"),
)


class PrepareError(RuntimeError):
    """A user-facing preparation error (bad input, failed download, failed tool)."""


# ---------------------------------------------------------------- raw input


def download_raw(dest: Path, langs: list[str], timeout: float = 60.0) -> Path:
    """Download the raw Multi30k task-1 files for ``langs`` into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for stem, _ in SPLITS:
        for lang in langs:
            name = f"{stem}.{lang}.gz"
            target = dest / name
            if target.exists() and target.stat().st_size > 0:
                continue
            url = DOWNLOAD_URL + name
            print(f"downloading {url}", file=sys.stderr)
            part = target.with_name(name + ".part")
            try:
                with (
                    urllib.request.urlopen(url, timeout=timeout) as resp,
                    part.open("wb") as out,
                ):
                    shutil.copyfileobj(resp, out)
                with gzip.open(part, "rb") as check:  # fail early on an HTML error page
                    check.read(1)
            except (urllib.error.URLError, OSError, EOFError) as exc:
                part.unlink(missing_ok=True)
                raise PrepareError(
                    f"could not download {url}: {exc}\n"
                    "Check the network connection, or pass --raw-dir with a local copy "
                    f"of the files {stem}.{{{','.join(langs)}}}.gz."
                ) from exc
            part.replace(target)
    return dest


def find_raw_file(raw_dir: Path, stem: str, lang: str) -> Path:
    """Return ``raw_dir/stem.lang.gz`` or, failing that, the uncompressed ``raw_dir/stem.lang``."""
    for candidate in (raw_dir / f"{stem}.{lang}.gz", raw_dir / f"{stem}.{lang}"):
        if candidate.is_file():
            return candidate
    raise PrepareError(
        f"missing raw file: {raw_dir / f'{stem}.{lang}.gz'} (or {stem}.{lang})"
    )


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    """Read UTF-8 lines (gzip or plain) without their line terminators."""
    opener = gzip.open if path.suffix == ".gz" else open
    lines: list[str] = []
    with opener(path, "rt", encoding="utf-8", newline="\n") as handle:
        for line in handle:
            if limit is not None and len(lines) >= limit:
                break
            lines.append(line.rstrip("\r\n"))
    return lines


def write_lines(path: Path, lines: list[str]) -> None:
    """Write lines, one per line, UTF-8, ``\\n``-terminated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for line in lines:
            handle.write(line + "\n")


# ---------------------------------------------------------------- workers


Job = tuple[Preprocessing, str, list[str]]  # (settings, language, lines)


def _tokenize_chunk(job: Job) -> list[str]:
    settings, lang, lines = job
    return [tokenize_line(line, settings, lang) for line in lines]


def _bpe_chunk(job: Job) -> list[str]:
    settings, _, lines = job
    return [apply_bpe_line(line, settings) for line in lines]


def _chunks(lines: list[str], n: int) -> list[list[str]]:
    size = max(1, -(-len(lines) // n))
    return [lines[i : i + size] for i in range(0, len(lines), size)] or [[]]


def _parallel(
    func: Callable[[Job], list[str]],
    settings: Preprocessing,
    lang: str,
    lines: list[str],
    workers: int,
) -> list[str]:
    jobs = [(settings, lang, chunk) for chunk in _chunks(lines, workers)]
    if workers <= 1 or len(jobs) == 1:
        results = [func(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(func, jobs))
    return [line for chunk in results for line in chunk]


def tokenize(lines: list[str], lang: str, workers: int = 1,
             settings: Preprocessing | None = None) -> list[str]:
    """Moses punctuation normalisation + tokenisation (no XML escaping) of lines in ``lang``."""
    return _parallel(_tokenize_chunk, settings or Preprocessing(), lang, lines, workers)


def apply_bpe(lines: list[str], codes: Path, workers: int = 1,
              settings: Preprocessing | None = None) -> list[str]:
    """Apply subword-nmt BPE codes to tokenised lines."""
    settings = dataclasses.replace(settings or Preprocessing(), bpe_codes=str(codes))
    return _parallel(_bpe_chunk, settings, "", lines, workers)


def learn_spm(prefix: Path, lines: list[str], vocab_size: int, workers: int = 1) -> Path:
    """A joint SentencePiece model (unigram, every character covered) of ``vocab_size`` pieces learnt on
    ``lines``: ``prefix.model`` (returned) and ``prefix.vocab``."""
    try:
        import sentencepiece
    except ImportError as exc:
        raise PrepareError(f"--spm needs the sentencepiece package ({exc}): pip install sentencepiece") from None
    print(f"learning a joint SentencePiece model ({vocab_size} pieces) ...", file=sys.stderr)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter([line for line in lines if line]), model_prefix=str(prefix),
            vocab_size=vocab_size, character_coverage=1.0, model_type="unigram", num_threads=workers,
            minloglevel=2)
    except RuntimeError as exc:
        raise PrepareError(f"--spm {vocab_size}: {' '.join(str(exc).split())}") from None
    return prefix.with_suffix(".model")


# ---------------------------------------------------------------- pipeline


def prepare(
    out: Path,
    raw_dir: Path | None,
    src: str = "en",
    tgt: str = "de",
    bpe_merges: int = 8000,
    train_lines: int | None = None,
    test_lines: int | None = None,
    workers: int = 2,
    spm: int | None = None,
) -> dict[str, int]:
    """Run the whole pipeline; return the number of lines per split and the vocabulary size."""
    if src == tgt:
        raise PrepareError("--src and --tgt must differ")
    if (out / "data-bin" / "dict.src.txt").is_file():
        raise PrepareError(f"{out / 'data-bin'} already holds prepared data: give a new --out, or remove "
                           f"{out / 'data-bin'} to prepare it again")
    out.mkdir(parents=True, exist_ok=True)
    if raw_dir is None:
        raw_dir = download_raw(out / "raw_download", [src, tgt])
    if not raw_dir.is_dir():
        raise PrepareError(f"--raw-dir {raw_dir} is not a directory")

    raw: dict[str, dict[str, list[str]]] = {}
    for stem, split in SPLITS:
        limit = train_lines if split == "train" else test_lines
        src_path, tgt_path = (
            find_raw_file(raw_dir, stem, src),
            find_raw_file(raw_dir, stem, tgt),
        )
        src_lines, tgt_lines = read_lines(src_path, limit), read_lines(tgt_path, limit)
        if len(src_lines) != len(tgt_lines):
            raise PrepareError(
                f"line count mismatch in split {split!r}: {src_path} has {len(src_lines)} lines, "
                f"{tgt_path} has {len(tgt_lines)}"
            )
        if not src_lines:
            raise PrepareError(f"split {split!r} is empty ({src_path})")
        raw[split] = {"src": src_lines, "tgt": tgt_lines}

    settings = Preprocessing(source_lang=src, target_lang=tgt)
    if spm is not None:
        settings = dataclasses.replace(settings, tokenizer="none", normalize_punctuation=False, bpe="sentencepiece")
    print(f"tokenising ({workers} workers) ...", file=sys.stderr)
    tok: dict[str, dict[str, list[str]]] = {
        split: {
            "src": tokenize(sides["src"], src, workers, settings),
            "tgt": tokenize(sides["tgt"], tgt, workers, settings),
        }
        for split, sides in raw.items()
    }
    for split, sides in tok.items():
        pairs = zip(sides["src"], sides["tgt"], strict=True)
        empty = [n for n, (s, t) in enumerate(pairs, 1) if not s or not t]
        if empty:
            shown = ", ".join(map(str, empty[:10])) + (
                ", ..." if len(empty) > 10 else ""
            )
            print(
                f"warning: {len(empty)} line pair(s) in split {split!r} have an empty "
                f"side (lines {shown}); kept for alignment",
                file=sys.stderr,
            )

    if spm is not None:
        codes = learn_spm(out / "spm", tok["train"]["src"] + tok["train"]["tgt"], spm, workers)
    else:
        codes = out / "bpe.codes"
        print(f"learning joint BPE ({bpe_merges} merges) ...", file=sys.stderr)
        with codes.open("w", encoding="utf-8") as handle:
            learn_bpe(
                io.StringIO("\n".join(tok["train"]["src"] + tok["train"]["tgt"]) + "\n"),
                handle,
                bpe_merges,
            )

    tok_dir, ref_dir = out / "tok", out / "raw"
    for split, sides in tok.items():
        for side in ("src", "tgt"):
            write_lines(
                tok_dir / f"{split}.{side}",
                apply_bpe(sides[side], codes, workers, settings),
            )
            if split != "train":
                write_lines(ref_dir / f"{split}.{side}", raw[split][side])

    dest = out / "data-bin"
    cmd = preprocess_command(dest, "src", "tgt", trainpref=tok_dir / "train", validpref=tok_dir / "valid",
                             testpref=tok_dir / "test", joined=True, workers=workers)
    print("running: " + " ".join(cmd), file=sys.stderr)
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise PrepareError(
            f"fairseq-preprocess failed with exit code {result.returncode}"
        )

    write_record(dest / RECORD, dataclasses.replace(settings, bpe_codes=str(codes)))

    with (dest / "dict.src.txt").open(encoding="utf-8") as handle:
        vocab = sum(1 for _ in handle) + 4  # + <s>, <pad>, </s>, <unk>
    summary = {split: len(sides["src"]) for split, sides in raw.items()}
    summary["vocab"] = vocab
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument(
        "--raw-dir",
        type=Path,
        help="directory with the raw *.gz files (default: download)",
    )
    parser.add_argument("--src", default="en", help="source language (default: en)")
    parser.add_argument("--tgt", default="de", help="target language (default: de)")
    parser.add_argument(
        "--bpe-merges",
        type=int,
        default=8000,
        help="joint BPE merge operations (default: 8000)",
    )
    parser.add_argument(
        "--spm", type=int, metavar="VOCAB_SIZE",
        help="a joint SentencePiece model of VOCAB_SIZE pieces on the raw text instead of Moses and BPE",
    )
    parser.add_argument(
        "--train-lines", type=int, help="use only the first N training lines"
    )
    parser.add_argument(
        "--test-lines", type=int, help="use only the first N valid and test lines"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="worker processes (default: 2)"
    )
    args = parser.parse_args(argv)
    for name in ("bpe_merges", "spm", "train_lines", "test_lines", "workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")

    try:
        summary = prepare(
            args.out,
            args.raw_dir,
            src=args.src,
            tgt=args.tgt,
            bpe_merges=args.bpe_merges,
            train_lines=args.train_lines,
            test_lines=args.test_lines,
            workers=args.workers,
            spm=args.spm,
        )
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.src}-{args.tgt}: train {summary['train']} / valid {summary['valid']} / "
        f"test {summary['test']} lines; joined vocabulary {summary['vocab']} "
        f"(incl. 4 special symbols); data in {args.out / 'data-bin'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
