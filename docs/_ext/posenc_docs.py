"""The site's own Sphinx extension: the reference, links from prose, the explainer.

- ``builder-inited``: the reference's pages under ``api/`` (generated, not kept in git),
  one per public module of :data:`posenc._api.PUBLIC`: its docstring, a summary table,
  then its names under their task headings. A name two public modules export has its full
  entry on the first one's page and a link from the other. A value longer than a line is
  described, not printed.
- ``autodoc-process-docstring``: a public name with no docstring is a warning, so the
  strict build (``-W``) fails on it; an override takes its posenc base's docstring; a
  data docstring's first line stays prose (napoleon would read ``words: ...`` as a type).
- ``autodoc-skip-member``: torch's ``extra_repr`` hook is not part of a module's API.
- ``missing-reference``: a reference to a module's home (``posenc.families.rotary...``,
  as type hints spell it) is retried under its short path, then resolved to the public
  entry of the same Python object; ``warn-missing-reference``: a reference to an internal
  object stays text (a posenc name that is no object still fails the build).
- ``doctree-resolved``: in a user's page (not the development pages), every ``posenc.X``
  in code links to its entry, and one that is not public fails the build.
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
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

from posenc import _api, _moved

LOG = logging.getLogger(__name__)
API = "api"
#: pages for maintainers: they may name internal modules, and their mentions stay code
DEVELOPMENT = ("dev/", "guides/architecture", "guides/gpu", "guides/benchmarks",
               "guides/explainer-internals", "changelog", "api/")  # fmt: skip
#: a value shown in full in the reference fits on one line
MAX_VALUE = 60


def _directive(value: Any) -> str:
    if inspect.isclass(value):
        return "class"
    if callable(value) and (inspect.isroutine(value) or hasattr(value, "__wrapped__")):
        return "function"
    return "data"


@functools.cache  # read by every user's page's links: computed once per build process
def entries() -> dict[int, str]:
    """id(object) -> the dotted name of its full entry: the first public module (in
    :data:`posenc._api.PUBLIC`'s order) that exports it. Values equal by identity only
    (small ints and strings are shared objects) are never merged."""
    found: dict[int, str] = {}
    for module_name in _api.PUBLIC:
        module = importlib.import_module(module_name)
        for name in _api.names(module_name):
            value = getattr(module, name)
            if _directive(value) != "data":
                found.setdefault(id(value), f"{module_name}.{name}")
    return found


def _summary(value: Any) -> str:
    """A name's one-line summary: its docstring's first sentence, roles as code."""
    doc = inspect.getdoc(value) or ""
    first = doc.split("\n\n")[0].replace("\n", " ")
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"``\1``", first)


def _data_summary(dotted: str) -> str:
    return " ".join(_assigned_doc(dotted)).strip()


def _short_value(value: Any) -> bool:
    """A value shown in full: one short line, and no path of the machine that built it."""
    text = repr(value)
    return len(text) <= MAX_VALUE and "\n" not in text and "/" not in text


def module_page(module_name: str, home: dict[int, str]) -> str:
    """The reST of one public module's page: its docstring, a summary table, then its
    names under their task headings (full entries, or a link where another public module
    holds the entry)."""
    module = importlib.import_module(module_name)
    # the front page is "posenc": the package's own page is named as a package
    title = "The ``posenc`` package" if module_name == "posenc" else f"``{module_name}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {module_name}", "   :no-members:", ""]
    lines += [".. list-table::", "   :widths: 1 3", "   :class: posenc-summary", ""]
    for name in _api.names(module_name):
        value = getattr(module, name)
        kind = _directive(value)
        first = _data_summary(f"{module_name}.{name}") if kind == "data" else _summary(value)
        lines += [f"   * - :py:obj:`{name} <{module_name}.{name}>`", f"     - {first or ' '}"]
    lines += [""]
    for heading, names in _api.PUBLIC[module_name].items():
        lines += [heading, "-" * len(heading), ""]
        for name in names:
            dotted = f"{module_name}.{name}"
            value = getattr(module, name)
            kind = _directive(value)
            entry = home.get(id(value), dotted) if kind != "data" else dotted
            if entry == dotted:
                lines += [f".. auto{kind}:: {dotted}"]
                if kind == "class":
                    lines += ["   :members:", "   :undoc-members:"]
                if kind == "data" and not _short_value(value):
                    lines += ["   :no-value:"]
                lines += [""]
            else:  # another public module holds the entry: an anchor here and a link
                lines += [".. raw:: html", "", f'   <span id="{dotted}"></span>', ""]
                lines += [f".. py:{kind}:: {name}", "   :no-index:", ""]
                lines += [f"   The same object as :py:obj:`{entry}`. {_summary(value)}", ""]
    return "\n".join(lines)


def index_page() -> str:
    """The reference's first page: the public modules, each with its first line."""
    lines = ["API reference", "=============", ""]
    lines += [
        "The public surface of posenc: the names ``posenc`` exports, and the modules users",
        "import by their own path. Each page opens with a table of its names, then gives",
        "them grouped by task. Every other module is internal (see the architecture page",
        "under Development); it may change without notice.",
        "",
        ".. list-table::",
        "   :widths: 1 3",
        "   :class: posenc-summary",
        "",
    ]
    for module_name in _api.PUBLIC:
        module = importlib.import_module(module_name)
        first = _summary(module)
        lines += [f"   * - :doc:`{module_name}`", f"     - {first}"]
    lines += ["", ".. toctree::", "   :hidden:", ""]
    lines += [f"   {m}" for m in _api.PUBLIC]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    """Write only a changed page, so an incremental build reads only what changed."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def write_api(app: Sphinx) -> None:
    """Write the reference's pages (before the build reads its sources)."""
    out = Path(app.srcdir) / API
    out.mkdir(exist_ok=True)
    home = entries()
    pages = {f"{m}.rst": module_page(m, home) for m in _api.PUBLIC}
    pages["index.rst"] = index_page()
    for name, text in pages.items():
        _write(out / name, text)
    for stale in set(out.glob("*.rst")) - {out / name for name in pages}:
        stale.unlink()


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
    """The dotted names a reference may mean, innermost scope first (Python's order):
    the documented path's scopes, then those of the module whose source holds the
    docstring (a name documented on a public page, ``posenc.lab.LabConfig``, was written
    in its home's scope)."""
    module, cls = node.get("py:module"), node.get("py:class")
    scopes = [f"{module}.{cls}" if module and cls else "", module or ""]
    documented = _resolve(f"{module}.{cls}" if cls else module) if module else None
    home = getattr(documented, "__module__", None) if cls else None
    if isinstance(home, str) and cls:
        scopes += [f"{home}.{cls.split('.')[0]}", home]
    # autodoc notes where a docstring came from: "...: docstring of posenc.families.x.f"
    written = re.search(r"docstring of ([\w.]+)", str(node.source or node.parent.source or ""))
    if written:
        source = written.group(1).rsplit(".", 1)[0]
        scopes += [source, source.rsplit(".", 1)[0]]
    return [f"{scope}.{target}" for scope in scopes if scope] + [target]


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


def quiet_internal(app: Sphinx, domain: Any, node: nodes.Element) -> bool | None:
    """A docstring's reference to an internal object of posenc stays text, without a
    warning: the reference documents the public surface only. A posenc name that is no
    object at all (a typo) still warns, and the strict build fails on it."""
    if node.get("refdomain") != "py":
        return None
    target = _moved.short(node["reftarget"].lstrip(".~"))
    found = any(
        _resolve(c) is not None for c in _candidates(target, node) if c.startswith("posenc.")
    )
    return True if found else None


def mention_anchor(dotted: str, home: dict[int, str]) -> tuple[str, str] | None:
    """(page, anchor) of a mention of ``dotted`` in prose, or None if it is not public.

    A public module is its page; a public name (or an attribute of one, ``posenc.Rotary.
    forward``) is its full entry's anchor, on the page of the module that holds it.
    """
    if dotted in _api.PUBLIC:
        return f"{API}/{dotted}", ""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module, name, rest = ".".join(parts[:cut]), parts[cut], parts[cut + 1 :]
        if module in _api.PUBLIC and name in _api.names(module):
            value = getattr(importlib.import_module(module), name)
            entry = home.get(id(value), f"{module}.{name}")
            if rest and _resolve(".".join([entry, *rest])) is None:
                return None
            page = entry.rsplit(".", 1)[0]
            return f"{API}/{page}", ".".join([entry, *rest])
    return None


#: a mention in prose: code that is a dotted posenc name, called or not
MENTION = re.compile(r"(posenc(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?")


def link_mentions(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Every ``posenc.X`` in code in a user's page links to its reference entry; one that
    is not public warns (the strict build fails): users' pages name only public names."""
    if docname.startswith(DEVELOPMENT):
        return
    home = entries()
    for literal in list(doctree.findall(nodes.literal)):
        match = MENTION.fullmatch(literal.astext())
        if match is None or isinstance(literal.parent, nodes.reference):
            continue
        where = mention_anchor(match.group(1), home)
        if where is None:
            LOG.warning(
                "%s is not a public name of posenc (posenc._api.PUBLIC): a user's page "
                "names public ones only",
                match.group(1),
                location=literal,
                type="posenc",
                subtype="mention",
            )
            continue
        page, anchor = where
        uri = app.builder.get_relative_uri(docname, page) + (f"#{anchor}" if anchor else "")
        link = nodes.reference("", "", internal=True, refuri=uri, classes=["posenc-mention"])
        literal.replace_self(link)
        link += literal


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

    report.build(out, site="../")  # the explainer sits at explainer/ inside the site


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("posenc_explainer", "", "env", str)
    app.connect("builder-inited", write_api)
    app.connect("autodoc-process-docstring", keep_prose, priority=400)
    app.connect("autodoc-process-docstring", restore_prose, priority=600)
    app.connect("autodoc-process-docstring", no_docstring, priority=700)
    app.connect("autodoc-skip-member", skip_torch_hooks)
    app.connect("missing-reference", short_reference)
    app.connect("autodoc-process-signature", factory_defaults)
    app.connect("warn-missing-reference", quiet_internal)
    app.connect("doctree-resolved", link_mentions)
    app.connect("build-finished", build_explainer)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
