"""The architecture, checked from the source: four layers, imports pointing down only.

Every ``import`` of every module under ``src/posenc`` is read from its syntax tree,
at module level and inside functions, and the graph must have no cycle; core
imports nothing above it, a family imports no integration or face, integration
no face, and nothing imports the command line.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from posenc import _moved

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = ("core", "families", "integration", "faces")
# what each layer may import from posenc (itself included); the package root
# re-exports core and families, so only faces may lean on it
ALLOWED = {
    "core": {"core"},
    "families": {"core", "families"},
    "integration": {"core", "families", "integration"},
    "faces": {"core", "families", "integration", "faces", "root"},
    "root": {"core", "families", "root"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / "posenc").rglob("*.py"))}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "root"


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The posenc modules ``name`` imports: ``from a import b`` counts ``a.b`` if it is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" for a in node.names]
            targets = [t if t in known else module for t in targets]
        else:
            continue
        found.update(t for t in targets if t == "posenc" or t.startswith("posenc."))
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


GRAPH = graph()


def test_every_import_names_a_module_by_its_home():
    # short paths (posenc.rotary ...) are for users; inside src the layer is explicit
    wrong = {
        (name, dep)
        for name, deps in GRAPH.items()
        for dep in deps
        if dep not in GRAPH and not dep.startswith("posenc.core._kernels")
    }
    assert not wrong, f"imports of modules that are not files under src/posenc: {wrong}"


def test_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH.get(node, ())):
            if dep == node:
                continue
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_imports_point_down_the_layers():
    upward = [
        f"{name} ({layer(name)}) imports {dep} ({layer(dep)})"
        for name, deps in GRAPH.items()
        for dep in deps
        if layer(dep) not in ALLOWED[layer(name)] and name != "posenc._moved"
    ]
    assert not upward, "\n".join(upward)


def test_nothing_imports_the_command_line():
    users = [name for name, deps in GRAPH.items() if "posenc.faces.cli" in deps]
    assert not users


def test_the_checker_sees_function_level_and_upward_imports(tmp_path):
    # the checker itself must be able to fail: a core module with an upward import
    # inside a function, and a from-import of a module
    package = tmp_path / "posenc" / "core"
    package.mkdir(parents=True)
    source = package / "bad.py"
    source.write_text("def f():\n    from posenc.faces import cli\n    import posenc.hf\n")
    known = {"posenc.faces.cli"}
    found = imports("posenc.core.bad", source, known)
    assert found == {"posenc.faces.cli", "posenc.hf"}
    assert layer("posenc.faces.cli") not in ALLOWED["core"]


@pytest.mark.parametrize("short", sorted(_moved.MOVED))
def test_short_paths_are_the_layered_modules(short):
    home = _moved.MOVED[short]
    assert importlib.util.find_spec(home) is not None
    module = importlib.import_module(short)
    assert module is importlib.import_module(home)
    assert module.__spec__.name == home  # the home keeps its own spec


def test_submodules_of_short_paths():
    import posenc.rotary.schedules

    import posenc.families.rotary.schedules

    assert posenc.rotary.schedules is posenc.families.rotary.schedules
    from posenc.hf import rope_spec
    from posenc.rotary.config import rope_spec as home

    assert rope_spec is home
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("posenc.rotary.no_such_module")


import importlib  # noqa: E402  (used by the tests above; kept beside them)


def test_a_home_is_named_by_its_most_specific_short_path():
    assert _moved.short("posenc.families.absolute.modules.SinusoidalEmbedding") == (
        "posenc.modules.SinusoidalEmbedding"
    )
    assert _moved.short("posenc.families.absolute.grid") == "posenc.absolute.grid"
    assert _moved.short("posenc.core.checks") == "posenc.core.checks"  # served by none
    for home in _moved.MOVED.values():  # the short name leads back to the same module
        assert _moved.home(_moved.short(home)) == home
