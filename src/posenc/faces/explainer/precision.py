"""How exact the encoding is far out: posenc's exact angles against the usual float32 code."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, fmt, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    dim, length, preset = inputs.dim, inputs.length, inputs.preset
    curves = analysis.precision_curves(dim, preset)
    return Section(
        "precision",
        "How exact is the encoding far out?",
        "The usual code multiplies a float32 position by a float32 frequency and "
        "takes the sine: the product's rounding error grows with the position, so "
        "far positions get wrong values, and under autocast the position itself "
        "becomes bfloat16 and neighbouring positions collapse into one. posenc "
        "reduces the angle modulo 2\u03c0 exactly and rounds once: its float32 error "
        "stays at float32's resolution at any position.",
        [
            (
                f"at position {p:.0e}: posenc / usual float32 / usual bfloat16",
                f"{fmt(a)} / {fmt(b)} / {fmt(c)}",
            )
            for p, a, b, c in zip(
                curves["position"],
                curves["posenc float32"],
                curves["naive float32"],
                curves["naive bfloat16"],
                strict=True,
            )
        ],
        ["precision"],
        [],
        "import posenc\nrow = posenc.sinusoidal([10**6], 512)  # float32, exact to its rounding",
        draw={"precision": plotted("precision", dim=dim, length=length, preset=preset)},
    )
