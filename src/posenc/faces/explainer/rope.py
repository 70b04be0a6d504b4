"""RoPE: the same clocks, turning the query and the key (the RoPE explorer)."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, holds, plotted
from posenc.integration import analysis


def build(inputs: Inputs) -> Section:
    rope = inputs.rope
    rel = analysis.rope_relative()
    _, bound, _ = analysis.rope_decay(rope["head_dim"], rope["base"], 2000)
    return Section(
        "rope",
        "RoPE: the same clocks, turning the query and the key",
        "RoPE (Su et al. 2021) uses the same frequencies, but instead of adding a "
        "vector it rotates each (channel, channel) pair of the query by m\u03b8\u1d62 "
        "and of the key by n\u03b8\u1d62, m and n being their positions, after the "
        "projections (the previous section: an added position is projected with the "
        "token and loses its relativity). A rotation "
        "keeps lengths and the dot product of two rotated vectors only sees the "
        "difference of their angles: q_m \u00b7 k_n depends on m \u2212 n alone. Pick "
        "m and n below; lock the offset and move both: the vectors turn, the score "
        "does not move, and the score matrix is constant along every diagonal.\n\n"
        "The formula pairs channels 2i and 2i + 1, as the RoFormer paper does; the code "
        "uses posenc.Rotary's default, the half layout of HF's rotate_half, which pairs "
        "channel i with i + d/2. The two are the same rotation after a fixed "
        "permutation of the channels, and a checkpoint must be run in its own (the "
        "layouts section below).\n\n"
        "The average of the rotations over the pairs shrinks as the distance grows "
        "(RoFormer, section 3.4.3): distant tokens interact less, on average.",
        [
            (
                "q_m \u00b7 k_n the same along every diagonal m \u2212 n",
                holds(rel["float64"], 64 * 2**-52 * rel["scale"]),
            ),
            (
                "decay bound at distance 100 / 1000 (relative to 0)",
                f"{bound[100]:.3f} / {bound[1000]:.3f}",
            ),
        ],
        ["decay"],
        [
            r"\begin{pmatrix} q'_{2i} \\ q'_{2i+1} \end{pmatrix} = "
            r"\begin{pmatrix} \cos(m\theta_i) & -\sin(m\theta_i) \\"
            r" \sin(m\theta_i) & \cos(m\theta_i) \end{pmatrix}"
            r"\begin{pmatrix} q_{2i} \\ q_{2i+1} \end{pmatrix},\quad "
            r"\theta_i = \mathrm{base}^{-2i/d}",
            r"\langle R_m q,\, R_n k \rangle = \langle q,\, R_{n-m}\, k \rangle",
        ],
        "import torch, posenc\n"
        "rope = posenc.Rotary(128)  # HF's half layout\n"
        "q = k = torch.randn(1, 8, 16, 128)  # (batch, heads, seq, head_dim)\n"
        "q, k = rope(q, k)",
        explorer="rope",
        draw={"decay": plotted("decay", head_dim=rope["head_dim"], base=rope["base"])},
    )
