"""The explainer's sections, one module each, in the order :data:`SECTIONS` gives them.

Each section module has a ``build(inputs)`` that returns its
:class:`~posenc.faces.explainer.shared.Section` (or None when this run has no
data for it): its question, its answer, its formulas, its few lines of posenc
code, the numbers it measured (:mod:`posenc.analysis`), its figures and its
explorer, all in the one file. :mod:`.shared` holds what they share. A new
section is a new module here and one line in :data:`SECTIONS`.

:func:`posenc.report.build` writes the page from :func:`sections`.
"""

from __future__ import annotations

import importlib

from posenc.faces.explainer.shared import Inputs, Section

#: The section modules, in the page's order (a learner's: why positions, why not the
#: index, the sinusoid and its base, its timestep use, its properties, learned tables
#: and the layers, RoPE and its layouts and long contexts, NoPE, biases, grids).
SECTIONS: tuple[str, ...] = (
    "why",
    "index",
    "sinusoidal",
    "base",
    "exp_log",
    "timesteps",
    "shift",
    "add_concat",
    "geometry",
    "precision",
    "learned",
    "layers",
    "projections",
    "rope",
    "rope_layouts",
    "extension",
    "extend",
    "nope",
    "biases",
    "arithmetic",
    "grid",
)


def sections(inputs: Inputs) -> list[Section]:
    """Every section of :data:`SECTIONS` that this run has data for, in order."""
    built = []
    for name in SECTIONS:
        section = importlib.import_module(f"{__name__}.{name}").build(inputs)
        if section is not None:
            built.append(section)
    return built
