"""Adding or concatenating a position to a token: what each leaves readable."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    dim, length = inputs.dim, inputs.length
    ac = analysis.add_concat(dim=dim, length=length)
    return Section(
        "add-concat",
        "Adding or concatenating a position to a token?",
        "The Transformer adds the encoding to the token embedding, after multiplying "
        "the embedding by \u221ad (section 3.4). Seen in the two channels of one "
        "(sin, cos) pair, each token is a point and the token at every position is "
        "a point on a unit circle around it (left). At that scale the token "
        "dominates and the position is a small offset, still mostly readable. "
        "Without the \u221ad, embeddings initialised with entries of size 1/\u221ad "
        "are tiny, every token's circle lies on top of the others, and the position "
        "drowns the token (middle). (A token or a position is read back as the "
        "best-matching embedding or table row.) Concatenating keeps token and "
        "position in separate channels (right): nothing interferes, at the cost of "
        "d more channels, and the model can still mix them in its first projection.",
        [
            (
                f"added, times \u221ad (entries of std {ac.scaled_std:.2g}): "
                "position / token read back",
                f"{100 * ac.position_recovery_scaled:.1f}% / {100 * ac.token_recovery_scaled:.1f}%",
            ),
            (
                f"added, no factor (entries of std {ac.unscaled_std:.2g}): "
                "position / token read back",
                f"{100 * ac.position_recovery_unscaled:.1f}% / "
                f"{100 * ac.token_recovery_unscaled:.1f}%",
            ),
            (
                "concatenated: position / token read back",
                f"{100 * ac.concat_position_recovery:.1f}% / {100 * ac.concat_token_recovery:.1f}%",
            ),
        ],
        ["add-concat"],
        [
            r"x_p = \sqrt{d}\, e_{\text{token}} + \mathrm{PE}(p)"
            r"\quad\text{or}\quad "
            r"x_p = \big[\, e_{\text{token}} \,;\, \mathrm{PE}(p) \,\big]",
        ],
        "import torch, posenc\n"
        f"emb = torch.nn.Embedding(1000, {dim})\n"
        f"add = posenc.SinusoidalEmbedding({dim}, input_scale={dim} ** 0.5)\n"
        "x = add(emb(torch.tensor([[5, 7, 9]])))  # sqrt(d) e + PE(p), p = 0, 1, 2",
        draw={"add-concat": plotted("add-concat", dim=dim, length=length)},
    )
