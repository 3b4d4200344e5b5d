"""The documentation checks itself: every ``--flag`` of a ``fairseq-*`` command in a fenced
shell block of README.md or docs/*.md is accepted by that command's own parser with the
plugin loaded, and every relative link in them resolves to a file.

Shell blocks are fences tagged ``bash``, ``sh``, ``shell`` or nothing. A command is
read as the shell would split it (``\\`` line continuations joined, comments and
quotes handled, ``$(which fairseq-train)`` read as ``fairseq-train``), from its
``fairseq-*`` word to the end of the line or a ``|``, ``;``, ``&&``, ``>``; ``...``
stands for elided arguments and is skipped, ``<name>`` is a placeholder value, and
``[--flag value]`` an optional flag, checked like the others. Each command is parsed as its CLI does:
fairseq-preprocess with ``options.get_preprocessing_parser``; fairseq-train,
fairseq-generate and fairseq-interactive with ``options.parse_args_and_arch`` on their
parsers, whose second pass adds the options of the command's own ``--task``,
``--arch``, ``--criterion``, optimizer and scheduler. ``--user-dir fairseq_insertion``
is pointed at this checkout's plugin. Flags must match exactly (fairseq's parsers
take no abbreviations), and values must be ones the parser accepts (``--decoding``
choices, numbers).
"""

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

import pytest

from tests.utils import PLUGIN, REPO

SHELL_TAGS = {"", "bash", "sh", "shell"}
SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "("}
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|<img [^>]*src=\"([^\"]+)\"")


def documents() -> List[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]


# ---------------------------------------------------------------- reading the docs
def fenced_blocks(text: str) -> Iterator[Tuple[str, int, str]]:
    """(tag, first line number, content) of every fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, tag, start = m.group(1), m.group(2).lower(), i + 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        yield tag, start + 1, "\n".join(body)


def fairseq_commands(block: str) -> Iterator[Tuple[int, str, List[str]]]:
    """(line offset in the block, CLI name, arguments) of every fairseq-* command of a shell block."""
    logical = []
    lines = block.split("\n")
    current, first = "", 0
    for i, line in enumerate(lines):  # join backslash continuations
        if not current:
            first = i
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append((first, current + line))
        current = ""
    if current:
        logical.append((first, current))
    for offset, line in logical:
        if not re.search(r"(^|[\s/(])fairseq-\w", line):
            continue  # no fairseq command (prose in a plain fence may not even split)
        line = re.sub(r"\$\(\s*which\s+(fairseq-[\w-]+)\s*\)", r"\1", line)
        line = re.sub(r"<[\w./-]+>", "PLACEHOLDER", line)  # <data-bin>: a placeholder, not a redirection
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError as e:  # unbalanced quotes
            yield offset, "shell", [f"cannot be split: {e}"]
            continue
        for i, word in enumerate(words):
            name = word.rsplit("/", 1)[-1]
            if re.fullmatch(r"fairseq-[\w-]+", name):
                args = []
                for w in words[i + 1:]:
                    if w in SEPARATORS:
                        break
                    w = w[1:] if w.startswith("[") else w  # [--optional flag]
                    w = w[:-1] if w.endswith("]") and "[" not in w else w
                    if w and w not in ("...", "…"):
                        args.append(w)
                yield offset, name, args


# ---------------------------------------------------------------- checking one command
def _with_plugin(args: Sequence[str]) -> List[str]:
    """``--user-dir`` values resolved against the checkout (fairseq_insertion: this plugin)."""
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a == "--user-dir":
            value = out[i + 1]
            if Path(value).name == "fairseq_insertion" or "fairseq_insertion" in value:
                out[i + 1] = PLUGIN
            elif (REPO / value).is_dir():
                out[i + 1] = str(REPO / value)
    return out


def check_command(cli: str, args: Sequence[str]) -> List[str]:
    """What ``cli`` would reject in ``args``: unknown flags and unparsable values."""
    from fairseq import options

    parsers = {
        "fairseq-train": options.get_training_parser,
        "fairseq-generate": options.get_generation_parser,
        "fairseq-interactive": options.get_interactive_generation_parser,
    }
    args = _with_plugin(args)
    if cli == "fairseq-train" and "--arch" not in args and not any(a.startswith("--arch=") for a in args):
        return [f"{cli} without --arch: its model options cannot be checked (fairseq-train needs one)"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            if cli == "fairseq-preprocess":
                _, extra = options.get_preprocessing_parser().parse_known_args(args)
            elif cli in parsers:
                _, extra = options.parse_args_and_arch(parsers[cli](), input_args=args, parse_known=True)
            else:
                return [f"{cli}: not a fairseq CLI this check knows (add its parser to tests/test_docs.py)"]
    except SystemExit:
        return [f"{cli} rejects the command: {err.getvalue().strip().splitlines()[-1]}"]
    except Exception as e:  # e.g. an unknown --arch (fairseq raises a bare RuntimeError)
        return [f"{cli} fails on the command: {type(e).__name__} {e}"]
    return [f"{cli} does not know {a.split('=')[0]}" for a in extra if a.startswith("-")]


def check_flags(paths: Sequence[Path]) -> List[str]:
    problems = []
    for path in paths:
        for tag, start, block in fenced_blocks(path.read_text(encoding="utf-8")):
            if tag not in SHELL_TAGS:
                continue
            for offset, cli, args in fairseq_commands(block):
                where = f"{path.name}:{start + offset}"
                if cli == "shell":
                    problems.append(f"{where}: {args[0]}")
                    continue
                problems.extend(f"{where}: {p}" for p in check_command(cli, args))
    return problems


# ---------------------------------------------------------------- links
def _prose(text: str) -> str:
    """``text`` without fenced blocks and inline code (links there are not links)."""
    text = re.sub(r"^\s*```.*?^\s*```[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def check_links(paths: Sequence[Path]) -> List[str]:
    problems = []
    for path in paths:
        for m in LINK.finditer(_prose(path.read_text(encoding="utf-8"))):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-zA-Z][\w+.-]*:", target):
                continue  # a URL
            if target.startswith("#"):
                target = path.name + target
            file, _, anchor = target.split("?", 1)[0].partition("#")
            if not (path.parent / file).exists():
                problems.append(f"{_shown(path)}: link to {target} does not resolve")
            elif anchor and file.endswith(".md") and anchor not in anchors(path.parent / file):
                problems.append(f"{_shown(path)}: link to {target}: {file} has no heading #{anchor}")
    return problems


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def anchors(path: Path) -> set:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    heading's with -1, -2, ..."""
    text = re.sub(r"^\s*```.*?^\s*```[^\n]*$", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    found: set = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


# ---------------------------------------------------------------- the checks
def test_every_fairseq_flag_in_the_docs_is_accepted():
    problems = check_flags(documents())
    assert not problems, "\n".join(problems)


def test_the_docs_hold_fairseq_commands_to_check():
    found = {cli for path in documents() for tag, _, block in fenced_blocks(path.read_text(encoding="utf-8"))
             if tag in SHELL_TAGS for _, cli, _ in fairseq_commands(block)}
    assert {"fairseq-preprocess", "fairseq-train", "fairseq-generate", "fairseq-interactive"} <= found


def test_deploy_lists_every_option_of_the_runtime():
    from fairseq_insertion.config import RUNTIME_OPTIONS

    text = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert [name for name in RUNTIME_OPTIONS if f"`{name}`" not in text] == []


def test_every_relative_link_resolves():
    problems = check_links(documents())
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme_and_says_what_it_is_for():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = {m.group(1).split("#")[0] for m in LINK.finditer(_prose(readme)) if m.group(1)}
    pages = sorted((REPO / "docs").glob("*.md"))
    assert pages
    for page in pages:
        assert f"docs/{page.name}" in linked, f"README.md does not link docs/{page.name}"
        lines = [line for line in page.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert lines[0].startswith("# ") and not lines[1].startswith("#"), f"{page.name}: a title, then one line"


def test_the_flags_page_is_the_plugins_listing():
    """docs/flags.md is what ``python -m fairseq_insertion --markdown`` prints: a flag added, renamed or removed in
    the code without the page written again fails here."""
    proc = subprocess.run([sys.executable, "-m", "fairseq_insertion", "--markdown"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(f"`{flag}" in proc.stdout for flag in ("--cached-decoder", "--order", "--eos-penalty", "--shortlist"))
    assert (REPO / "docs" / "flags.md").read_text(encoding="utf-8") == proc.stdout, \
        "docs/flags.md is not the listing: python -m fairseq_insertion --markdown > docs/flags.md"


def test_readme_is_a_landing_page():
    assert (REPO / "README.md").stat().st_size <= 12 * 1024


# ---------------------------------------------------------------- the check can fail
SCRATCH = """# scratch

```bash
fairseq-train data-bin --user-dir fairseq_insertion --task insertion_translation \\
    --arch insertion_transformer_small --criterion insertion_loss --tau 1.0 ... \\
    --ordr binary_tree --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3   # typo: --ordr
fairseq-generate data-bin --user-dir fairseq_insertion --task insertion_translation \\
    --path ckpt.pt --decoding parallel --eos-penalty 0.5 --print-step | grep ^H
```

```
$ ignored prompt line; the next command is checked
PATH=/x $(which fairseq-generate) data-bin --user-dir fairseq_insertion --task insertion_translation --decoding paralel
fairseq-interactive <data-bin> --user-dir fairseq_insertion --task insertion_translation --path <ckpt> [--nbst 2]
```

```python
fairseq-train("not a shell block") --nonsense
```

See [the canvas](../fairseq_insertion/canvas.py), [the web](https://example.org/x.md), [here](#scratch)
and [a missing page](docs/nowhere.md#part), [a missing heading](#no-such-heading), [the fix](#the-fix-two).

## The fix: `two`
"""


def test_a_misspelled_flag_a_bad_value_and_a_broken_link_are_reported(tmp_path):
    doc = tmp_path / "docs" / "scratch.md"
    doc.parent.mkdir()
    doc.write_text(SCRATCH.replace("../fairseq_insertion/canvas.py", str(REPO / "fairseq_insertion" / "canvas.py")))
    problems = check_flags([doc])
    assert len(problems) == 3, problems
    assert problems[0].startswith("scratch.md:4: fairseq-train does not know --ordr"), problems
    assert "scratch.md:13: fairseq-generate rejects the command" in problems[1] and "paralel" in problems[1]
    assert problems[2] == "scratch.md:14: fairseq-interactive does not know --nbst"
    links = check_links([doc])
    assert len(links) == 2 and "docs/nowhere.md#part does not resolve" in links[0], links
    assert links[1] == "scratch.md: link to scratch.md#no-such-heading: scratch.md has no heading #no-such-heading"
    # the fixed copy passes: --tau (a criterion option) and --decoding (a task option) are known
    fixed = tmp_path / "fixed.md"
    fixed.write_text(doc.read_text().replace("--ordr", "--order").replace("paralel", "parallel")
                     .replace("nbst", "nbest").replace("docs/nowhere.md#part", "scratch.md")
                     .replace("#no-such-heading", "#scratch"))
    (tmp_path / "scratch.md").write_text("")
    assert check_flags([fixed]) == [] and check_links([fixed]) == []


@pytest.mark.parametrize("cli,flag", [("fairseq-train", "--print-step"), ("fairseq-generate", "--tau"),
                                      ("fairseq-preprocess", "--user-dirr")])
def test_a_flag_of_another_command_is_reported(cli, flag):
    args = ["data-bin", "--user-dir", "fairseq_insertion", "--task", "insertion_translation"]
    if cli == "fairseq-train":
        args += ["--arch", "insertion_transformer_tiny", "--criterion", "insertion_loss"]
    if cli == "fairseq-preprocess":
        args = ["--source-lang", "en", "--target-lang", "de"]
    assert check_command(cli, [*args, flag]) == [f"{cli} does not know {flag}"]


# ---------------------------------------------------------------- plain words
SHORTHAND = re.compile(r"\b(kit|kit's|sittings?|levers?|chain|chain's)\b|`-(long|longer|closest|cont)`", re.I)


def shorthand(text: str) -> list[str]:
    """The project's shorthand in a page's prose (link targets left out)."""
    prose = re.sub(r"\]\([^)]*\)", "]", text)
    return sorted({m.group(0) for m in SHORTHAND.finditer(prose)})


def test_the_guide_pages_use_no_shorthand_and_results_defines_it():
    for page in sorted((REPO / "docs").glob("*.md")):
        if page.name != "results.md":
            assert not shorthand(page.read_text(encoding="utf-8")), page.name
    results = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    words = results[results.index("## Words these logs use"):results.index("\n## ", results.index("## Words") + 1)]
    for term in ("the kit", "stage", "the chain", "`-long`", "`-cont`", "`-closest`", "`-longer`", "sitting", "lever"):
        assert f"**{term}**" in words, term
    assert shorthand("the kit's `-longer` model, two sittings")  # the check can fail
