"""Why every norm is sqrt(d/2), and what a dot product of two rows measures."""

from __future__ import annotations

import math

from posenc.faces.explainer.shared import Inputs, Section, holds, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    dim, length, preset = inputs.dim, inputs.length, inputs.preset
    norms = analysis.norms(dim, length, preset=preset)
    dots = analysis.offset_dot_products(dim, length, (1, 10, 100), preset=preset)
    options = {"dim": dim, "length": length, "preset": preset}
    return Section(
        "geometry",
        "Why is every norm \u221a(d/2), and what does a dot product measure?",
        "Each (sin, cos) pair lies on the unit circle, so it contributes "
        "sin\u00b2 + cos\u00b2 = 1 to the squared norm, whatever the position: every "
        "row has norm \u221a(d/2) (the first figure, right). No position is louder than "
        "another.\n\n"
        "The dot product of two rows is a sum of cos(k\u03c9\u1d62) over the pairs: "
        "it depends on the offset k only, not on where the two positions are (the "
        "first figure, left), and it falls off, with ripples, as the offset grows. The "
        "cosine similarity of every pair of positions (the square figure below it) is "
        "therefore constant along diagonals.",
        [
            (
                f"norm of every row, positions 0-{length - 1}",
                f"{math.sqrt(dim / 2):.6g} = \u221a({dim}/2): "
                + holds(norms.max_deviation, norms.tolerance),
            )
        ]
        + [
            (f"PE(p) \u00b7 PE(p + {k:g}), the same at every p", f"{cf:.6g}")
            for k, cf in zip(dots.offsets, dots.closed_form, strict=True)
        ]
        + [("the same at every p", holds(max(dots.spread), dots.tolerance))],
        ["offsets", "similarity"],
        [
            r"\left\lVert \mathrm{PE}(p) \right\rVert^2 = \sum_{i=0}^{d/2-1}"
            r"\left(\sin^2(p\omega_i) + \cos^2(p\omega_i)\right) = \frac{d}{2}",
            r"\mathrm{PE}(p) \cdot \mathrm{PE}(p + k) = \sum_{i=0}^{d/2-1} \cos(k\omega_i)",
        ],
        "import numpy as np, posenc\n"
        f"pe = posenc.sinusoidal(1000, {dim}, dtype='float64')\n"
        "print(np.linalg.norm(pe, axis=1).min(), np.sqrt(pe.shape[1] / 2))",
        draw={name: plotted(name, **options) for name in ("offsets", "similarity")},
    )
