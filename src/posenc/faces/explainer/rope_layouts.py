"""RoPE's two channel layouts, interleaved and half: one rotation, a permutation apart."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, holds, plotted
from posenc.integration.analysis.layouts import rope_layouts

#: Channels of the head and positions of the measurement and its figure.
HEAD_DIM, LENGTH = 64, 32


def build(inputs: Inputs) -> Section:
    r = rope_layouts(HEAD_DIM, LENGTH, seed=0)
    half = HEAD_DIM // 2
    shown = r.permutation
    order = (
        f"{', '.join(map(str, shown[:3]))}, \u2026, {shown[half - 1]}, "
        f"{', '.join(map(str, shown[half : half + 3]))}, \u2026, {shown[-1]}"
    )
    return Section(
        "rope-layouts",
        "RoPE's two layouts: interleaved pairs and half pairs",
        "RoPE rotates pairs of channels, and two conventions choose the pairs. The "
        "interleaved layout rotates channels 2i and 2i + 1 together: the RoFormer "
        "paper's formula (the section above), GPT-J, and Meta's original Llama code (a "
        "complex multiply of neighbouring channels; Touvron et al. 2023). The half layout "
        "rotates channel i with channel i + d/2: GPT-NeoX (Black et al. 2022) and the "
        "rotate_half of HF transformers' Llama and most of its models. "
        'posenc.apply_rotary and posenc.Rotary take either (layout="half", the '
        'default, or layout="interleaved").\n\n'
        "They are the same rotation after a fixed permutation of the channels: channel i "
        "of the half layout is channel 2i of the interleaved one and channel i + d/2 is "
        "channel 2i + 1. Permuting the rows of W_q and W_k by that map turns a checkpoint "
        "of one layout into one of the other with the same scores, which is what "
        "transformers' conversion script does to the query and key weights of Meta's "
        "Llama checkpoints. Loaded without it, the model runs and is wrong: channels "
        "that belong to different pairs are rotated together, by angles meant for "
        "others.\n\n"
        "At m = n the rotations cancel in any layout, so the error is zero on the "
        "diagonal and a check at a single position passes; it appears as soon as the "
        f"query and key positions differ (the figure, right). Measured with head_dim "
        f"{HEAD_DIM} over positions 0-{LENGTH - 1}, random tokens and weights (seed 0), "
        "the interleaved model's scores against the half layout's:",
        [
            (
                f"half layout, rows of W_q and W_k permuted ({order}): largest |score difference|",
                holds(r.permuted_difference, r.tolerance),
            ),
            (
                "half layout, the same weights unpermuted: largest |score difference| "
                "(largest |score|)",
                f"{r.wrong_difference:.3g} ({r.size:.3g})",
            ),
            (
                "unpermuted, at m = n only, where the rotations cancel",
                holds(r.diagonal_difference, r.tolerance),
            ),
        ],
        ["rope-layouts"],
        [
            r"\begin{pmatrix} q'_{i} \\ q'_{i+d/2} \end{pmatrix} = "
            r"\begin{pmatrix} \cos(m\theta_i) & -\sin(m\theta_i) \\"
            r" \sin(m\theta_i) & \cos(m\theta_i) \end{pmatrix}"
            r"\begin{pmatrix} q_{i} \\ q_{i+d/2} \end{pmatrix}"
            r"\quad\text{(half; interleaved: } 2i,\ 2i+1\text{)}",
            r"q^{\text{half}}_{i} = q^{\text{int}}_{2i},\quad "
            r"q^{\text{half}}_{i+d/2} = q^{\text{int}}_{2i+1}:\quad "
            r"W_q^{\text{half}} = P\,W_q^{\text{int}},\quad "
            r"W_k^{\text{half}} = P\,W_k^{\text{int}}",
            r"{\big(R_m P q\big)}^\top \big(R_n P k\big) = "
            r"{\big(P R^{\text{int}}_m q\big)}^\top \big(P R^{\text{int}}_n k\big) = "
            r"{\big(R^{\text{int}}_m q\big)}^\top \big(R^{\text{int}}_n k\big)",
        ],
        "import torch, posenc\n"
        "q, k = torch.randn(2, 16, 64, dtype=torch.float64)  # one head: (seq, head_dim)\n"
        "perm = torch.cat([torch.arange(0, 64, 2), torch.arange(1, 64, 2)])\n"
        "def scores(layout, q, k):\n"
        "    c, s = posenc.Rotary(64, layout=layout).cos_sin(torch.arange(16), dtype=q.dtype)\n"
        "    q, k = (posenc.apply_rotary(x, c, s, layout=layout) for x in (q, k))\n"
        "    return q @ k.T\n"
        "right = scores('interleaved', q, k)\n"
        "print((scores('half', q[:, perm], k[:, perm]) - right).abs().max())  # ~1e-15\n"
        "print((scores('half', q, k) - right).abs().max())  # wrong: large",
        draw={
            "rope-layouts": plotted("rope-layouts", head_dim=HEAD_DIM, length=LENGTH, measured=r)
        },
    )
