"""Why the code uses exp and log: the same frequencies rounded otherwise, and the h - 1 variant."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, fmt, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    dim = inputs.dim
    errors = analysis.exp_log_errors(dim)  # float32 only: float64's are rounding noise
    return Section(
        "exp-log",
        "Why does the code use exp and log?",
        "The paper writes the frequency as a power, 1/10000^(2i/d). Most code "
        "(tensor2tensor first, then the PyTorch tutorial, fairseq, diffusers) writes "
        "exp(2i \u00b7 \u2212ln(10000)/d) instead: the same number, since "
        "a^x = exp(x ln a). The log form needs one multiply and one exp per channel "
        "and no power of a large base; it is a habit of speed, not of meaning.\n\n"
        "Both forms round in float32: the frequency is off by a few parts in 10^7 "
        "(left, in units of float32's spacing 2^-24). That error is multiplied by "
        "the position: at position 10^6 an error of 10^-7 in \u03c9 turns a hand by "
        "0.1 radian, which is why posenc computes angles exactly (see the precision "
        "section).\n\n"
        "One variant is a different encoding, not a rounding: the Annotated "
        "Diffusion Model, fairseq, Whisper and DDPM divide by h \u2212 1 (h = d/2) "
        "instead of h, so their slowest pair reaches exactly 1/10000 (right). A model "
        "trained with one must be run with the same one: posenc names each as a "
        "preset.",
        [
            (
                f"{name} float32: largest relative error of \u03c9 against 40-digit mpmath",
                fmt(float(err.max())),
            )
            for name, err in (
                ("power", errors.power_error),
                ("exp-log", errors.exp_log_error),
            )
        ]
        + [
            (
                "slowest frequency: paper (h) / h \u2212 1 variant",
                f"{errors.paper[-1]:.6g} / {errors.variant[-1]:.6g}",
            ),
        ],
        ["exp-log"],
        [
            r"\omega_i = \frac{1}{10000^{2i/d}} = "
            r"\exp\!\left(2i \cdot \frac{-\ln 10000}{d}\right)",
            r"\omega_i^{(h-1)} = \exp\!\left(\frac{-i \ln 10000}{h - 1}\right),\quad "
            r"h = d/2",
        ],
        "import math, torch\n"
        "i2 = torch.arange(0, 512, 2)\n"
        "power = 1 / 10000 ** (i2 / 512)\n"
        "explog = torch.exp(i2 * -(math.log(10000.0) / 512))\n"
        "print((power - explog).abs().max())  # a few float32 ulp",
        draw={"exp-log": plotted("exp-log", dim=dim)},
    )
