"""Why not the index itself, or the index over the length: unbounded, or length-dependent."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    dim = inputs.dim
    idx = analysis.index_features(dim=dim)
    return Section(
        "index",
        "Why not the index itself, or the index over the length?",
        "The simplest position feature is the index p itself, added to each token's "
        "vector (or as one more channel). It grows without bound: the last token of a "
        "4096-token sequence would carry 4095, while the token embeddings it is added "
        "to have entries of a few hundredths (GPT-2 draws them with standard deviation "
        "0.02). The position would drown the token, and a model trained on short "
        "sequences would meet values it never saw on long ones.\n\n"
        "Dividing by the length, p / (L \u2212 1), keeps every value in [0, 1] but "
        "gives one position a different code in every sequence: position 5 is 0.5 in a "
        "sequence of 11 tokens and 0.05 in one of 101, so \u201cthe token five places "
        "in\u201d has no fixed meaning, and the length must be known before the first "
        "token is encoded (not so when generating).\n\n"
        "Bounded, periodic features fix both. Every sinusoidal value lies in "
        "[\u22121, 1] and every row has the same norm \u221a(d/2) at any length; a "
        "position's code does not depend on the sequence around it; the pairs turn at "
        "geometrically spaced speeds, so the codes stay distinct up to the slowest "
        "pair's wavelength and far beyond; and an offset k acts on every code as the "
        "same rotation (the shift section below), which is what lets a model learn "
        "\u201cthe token k places back\u201d once for all positions.",
        [
            (
                f"position {idx.position} as p / (L \u2212 1), for L = "
                + ", ".join(map(str, idx.lengths)),
                ", ".join(f"{v:.4g}" for v in idx.normalised),
            ),
            (
                "the raw index at the end of those sequences",
                ", ".join(map(str, idx.largest_index)),
            ),
            (
                f"largest |value| of the sinusoidal table over {max(idx.lengths)} "
                f"positions; norm of every row (d = {dim})",
                f"{idx.sinusoidal_bound:.6g}; {idx.row_norm:.6g} = \u221a({dim}/2)",
            ),
            (
                f"smallest distance between the codes of two different positions below "
                f"{max(idx.lengths)} (offset where it occurs)",
                f"{idx.nearest:.4g} (offset {idx.nearest_offset}): every code distinct",
            ),
            (
                "wavelength of the slowest pair, positions per turn",
                f"{idx.longest_wavelength:.6g}",
            ),
        ],
        ["index"],
        [
            r"x_p = e_{\text{token}} + p \quad\text{or}\quad "
            r"x_p = e_{\text{token}} + \frac{p}{L - 1}",
            r"\left\lVert \mathrm{PE}(p) - \mathrm{PE}(p + k) \right\rVert^2 = "
            r"2 \sum_{i} \big(1 - \cos(k\,\omega_i)\big)"
            r"\quad\text{(the same for every } p\text{)}",
        ],
        "import numpy as np, posenc\n"
        "print(5 / (11 - 1), 5 / (101 - 1))  # 0.5 and 0.05: one position, two codes\n"
        f"pe = posenc.sinusoidal(4096, {dim}, dtype='float64')\n"
        "print(np.abs(pe).max(), np.linalg.norm(pe, axis=1).max())  # 1.0 and sqrt(d/2)",
        draw={"index": plotted("index", dim=dim)},
    )
