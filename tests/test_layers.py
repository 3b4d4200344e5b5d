"""The package's modules import one another one way only, down this order: config (decoding options, standard library
only) <- loop (the decoding loop of both backends, numpy only) <- slots (the slot rule: its torch and graph
applications, numpy only) <- quantization (int8 graphs with per-row scales: numpy and onnx only) <- preprocess (raw
text, standard library until a line is prepared) <- export_format (the exported files, standard library) <- runtime
(the deployment subpackage) <- decoding (torch's arrays for the loop) <- canvas (training), precision,
fairseq_fixes, constraints, shortlist (the lexical shortlist table from a data-bin) <- weights (the decoder's
weights as inference reads them) <- fast_decoder, checkpoints, hub_interface <- model <- criterion, generator,
rerank <- task <- hub <- export (ONNX) <- the package <- __main__ (the option listing); visualize (it reads
fairseq-generate output) imports none of them; the runtime imports config, loop, preprocess and export_format alone
(tests/test_runtime.py). Checked statically (importing a submodule runs the package's ``__init__``, which imports
them all), imports inside functions included."""

import ast
from pathlib import Path
from typing import Dict, Set

PACKAGE = Path(__file__).resolve().parents[1] / "fairseq_insertion"
NAME = PACKAGE.name
LAYERS = ["errors", "config", "loop", "slots", "quantization", "preprocess", "export_format", "runtime", "decoding",
          "canvas", "visualize", "serve", "precision", "fairseq_fixes", "constraints", "shortlist", "closure",
          "weights", "slot_head", "fast_decoder", "pass_decoder", "checkpoints", "hub_interface", "model", "criterion",
          "generator", "rerank", "task", "hub", "export", "__init__", "__main__"]
SUBPACKAGES = {"runtime", "export", "loop", "serve"}  # imported by its name from the modules above it


def sibling_imports(source: str, module: str) -> Set[str]:
    """Sibling modules of the package that ``source`` (the module ``module``) imports, anywhere in it."""
    siblings = set(LAYERS) - {"__init__"}
    found: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == NAME:
                    found.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                continue  # outside the package
            if node.level == 1:
                parts = (node.module or "").split(".") if node.module else []
            elif node.module and node.module.split(".")[0] == NAME:
                parts = node.module.split(".")[1:]
            else:
                continue
            if parts:  # from .x import y / from fairseq_insertion.x import y
                found.add(parts[0])
            else:  # from . import x / from fairseq_insertion import x: x is a module or a name of __init__
                found.update(a.name if a.name in siblings else "__init__" for a in node.names)
    found.discard(module)
    return found


def import_graph() -> Dict[str, Set[str]]:
    return {p.stem: sibling_imports(p.read_text(), p.stem) for p in sorted(PACKAGE.glob("*.py"))}


def test_every_module_has_a_layer():
    assert sorted(import_graph()) == sorted(set(LAYERS) - SUBPACKAGES)
    assert all((PACKAGE / name / "__init__.py").is_file() for name in SUBPACKAGES)


def test_imports_point_down_the_layers():
    graph = import_graph()
    upward = [f"{m} imports {d}" for m, deps in graph.items() for d in sorted(deps)
              if LAYERS.index(d) >= LAYERS.index(m)]
    assert not upward, upward


def test_no_import_cycle():
    graph = import_graph()
    done: Set[str] = set()

    def visit(m: str, path: tuple) -> None:
        assert m not in path, " -> ".join(path + (m,))
        if m in done:
            return
        for d in graph.get(m, ()):
            visit(d, path + (m,))
        done.add(m)

    for m in graph:
        visit(m, ())


def test_the_check_sees_upward_and_lazy_imports():
    assert sibling_imports("from . import hub\n", "model") == {"hub"}
    assert sibling_imports("def f():\n    from .hub import X\n", "model") == {"hub"}
    assert sibling_imports("import fairseq_insertion.task\n", "model") == {"task"}
    assert sibling_imports("from fairseq_insertion import task as t\n", "model") == {"task"}
    assert sibling_imports("from fairseq.models import X\nfrom . import canvas as C\n", "model") == {"canvas"}


def assigned_attributes_of_siblings(source: str) -> Set[str]:
    """``name.attr`` for every assignment in ``source`` to an attribute of a name imported from a sibling
    module (``from .model import Model`` then ``Model.x = ...``)."""
    tree = ast.parse(source)
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
                for a in node.names}
    targets = [t for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    return {f"{t.value.id}.{t.attr}" for t in targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in imported}


def test_no_module_sets_another_modules_attributes():
    found = {p.stem: assigned_attributes_of_siblings(p.read_text()) for p in sorted(PACKAGE.glob("*.py"))}
    assert not {m: a for m, a in found.items() if a}
    assert assigned_attributes_of_siblings("from .model import M\nM.hub = 1\n") == {"M.hub"}
    assert assigned_attributes_of_siblings("from .model import M\nm = M()\nm.x = 1\n") == set()


def test_from_pretrained_returns_the_insertion_hub_interface():
    import inspect

    from fairseq_insertion import hub, hub_interface
    from fairseq_insertion.model import InsertionTransformerModel

    assert hub.InsertionHubInterface is hub_interface.InsertionHubInterface
    returns = inspect.signature(InsertionTransformerModel.from_pretrained).return_annotation
    assert returns in ("InsertionHubInterface", hub_interface.InsertionHubInterface)
    assert not hasattr(InsertionTransformerModel, "hub_interface")


# The benchmark measures checkpoints through the package's public rooms only: the package itself (its
# registrations), config (DecodingConfig), export (the ONNX export) and runtime (the Translator); and from
# examples/ only the recipes that make what it measures and their shared steps.
PUBLIC_ROOMS = {NAME, f"{NAME}.config", f"{NAME}.export", f"{NAME}.runtime", f"{NAME}.preprocess"}  # + raw text
RECIPES = {"examples.commands", "examples.steps", "examples.generate_output", "examples.multi30k.systems",
           "examples.multi30k.constraints"}
BENCHMARKS = PACKAGE.parent / "benchmarks"


def imported_modules(source: str, package: str) -> Set[str]:
    """Every module ``source`` (a module of ``package``) imports, anywhere in it, relative imports resolved;
    ``from X import y`` counts as X, or as X.y where X is a package."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module if not node.level else f"{package}.{node.module}" if node.module else package
            folder = PACKAGE.parent / base.replace(".", "/")
            found.update(f"{base}.{a.name}" if (folder / a.name).is_dir() or (folder / f"{a.name}.py").is_file()
                         else base for a in node.names)
    return found


def test_the_benchmark_imports_only_public_rooms_and_recipes():
    modules = sorted(BENCHMARKS.glob("*.py"))
    assert len(modules) >= 4
    wrong = {p.name: sorted(m for m in imported_modules(p.read_text(), "benchmarks")
                            if (m.split(".")[0] == NAME and m not in PUBLIC_ROOMS)
                            or (m.split(".")[0] == "examples" and m not in RECIPES))
             for p in modules}
    assert not {name: found for name, found in wrong.items() if found}, wrong
    seen = set().union(*(imported_modules(p.read_text(), "benchmarks") for p in modules))
    assert f"{NAME}.runtime" in seen and "examples.multi30k.systems" in seen  # the check reads what is there


def test_the_benchmark_import_check_sees_lazy_relative_and_package_imports():
    assert imported_modules("def f():\n    from fairseq_insertion.model import M\n", "benchmarks") == {
        "fairseq_insertion.model"}
    assert imported_modules("from . import harness as H\n", "benchmarks") == {"benchmarks.harness"}
    assert imported_modules("from examples.multi30k import recipe\n", "benchmarks") == {"examples.multi30k.recipe"}
    assert imported_modules("import fairseq_insertion.generator\n", "benchmarks") == {"fairseq_insertion.generator"}


LOOP_ORDER = ["ops", "geometry", "starts", "state", "steps", "bans", "rules", "driver", "__init__"]


def loop_imports(source: str) -> Set[str]:
    """The modules a module of ``loop/`` imports, anywhere in it: ``loop.X`` for its siblings, ``X`` for the
    package's other modules (``from ..X``), the top-level name for the others."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.add(f"loop.{node.module}")
            elif node.level == 2:
                found.add(node.module or "__init__")
            else:
                found.add(node.module.split(".")[0])
    return found


def test_the_loop_imports_numpy_the_config_and_its_own_modules_down_its_order():
    """Inside ``loop/``: each module imports only numpy, the standard library, the package's config and the loop's
    modules before it in LOOP_ORDER (no torch, no fairseq, no onnx: the runtime runs it)."""
    loop = PACKAGE / "loop"
    assert sorted(p.stem for p in loop.glob("*.py")) == sorted(LOOP_ORDER)
    wrong = [f"{p.stem} imports {m}" for p in sorted(loop.glob("*.py")) for m in sorted(loop_imports(p.read_text()))
             if m in ("torch", "fairseq", "onnx", "onnxruntime", NAME) or (m in LAYERS and m != "config")
             or (m.startswith("loop.") and LOOP_ORDER.index(m[5:]) >= LOOP_ORDER.index(p.stem))]
    assert not wrong, wrong
    assert loop_imports((loop / "starts.py").read_text()) >= {"config", "loop.ops", "numpy"}  # it reads what is there
