"""No module of posenc takes another module's private names.

A private name starts with one underscore and is not a dunder (``_plan`` and
``_`` are private; ``__all__`` and ``__version__`` are not). Every ``.py``
under ``src/posenc/`` is parsed with :mod:`ast`, and a module M *takes* the
name ``_x`` from the posenc module T when it

- imports it: ``from T import _x`` (relative imports resolved against M's
  package, ``from .run import _x`` included);
- reads it off a binding of T: ``T._x`` where the name is bound to T by
  ``import T as m``, ``from P import m`` (``P.m`` a module) or ``import
  posenc.a.b`` (the attribute chain ``posenc.a.b._x`` is followed one module at
  a time), or ``getattr``/``hasattr``/``setattr``/``delattr`` with the constant
  ``"_x"``; in code, annotations and quoted annotations alike.

That is a violation unless T is M itself, or ``_x`` is a private *submodule*
of the package T and M is T or lies inside it: a package's private module
(``posenc._moved``, ``posenc.core._kernels``) is shared by that package's
modules and subpackages, and by nobody else. Only names taken count, not the
module path an import spells: ``from posenc.pkg._blocks import grouped`` takes
the public ``grouped`` and is allowed anywhere, while ``from posenc.pkg import
_blocks`` outside ``posenc.pkg`` is not (nor is ``posenc.pkg._blocks.grouped``
after ``import posenc``: it reads ``_blocks`` off ``posenc.pkg``). A package's
``__init__`` is a module of its own: its private names are not its submodules'.

Short paths (``posenc.attend``, ``posenc.lab`` ...) are resolved to their homes
first (:func:`posenc._moved.home`), and names by Python's scoping rules (a
function's parameter or assignment shadows a module-level alias of the same
name). Private attributes of classes and other objects, and names taken from
outside posenc (``torch._dynamo``), are out of scope.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from posenc._moved import home

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "posenc"
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_ATTR_FUNCTIONS = ("getattr", "hasattr", "setattr", "delattr")


def is_private(name: str) -> bool:
    """Whether ``name`` is private: one leading underscore, and not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Violation:
    """One private name taken: where, what, and from which module."""

    path: str
    line: int
    name: str
    source: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name} (from {self.source})"


@dataclass
class _Scope:
    """A function, class, comprehension or module body: its locals and module aliases."""

    node: ast.AST
    parent: _Scope | None
    modules: dict[str, str]  # local name -> the module it is bound to by an import
    locals: set[str]  # names bound here by anything else (a local shadows an outer alias)
    globals: set[str]


def canonical(name: str) -> str:
    """The home of a posenc module named by a short path, or ``name`` itself."""
    return home(name) or name


def _module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of a source file under ``SRC``, and whether it is a package."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    package = parts[-1] == "__init__"
    if package:
        parts.pop()
    return ".".join(parts), package


def source_modules() -> set[str]:
    """Every module and package of posenc, compiled extensions and namespace packages included."""
    found = set()
    for path in (SRC / ROOT).rglob("*"):
        if path.suffix in (".py", ".so", ".pyd"):
            parts = [*path.parent.relative_to(SRC).parts, path.name.split(".")[0]]
            if parts[-1] == "__init__":
                parts.pop()
            found.add(".".join(parts))
            # a folder of modules is a package, with or without its __init__.py
            found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return found


class _Checker(ast.NodeVisitor):
    """The private names one module takes from other posenc modules."""

    def __init__(
        self, path: str, module: str, package: bool, is_module: Callable[[str], bool]
    ) -> None:
        self.path, self.module, self.is_module = path, module, is_module
        self.package = module if package else module.rpartition(".")[0]
        self.found: list[Violation] = []
        self.scope: _Scope | None = None

    # -------------------------------------------------------------- the rule

    def _take(self, source: str, name: str, node: ast.AST) -> None:
        """Record ``name`` taken from the module ``source`` if the rule forbids it."""
        source = canonical(source)
        if source.split(".")[0] != ROOT or not is_private(name) or source == self.module:
            return
        # a package's private submodule is its modules' and subpackages' to share
        inside = self.module.startswith(source + ".")
        if inside and self.is_module(canonical(f"{source}.{name}")):
            return
        self.found.append(Violation(self.path, getattr(node, "lineno", 0), name, source))

    # -------------------------------------------------------------- scopes

    def _enter(self, node: ast.AST) -> None:
        """Open the scope of ``node``: the module aliases and other names bound in it."""
        modules: dict[str, str] = {}
        local: set[str] = set()
        declared: set[str] = set()
        args = getattr(node, "args", None)
        if isinstance(args, ast.arguments):
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            every += [a for a in (args.vararg, args.kwarg) if a is not None]
            local.update(a.arg for a in every)
        body = node.generators if isinstance(node, _COMPREHENSIONS) else _body(node)
        for child in _own_nodes(body):
            if isinstance(child, (ast.Global, ast.Nonlocal)):
                declared.update(child.names)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for alias in child.names:
                    bound, target = self._binding(child, alias)
                    if target is not None:
                        modules[bound] = target
                    else:
                        local.add(bound)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
                local.add(child.id)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                local.add(child.name)
            elif isinstance(child, ast.ExceptHandler) and child.name:
                local.add(child.name)
            elif isinstance(child, (ast.MatchAs, ast.MatchStar)) and child.name:
                local.add(child.name)
        self.scope = _Scope(node, self.scope, modules, local - set(modules) - declared, declared)

    def _leave(self) -> None:
        assert self.scope is not None
        self.scope = self.scope.parent

    def _resolve(self, name: str) -> str | None:
        """The module ``name`` is bound to where it is read, or None if it is not one."""
        scope, first = self.scope, True
        while scope is not None:
            if name in scope.globals:
                scope = _outermost(scope)
            # a class body's names are invisible to the functions inside it
            if first or not isinstance(scope.node, ast.ClassDef) or scope.parent is None:
                if name in scope.modules:
                    return scope.modules[name]
                if name in scope.locals:
                    return None
            scope, first = scope.parent, False
        return None

    def _binding(
        self, node: ast.Import | ast.ImportFrom, alias: ast.alias
    ) -> tuple[str, str | None]:
        """The name an import binds, and the module bound to it (None: not a posenc module)."""
        if isinstance(node, ast.Import):
            if alias.asname is None:  # `import a.b.c` binds `a`, to the package a
                top = alias.name.split(".")[0]
                return top, top
            return alias.asname, alias.name
        source = self._from(node)
        target = f"{source}.{alias.name}" if source else alias.name
        module = target if self.is_module(canonical(target)) else None
        return alias.asname or alias.name, module

    def _from(self, node: ast.ImportFrom) -> str:
        """The absolute module a ``from`` import reads, relative imports resolved."""
        if not node.level:
            return node.module or ""
        base = self.package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])

    # -------------------------------------------------------------- visits

    def visit_Module(self, node: ast.Module) -> None:
        self._enter(node)
        self.generic_visit(node)
        self._leave()

    def _visit_scope(self, node: ast.AST) -> None:
        # decorators, defaults, bases and annotations are evaluated in the enclosing scope
        outer = [*getattr(node, "decorator_list", ()), *getattr(node, "bases", ())]
        outer += [k.value for k in getattr(node, "keywords", ())]
        args = getattr(node, "args", None)
        if isinstance(args, ast.arguments):
            outer += [*args.defaults, *[d for d in args.kw_defaults if d is not None]]
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            outer += [a.annotation for a in every if a is not None and a.annotation is not None]
        returns = getattr(node, "returns", None)
        if returns is not None:
            outer.append(returns)
        for child in outer:
            self._visit_annotation(child)
        self._enter(node)
        for child in _body(node):
            self.visit(child)
        self._leave()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_scope
    visit_Lambda = _visit_scope

    def _visit_comprehension(self, node: ast.AST) -> None:
        self._enter(node)
        self.generic_visit(node)
        self._leave()

    visit_ListComp = visit_SetComp = visit_DictComp = _visit_comprehension
    visit_GeneratorExp = _visit_comprehension

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._visit_annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def _visit_annotation(self, node: ast.expr) -> None:
        # a quoted annotation ("att._Plan", list["att._Plan"]) is code all the same
        for child in ast.walk(node):
            if isinstance(child, ast.Constant) and isinstance(child.value, str):
                try:
                    parsed = ast.parse(child.value.strip(), mode="eval").body
                except SyntaxError:
                    continue  # a Literal's string, not code
                for part in ast.walk(parsed):
                    ast.copy_location(part, child)
                self._visit_annotation(parsed)
        self.visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        pass  # the module path an import spells is not a name taken (module docstring)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = self._from(node)
        for alias in node.names:
            self._take(source, alias.name, alias)  # its own line in a parenthesised import

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = self._module_of(node.value)
        if base is not None:
            self._take(base, node.attr, node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if isinstance(func, ast.Name) and func.id in _ATTR_FUNCTIONS and len(args) >= 2:
            name = args[1]
            base = self._module_of(args[0])
            if base is not None and isinstance(name, ast.Constant) and isinstance(name.value, str):
                self._take(base, name.value, node)
        self.generic_visit(node)

    def _module_of(self, node: ast.expr) -> str | None:
        """The module an expression names (``m``, ``posenc.core.checks``), or None."""
        if isinstance(node, ast.Name):
            return self._resolve(node.id)
        if isinstance(node, ast.Attribute):
            base = self._module_of(node.value)
            if base is not None and self.is_module(canonical(f"{base}.{node.attr}")):
                return f"{base}.{node.attr}"
        return None


def _body(node: ast.AST) -> list[ast.AST]:
    """A scope's statements (a lambda's one expression)."""
    if isinstance(node, ast.Lambda):
        return [node.body]
    return list(getattr(node, "body", ()))


def _outermost(scope: _Scope) -> _Scope:
    while scope.parent is not None:
        scope = scope.parent
    return scope


def _own_nodes(nodes: list[ast.AST]) -> Iterator[ast.AST]:
    """The nodes of a scope's body, not descending into the scopes nested in it."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (*_SCOPES, *_COMPREHENSIONS)):
            continue  # its name (a def or class) is bound here, the rest is its own
        stack.extend(ast.iter_child_nodes(node))


def check_source(
    text: str, module: str, *, package: bool = False, path: str = "<string>",
    is_module: Callable[[str], bool],
) -> list[Violation]:  # fmt: skip
    """The private names the module ``module`` (source ``text``) takes from others."""
    checker = _Checker(path, module, package, is_module)
    checker.visit(ast.parse(text, path))
    return checker.found


def check_tree() -> list[Violation]:
    """The private names taken across every module under ``src/posenc``."""
    modules = source_modules()
    found = []
    for path in sorted((SRC / ROOT).rglob("*.py")):
        module, package = _module_name(path)
        rel = str(path.relative_to(SRC.parent))
        found += check_source(
            path.read_text(), module, package=package, path=rel, is_module=modules.__contains__
        )
    return found


def test_no_module_takes_another_modules_private_names():
    found = check_tree()
    if found:
        pytest.fail("private names taken from other modules:\n" + "\n".join(map(str, found)))


# ---------------------------------------------------------------- the checker itself

FAKE = {
    "posenc",
    "posenc._moved",
    "posenc.core",
    "posenc.core.checks",
    "posenc.pkg",
    "posenc.pkg._blocks",
    "posenc.pkg.attention",
    "posenc.pkg.sub",
    "posenc.pkg.sub.mod",
    "posenc.other",
    "posenc.other.user",
    "posenc.integration",
    "posenc.integration.attention",  # posenc.attend's home
}


def taken(text: str, module: str = "posenc.other.user", package: bool = False) -> list[str]:
    found = check_source(text, module, package=package, is_module=FAKE.__contains__)
    return [f"{v.line}:{v.name}" for v in found]


def test_checker_catches_imported_private_names():
    assert taken("from posenc.pkg.attention import _plan, public") == ["1:_plan"]
    assert taken("from ..pkg.attention import _plan as p") == ["1:_plan"]
    assert taken("from . import _helper") == ["1:_helper"]  # from the package posenc.other
    assert taken("def f():\n    from posenc.attend import _plan") == ["2:_plan"]
    assert taken("from posenc.pkg import _blocks") == ["1:_blocks"]  # not its package
    assert taken("from posenc.pkg import _plan", "posenc.pkg.sub.mod") == ["1:_plan"]  # __init__'s


def test_checker_catches_private_names_read_off_modules():
    assert taken("from posenc.pkg import attention as att\nx: att._Plan") == ["2:_Plan"]
    assert taken("from posenc.core import checks\nchecks._compiling()") == ["2:_compiling"]
    assert taken("import posenc.pkg.attention as m\nm._y") == ["2:_y"]
    assert taken("import posenc.core.checks\nposenc.core.checks._x") == ["2:_x"]
    assert taken("import posenc\nposenc.pkg.sub.mod._z.w") == ["2:_z"]
    assert taken("import posenc.attend as a\na._plan") == ["2:_plan"]  # a short path
    assert taken("from .. import pkg\npkg.attention._plan") == ["2:_plan"]
    assert taken("from posenc.core import checks\ngetattr(checks, '_x')") == ["2:_x"]
    quoted = "from posenc.pkg import attention as att\ndef f(p: 'att._Plan') -> None: ..."
    assert taken(quoted) == ["2:_Plan"]
    assert taken("from posenc.pkg import attention as att\nx: list['att._Plan']") == ["2:_Plan"]
    assert taken("from posenc.pkg.attention import (\n    Plan,\n    _plan,\n)") == ["3:_plan"]
    nested = "from posenc.core import checks\ndef f():\n    def g():\n        checks._x"
    assert taken(nested) == ["4:_x"]


def test_checker_allows_what_the_rule_allows():
    # a package's own private submodule, from the package and from inside it
    assert taken("from posenc import _moved\n_moved.install()", "posenc", package=True) == []
    assert taken("from posenc.pkg import _blocks", "posenc.pkg.attention") == []
    assert taken("from .. import _blocks", "posenc.pkg.sub.mod") == []
    assert taken("import posenc.pkg._blocks as b\nb.grouped", "posenc.pkg.sub.mod") == []
    # public names of a private module, from anywhere
    assert taken("from posenc.pkg._blocks import grouped") == []
    assert taken("import posenc.pkg._blocks as b\nb.grouped()") == []
    # dunders, a module's own names, and names from outside posenc
    assert taken("import posenc\nposenc.__version__\nfrom posenc import __version__") == []
    assert taken("from posenc.other.user import _mine", "posenc.other.user") == []
    assert taken("import torch\ntorch._dynamo\nfrom torch._C import _x") == []
    # a local that shadows an alias, a class's private attribute, a non-module import
    shadow = "from posenc.core import checks\ndef f(checks):\n    checks._x"
    assert taken(shadow) == []
    assert taken("from posenc.pkg.attention import Plan\nPlan._field") == []
    assert taken("from posenc.core import checks\ndef f():\n    checks = 1\n    checks._x") == []
