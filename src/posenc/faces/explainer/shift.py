"""Why PE(p + k) is a linear function of PE(p): a rotation per pair, not a per-column fit."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, holds, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    dim, length, preset = inputs.dim, inputs.length, inputs.preset
    sh = analysis.shift_error(dim, length, (1, 10, 100), preset=preset)
    reg = analysis.regression_r2(dim, length, 10, preset=preset)
    options = {"dim": dim, "length": length, "preset": preset, "offset": 10}
    return Section(
        "shift",
        "Why is PE(p + k) a linear function of PE(p), when a regression says no?",
        "The paper chose sinusoids because \u201cfor any fixed offset k, PE(p + k) "
        "can be represented as a linear function of PE(p)\u201d. The function is a "
        "rotation: by the angle-addition formulas, the pair of pair i at p + k is "
        "the pair at p turned by k\u03c9\u1d62. The 2x2 matrix holds only "
        "cos(k\u03c9\u1d62) and sin(k\u03c9\u1d62): constants for a fixed k, the "
        "same for every p. Stacking one rotation per pair gives a block-diagonal "
        "matrix M_k (the first figure: its first 16 channels).\n\n"
        "A regression of one column at p + k on the same column at p fails (the "
        "second figure, its left panel) because sin(\u03c9(p + k)) needs cos(\u03c9p) "
        "as well: the partner column. With the (sin, cos) pair as regressors the fit is "
        "exact (its right panel).",
        [
            (f"PE(p + {k:g}) = M_{k:g} PE(p) at every p", holds(e, sh.tolerance))
            for k, e in zip(sh.offsets, sh.max_error, strict=True)
        ]
        + [
            (f"R\u00b2 of channel {reg.column} at p + 10 from itself", f"{reg.single_r2:.4f}"),
            (
                "R\u00b2 from its (sin, cos) pair",
                "1 (to float64 rounding)" if reg.pair_r2 > 1 - 1e-12 else f"{reg.pair_r2:.6f}",
            ),
        ],
        ["shift", "regression"],
        [
            r"\begin{pmatrix} \sin(\omega_i (p+k)) \\ \cos(\omega_i (p+k)) \end{pmatrix}"
            r" = \begin{pmatrix} \cos(k\omega_i) & \sin(k\omega_i) \\"
            r" -\sin(k\omega_i) & \cos(k\omega_i) \end{pmatrix}"
            r" \begin{pmatrix} \sin(\omega_i p) \\ \cos(\omega_i p) \end{pmatrix}",
            r"\mathrm{PE}(p + k) = M_k\,\mathrm{PE}(p),\quad M_k = "
            r"\mathrm{diag}\big(R(k\omega_0), \ldots, R(k\omega_{d/2-1})\big)",
        ],
        "import numpy as np, posenc\n"
        f"pe = posenc.sinusoidal({length + 10}, {dim}, dtype='float64')\n"
        f"M = posenc.shift_matrix(10, {dim})\n"
        "print(np.abs(pe[10:] - pe[:-10] @ M.T).max())  # float64 rounding",
        draw={name: plotted(name, **options) for name in ("shift", "regression")},
    )
