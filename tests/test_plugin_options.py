"""``python -m fairseq_insertion --help`` lists exactly the options fairseq's parsers gain from the
plugin: those ``fairseq-train``, ``fairseq-generate`` and ``fairseq-interactive`` accept with
``--user-dir fairseq_insertion --task insertion_translation --criterion insertion_loss --arch
insertion_transformer`` and not with fairseq's plain translation setup, each in a group whose commands
accept it."""

import re
import subprocess
import sys
from typing import Dict, List, Set

import pytest

from tests.utils import PLUGIN, REPO

PLUGIN_ARGS = ["--user-dir", PLUGIN, "--task", "insertion_translation", "--criterion", "insertion_loss",
               "--arch", "insertion_transformer"]
PLAIN_ARGS = ["--task", "translation", "--criterion", "cross_entropy", "--arch", "transformer"]
CLIS = ("fairseq-train", "fairseq-generate", "fairseq-interactive")


def parser_options(cli: str, args: List[str]) -> Set[str]:
    """Every option string ``cli``'s parser has after fairseq adds what ``args`` select."""
    from fairseq import options

    make = {"fairseq-train": options.get_training_parser, "fairseq-generate": options.get_generation_parser,
            "fairseq-interactive": options.get_interactive_generation_parser}[cli]
    parser = make()
    options.parse_args_and_arch(parser, input_args=["data-bin", *args], parse_known=True)
    return {s for action in parser._actions for s in action.option_strings}


@pytest.fixture(scope="module")
def gained() -> Dict[str, Set[str]]:
    return {cli: parser_options(cli, PLUGIN_ARGS) - parser_options(cli, PLAIN_ARGS) for cli in CLIS}


@pytest.fixture(scope="module")
def listing() -> Dict[str, List[str]]:
    """The command's output: group title -> its options, in order."""
    run = subprocess.run([sys.executable, "-m", "fairseq_insertion", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    groups: Dict[str, List[str]] = {}
    title = None
    for line in run.stdout.splitlines():
        if re.fullmatch(r"\S.*:", line) and not line.startswith("usage:"):
            title = line[:-1]
            groups[title] = []
        elif title is not None and (m := re.match(r"  (--[\w-]+)", line)):
            groups[title].append(m.group(1))
    return groups


def commands_of(title: str) -> List[str]:
    """``fairseq-generate, fairseq-interactive: task options (...)`` -> the two commands."""
    return re.findall(r"fairseq-[\w-]+", title.split(":")[0])


def test_lists_every_option_the_plugin_adds_and_nothing_else(gained, listing):
    listed = [o for title, opts in listing.items() if title != "options" for o in opts]
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({o for o in listed if listed.count(o) > 1})}"
    everything = set.union(*gained.values())
    assert {"--decoding", "--order", "--content-location"} <= everything  # the comparison sees the plugin
    assert sorted(everything - set(listed)) == [], "gained by fairseq's parsers but not listed"
    assert sorted(set(listed) - everything) == [], "listed but not an option the plugin adds"


def test_each_group_names_commands_that_accept_its_options(gained, listing):
    groups = {title: opts for title, opts in listing.items() if title != "options"}
    assert {c for title in groups for c in commands_of(title)} == set(CLIS)
    for title, opts in groups.items():
        assert opts, f"empty group {title!r}"
        assert commands_of(title), f"group {title!r} names no command"
        for cli in commands_of(title):
            assert set(opts) <= gained[cli], f"{title!r}: {cli} does not take {sorted(set(opts) - gained[cli])}"
    model = [opts for title, opts in groups.items() if "--arch insertion_transformer" in title]
    assert model and all(o not in gained["fairseq-generate"] for o in model[0])  # model options: training only


def test_every_listed_option_has_help():
    from fairseq_insertion.__main__ import build_parser

    parser = build_parser()
    missing = [a.option_strings[0] for a in parser._actions if a.option_strings and not (a.help or "").strip()]
    assert missing == []
