"""The sinusoidal encoding: a fixed table, read as clock hands (the sinusoidal explorer)."""

from __future__ import annotations

import numpy as np

from posenc.faces.explainer.shared import Inputs, Section
from posenc.families.absolute.sinusoidal import resolve


def build(inputs: Inputs) -> Section:
    import posenc

    dim, length, preset = inputs.dim, inputs.length, inputs.preset
    table = posenc.sinusoidal(length, dim, preset=preset, dtype="float64")
    wl = 2 * np.pi / resolve(preset).inv_freq(dim)
    fixed_params = sum(p.numel() for p in posenc.SinusoidalEmbedding(dim).parameters())
    learned_params = sum(
        p.numel() for p in posenc.LearnedPositionalEmbedding(length, dim).parameters()
    )
    return Section(
        "sinusoidal",
        "The sinusoidal encoding: a table, and a clock with many hands",
        "Vaswani et al. (2017, section 3.5) give position p a vector of d numbers: "
        "pairs of a sine and a cosine of p times a frequency \u03c9\u1d62 that falls "
        "geometrically from 1 radian per position (pair 0) to nearly 1/10000 (the "
        "last pair). Drawn as a table, one row per position, the fast channels on the "
        "left change at every row and the slow ones on the right barely move.\n\n"
        "Each (sin, cos) pair is a point on a unit circle: the tip of a clock hand "
        "that turns by \u03c9\u1d62 radians per position. Drawn as (cos, sin) with "
        "the y axis up, every hand turns counter-clockwise. The fast hands tell "
        "neighbouring positions apart; the slow ones tell far-apart positions apart "
        "without wrapping around. A position is the reading of all the hands "
        "together. Move the slider: the marked row of the table is the hands' "
        "reading, and the first values are printed exactly (posenc computes every "
        "angle exactly and rounds once). The hands shown are spread "
        "log-uniformly over the pairs, so fast, middle and slow ones all appear. "
        "The base selector replaces the 10000 of the formula: the next section says "
        "what it controls.\n\n"
        "Nothing here is learned. The frequencies are set by the formula, one per pair, "
        "and the table is a fixed function of the position: a model that uses it trains "
        "no parameter for it (posenc keeps it as a buffer, not a parameter). \u201cThe "
        "model learns a different frequency for each dimension\u201d is a common "
        "misreading: what the model learns is how to read the hands, in the weights of "
        "the layers after it. Only a learned table (a free vector per position, the "
        "learned section below) or a variant that trains its frequencies (such as "
        "FoPE's coefficients) learns positions.",
        [
            ("shape of the table shown (positions x channels)", f"{length} x {dim}"),
            (
                f"trainable parameters: posenc.SinusoidalEmbedding({dim}) / "
                f"posenc.LearnedPositionalEmbedding({length}, {dim})",
                f"{fixed_params} / {learned_params:,}",
            ),
            (
                "shortest and longest wavelength (positions per turn)",
                f"{wl.min():.4f}, {wl.max():.5g}",
            ),
            (
                f"channels that change by less than 0.01 over positions 0-{length - 1}",
                f"{int((np.ptp(table, axis=0) < 0.01).sum())} of {dim}",
            ),
        ],
        [],
        [
            r"\mathrm{PE}(p, 2i) = \sin(p\,\omega_i),\quad "
            r"\mathrm{PE}(p, 2i+1) = \cos(p\,\omega_i),\quad "
            r"\omega_i = 10000^{-2i/d}",
        ],
        "import posenc\n"
        f"pe = posenc.sinusoidal({length}, {dim}, preset={preset!r})  # float32\n"
        "print(pe.shape, pe[7, :8])",
        explorer="sinusoidal",
    )
