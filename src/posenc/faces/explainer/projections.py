"""Why an added encoding is not relative after the query and key projections (RoPE's motive)."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, holds, plotted
from posenc.integration.analysis.projections import position_terms

#: Positions and channels of the measurement and its figure.
LENGTH, DIM = 24, 32


def build(inputs: Inputs) -> Section:
    t = position_terms(DIM, LENGTH, seed=0)
    return Section(
        "projections",
        "Why is an added encoding not relative once the projections have read it?",
        "The shift rotation makes PE(m) \u00b7 PE(n) a function of m \u2212 n alone (the "
        "dot-product section), so an added table seems to hand attention the relative "
        "position for free. But attention never takes that dot product: it scores "
        "projections. With x_p = e_p + PE(p), a token plus its position, the score of "
        "query m and key n is (W_q x_m) \u00b7 (W_k x_n) = x_m\u1d40 A x_n with "
        "A = W_q\u1d40 W_k, and it splits into four terms: content-content, "
        "content-position, position-content and position-position.\n\n"
        "Only the last involves the positions alone, and it is relative only for some A. "
        "Since PE(n) = M_{n\u2212m} PE(m) and PE(m) = M_m PE(0), the term is "
        "PE(0)\u1d40 M_m\u1d40 A M_m M_{n\u2212m} PE(0): when A commutes with every "
        "rotation M_k (the identity does, and so does any sum of shift rotations) M_m "
        "passes through A and cancels, and m \u2212 n is all that is left. Learned "
        "projections have no reason to commute with the rotations: the term then "
        "depends on m as well, and the two cross terms tie each token to the other's "
        "absolute position. This is where RoPE (Su et al. 2021) starts.\n\n"
        "RoPE puts the position after the projections: it rotates the projected query "
        "by m and the projected key by n, and the score becomes "
        "x_m\u1d40 W_q\u1d40 R_{n\u2212m} W_k x_n, relative for any weights. Measured here "
        f"over positions 0-{LENGTH - 1} at d = {DIM}, with random W_q and W_k (seed 0): "
        "the figure draws the position-position term over (m, n), constant along every "
        "diagonal for the identity, for an A that commutes and for RoPE (the same "
        "token vectors and random weights at every position), and not for the random "
        "projections of an added table.",
        [
            (
                "identity projections: PE(m) \u00b7 PE(n) the same for every pair with one "
                "offset m \u2212 n",
                holds(t.spread["identity"], t.tolerance["identity"]),
            ),
            (
                "A = I + 0.7 M_3 \u2212 0.4 M_11, which commutes with the rotations: "
                "PE(m)\u1d40 A PE(n) the same along each offset",
                holds(t.spread["commuting"], t.tolerance["commuting"]),
            ),
            (
                "random W_q, W_k: largest spread of PE(m)\u1d40 W_q\u1d40 W_k PE(n) over the "
                "pairs of one offset (largest |term|)",
                f"{t.spread['random']:.3g} ({t.size['random']:.3g})",
            ),
            (
                "RoPE after the same random W_q, W_k: (R_m W_q e) \u00b7 (R_n W_k e\u2032) "
                "the same along each offset",
                holds(t.spread["rope"], t.tolerance["rope"]),
            ),
            (
                "the four terms add up to the score (x_p = e_p + PE(p), random weights)",
                holds(t.decomposition_error, t.decomposition_tolerance),
            ),
        ],
        ["projections"],
        [
            r"{(W_q x_m)}^\top (W_k x_n) = e_m^\top A\, e_n + e_m^\top A\, \mathrm{PE}(n)"
            r" + {\mathrm{PE}(m)}^\top A\, e_n + {\mathrm{PE}(m)}^\top A\, \mathrm{PE}(n),"
            r"\quad A = W_q^\top W_k",
            r"{\mathrm{PE}(m)}^\top A\, \mathrm{PE}(n) = "
            r"{\mathrm{PE}(0)}^\top M_m^\top A\, M_m\, M_{n-m}\, \mathrm{PE}(0)"
            r" = {\mathrm{PE}(0)}^\top A\, M_{n-m}\, \mathrm{PE}(0)"
            r"\quad\text{if } A M_k = M_k A",
            r"{(R_m W_q x_m)}^\top (R_n W_k x_n) = x_m^\top W_q^\top R_{n-m} W_k\, x_n",
        ],
        "import numpy as np, posenc\n"
        "pe = posenc.sinusoidal(16, 32, dtype='float64')\n"
        "w = np.random.default_rng(0).normal(size=(2, 32, 32)) / 32**0.5\n"
        "for a in (np.eye(32), w[0].T @ w[1]):  # identity, then random projections\n"
        "    term = pe @ a @ pe.T  # the position-position term over (m, n)\n"
        "    print(np.ptp(np.diagonal(term, 1)))  # offset 1: ~1e-15, then not 0",
        draw={"projections": plotted("projections", dim=DIM, length=LENGTH)},
    )
