"""Every public class and function has an Examples section, and it runs.

The public names are those of :data:`posenc._api.PUBLIC`. Each one's docstring is
parsed by :mod:`doctest` and run in a namespace of its own (an example imports what it
uses, as a user copying it would), with ``ELLIPSIS`` and ``NORMALIZE_WHITESPACE``.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
from typing import Any

import pytest

from posenc import _api

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def documented() -> list[tuple[str, Any]]:
    """(dotted name, object) of every public class and function, each object once."""
    seen: set[int] = set()
    found = []
    for module_name in _api.PUBLIC:
        module = importlib.import_module(module_name)
        for name in _api.names(module_name):
            value = getattr(module, name)
            if not (inspect.isclass(value) or inspect.isroutine(value)):
                continue  # data: described by its one-line doc, shown in the reference
            if id(value) not in seen:
                seen.add(id(value))
                found.append((f"{module_name}.{name}", value))
    return found


@pytest.fixture(autouse=True)
def registries_restored() -> Any:
    """An example may register (``posenc.rotary.schedules.register``): the rest of the
    session sees the registries as they were."""
    from posenc.families.rotary import schedules

    # every registry of the module (SCHEDULES, PARAMETERS, STRETCH, and any added later)
    tables = tuple(v for v in vars(schedules).values() if type(v) is dict)
    assert {id(schedules.SCHEDULES), id(schedules.STRETCH)} <= {id(t) for t in tables}
    saved = [dict(table) for table in tables]
    yield
    for table, before in zip(tables, saved, strict=True):
        table.clear()
        table.update(before)


@pytest.mark.parametrize(("dotted", "value"), documented(), ids=[d for d, _ in documented()])
def test_the_example_runs(dotted: str, value: Any) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(inspect.getdoc(value) or "", {}, dotted, None, 0)
    assert test.examples, f"{dotted} has no example"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    out: list[str] = []
    runner.run(test, out=out.append, clear_globs=True)
    assert runner.failures == 0, "".join(out)
