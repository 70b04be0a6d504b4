"""Why positions at all: self-attention is permutation-equivariant."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, holds, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    perm = analysis.permutation_check()
    return Section(
        "why",
        "Why positions at all?",
        "Attention compares every token with every other by content alone: the score "
        "of query i and key j is a dot product of their vectors, and the output is a "
        "weighted sum of values. Reorder the tokens and every score, weight and output "
        "row is reordered the same way, nothing else changes: \u201cthe dog bit the "
        "man\u201d and \u201cthe man bit the dog\u201d give the same set of outputs. "
        "Self-attention is permutation-equivariant.\n\n"
        "A positional encoding breaks the symmetry: it makes the same token at "
        "another position a different vector (added to the input, as below), or it "
        "makes the score depend on where the two tokens are (RoPE, ALiBi, T5, "
        "further down).",
        [
            (
                "attention of the permuted tokens = the permuted attention, no positions",
                holds(perm.max_difference, perm.bound),
            ),
            (
                "largest change of an output row once positions are added",
                f"{perm.with_positions:.3g}",
            ),
        ],
        ["permutation"],
        [
            r"\mathrm{Attn}(X) = \mathrm{softmax}\!\left("
            r"\frac{X W_Q (X W_K)^\top}{\sqrt{d}}\right) X W_V",
            r"\mathrm{Attn}(P X) = P\,\mathrm{Attn}(X)"
            r"\quad\text{for every permutation matrix } P",
        ],
        "from posenc import analysis\n"
        "r = analysis.permutation_check(dim=16, tokens=6)\n"
        "print(r.max_difference, r.with_positions)  # rounding (~1e-16), then ~0.7",
        draw={"permutation": plotted("permutation")},
    )
