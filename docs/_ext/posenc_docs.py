"""The site's own Sphinx extension: the API pages, references by short path, the explainer.

- ``builder-inited``: the reference's pages under ``api/`` (generated, not kept in git),
  one per import path (``posenc.rotary`` and its submodules) and per layer: a section per
  public module, its docstring, then every name of its ``__all__`` in that order. Modules
  are named by the short paths users import (``posenc.rotary.schedules``), the ones
  :data:`posenc._moved.MOVED` serves.
- ``autodoc-process-docstring``: a public name with no docstring is a warning, so the
  strict build (``-W``) fails on it; an override takes its posenc base's docstring; a
  data docstring's first line stays prose (napoleon would read ``words: ...`` as a type).
- ``autodoc-skip-member``: torch's ``extra_repr`` hook is not part of a module's API.
- ``missing-reference``: a reference to a module's home (``posenc.families.rotary...``,
  as type hints spell it) is retried under its short path; a name documented elsewhere
  (``posenc.sinusoidal``) resolves to the entry of the same Python object.
- ``autodoc-process-signature``: a dataclass field's ``<factory>`` default reads ``...``.
- ``build-finished``: the explainer ``posenc report`` writes, built into ``explainer/``
  (``posenc_explainer = PATH``: a report already built there is copied instead;
  ``none``: none is written, the caller puts one there).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

from posenc import _moved

LOG = logging.getLogger(__name__)
API = "api"


def public_modules() -> dict[str, ModuleType]:
    """Every module of posenc with no private part in its path, by the name users import.

    A module served under a short path (:data:`posenc._moved.MOVED`) is named by it
    (``posenc.rotary.schedules``); the rest (``posenc.core.checks``) by their homes.
    """
    import posenc

    found: dict[str, ModuleType] = {"posenc": posenc}
    for info in pkgutil.walk_packages(posenc.__path__, "posenc."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found[_moved.short(info.name)] = importlib.import_module(info.name)
    return dict(sorted(found.items()))


def public_names(module: ModuleType) -> list[str]:
    """A public module's names: its ``__all__`` (which every public module defines)."""
    names = getattr(module, "__all__", None)
    if names is None:
        raise ValueError(f"{module.__name__} defines no __all__: its public names are unknown")
    return [n for n in names if n != "__version__"]


def _directive(value: Any, module: ModuleType) -> str:
    if inspect.ismodule(value) and value.__name__.startswith(module.__name__ + "."):
        return ""  # a submodule: it has its own section
    if inspect.isclass(value):
        return "class"
    if callable(value) and (inspect.isroutine(value) or hasattr(value, "__wrapped__")):
        return "function"
    return "data"


@functools.cache  # each module's source is parsed once per build, not once per name
def defined_names(module: ModuleType) -> set[str]:
    """The names a module's own source binds at its top level (not its imports)."""
    source = inspect.getsource(module)
    bound: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound.add(node.target.id)
    return bound


@functools.cache  # each module's source is parsed once per build, not once per name
def imported_names(module: ModuleType) -> dict[str, tuple[str, str]]:
    """name -> (module, name) for each ``from ... import`` at a module's top level."""
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    found: dict[str, tuple[str, str]] = {}
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                found[alias.asname or alias.name] = (source, alias.name)
    return found


def origin(module_name: str, name: str) -> tuple[str, str]:
    """The module whose source assigns ``name`` and its name there, following imports."""
    module = importlib.import_module(module_name)
    source = imported_names(module).get(name)
    if name in defined_names(module) or source is None:
        return module.__name__, name
    return origin(*source)


#: values whose identity says nothing (equal small ints and strings are one object)
SCALARS = (int, float, complex, str, bytes, bool, tuple, frozenset, type(None))


def homes(modules: dict[str, ModuleType]) -> dict[int, list[str]]:
    """id(object) -> the dotted names of its full entries, for the classes, functions and
    containers that a public module defines (a lazily imported name has no import)."""
    found: dict[int, list[str]] = {}
    for short, module in modules.items():
        for name in sorted(defined_names(module) & set(public_names(module))):
            value = getattr(module, name)
            if not isinstance(value, SCALARS):
                found.setdefault(id(value), []).append(f"{short}.{name}")
    return found


def full_entry(short: str, module: ModuleType, name: str, home: dict[int, list[str]]) -> str:
    """Where ``short.name``'s full entry is: itself (a name its module defines, or imports
    from a private module), else the public module that defines it."""
    if name in defined_names(module):
        return f"{short}.{name}"
    source, there = origin(module.__name__, name)
    if source != module.__name__:
        private = any(part.startswith("_") for part in source.split("."))
        return f"{short}.{name}" if private else f"{_moved.short(source)}.{there}"
    value = getattr(module, name)
    if not isinstance(value, SCALARS) and id(value) in home:
        entries = home[id(value)]  # posenc's lazy names: the same object, defined elsewhere
        return next((e for e in entries if e.rsplit(".", 1)[-1] == name), entries[0])
    return f"{short}.{name}"


def summary(value: Any, kind: str) -> str:
    """A re-export's one-line summary: its docstring's first line, references as code
    (they were written for the defining module's scope)."""
    first = (
        (inspect.getdoc(value) or "").split("\n\n")[0].replace("\n", " ") if kind != "data" else ""
    )
    first = re.sub(r":[a-z]+:`~?([^`]+)`", r"``\1``", first)
    return f" {first}" if first else ""


def module_page(short: str, module: ModuleType, home: dict[int, list[str]]) -> str:
    """The reST of one module's section: full entries for its own names, links for the rest."""
    lines = [short, "-" * len(short), "", f".. automodule:: {short}", "   :no-members:", ""]
    for name in public_names(module):
        value = getattr(module, name)
        kind = _directive(value, module)
        entry = full_entry(short, module, name, home) if kind else ""
        if not kind:
            lines += [f".. rubric:: {name}", "", f"The submodule :mod:`{short}.{name}`.", ""]
        elif entry == f"{short}.{name}":
            lines += [f".. auto{kind}:: {short}.{name}"]
            if kind == "class":
                lines += ["   :members:", "   :undoc-members:"]
            lines += [""]
        else:  # a re-export: its own anchor (not a second entry: a name has one target)
            lines += [".. raw:: html", "", f'   <span id="{short}.{name}"></span>', ""]
            lines += [f".. py:{kind}:: {name}", "   :no-index:", ""]
            lines += [f"   :py:obj:`{entry}`, imported here.{summary(value, kind)}", ""]
    return "\n".join(lines)


LAYERS = ("posenc.core", "posenc.families", "posenc.integration", "posenc.faces")


def group(short: str) -> str:
    """The page a module is on: ``posenc`` alone; else its import path's first two parts
    (``posenc.rotary`` holds ``posenc.rotary.schedules``), the layers' modules by layer."""
    return ".".join(short.split(".")[:2])


def group_page(name: str, members: list[str], modules: dict[str, ModuleType], home: Any) -> str:
    """One page of the reference: a section per module of the group."""
    title = f"{name} (layer)" if name in LAYERS else name
    lines = [title, "=" * len(title), ""]
    for short in members:
        section = module_page(short, modules[short], home)
        if short == name:  # the group's own module: its docstring opens the page
            section = section.split("\n", 3)[3]
        lines += [section, ""]
    return "\n".join(lines)


def index_page(groups: dict[str, list[str]]) -> str:
    """The reference's first page: the import paths, then the layers beneath them."""

    def toctree(caption: str, names: list[str]) -> list[str]:
        head = [".. toctree::", "   :maxdepth: 1", f"   :caption: {caption}", ""]
        return [*head, *(f"   {n}" for n in names), ""]

    lines = ["API reference", "=============", ""]
    lines += [
        "Every public name, module by module, under the import path users type",
        "(``posenc.rotary.schedules``, on the page of ``posenc.rotary``). The names",
        "``posenc`` itself exports are on its page. The code lives in four layers beneath",
        "these paths (core, families, integration, faces, each importing only from the",
        "ones below it); their other modules, which the paths' pages refer to, follow.",
        "",
    ]
    paths = [g for g in groups if g not in LAYERS]
    lines += toctree("Import paths", paths) + toctree(
        "The layers", [g for g in LAYERS if g in groups]
    )
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    """Write only a changed page, so an incremental build reads only what changed."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def write_api(app: Sphinx) -> None:
    """Write the reference's pages (before the build reads its sources)."""
    out = Path(app.srcdir) / API
    out.mkdir(exist_ok=True)
    modules = public_modules()
    home = homes(modules)
    groups: dict[str, list[str]] = {}
    for short in modules:
        groups.setdefault(group(short), []).append(short)
    for name, members in groups.items():
        _write(out / f"{name}.rst", group_page(name, members, modules, home))
    _write(out / "index.rst", index_page(groups))
    for stale in set(out.glob("*.rst")) - {out / f"{g}.rst" for g in groups} - {out / "index.rst"}:
        stale.unlink()


def _inherited_docstring(obj: Any, lines: list[str]) -> bool:
    """True when the lines are only the docstring of the value's type (a data item)."""
    own = inspect.getdoc(type(obj)) or ""
    return bool(own) and "\n".join(lines).strip() == own.strip()


def _posenc_base_doc(obj: Any, name: str) -> str:
    """The docstring of the method a posenc base class defines under the same name.

    An override (``ALiBi.relative_bias``) means what its base's docstring says; torch's
    bases (``Module.forward``, ``Function.backward``) are not posenc's and never used.
    """
    owner = getattr(obj, "__qualname__", "").rsplit(".", 1)[0]
    module = inspect.getmodule(obj)
    cls = getattr(module, owner, None) if module is not None and owner else None
    for base in getattr(cls, "__mro__", ())[1:]:
        if base.__module__.startswith("posenc.") and name in vars(base):
            doc = inspect.getdoc(vars(base)[name])
            if doc:
                return doc
    return ""


def _assigned_doc(dotted: str) -> list[str]:
    """The ``#:`` comment where a module-level name is assigned (its import followed)."""
    from sphinx.pycode import ModuleAnalyzer

    module_name, name = dotted.rsplit(".", 1)
    source, there = origin(importlib.import_module(module_name).__name__, name)
    docs = ModuleAnalyzer.for_module(source).find_attr_docs()
    return list(docs.get(("", there), []))


def no_docstring(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Warn (so the strict build fails) on a public name with no docstring of its own,
    after taking an override's from the posenc base class that defines the method."""
    last = name.rsplit(".", 1)[-1]
    if last.startswith("_") or what == "module":
        return
    if not any(line.strip() for line in lines) and what in ("method", "property"):
        lines[:] = _posenc_base_doc(getattr(obj, "fget", obj), last).splitlines()
    if what == "data" and (not any(s.strip() for s in lines) or _inherited_docstring(obj, lines)):
        lines[:] = _assigned_doc(name)
    owner = _resolve(name.rsplit(".", 1)[0])
    if dataclasses.is_dataclass(owner) and last in owner.__dataclass_fields__:
        return  # a field with a function as its default: the class's Attributes say it
    if not any(line.strip() for line in lines) or (
        what in ("data", "attribute") and _inherited_docstring(obj, lines)
    ):
        LOG.warning("%s %s has no docstring", what, name, type="posenc", subtype="docstring")


#: what napoleon reads as ``type: description`` (a value's docstring) and posenc writes as
#: prose: ``The named conventions: ...`` (the type is in the annotation)
PROSE = ("data", "attribute", "property")
_before_napoleon: dict[str, list[str]] = {}


def keep_prose(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Before napoleon (priority 400): note a value's docstring as written."""
    if what in PROSE:
        _before_napoleon[name] = list(lines)


def restore_prose(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """After napoleon (priority 600): a value's docstring as written, not split on its
    first colon into a type that no reference resolves."""
    if what in PROSE and name in _before_napoleon:
        lines[:] = _before_napoleon.pop(name)


#: torch's hooks that modules override for torch's own use, not part of their API
TORCH_HOOKS = frozenset({"extra_repr"})


def skip_torch_hooks(
    app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any
) -> bool | None:
    return True if name in TORCH_HOOKS else None


def _resolve(module_path: str) -> Any:
    """The Python object a documented dotted name stands for (None if unknown)."""
    parts = module_path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                value = getattr(value, attr)
        except AttributeError:
            return None
        return value
    return None


def _candidates(target: str, node: nodes.Element) -> list[str]:
    """The dotted names a reference may mean, innermost scope first (Python's order)."""
    module, cls = node.get("py:module"), node.get("py:class")
    scopes = [f"{module}.{cls}" if module and cls else "", module or "", ""]
    return [f"{scope}.{target}" if scope else target for scope in scopes]


def short_reference(
    app: Sphinx, env: Any, node: nodes.Element, contnode: nodes.Element
) -> nodes.Element | None:
    """Resolve a reference the Python domain could not: by short path, then by object.

    ``posenc.families.rotary.tables.Layout`` is retried as ``posenc.rotary.tables.Layout``.
    A name documented elsewhere (``posenc.sinusoidal``, whose entry is the function's own
    module's) resolves to the entry of the same Python object, found by identity, never by
    a guess: an unknown name stays unresolved and the strict build fails on it.
    """
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    target, kind, doc = node["reftarget"].lstrip(".~"), node["reftype"], node["refdoc"]
    short = _moved.short(target)
    if short != target:
        found = domain.resolve_xref(env, doc, app.builder, kind, short, node, contnode)
        if found is not None:
            return found
    wanted = next((v for v in map(_resolve, _candidates(short, node)) if v is not None), None)
    if wanted is None:
        return None
    last = short.rsplit(".", 1)[-1]
    matches = [
        (name, entry)
        for name, entry in domain.find_obj(env, "", "", last, kind, 1)
        if not entry.aliased and _resolve(name) is wanted
    ]
    if not matches:
        return None
    name, entry = min(matches, key=lambda m: (m[1].docname != doc, len(m[0])))
    return make_refnode(app.builder, doc, entry.docname, entry.node_id, contnode, name)


def factory_defaults(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    annotation: str | None,
) -> tuple[str | None, str | None] | None:
    """A dataclass field's ``<factory>`` default, which no signature parser reads, as ``...``."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), annotation
    return None


def build_explainer(app: Sphinx, exception: Exception | None) -> None:
    """Write the explainer into the site's ``explainer/`` (or copy a built one)."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir) / "explainer"
    if app.config.posenc_explainer == "none":  # the caller puts one there (the tests)
        return
    if app.config.posenc_explainer:  # a report already built
        shutil.copytree(app.config.posenc_explainer, out, dirs_exist_ok=True)
        return
    from posenc import report

    report.build(out)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("posenc_explainer", "", "env", str)
    app.connect("builder-inited", write_api)
    app.connect("autodoc-process-docstring", keep_prose, priority=400)
    app.connect("autodoc-process-docstring", restore_prose, priority=600)
    app.connect("autodoc-process-docstring", no_docstring, priority=700)
    app.connect("autodoc-skip-member", skip_torch_hooks)
    app.connect("missing-reference", short_reference)
    app.connect("autodoc-process-signature", factory_defaults)
    app.connect("build-finished", build_explainer)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
