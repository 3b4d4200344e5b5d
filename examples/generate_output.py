"""fairseq-generate (and fairseq-interactive) output, read in one place, and scored.

Lines read (the first of each kind per sentence id: the best hypothesis under ``--nbest``):
``S-`` source, ``T-`` target, ``H-`` score and hypothesis, ``D-`` score and detokenised hypothesis,
``P-`` positional scores, ``I-`` decoding iterations (``--print-step``); and two summary lines,
fairseq's ``Translated N sentences (M tokens) in Xs (R sentences/s ...)`` and the plugin's
``insertion decoding (...): N sentences, mean iterations ...``. Anything else is ignored.

Scoring (:func:`score`): sacreBLEU on the ``H-`` text with any ``@@ `` BPE markers removed,
detokenised with ``sacremoses.MosesDetokenizer(lang)`` (none with ``lang=None``), against the raw
references. The length n of a hypothesis is its number of ``P-`` scores minus ``p_specials`` (the
final ``</s>``; fairseq's NAT models also score ``<s>``), else its number of words; the bound is
floor(log2 n)+1 (``fairseq_insertion.canvas.log2_bound``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sacrebleu.metrics import BLEU
from sacremoses import MosesDetokenizer

from fairseq_insertion.canvas import log2_bound

LINE_RE = re.compile(r"^([STHDPI])-(\d+)\t(.*)$")
TRANSLATED_RE = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s")
SUMMARY_RE = re.compile(
    r"insertion decoding \((\w+)\): (\d+) sentences, mean iterations ([\d.]+), mean floor\(log2 n\)\+1 ([\d.]+), "
    r"mean length ([\d.]+), batched forward passes (\d+) \(([\d.]+) per batch")


class ScoreError(RuntimeError):
    """Output that cannot be scored; the message names what is missing."""


@dataclass
class GenerateOutput:
    """What one fairseq-generate run printed, keyed by sentence id."""

    sources: dict[int, str] = field(default_factory=dict)
    targets: dict[int, str] = field(default_factory=dict)
    hypotheses: dict[int, str] = field(default_factory=dict)  # H- text as printed
    candidates: dict[int, list[str]] = field(default_factory=dict)  # every H- text (--nbest), best first
    scores: dict[int, float] = field(default_factory=dict)  # H- score
    detokenized: dict[int, str] = field(default_factory=dict)  # D- text
    positional_scores: dict[int, int] = field(default_factory=dict)  # number of P- scores
    iterations: dict[int, int] = field(default_factory=dict)
    decode_seconds: float | None = None  # fairseq's "Translated ..." line: generation time, no start-up
    insertion_summary: dict[str, float] = field(default_factory=dict)  # the plugin's summary line


def remove_bpe(text: str) -> str:
    """Remove subword-nmt ``@@ `` continuation markers (idempotent)."""
    return (text + " ").replace("@@ ", "").rstrip()


def parse_generate_output(text: str, where: str = "output") -> GenerateOutput:
    """Every line of a fairseq-generate or -interactive output (stdout and log together);
    ``where`` names it in errors."""
    out = GenerateOutput()
    for lineno, raw in enumerate(text.splitlines(), 1):
        match = LINE_RE.match(raw)
        if match is None:
            summary_line(raw, out)
            continue
        kind, sid, rest = match.group(1), int(match.group(2)), match.group(3)
        if kind in "HD":
            score, _, words = rest.partition("\t")  # score \t text (the text may be empty)
            table = out.hypotheses if kind == "H" else out.detokenized
            if kind == "H":
                out.candidates.setdefault(sid, []).append(words)
            if sid not in table:
                table[sid] = words
                if kind == "H":
                    out.scores[sid] = float(score)
        elif kind in "ST":
            (out.sources if kind == "S" else out.targets).setdefault(sid, rest)
        elif kind == "P":
            out.positional_scores.setdefault(sid, len(rest.split()))
        elif sid not in out.iterations:
            try:
                out.iterations[sid] = int(rest.strip())
            except ValueError as exc:
                raise ScoreError(f"{where}:{lineno}: bad iteration count {rest!r}") from exc
    return out


def summary_line(line: str, out: GenerateOutput) -> None:
    """fairseq's generation time and the plugin's decoding summary, when ``line`` is one of them."""
    match = TRANSLATED_RE.search(line)
    if match:
        sentences, per_second = int(match.group(1).replace(",", "")), float(match.group(4))
        # sentences / (sentences/s): more digits than the printed "in X.Xs"
        out.decode_seconds = sentences / per_second if per_second > 0 else float(match.group(3))
    match = SUMMARY_RE.search(line)
    if match:
        keys = ("sentences", "mean_iterations", "mean_log2_bound", "mean_length", "forward_passes",
                "passes_per_batch")
        out.insertion_summary = {k: float(v) for k, v in zip(keys, match.groups()[1:])}


def read_generate_output(*paths: Path) -> GenerateOutput:
    """:func:`parse_generate_output` of the files together (stdout, then the log)."""
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in paths if p.is_file())
    return parse_generate_output(text, where=str(paths[0]))


def read_reference(path: Path) -> list[str]:
    """Raw (untokenised) reference lines."""
    if not path.is_file():
        raise ScoreError(f"{path}: no such reference file")
    with path.open(encoding="utf-8", newline="\n") as handle:
        return [line.rstrip("\r\n") for line in handle]


def _format_ids(ids: list[int], limit: int = 20) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f", ... ({len(ids)} in total)" if len(ids) > limit else "")


def lengths(gen: GenerateOutput, p_specials: int = 1) -> dict[int, int]:
    """Output length n per sentence: P- scores less ``p_specials``, else the words of the H- text."""
    return {i: max(0, gen.positional_scores[i] - p_specials) if i in gen.positional_scores
            else len(remove_bpe(h).split()) for i, h in gen.hypotheses.items()}


def detokenized(gen: GenerateOutput, lang: str | None) -> list[str]:
    """The ``H-`` hypotheses in id order as they are scored: BPE removed, Moses-detokenised (``lang``;
    None: words joined by spaces)."""
    detok = MosesDetokenizer(lang=lang) if lang else None
    words = [remove_bpe(gen.hypotheses[i]).split() for i in sorted(gen.hypotheses)]
    return [detok.detokenize(w, unescape=False) if detok else " ".join(w) for w in words]


def score(gen: GenerateOutput, references: list[str], lang: str | None, p_specials: int = 1) -> dict:
    """Detokenised corpus BLEU (with its signature and brevity penalty), the mean length, and the
    iteration statistics against floor(log2 n)+1. Every reference needs exactly one hypothesis."""
    expected = set(range(len(references)))
    missing, extra = sorted(expected - gen.hypotheses.keys()), sorted(gen.hypotheses.keys() - expected)
    if missing or extra:
        msg = f"{len(gen.hypotheses)} hypotheses but {len(references)} reference lines"
        if missing:
            msg += f"; missing hypothesis ids: {_format_ids(missing)}"
        if extra:
            msg += f"; hypothesis ids beyond the reference: {_format_ids(extra)}"
        raise ScoreError(msg)
    ids = sorted(gen.hypotheses)
    hyps = detokenized(gen, lang)
    bleu = BLEU()
    result = bleu.corpus_score(hyps, [references])
    n = lengths(gen, p_specials)
    mean_iterations = iterations = None
    if gen.iterations:
        if gen.iterations.keys() != set(ids):
            lacking = sorted(set(ids) - gen.iterations.keys())
            raise ScoreError(f"I- lines present but missing for ids: {_format_ids(lacking)}")
        mean_iterations = sum(gen.iterations.values()) / len(ids)
        iterations = iteration_distribution([gen.iterations[i] for i in ids], [n[i] for i in ids])
    return {
        "bleu": result.score,
        "bleu_str": str(result),
        "signature": str(bleu.get_signature()),
        "sentences": len(ids),
        "mean_iterations": mean_iterations,
        "mean_log2_bound": sum(log2_bound(n[i]) for i in ids) / len(ids) if ids else 0.0,
        "mean_length": sum(n.values()) / len(ids) if ids else 0.0,
        "length_source": "P" if gen.positional_scores else "H",
        "brevity_penalty": result.bp,
        "length_ratio": result.sys_len / max(result.ref_len, 1),  # hypothesis words over reference words
        "iterations": iterations,
    }


def iteration_distribution(iterations: list[int], lengths: list[int]) -> dict[str, float]:
    """Per-sentence decoding iterations against floor(log2 n)+1: mean, 99th percentile and max
    of the iterations, the mean excess over the bound, and how many sentences take more than
    twice their bound, and more than twice their bound + 2."""
    bounds = [log2_bound(n) for n in lengths]
    ordered = sorted(iterations)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0
    return {
        "mean": sum(iterations) / max(len(iterations), 1),
        "p99": p99,
        "max": max(iterations, default=0),
        "mean_over_bound": sum(i - b for i, b in zip(iterations, bounds)) / max(len(iterations), 1),
        "over_2x_bound": sum(i > 2 * b for i, b in zip(iterations, bounds)),
        "over_2x_bound_plus_2": sum(i > 2 * b + 2 for i, b in zip(iterations, bounds)),
    }
