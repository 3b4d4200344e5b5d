"""``python -m fairseq_insertion [--help | --markdown]``: every command-line option the plugin adds to fairseq,
grouped by the commands it applies to (``--markdown``: as the page ``docs/flags.md``), read at runtime from the
components the package registers: what each one's ``add_args`` adds beyond its fairseq base and fairseq's own."""

import argparse
import sys
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

# the commands a component's options take effect in, by fairseq registry, and a note on them
APPLIES = {
    "model": ("fairseq-train", "stored in the checkpoint, so decoding reads them from there"),
    "criterion": ("fairseq-train", None),
    "optimizer": ("fairseq-train", None),
    "lr_scheduler": ("fairseq-train", None),
    "task": ("fairseq-generate, fairseq-interactive",
             "the hub takes them as keyword arguments; fairseq-train accepts them too"),
}
ORDER = ("fairseq-train", "fairseq-generate")  # training groups first, then decoding


class Component(NamedTuple):
    """A class the plugin registers with fairseq: ``kind`` is the registry (``--{kind} NAME``)."""

    kind: str
    names: List[str]  # the names it is registered under (for a model, its architectures)
    cls: type


class _Recorder:
    """A stand-in parser: records ``add_argument``'s option strings, passing the calls whose first option is in
    ``keep`` on to ``target``, their keywords changed by ``adjust``."""

    def __init__(self, target: Any = None, keep: Optional[Set[str]] = None,
                 adjust: Callable[[str, Dict[str, Any]], Dict[str, Any]] = lambda flag, kwargs: kwargs):
        self.target, self.keep, self.adjust = target, set(keep or ()), adjust
        self.options: List[str] = []
        self._scratch = argparse.ArgumentParser(add_help=False)

    def add_argument(self, *names: str, **kwargs: Any) -> Optional[argparse.Action]:
        flags = [n for n in names if n.startswith("-")]
        self.options += flags
        if self.target is None or not flags or flags[0] not in self.keep:
            return None
        self.keep -= set(flags)  # fairseq keeps an option's first definition
        return self.target.add_argument(*names, **self.adjust(flags[0], dict(kwargs)))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> "_Recorder":
        return self

    def __getattr__(self, name: str) -> Any:  # set_defaults and the like: no effect on the listing
        return getattr(self._scratch, name)


def options_of(add_args: Callable[[Any], None]) -> List[str]:
    recorder = _Recorder()
    add_args(recorder)
    return recorder.options


def components(package: str = __package__ or "fairseq_insertion") -> List[Component]:
    """Every class the package registers with fairseq, in the order fairseq adds their options."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    def ours(registry: Dict[str, type]) -> Iterator[Tuple[str, type]]:
        return ((name, cls) for name, cls in registry.items() if cls.__module__.split(".")[0] == package)

    found = [Component("model", [a for a, c in ARCH_MODEL_REGISTRY.items() if c is cls] or [name], cls)
             for name, cls in ours(MODEL_REGISTRY)]
    found += [Component("task", [name], cls) for name, cls in ours(TASK_REGISTRY)]
    for kind, registry in REGISTRIES.items():
        found += [Component(kind, [name], cls) for name, cls in ours(registry["registry"])]
    return found


def architecture_defaults(architectures: Sequence[str]) -> Callable[[str, Dict[str, Any]], Dict[str, Any]]:
    """An ``adjust`` for model options (no argparse default): each architecture's default, one when they agree."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    configured = []
    for arch in architectures:
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[arch](args)
        configured.append((arch, args))

    def adjust(flag: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        dest = kwargs.get("dest") or flag.lstrip("-").replace("-", "_")
        values = [(arch, getattr(args, dest, None)) for arch, args in configured]
        if all(v is None for _, v in values):
            return kwargs
        if len({repr(v) for _, v in values}) == 1:
            return {**kwargs, "default": values[0][1]}
        by_arch = ", ".join(f"{arch} {v}" for arch, v in values)
        return {**kwargs, "help": f"{kwargs.get('help') or ''} (default by architecture: {by_arch})"}

    return adjust


class _Formatter(argparse.HelpFormatter):
    """argparse's help with each option's default, when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if all(action.default is not v for v in (None, False, argparse.SUPPRESS)) and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    """A parser whose help lists the plugin's options, one group per component."""
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_insertion", usage="%(prog)s [-h] [--markdown]", formatter_class=_Formatter,
        description="The options fairseq_insertion adds to fairseq's commands (with --user-dir "
                    "fairseq_insertion), grouped by the commands they apply to; fairseq's own options are in "
                    "each command's --help.")
    from fairseq import options

    # the options of fairseq's train, generate and interactive parsers before any component adds its own
    parsers = (options.get_training_parser(), options.get_generation_parser(),
               options.get_interactive_generation_parser())
    known = {s for p in parsers for a in p._actions for s in a.option_strings}
    groups = []
    package = __package__ or "fairseq_insertion"
    for comp in components():  # its fairseq base: the nearest class it extends that is not the package's own
        base = next((b for b in comp.cls.__mro__[1:] if b.__module__.split(".")[0] != package
                     and hasattr(b, "add_args")), None)
        inherited = set(options_of(base.add_args)) if base is not None else set()
        added = [o for o in options_of(comp.cls.add_args) if o not in inherited and o not in known]
        if not added:
            continue
        known |= set(added)
        flag = "--arch" if comp.kind == "model" else f"--{comp.kind.replace('_', '-')}"
        where, note = APPLIES.get(comp.kind, (f"every command that takes {flag}", None))
        title = f"{where}: {comp.kind} options ({flag} {', '.join(comp.names)})"
        groups.append((where, title, note, comp, added))
    groups.sort(key=lambda g: next((i for i, w in enumerate(ORDER) if g[0].startswith(w)), len(ORDER)))
    for _, title, note, comp, added in groups:
        adjust = architecture_defaults(comp.names) if comp.kind == "model" else (lambda flag, kwargs: kwargs)
        comp.cls.add_args(_Recorder(parser.add_argument_group(title, note), set(added), adjust))
    return parser


def markdown(parser: argparse.ArgumentParser) -> str:
    """The listing as a Markdown page (``docs/flags.md``): one section a group, one table row an option."""
    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    made = "<!-- python -m fairseq_insertion --markdown > docs/flags.md (tests/test_docs.py checks it) -->"
    out = ["# Flags", "", cell(parser.description or ""), "", made, ""]
    for group in parser._action_groups[2:]:  # after argparse's own two: one group a component
        actions = [a for a in group._group_actions if a.option_strings and a.help != argparse.SUPPRESS
                   and a.dest != "help"]
        if not actions:
            continue
        out += [f"## {group.title}", ""] + ([cell(group.description), ""] if group.description else [])
        out += ["| option | default | what it does |", "| --- | --- | --- |"]
        for a in actions:
            name = ", ".join(a.option_strings)
            value = a.metavar or ("{" + ",".join(map(str, a.choices)) + "}" if a.choices else None)
            if a.nargs != 0 and value is None:
                value = a.dest.upper()
            shown = f"`{name}{' ' + str(value) if a.nargs != 0 else ''}`"
            default = "" if any(a.default is v for v in (None, False, argparse.SUPPRESS)) else f"`{a.default}`"
            out.append(f"| {shown} | {default} | {cell(a.help or '')} |")
        out.append("")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    parser.add_argument("--markdown", action="store_true", help="print the listing as a Markdown page")
    if parser.parse_args(argv).markdown:  # --help prints the listing and exits
        print(markdown(parser))
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
