"""Pictures of insertion decoding: one sentence's decode, one row per iteration (docs/visualize.md).

    python -m fairseq_insertion.visualize gen.out --id 0 --svg decode.svg [--png decode.png] [--text]

Reads the ``H-``, ``P-``, ``I-`` and ``E-<id>_<step>`` lines of ``fairseq-generate --print-step --retain-iter-history``.
Hand-made SVG, or PNG with matplotlib (the ``plot`` extra). Imports nothing from the plugin, nor torch or fairseq.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence
from xml.sax.saxutils import escape, quoteattr

try:
    from .errors import InsertionError
except ImportError:  # the file loaded on its own, outside the package: the standard library alone
    InsertionError = ValueError  # type: ignore[misc,assignment]

LINE_RE = re.compile(r"^([STHPIE])-(\d+)(?:_(\d+))?\t(.*)$")


class VisualizeError(InsertionError):
    """The generate output cannot be drawn (missing history, unknown id, inconsistent rows)."""


# ------------------------------------------------------------------ reading
@dataclass
class Hypothesis:
    """The lines of one hypothesis in a fairseq-generate output."""

    text: str
    scores: list[str] = field(default_factory=list)  # P- fields, as printed
    iterations: int | None = None  # I-
    history: dict[int, list[str]] = field(default_factory=dict)  # E- step -> canvas tokens


@dataclass
class Sentence:
    """Everything a fairseq-generate output says about one sentence id."""

    sentence_id: int
    source: str = ""
    target: str | None = None
    hypotheses: list[Hypothesis] = field(default_factory=list)


def read_generate_output(lines: Iterable[str]) -> dict[int, Sentence]:
    """{sentence id: its S-, T-, H-, P-, I- and E- lines}, in the order the ids first appear; other lines ignored."""
    sentences: dict[int, Sentence] = {}
    for line in lines:
        m = LINE_RE.match(line.rstrip("\r\n"))
        if not m:
            continue
        kind, sid, step, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        if (kind == "E") != (step is not None):
            continue
        s = sentences.setdefault(sid, Sentence(sid))
        if kind == "S":
            s.source = rest
        elif kind == "T":
            s.target = rest
        elif kind == "H":
            s.hypotheses.append(Hypothesis(rest.split("\t", 1)[1] if "\t" in rest else ""))
        elif not s.hypotheses:
            continue  # a P-/I-/E- line before any H- line of its id: not fairseq's order
        elif kind == "P":
            s.hypotheses[-1].scores = rest.split()
        elif kind == "I":
            s.hypotheses[-1].iterations = int(rest)
        else:
            s.hypotheses[-1].history[int(step)] = rest.split()
    return sentences


# ------------------------------------------------------------------ alignment
def align(previous: Sequence[str], current: Sequence[str]) -> list[int]:
    """The position in ``current`` of each token of ``previous`` (a subsequence of it, else :class:`VisualizeError`):
    left to right, each token matched to the leftmost equal token after the previous match."""
    out: list[int] = []
    j = 0
    for token in previous:
        while j < len(current) and current[j] != token:
            j += 1
        if j == len(current):
            raise VisualizeError(f"{' '.join(previous)!r} is not a subsequence of {' '.join(current)!r}")
        out.append(j)
        j += 1
    return out


def insertion_iterations(history: Sequence[Sequence[str]]) -> list[int]:
    """For each token of the last canvas of ``history`` (the canvases after iterations
    1, 2, ...), the first iteration whose canvas holds it, following :func:`align` back."""
    if not history:
        return []
    final = history[-1]
    position: list[int | None] = list(range(len(final)))  # in the canvas of iteration t, None once born
    born = [1] * len(final)
    for t in range(len(history) - 1, 0, -1):
        back = {p: i for i, p in enumerate(align(history[t - 1], history[t]))}
        for j, p in enumerate(position):
            if p is None:
                continue
            if p in back:
                position[j] = back[p]
            else:
                born[j], position[j] = t + 1, None
    return born


# ------------------------------------------------------------------ one decode
@dataclass
class Decode:
    """One sentence's decode: the canvas before and after every iteration."""

    sentence_id: int
    source: str
    rows: list[list[str]]  # rows[0]: the initial canvas; rows[t]: the canvas after iteration t
    iteration: list[int]  # per output token: the iteration that inserted it (0: on the initial canvas)

    @property
    def tokens(self) -> list[str]:  # the output
        return self.rows[-1]

    @property
    def given(self) -> list[bool]:
        """Per output token: on the initial canvas (a constraint token)."""
        return [t == 0 for t in self.iteration]

    def new_in_row(self, t: int) -> list[bool]:
        """Per token of row ``t``: inserted in iteration ``t``."""
        return [it == t for it in self.iteration if it <= t]


def _is_zero(score: str) -> bool:
    try:
        return float(score) == 0.0 and not score.startswith("-")
    except ValueError:
        return False


def decode_of(sentence: Sentence, hypothesis: int = 0) -> Decode:
    """The :class:`Decode` of one hypothesis of ``sentence`` (0: the best)."""
    name = f"sentence {sentence.sentence_id}"
    if not 0 <= hypothesis < len(sentence.hypotheses):
        raise VisualizeError(f"{name} has {len(sentence.hypotheses)} hypotheses (H- lines), no hypothesis "
                             f"{hypothesis}")
    hyp = sentence.hypotheses[hypothesis]
    if hyp.iterations is None:
        raise VisualizeError(f"{name}: no I- line; run fairseq-generate with --print-step --retain-iter-history")
    steps = sorted(hyp.history)
    if steps != list(range(hyp.iterations)):
        raise VisualizeError(f"{name}: {hyp.iterations} iterations (I- line) but E- lines for steps {steps}; "
                             "run fairseq-generate with --retain-iter-history")
    history = [hyp.history[s] for s in steps]
    if not history:  # no iteration: the output is the initial canvas
        tokens = hyp.text.split()
        return Decode(sentence.sentence_id, sentence.source, [tokens], [0] * len(tokens))
    iteration = insertion_iterations(history)
    final = history[-1]
    if len(hyp.scores) == len(final) + 1:  # one score per token and the final </s>
        iteration = [0 if t == 1 and _is_zero(s) else t for t, s in zip(iteration, hyp.scores)]
    rows = [[tok for tok, t in zip(final, iteration) if t == 0]] + history
    for t, row in enumerate(rows):  # the alignment reproduces every canvas (a check, it cannot fail)
        if [tok for tok, it in zip(final, iteration) if it <= t] != row:
            raise VisualizeError(f"{name}: iteration {t}'s canvas does not follow from the alignment")
    return Decode(sentence.sentence_id, sentence.source, rows, iteration)


def text_rows(decode: Decode) -> list[str]:
    """The rows as text, new tokens in [brackets] and initial-canvas tokens in {braces}."""
    out = []
    for t, row in enumerate(decode.rows):
        marks = decode.new_in_row(t)
        words = [f"{{{tok}}}" if t == 0 else f"[{tok}]" if new else tok for tok, new in zip(row, marks)]
        out.append(f"{t:>3} | " + " ".join(words))
    out.append("out | " + " ".join(f"{tok}/{it}" for tok, it in zip(decode.tokens, decode.iteration)))
    return out


# ------------------------------------------------------------------ layout
FONT = 14  # px
CHAR = 0.6 * FONT  # the advance of a monospace character
PAD, GAP, ROW, MARGIN = 4.0, 6.0, 26.0, 12.0
PALETTE = ["#ffd166", "#8ecae6", "#b5e48c", "#f4a3c0", "#cdb4db", "#ffb38a", "#a0e7e5", "#e9c46a", "#bde0fe", "#d9ed92"]
CONSTRAINT, OLD, INK = "#1d4ed8", "#8a8a8a", "#111111"
CONSTRAINT_STYLE = {"kind": "constraint", "fill": "#ffffff", "stroke": CONSTRAINT, "dashed": True, "color": CONSTRAINT,
                    "italic": True}  # a token on the initial canvas, in every row


@dataclass
class Cell:
    """A token drawn in a box."""

    x: float
    y: float
    width: float
    text: str
    kind: str  # new, old, constraint, output
    row: int | None  # None: the output row
    col: int
    fill: str | None = None
    stroke: str | None = None
    dashed: bool = False
    color: str = INK
    bold: bool = False
    italic: bool = False


@dataclass
class Label:
    """Free text; ``y`` is the baseline."""

    x: float
    y: float
    text: str
    size: float = FONT
    color: str = INK
    anchor: str = "start"  # start, middle, end


@dataclass
class Picture:
    width: float
    height: float
    cells: list[Cell]
    labels: list[Label]


def iteration_color(t: int) -> str:
    return PALETTE[(t - 1) % len(PALETTE)]


def layout(decode: Decode, title: str | None = None) -> Picture:
    """Where every token and label goes: token j of the output keeps its column in every row."""
    n = len(decode.tokens)
    widths = [CHAR * max(len(tok), 1) + 2 * PAD for tok in decode.tokens]
    left = MARGIN + CHAR * 5 + GAP
    xs = list(itertools.accumulate((w + GAP for w in widths), initial=left))  # each token's x, then the grid's right
    grid_right = xs.pop()
    title = f"S-{decode.sentence_id}: {decode.source}" if title is None else title
    labels = [Label(MARGIN, MARGIN + FONT, title, FONT, INK),
              Label(MARGIN, MARGIN + 2 * FONT + 8, "iter", FONT * 0.85, OLD)]
    top = MARGIN + 2 * FONT + 16
    cells: list[Cell] = []
    for t in range(len(decode.rows)):
        y = top + t * ROW
        labels.append(Label(MARGIN + CHAR * 4, y + (ROW - 4) / 2 + FONT * 0.35, str(t), FONT, OLD, "end"))
        if t == 0 and not decode.rows[0]:
            labels.append(Label(left + PAD, y + (ROW - 4) / 2 + FONT * 0.35, "(empty canvas)", FONT * 0.85, OLD))
        for j in range(n):
            it = decode.iteration[j]
            if it > t:
                continue
            style = CONSTRAINT_STYLE if it == 0 else {"kind": "new", "fill": iteration_color(t), "bold": True} \
                if it == t else {"kind": "old", "color": OLD}
            cells.append(Cell(xs[j], y, widths[j], decode.tokens[j], row=t, col=j, **style))
    y = top + len(decode.rows) * ROW + 10
    labels.append(Label(MARGIN + CHAR * 4, y + (ROW - 4) / 2 + FONT * 0.35, "out", FONT, INK, "end"))
    for j in range(n):
        it = decode.iteration[j]
        style = CONSTRAINT_STYLE if it == 0 else {"kind": "output", "fill": iteration_color(it)}
        cells.append(Cell(xs[j], y, widths[j], decode.tokens[j], row=None, col=j, **style))
        labels.append(Label(xs[j] + widths[j] / 2, y + ROW + FONT, str(it), FONT * 0.85,
                            CONSTRAINT if it == 0 else INK, "middle"))
    bound = math.floor(math.log2(n)) + 1 if n else 0
    y += ROW + FONT + 22
    notes = [f"{n} tokens, {len(decode.rows) - 1} iterations (floor(log2 n)+1 = {bound}); "
             "coloured: inserted in that iteration, grey: already there"]
    if any(decode.given):
        notes.append("dashed: constraint, on the canvas from the start (iteration 0)")
    for note in notes:
        labels.append(Label(MARGIN, y, note, FONT * 0.85, OLD))
        y += FONT + 4
    width = max(grid_right, MARGIN + CHAR * max(len(lab.text) for lab in labels)) + MARGIN
    return Picture(width, y - FONT + MARGIN, cells, labels)


# ------------------------------------------------------------------ writers
def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def to_svg(picture: Picture) -> str:
    """The picture as a standalone SVG document. Each token is a ``<g class="token KIND">``
    with ``data-row`` (absent in the output row) and ``data-col`` (its output position)."""
    w, h = _num(picture.width), _num(picture.height)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           f'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="{FONT}">',
           '<rect width="100%" height="100%" fill="#ffffff"/>']
    for c in picture.cells:
        row = "" if c.row is None else f' data-row="{c.row}"'
        out.append(f'<g class="token {c.kind}"{row} data-col="{c.col}">')
        if c.fill or c.stroke:
            dash = ' stroke-dasharray="4 2"' if c.dashed else ""
            out.append(f'<rect x="{_num(c.x)}" y="{_num(c.y)}" width="{_num(c.width)}" height="{_num(ROW - 4)}" '
                       f'rx="3" fill="{c.fill or "none"}" stroke="{c.stroke or "none"}"{dash}/>')
        style = (' font-weight="bold"' if c.bold else "") + (' font-style="italic"' if c.italic else "")
        out.append(f'<text x="{_num(c.x + c.width / 2)}" y="{_num(c.y + (ROW - 4) / 2 + FONT * 0.35)}" '
                   f'text-anchor="middle" fill="{c.color}"{style}>{escape(c.text)}</text></g>')
    for lab in picture.labels:
        out.append(f'<text x="{_num(lab.x)}" y="{_num(lab.y)}" font-size="{_num(lab.size)}" fill="{lab.color}" '
                   f'text-anchor={quoteattr(lab.anchor)}>{escape(lab.text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def save_png(picture: Picture, path: Path | str, scale: float = 2.0) -> None:
    """The same picture through matplotlib (the ``plot`` extra), ``scale`` pixels per SVG unit."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
    try:
        import matplotlib
    except ImportError as e:
        raise VisualizeError("PNG output needs matplotlib: pip install -e '.[plot]' (or write --svg)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    dpi = 100 * scale
    fig = plt.figure(figsize=(picture.width / 100, picture.height / 100), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, picture.width)
    ax.set_ylim(picture.height, 0)
    ax.axis("off")
    pt = 72 / 100  # points per SVG unit at 100 units per inch
    for c in picture.cells:
        if c.fill or c.stroke:
            ax.add_patch(FancyBboxPatch((c.x, c.y), c.width, ROW - 4, boxstyle="round,pad=0,rounding_size=3",
                                        facecolor=c.fill or "none", edgecolor=c.stroke or "none",
                                        linestyle="--" if c.dashed else "-", linewidth=1))
        ax.text(c.x + c.width / 2, c.y + (ROW - 4) / 2, c.text, ha="center", va="center", family="monospace",
                fontsize=FONT * pt, color=c.color, fontweight="bold" if c.bold else "normal",
                fontstyle="italic" if c.italic else "normal")
    for lab in picture.labels:
        ax.text(lab.x, lab.y, lab.text, ha={"start": "left", "middle": "center", "end": "right"}[lab.anchor],
                va="baseline", family="monospace", fontsize=lab.size * pt, color=lab.color)
    fig.savefig(path, dpi=dpi, facecolor="white")
    plt.close(fig)


# ------------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairseq_insertion.visualize", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("generate_output", help="fairseq-generate output made with --print-step --retain-iter-history "
                                           "(- for standard input)")
    p.add_argument("--id", type=int, default=None, help="sentence id (default: the first in the file)")
    p.add_argument("--hypothesis", type=int, default=0, help="which hypothesis of the sentence under --nbest "
                                                             "(default 0, the best)")
    p.add_argument("--svg", type=Path, help="write the picture as SVG here")
    p.add_argument("--png", type=Path, help="write the picture as PNG here (needs matplotlib)")
    p.add_argument("--title", help="the picture's first line (default: S-<id>: the source)")
    p.add_argument("--text", action="store_true", help="print the rows as text: [new] tokens, {initial} tokens")
    args = p.parse_args(argv)
    try:
        with (contextlib.nullcontext(sys.stdin) if args.generate_output == "-"
              else open(args.generate_output, encoding="utf-8", errors="replace")) as f:
            sentences = read_generate_output(f)
        if not sentences:
            raise VisualizeError(f"{args.generate_output}: no fairseq-generate output lines (S-/H-/I-/E-)")
        sid = next(iter(sentences)) if args.id is None else args.id
        if sid not in sentences:
            raise VisualizeError(f"{args.generate_output}: no sentence id {sid}")
        decode = decode_of(sentences[sid], args.hypothesis)
        picture = layout(decode, args.title)
        if args.svg:
            args.svg.write_text(to_svg(picture), encoding="utf-8")
        if args.png:
            save_png(picture, args.png)
        if args.text:
            print("\n".join(text_rows(decode)))
        elif not (args.svg or args.png):
            sys.stdout.write(to_svg(picture))
    except (InsertionError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
