"""``posenc report``: positional encodings explained, with figures, formulas and exact numbers.

:func:`build` writes one self-contained page, ``out/index.html``, that works
offline from ``file://``: each section asks a question, answers it in a few
sentences, gives the formula (MathML, converted from LaTeX by latex2mathml),
a few lines of posenc code, a figure, and the numbers measured in this run
(:mod:`posenc.analysis`). Five explorers let the reader move the position,
the size and the base; a continuous diffusion timestep through the three
timestep conventions; the positions of a query and a key under RoPE; the
trained and target lengths of a context-extension schedule; and a query
position under each head of ALiBi and of a trained T5 table
(:mod:`posenc.faces.explorers`: their data computed by posenc, drawn with d3).
The sections follow a learner's order: why positions, why not the index, the
sinusoid and its timestep use, its properties, learned tables and what the
layers keep of a position (the lab's linear probes), RoPE and long contexts,
NoPE layers, biases, grids.
Static figures (:mod:`posenc.plot`) are embedded as SVG and also written to
``out/figures/*.{png,svg}``.

By default the page also shows the lab's bundled results (a copy task, a
byte-level language model and the flip-flop task, trained at one length and
tested beyond it, and the copy run's position probes and trained T5 table);
``lab=DIR`` shows a
fresh ``posenc lab run`` instead (a section whose data that run lacks, such
as probes, falls back to the bundled copy run).
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.faces.explorers import rope_settings
from posenc.faces.files import atomic_write
from posenc.families.absolute.sinusoidal import PRESETS, resolve
from posenc.integration import analysis

__all__ = [
    "build",
]

#: The page embeds the explorer's table for every d and base it offers, so its size grows
#: with both; at these maxima it stays under 4 MiB.
MAX_LENGTH = 128
#: The largest ``--dim`` (see :data:`MAX_LENGTH`).
MAX_DIM = 1024

#: The lab results shown when no ``lab`` directory is given: ``posenc lab run`` and
#: ``posenc lab run --task text`` at their defaults, and the flip-flop run of PaTH,
#: PaTH-FoX, FoX, RoPE and NoPE (results.json of each).
BUNDLED_LAB = ("lab-copy.json", "lab-text.json", "lab-flipflop.json")


@dataclass
class Section:
    """One question of the page: its answer, measured numbers, figures, formulas and code.

    Attributes:
        key: the section's HTML id.
        title: the question, as a heading.
        text: the answer, one paragraph per blank-line-separated block.
        numbers: ``(what, value)`` rows measured in this run.
        figures: names of :data:`posenc.plot.KINDS` figures shown.
        formulas: LaTeX, each rendered as a MathML block.
        code: a few lines of posenc code that compute what the section shows.
        explorer: the interactive explorer shown (``"sinusoidal"``, ``"rope"``,
            ``"extension"``), if any.
        extra: HTML appended to the section (the lab's results).
    """

    key: str
    title: str
    text: str
    numbers: list[tuple[str, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    formulas: list[str] = field(default_factory=list)
    code: str = ""
    explorer: str | None = None
    extra: str = ""


@dataclass
class Report:
    """What :func:`build` wrote: the sections, the HTML file and the figure files."""

    sections: list[Section]
    index: Path
    figures: dict[str, tuple[Path, Path]]
    seconds: float


def _fmt(x: float, digits: int = 3) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def mathml(latex: str) -> str:
    """``latex`` as a MathML ``<math display="block">`` element (latex2mathml)."""
    from latex2mathml.converter import convert

    return convert(latex, display="block")


def _holds(error: float, bound: float) -> str:
    """A property that holds to rounding, said as such rather than as a noise number."""
    if error <= bound:
        return f"yes: within float64 rounding (bound {_fmt(bound, 2)})"
    return f"NO: error {_fmt(error)} above the float64 bound {_fmt(bound, 2)}"


def _odd_timestep_channels(dim: int) -> tuple[int, int, float]:
    """Channels The Annotated Diffusion Model's code and posenc's preset give at odd ``dim``."""
    import torch

    import posenc
    from posenc.faces.bench.sinusoidal import annotated_diffusion_embedding

    theirs = annotated_diffusion_embedding(torch.tensor([10.0]), dim)
    ours = posenc.sinusoidal(torch.tensor([10.0]), dim, preset="annotated-diffusion")
    return int(theirs.shape[-1]), int(ours.shape[-1]), float(ours[0, -1])


def _sections(
    dim: int,
    length: int,
    preset: str,
    rope: dict[str, Any],
    learned: analysis.Learned,
    labs: Sequence[Any] = (),
) -> list[Section]:
    import posenc

    sections: list[Section] = []
    spec = resolve(preset)
    omega = spec.inv_freq(dim)
    table = posenc.sinusoidal(length, dim, preset=preset, dtype="float64")
    wl = 2 * np.pi / omega

    fixed_params = sum(p.numel() for p in posenc.SinusoidalEmbedding(dim).parameters())
    learned_params = sum(
        p.numel() for p in posenc.LearnedPositionalEmbedding(length, dim).parameters()
    )
    perm = analysis.permutation_check()
    sections.append(
        Section(
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
                    _holds(perm.max_difference, perm.bound),
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
        )
    )

    idx = analysis.index_features(dim=dim)
    sections.append(
        Section(
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
                r"\lVert \mathrm{PE}(p) - \mathrm{PE}(p + k) \rVert^2 = "
                r"2 \sum_{i} \big(1 - \cos(k\,\omega_i)\big)"
                r"\quad\text{(the same for every } p\text{)}",
            ],
            "import numpy as np, posenc\n"
            "print(5 / (11 - 1), 5 / (101 - 1))  # 0.5 and 0.05: one position, two codes\n"
            f"pe = posenc.sinusoidal(4096, {dim}, dtype='float64')\n"
            "print(np.abs(pe).max(), np.linalg.norm(pe, axis=1).max())  # 1.0 and sqrt(d/2)",
        )
    )

    sections.append(
        Section(
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
            "log-uniformly over the pairs, so fast, middle and slow ones all appear.\n\n"
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
    )

    errors = analysis.exp_log_errors(dim)  # float32 only: float64's are rounding noise
    sections.append(
        Section(
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
                    _fmt(float(err.max())),
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
        )
    )

    ts = analysis.timestep_presets(320)
    ldm_mean, ldm_lo, ldm_hi = ts.mismatch("ddpm", "ldm")
    _, same_lo, _ = ts.mismatch("ddpm", "annotated-diffusion")
    odd = _odd_timestep_channels(33)
    sections.append(
        Section(
            "timesteps",
            "Diffusion timesteps: the same sinusoid, fed a noise level",
            "Diffusion models run one network at every step of a noising process and must "
            "tell it which step it is at. DDPM (Ho et al. 2020) reuses the Transformer's "
            "sinusoid for that: the timestep t (0 to 999 for 1000 steps, or a float in "
            "continuous-time and flow models) goes where the position p went, and an MLP "
            "(linear, SiLU, linear) turns the result into the vector every residual block "
            "adds (DDPM, latent diffusion's UNet) or that scales and shifts the layer norms "
            "(DiT's adaLN). The SinusoidalPositionEmbeddings of The Annotated Diffusion Model "
            "is exactly this: \u201cposition\u201d in its name, a timestep in its input. Nothing "
            "about sequences is left: there is one t per image, not one per token, and the "
            "sinusoid is chosen because nearby noise levels should get similar vectors and "
            "far ones different vectors, at every scale.\n\n"
            "Three conventions are in use, and they disagree on the layout: diffusers' "
            "get_timestep_embedding defaults and DDPM put [sin | cos] with h \u2212 1 in the "
            "exponent (posenc's ddpm preset); latent diffusion, Stable Diffusion and DiT put "
            "[cos | sin] with h (flip_sin_to_cos=True, downscale_freq_shift=0: the ldm "
            "preset); The Annotated Diffusion Model is ddpm's layout (annotated-diffusion). "
            "A network trained with one and fed another sees vectors at a cosine of about "
            f"{ldm_mean:.2f} from those it learned: a different input, not a small error.\n\n"
            "The odd-d pitfall: with an odd number of channels, the annotated code builds "
            "two halves of d // 2 and returns d \u2212 1 channels, so the next layer's "
            "input size is wrong; diffusers pads a zero channel, and so do posenc's presets. "
            "Move t, d and the preset below: the vectors of the three presets side by side, "
            "and the similarity of t to every other timestep.",
            [
                (
                    "cosine of the ddpm and ldm embeddings of the same t, over t = 0..999, d = 320",
                    f"mean {ldm_mean:.3f}, min {ldm_lo:.3f}, max {ldm_hi:.3f}",
                ),
                (
                    "ddpm and annotated-diffusion, the same t: identical at even d",
                    _holds(1.0 - same_lo, ts.tolerance),
                ),
            ]
            + [
                (f"cos(e(t), e(t + {k:g})), ddpm, d = 320", f"{v:.4f}")
                for k, v in zip(ts.offsets, ts.neighbour[0], strict=True)
            ]
            + [
                (
                    "those cosines are the same at every t",
                    _holds(ts.neighbour_spread, ts.tolerance),
                ),
                (
                    "d = 33: channels from The Annotated Diffusion Model's code / from posenc "
                    "(last channel)",
                    f"{odd[0]} / {odd[1]} (zero)",
                ),
            ],
            ["timesteps"],
            [
                r"e(t) = \big[\sin(t\,\omega_0), \ldots, \sin(t\,\omega_{h-1}),\ "
                r"\cos(t\,\omega_0), \ldots, \cos(t\,\omega_{h-1})\big]",
                r"\omega_k = \exp\!\left(-\frac{k\,\ln 10000}{h - s}\right)",
                r"s = 1\ \text{(ddpm, annotated-diffusion)};\ \text{ldm: } s = 0"
                r"\text{, the halves swapped}",
                r"\mathrm{emb}(t) = W_2\, \mathrm{SiLU}\big(W_1\, e(t) + b_1\big) + b_2",
            ],
            "import torch, posenc\n"
            "t = torch.tensor([999.5, 10.0])  # float timesteps\n"
            "e = posenc.sinusoidal(t, 320, preset='ldm')  # (2, 320): [cos | sin], exact\n"
            "mlp = torch.nn.Sequential(torch.nn.Linear(320, 1280), torch.nn.SiLU(),\n"
            "                          torch.nn.Linear(1280, 1280))\n"
            "print(mlp(e).shape)  # the vector each block adds",
            explorer="timestep",
        )
    )

    sh = analysis.shift_error(dim, length, (1, 10, 100), preset=preset)
    reg = analysis.regression_r2(dim, length, 10, preset=preset)
    sections.append(
        Section(
            "shift",
            "Why is PE(p + k) a linear function of PE(p), when a regression says no?",
            "The paper chose sinusoids because \u201cfor any fixed offset k, PE(p + k) "
            "can be represented as a linear function of PE(p)\u201d. The function is a "
            "rotation: by the angle-addition formulas, the pair of pair i at p + k is "
            "the pair at p turned by k\u03c9\u1d62. The 2x2 matrix holds only "
            "cos(k\u03c9\u1d62) and sin(k\u03c9\u1d62): constants for a fixed k, the "
            "same for every p. Stacking one rotation per pair gives a block-diagonal "
            "matrix M_k (left figure: its first 16 channels).\n\n"
            "A regression of one column at p + k on the same column at p fails (right, "
            "left panel) because sin(\u03c9(p + k)) needs cos(\u03c9p) as well: the "
            "partner column. With the (sin, cos) pair as regressors the fit is exact "
            "(right panel).",
            [
                (f"PE(p + {k:g}) = M_{k:g} PE(p) at every p", _holds(e, sh.tolerance))
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
        )
    )

    ac = analysis.add_concat(dim=dim, length=length)
    sections.append(
        Section(
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
                    f"{100 * ac.position_recovery_scaled:.1f}% / "
                    f"{100 * ac.token_recovery_scaled:.1f}%",
                ),
                (
                    f"added, no factor (entries of std {ac.unscaled_std:.2g}): "
                    "position / token read back",
                    f"{100 * ac.position_recovery_unscaled:.1f}% / "
                    f"{100 * ac.token_recovery_unscaled:.1f}%",
                ),
                (
                    "concatenated: position / token read back",
                    f"{100 * ac.concat_position_recovery:.1f}% / "
                    f"{100 * ac.concat_token_recovery:.1f}%",
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
        )
    )

    norms = analysis.norms(dim, length, preset=preset)
    dots = analysis.offset_dot_products(dim, length, (1, 10, 100), preset=preset)
    sections.append(
        Section(
            "geometry",
            "Why is every norm \u221a(d/2), and what does a dot product measure?",
            "Each (sin, cos) pair lies on the unit circle, so it contributes "
            "sin\u00b2 + cos\u00b2 = 1 to the squared norm, whatever the position: every "
            "row has norm \u221a(d/2). No position is louder than another.\n\n"
            "The dot product of two rows is a sum of cos(k\u03c9\u1d62) over the pairs: "
            "it depends on the offset k only, not on where the two positions are (left), "
            "and it falls off, with ripples, as the offset grows. The cosine similarity "
            "of every pair of positions (right) is therefore constant along diagonals.",
            [
                (
                    f"norm of every row, positions 0-{length - 1}",
                    f"{math.sqrt(dim / 2):.6g} = \u221a({dim}/2): "
                    + _holds(norms.max_deviation, norms.tolerance),
                )
            ]
            + [
                (f"PE(p) \u00b7 PE(p + {k:g}), the same at every p", f"{cf:.6g}")
                for k, cf in zip(dots.offsets, dots.closed_form, strict=True)
            ]
            + [("the same at every p", _holds(max(dots.spread), dots.tolerance))],
            ["offsets", "similarity"],
            [
                r"\lVert \mathrm{PE}(p) \rVert^2 = \sum_{i=0}^{d/2-1}"
                r"\left(\sin^2(p\omega_i) + \cos^2(p\omega_i)\right) = \frac{d}{2}",
                r"\mathrm{PE}(p) \cdot \mathrm{PE}(p + k) = \sum_{i=0}^{d/2-1} \cos(k\omega_i)",
            ],
            "import numpy as np, posenc\n"
            f"pe = posenc.sinusoidal(1000, {dim}, dtype='float64')\n"
            "print(np.linalg.norm(pe, axis=1).min(), np.sqrt(pe.shape[1] / 2))",
        )
    )

    curves = analysis.precision_curves(dim, preset)
    sections.append(
        Section(
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
                    f"{_fmt(a)} / {_fmt(b)} / {_fmt(c)}",
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
            "import posenc\n"
            "row = posenc.sinusoidal([10**6], 512)  # float32, exact to its rounding",
        )
    )

    lt = learned.table
    near, far_sim = learned.similarity(apart=8)
    sections.append(
        Section(
            "learned",
            "Learned versus sinusoidal: what happens beyond the trained length?",
            f"A learned table is a free parameter per position. Here one of "
            f"{lt.shape[0]} positions x {lt.shape[1]} channels is trained from random "
            f"numbers for {learned.steps} steps on a task that needs positions (copy the "
            "previous token, one causal attention layer). It learns a structure for the "
            "positions it sees, and nothing for the others: a row it never trained is "
            "its random initialisation, and a position past the table does not exist. "
            "The sinusoidal table is a fixed rule, defined at every position, but a "
            "model trained on short sequences has never seen the hands' readings of "
            "the long ones.\n\n"
            "The lab below trains small transformers at one length and tests them "
            "beyond it: learned and sinusoidal encodings fall to zero past the trained "
            "lengths, RoPE degrades, ALiBi (a bias on the scores, not a vector) holds.",
            [
                ("copy accuracy of the tiny run", f"{100 * learned.accuracy:.1f}%"),
                ("learned: mean cosine of neighbouring positions", f"{near:.3f}"),
                ("learned: mean cosine of positions more than 8 apart", f"{far_sim:.3f}"),
            ],
            ["learned"],
            [],
            "import torch, posenc\n"
            "learned = posenc.LearnedPositionalEmbedding(512, 64)  # positions 0..511 only\n"
            "fixed = posenc.SinusoidalEmbedding(64)  # any position\n"
            "x = torch.zeros(4, 64)\n"
            "y = fixed(x, positions=torch.arange(100_000, 100_004))",
        )
    )

    probed = _first(labs, lambda run: bool(run.probes))
    sections.append(_layers_section(probed))

    rel = analysis.rope_relative()
    _, bound, _ = analysis.rope_decay(rope["head_dim"], rope["base"], 2000)
    sections.append(
        Section(
            "rope",
            "RoPE: the same clocks, turning the query and the key",
            "RoPE (Su et al. 2021) uses the same frequencies, but instead of adding a "
            "vector it rotates each (channel, channel) pair of the query by m\u03b8\u1d62 "
            "and of the key by n\u03b8\u1d62, m and n being their positions. A rotation "
            "keeps lengths and the dot product of two rotated vectors only sees the "
            "difference of their angles: q_m \u00b7 k_n depends on m \u2212 n alone. Pick "
            "m and n below; lock the offset and move both: the vectors turn, the score "
            "does not move, and the score matrix is constant along every diagonal.\n\n"
            "The average of the rotations over the pairs shrinks as the distance grows "
            "(RoFormer, section 3.4.3): distant tokens interact less, on average.",
            [
                (
                    "q_m \u00b7 k_n the same along every diagonal m \u2212 n",
                    _holds(rel["float64"], 64 * 2**-52 * rel["scale"]),
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
        )
    )

    from posenc.faces import engine_table
    from posenc.integration.analysis import explorer as ex

    ext = ex.extension_explorer(
        rope["head_dim"],
        rope["base"],
        trained=[rope["original"]],
        factors=[rope["factor"]],
        schedules=rope["schedules"],
    )
    rows = []
    for s in ext["schedules"]:
        d = ex.describe(
            ext["cases"][s.key, rope["original"], rope["factor"]], rope["original"], rope["factor"]
        )
        rows.append(
            (
                s.label,
                f"{d['kept']} kept, {d['interpolated']} interpolated, {d['blended']} "
                f"blended; {d['in_range']} of {rope['head_dim'] // 2} in trained range; "
                f"attention scaling {d['attention_scaling']:.4g}",
            )
        )
    sections.append(
        Section(
            "extension",
            "Context extension: how the schedules stretch the clocks",
            f"A RoPE model trained on {rope['original']} positions has seen each pair "
            "turn through angles up to trained length x \u03b8\u1d62. Run it on longer "
            "inputs and the slow pairs reach angles it never saw. The scaling schedules "
            "slow some hands down so that the target length looks like the trained one. "
            "Linear interpolation divides every frequency by the factor (the fast "
            "pairs, which turned many times in training, lose resolution). NTK-aware "
            "scaling raises the base: fast pairs almost kept, slow ones divided. YaRN "
            "and llama3 keep the fast pairs, interpolate the slow ones and blend "
            "between, by each pair's wavelength against the trained length. A pair is "
            "in range when every angle it reaches at the target length was reached in "
            "training.\n\n"
            f"Choose a schedule, a trained and a target length. The table is the "
            f"same count for {rope['name']} at factor {rope['factor']:g}.",
            rows,
            [],
            [
                r"\theta'_i = \frac{\theta_i}{s}\ \text{(linear)},\quad "
                r"\theta'_i = \big(\mathrm{base}\, s^{d/(d-2)}\big)^{-2i/d}\ \text{(NTK)}",
                r"\theta'_i = (1 - \gamma_i)\,\frac{\theta_i}{s} + \gamma_i\,\theta_i,\quad "
                r"\gamma_i = \mathrm{ramp}\!\left(\frac{L}{\lambda_i}\right)"
                r"\ \text{(YaRN, llama3)}",
            ],
            "import posenc\n"
            "rope = posenc.Rotary(128, base=500000.0, scaling={\n"
            "    'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0,\n"
            "    'high_freq_factor': 4.0, 'original_max_position_embeddings': 8192})\n"
            "print(rope.inv_freq[-4:])",
            explorer="extension",
            extra=engine_table.html(engine_table.bundled()),
        )
    )

    hybrid = _first(labs, lambda run: {"rope", "nope", "hybrid-nope"} <= _encodings(run))
    sections.append(_nope_section(hybrid))

    from posenc.faces.lab import tasks

    copy = _first(labs, lambda run: "t5" in _encodings(run)).config
    seen = tasks.sequence_length(copy.task, copy.train_len) - 1
    reach = copy.max_positions - 1
    trained_buckets = sorted(set(posenc.t5_bucket(-np.arange(seen + 1), bidirectional=False)))
    beyond_buckets = sorted(
        set(posenc.t5_bucket(-np.arange(seen + 1, reach + 1), bidirectional=False))
    )
    slopes = posenc.alibi_slopes(8)
    boundaries = posenc.t5_bucket(-np.arange(200))
    starts = [int(d) for d in np.arange(1, 200)[np.diff(boundaries) != 0]]
    sections.append(
        Section(
            "biases",
            "ALiBi and T5: positions as a bias on the scores",
            "Instead of touching the vectors, add a number to each attention score "
            "that depends on the distance. ALiBi (Press et al. 2022) adds "
            "\u2212m\u2095 (i \u2212 j): a straight penalty, steeper for some heads than "
            "others (slopes 2^(\u22128h/H)). Nothing is learned and nothing depends on "
            "the trained length, which is why it extrapolates (the lab section). T5 "
            "(Raffel et al. 2020) learns one number per head for each bucket of the "
            "relative position: exact for small distances, logarithmic beyond, and the "
            "same bucket for everything past max_distance.\n\n"
            "Pick a bias, a head and a query position below: the bias over the keys, and "
            "the attention weights the bias alone gives when every content score is the "
            "same. ALiBi's steep heads look at the last few tokens, its flat heads spread "
            "over the whole context. The T5 table is the one the lab's copy run learned: "
            "each band of keys is one bucket. Move the query past the trained lengths: the "
            "longer distances fall in buckets that training never reached: their numbers got "
            "no gradient and are still the random ones the table started from (shrunk a "
            "little by weight decay), one reason T5 fails beyond its trained lengths in the "
            "lab.",
            [
                ("ALiBi slopes, 8 heads", ", ".join(f"2^{math.log2(s):g}" for s in slopes)),
                (
                    "T5 bucket starts (bidirectional, 32 buckets, max_distance 128)",
                    ", ".join(map(str, starts)),
                ),
                (
                    f"causal T5 buckets of the distances the lab trained on (0-{seen}) / of "
                    f"the distances beyond, up to {reach}",
                    f"{trained_buckets[0]}-{trained_buckets[-1]} / "
                    f"{beyond_buckets[0]}-{beyond_buckets[-1]}",
                ),
            ],
            ["alibi", "t5"],
            [
                r"s_{ij} = \frac{q_i \cdot k_j}{\sqrt{d}} - m_h\,(i - j),\quad "
                r"m_h = 2^{-8h/H}",
                r"s_{ij} = q_i \cdot k_j + b_h\big(\mathrm{bucket}(j - i)\big)\ \text{(T5)}",
            ],
            "import torch, posenc\n"
            "alibi = posenc.ALiBi(8)\n"
            "bias = alibi.bias(16, 16)  # (heads, queries, keys), add to the scores",
            explorer="bias",
        )
    )

    sections.extend(_arithmetic_sections())

    g = posenc.grid((14, 14), 64, preset="mae", dtype="float64")
    sections.append(
        Section(
            "grid",
            "2-D grids: positions of image patches",
            "A vision transformer's patches sit on a grid. MAE's encoding gives half the "
            "channels a 1-D sinusoidal encoding of the patch's row and half of its "
            "column. Shown: a 14 x 14 grid with 64 channels, one tile per channel; the "
            "first half vary along one axis, the second half along the other.",
            [
                ("grid positions x channels", f"{g.shape[0]} x {g.shape[1]}"),
                (
                    "channels that vary along one axis only: rows / columns",
                    f"{int((np.ptp(g.reshape(14, 14, 64), axis=1).max(0) < 1e-12).sum())} / "
                    f"{int((np.ptp(g.reshape(14, 14, 64), axis=0).max(0) < 1e-12).sum())}",
                ),
            ],
            ["grid"],
            [],
            "import posenc\ng = posenc.grid((14, 14), 64, preset='mae')  # (196, 64)",
        )
    )
    return sections


def _first(labs: Sequence[Any], want: Callable[[Any], bool]) -> Any:
    """The first lab run that has what a section needs, else the bundled copy run's."""
    from posenc.faces.lab import results

    for run in labs:
        if want(run):
            return run
    return results.bundled()[0]


def _encodings(run: Any) -> set[str]:
    return {r.encoding for r in run.records}


def _lab_note(run: Any) -> str:
    c = run.config
    seeds = "seed 0" if c.seeds == 1 else f"seeds 0-{c.seeds - 1}"
    return (
        f"the lab's {c.task} run ({c.layers} layers, {c.heads} heads, width {c.d_model}, "
        f"{c.steps} steps, trained on lengths 1-{c.train_len}, {seeds})"
    )


def _spread(values: tuple[float, float, float], digits: int = 2) -> str:
    mean, lo, hi = values
    return f"{mean:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _layers_section(run: Any) -> Section:
    """How positions survive through the layers: the lab's linear probes, layer by layer."""
    from posenc.faces.lab import results

    rows = results.probe_summary(run.probes)
    by: dict[str, dict[str, dict[int, tuple[float, float, float]]]] = {}
    positions = 2
    for row in rows:
        by.setdefault(row["encoding"], {})[row["metric"]] = row["layers"]
        positions = row["positions"]
    chance = 1 / positions
    numbers = []
    for encoding, metrics in by.items():
        acc, r2 = metrics.get("accuracy", {}), metrics.get("r2", {})
        layers = sorted(acc)
        numbers.append(
            (
                f"{encoding}: probe accuracy, embedding \u2192 "
                + " \u2192 ".join(f"block {v}" for v in layers[1:]),
                " \u2192 ".join(_spread(acc[v]) for v in layers)
                + (f"; R\u00b2 {_spread(r2[layers[-1]])} after the last" if r2 else ""),
            )
        )
    numbers.append(("chance accuracy (1 / positions)", f"{chance:.3f} (1/{positions})"))
    finding = _probe_finding(by, chance)
    text = (
        "A transformer block never replaces its input: it adds to it. Each block reads "
        "the residual stream x, computes attention and an MLP from a normalised copy, and "
        "adds their outputs back, so what the embedding put in (the token, and an absolute "
        "position if one was added) stays in x unless a later block writes over it. "
        "Whether it does is a question of measurement, not of diagrams: fit a linear probe "
        "from each layer's residual stream to the token's absolute position, on sequences "
        "the probe was not fitted on, and see how much of the position it reads back.\n\n"
        f"The probes here were fitted on the models of {_lab_note(run)}: a classifier over "
        f"the {positions} positions (accuracy) and a least-squares read-out of the index "
        "(R\u00b2), per layer. The absolute encodings (sinusoidal, learned) put the "
        "position into the stream at the embedding, where a linear read-out finds it "
        "almost whole. RoPE, ALiBi and T5 put nothing into the vectors: they act on the "
        "attention scores, so their embedding output carries no position beyond what the "
        "tokens themselves tell, and whatever more a probe reads after a block, attention "
        "wrote there. Causal attention can count: a "
        "query at position i averages over i + 1 keys, and how spread its weights are "
        "tells the position.\n\n" + finding
    )
    return Section(
        "layers",
        "How do positions survive through the layers?",
        text,
        numbers,
        ["probes"],
        [
            r"x_{l} = x_{l-1} + \mathrm{Attn}_l\big(\mathrm{LN}(x_{l-1})\big),\quad "
            r"x_{l} \leftarrow x_{l} + \mathrm{MLP}_l\big(\mathrm{LN}(x_{l})\big)",
            r"\hat{p} = \mathrm{argmax}_c\, (W x_l + b)_c,\quad "
            r"R^2 = 1 - \frac{\sum (p - \tilde{p})^2}{\sum (p - \bar{p})^2}",
        ],
        "import torch\n"
        "from posenc.lab.model import LabModel, ModelConfig\n"
        "from posenc.lab.probes import linear_accuracy\n"
        "model = LabModel(ModelConfig(vocab=16, d_model=32, layers=2, heads=4), 'nope')\n"
        "tokens = torch.randint(0, 16, (48, 12))\n"
        "y = torch.arange(12).repeat(48)\n"
        "for h in model.residuals(tokens):  # embedding output, then after each block\n"
        "    x = h.detach().reshape(-1, 32).double()\n"
        "    print(linear_accuracy(x[:384], y[:384], x[384:], y[384:], 12, steps=20))",
    )


def _probe_finding(
    by: dict[str, dict[str, dict[int, tuple[float, float, float]]]], chance: float
) -> str:
    """What the probes of one run show, in sentences whose numbers are that run's."""

    def acc(encoding: str) -> list[float]:
        layers = by.get(encoding, {}).get("accuracy", {})
        return [layers[v][0] for v in sorted(layers)]

    parts = []
    tables = [e for e in ("sinusoidal", "learned") if acc(e)]
    if tables:
        kept = ", ".join(f"{e} {acc(e)[-1]:.2f}" for e in tables)
        parts.append(
            "The absolute tables' position is still read after the last block "
            f"({kept}): the residual stream kept what the embedding put in."
        )
    written = [e for e in ("rope", "alibi", "t5", "nope", "hybrid-nope") if acc(e)]
    if written:
        embedding = max(acc(e)[0] for e in written)
        peak = [max(acc(e)[1:]) for e in written if len(acc(e)) > 1]
        last = [acc(e)[-1] for e in written]
        r2 = [by[e]["r2"][max(by[e]["r2"])][0] for e in written if by[e].get("r2")]
        parts.append(
            f"Without a table ({', '.join(written)}) the embedding output is read at "
            f"{embedding:.2f} at most (chance {chance:.2f}; what a probe finds there the "
            "tokens told it: a task's start token and separator sit at fixed places). After "
            f"the blocks a probe reads {min(peak):.2f}-{max(peak):.2f} at best and "
            f"{min(last):.2f}-{max(last):.2f} after the last"
            + (f", with R\u00b2 {min(r2):.2f}-{max(r2):.2f}" if r2 else "")
            + ": attention wrote the position into the stream"
            + (
                ", and the last block, turning to the answer, blurs the exact position "
                "while keeping the coarse one."
                if max(last) < max(peak) - 0.02
                else "."
            )
        )
    nope = acc("nope")
    if len(nope) > 1 and max(nope[1:]) > nope[0] + 0.05:
        parts.append(
            f"NoPE too (from {nope[0]:.2f} to {max(nope[1:]):.2f}): with no encoding at all, "
            "the causal mask put the position there, as Haviv et al. (2022) found in causal "
            "language models without positional encodings."
        )
    elif nope:
        parts.append(
            "NoPE's stream gained no position in this run; Haviv et al. (2022) found it in "
            "causal language models without positional encodings."
        )
    return " ".join(parts) or "This run has no probes of these encodings."


def _nope_section(run: Any) -> Section:
    """NoPE and layers without RoPE (Llama 4, SmolLM3, Cohere 2): the lab's numbers."""
    from posenc.faces.lab import results

    rows = {r["encoding"]: r for r in results.summary(run.records, run.config.train_len)}

    def cell(encoding: str, key: str) -> str:
        row = rows.get(encoding, {})
        return _spread(row[key], 3) if key in row else "-"

    numbers = [
        (
            f"{e}: exact match, lengths 1-{run.config.train_len} / "
            f"{run.config.train_len + 1}-{run.config.test_len}",
            f"{cell(e, 'within')} / {cell(e, 'beyond')}",
        )
        for e in ("rope", "nope", "hybrid-nope")
        if e in rows
    ]
    from posenc.integration.analysis.rope_reading import nope_layers

    llama4 = nope_layers(
        {"model_type": "llama4_text", "num_hidden_layers": 12, "no_rope_layer_interval": 4}
    )
    if llama4 is not None:
        numbers.append(
            (
                "NoPE layers of a 12-layer config with no_rope_layer_interval = 4, as "
                "posenc rope reads it",
                ", ".join(map(str, llama4["layers"])),
            )
        )
    return Section(
        "nope",
        "No positional encoding at all, and layers without RoPE",
        "A causal decoder can work with no positional encoding (NoPE): the mask already "
        "tells each query how many tokens came before it, and the layers can turn that "
        "into positions (the previous section measured it). Kazemnejad et al. (2023) "
        "found NoPE generalising to longer inputs better than RoPE, ALiBi or T5 on small "
        "synthetic tasks; trained on real text at scale, models still use RoPE in most "
        "layers.\n\n"
        "Recent long-context models mix the two. Llama 4 leaves every fourth layer without "
        "RoPE (its config's no_rope_layers: layers 3, 7, 11, ... attend to the whole "
        "context with no rotation, the others rotate and attend within chunks), SmolLM3 "
        "does the same with its own no_rope_layers, and Cohere 2 has three "
        "sliding-window RoPE layers for each global layer without positions. The RoPE "
        "layers keep the local order exact; the NoPE layers look across the whole "
        "context without the rotation angles that were never met in training (the "
        "extension section).\n\n"
        f"The numbers are from {_lab_note(run)}: RoPE in every layer, in none (nope), and "
        "in the first layer only (hybrid-nope: every second layer without RoPE, since "
        "the lab's models have two; Llama 4 and SmolLM3 use every fourth). "
        + _nope_finding(rows, run.config.train_len),
        numbers,
        ["nope-layers"],
        [
            r"\text{layer } i \text{ uses RoPE} \;\iff\; (i + 1) \bmod k \neq 0"
            r"\quad (k = 4 \text{ in Llama 4 and SmolLM3})",
        ],
        "import torch, posenc\n"
        "rope = posenc.Rotary(64)\n"
        "q = k = v = torch.randn(1, 4, 16, 64)\n"
        "for i in range(4):  # every 4th layer without RoPE, as Llama 4's no_rope_layers\n"
        "    uses_rope = (i + 1) % 4 != 0\n"
        "    out = posenc.attention(q, k, v, rotary=rope if uses_rope else None, causal=True)",
    )


def _nope_finding(rows: dict[str, dict[str, Any]], train_len: int) -> str:
    """What the lab's RoPE, NoPE and hybrid models did, in sentences with that run's numbers."""

    def mean(encoding: str, key: str) -> float | None:
        row = rows.get(encoding, {})
        return row[key][0] if key in row else None

    parts = []
    nope_in, nope_out = mean("nope", "within"), mean("nope", "beyond")
    rope_in, rope_out = mean("rope", "within"), mean("rope", "beyond")
    if nope_in is not None and rope_in is not None:
        if nope_in < rope_in - 0.1:
            parts.append(
                f"Here NoPE learned copy only in part: {nope_in:.2f} exact match within the "
                f"trained lengths (RoPE {rope_in:.2f})"
                + (f" and {nope_out:.2f} beyond" if nope_out is not None else "")
                + ". That disagrees with Kazemnejad et al.'s ranking, whose models were far "
                "larger than the lab's two layers of width 64; it is the measured result "
                "of these small models, seeds and spread as in the table."
            )
        else:
            parts.append(
                f"Here NoPE reached {nope_in:.2f} within the trained lengths "
                f"(RoPE {rope_in:.2f})"
                + (
                    f" and {nope_out:.2f} beyond (RoPE {rope_out:.2f})."
                    if nope_out is not None and rope_out is not None
                    else "."
                )
            )
    hyb_in, hyb_out = mean("hybrid-nope", "within"), mean("hybrid-nope", "beyond")
    if hyb_in is not None and hyb_out is not None and rope_out is not None:
        better = "above" if hyb_out > rope_out else "not above"
        parts.append(
            f"The hybrid reached {hyb_in:.2f} within and {hyb_out:.2f} beyond length "
            f"{train_len}, {better} RoPE in every layer ({rope_out:.2f} beyond)."
        )
    return " ".join(parts)


def _lab_figures(labs: Sequence[Any]) -> dict[str, Callable[[], Any]]:
    """The figures drawn from a lab run (the lab's own figures), by name."""
    from posenc.faces.lab import results

    def probes() -> Any:
        return results.probe_figure(_first(labs, lambda run: bool(run.probes)).probes)

    def nope_layers() -> Any:
        run = _first(labs, lambda run: {"rope", "nope", "hybrid-nope"} <= _encodings(run))
        keep = ("rope", "nope", "hybrid-nope")
        return results.figure(
            [r for r in run.records if r.encoding in keep],
            run.config.train_len,
            f"lab {run.config.task}: RoPE in every layer, in none, or in every other",
        )

    def arithmetic_curves() -> Any:
        from posenc.faces.lab import arithmetic

        return arithmetic.figure(arithmetic.bundled() or {})

    return {"probes": probes, "nope-layers": nope_layers, "arithmetic": arithmetic_curves}


def _figure_options(
    dim: int,
    length: int,
    preset: str,
    rope: dict[str, Any],
    learned: analysis.Learned,
    labs: Sequence[Any] = (),
) -> dict[str, dict[str, Any]]:
    base = {"dim": dim, "length": length, "preset": preset}
    options: dict[str, dict[str, Any]] = {name: base for name in ("heatmap", "clocks")}
    options.update(
        {
            "permutation": {},
            "index": {"dim": dim},
            "exp-log": {"dim": dim},
            "timesteps": {},
            "shift": {**base, "offset": 10},
            "regression": {**base, "offset": 10},
            "add-concat": {"dim": dim, "length": length},
            "offsets": base,
            "similarity": base,
            "precision": base,
            "learned": {"learned_table": learned.table},
            "decay": {"head_dim": rope["head_dim"], "base": rope["base"]},
            "alibi": {},
            "t5": {},
            "grid": {},
        }
    )
    return options


def _arithmetic_sections() -> list[Section]:
    """The lab's arithmetic study (``posenc lab arithmetic``, bundled), if posenc has one."""
    from posenc.faces.lab import arithmetic

    doc = arithmetic.bundled()
    if doc is None:
        return []
    numbers = [
        (f"{name}: longest operand length with every length up to it at "
         f"{arithmetic.GOAL} exact match or more (trained 1-{doc['trained_max']})",
         str(reach))
        for name, reach in doc["reach"].items()
    ]  # fmt: skip
    return [
        Section(
            "arithmetic",
            "Arithmetic beyond the trained length: why digits far out are lost",
            "\n\n".join(arithmetic.EXPLAINER),
            numbers,
            ["arithmetic"],
            list(arithmetic.FORMULAS),
            arithmetic.CODE,
            extra=arithmetic.section(doc, explainer=False),
        )
    ]


def _lab_runs(directory: Path | None) -> list[Any]:
    """The lab runs the page shows: a fresh run's directory, or the bundled copy and text runs."""
    from posenc.faces.lab import results

    if directory is None:
        return results.bundled()
    path = directory / "results.json"
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"--lab: cannot read {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--lab: {str(path)!r} is not JSON: {exc.msg}") from None
    return [results.read(doc)]


def _lab_html(runs: Sequence[Any]) -> str:
    """The lab runs' results as HTML sections."""
    from posenc.faces.lab import results

    return "\n".join(results.section(run.records, run.config, probes=run.probes) for run in runs)


def _img(svg: Path, alt: str) -> str:
    data = base64.b64encode(svg.read_bytes()).decode()
    return f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(alt)}">'


_CSS = """
:root{--ink:#1d2330;--muted:#5b6475;--rule:#e3e6ec;--accent:#3b5bdb;--code:#f5f6f8}
body{font:16px/1.55 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--ink);
max-width:980px;margin:0 auto;padding:1.5em 1.2em 4em}
h1{font-size:2em;margin:.3em 0 .1em}h2{font-size:1.4em;margin:2.4em 0 .6em;
padding-bottom:.2em;border-bottom:1px solid var(--rule)}
p{margin:.6em 0}.lead{color:var(--muted)}
nav{columns:2;font-size:.92em;margin:1em 0 2em;padding:.8em 1em;background:var(--code);
border-radius:6px}nav a{display:block;color:var(--accent);text-decoration:none}
math{font-family:"STIX Two Math","Cambria Math","Latin Modern Math","DejaVu Math TeX Gyre",
math}math[display=block]{margin:.8em 0;font-size:1.12em}
.formula{max-width:100%;overflow-x:auto;overflow-y:hidden}
pre{background:var(--code);padding:.7em 1em;border-radius:6px;overflow-x:auto;
font-size:.88em;line-height:1.4}
table.numbers{border-collapse:collapse;margin:.8em 0;font-size:.92em}
table.numbers caption{text-align:left;color:var(--muted);font-size:.9em;padding-bottom:.2em}
table.numbers td{padding:.25em .9em .25em 0;border-bottom:1px solid var(--rule);
vertical-align:top}table.numbers td:last-child{font-family:ui-monospace,monospace}
img{max-width:100%;display:block;margin:1em auto}
section#lab img,section.lab img{max-width:100%}
table.engines td.v-same{color:#2b8a3e}table.engines td.v-different{color:#c92a2a;
font-weight:600}table.engines td.v-refused,table.engines td.v-error{color:#e67700}
table.engines td:last-child,.engine-case td:last-child{font-family:inherit}
"""


def _section_html(s: Section, figures: dict[str, Path], explorers: dict[str, str]) -> str:
    parts = [f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2>']
    paragraphs = s.text.split("\n\n")
    parts += [f"<p>{html.escape(p)}</p>" for p in paragraphs[:1]]
    parts += [f'<div class="formula">{mathml(f)}</div>' for f in s.formulas]
    parts += [f"<p>{html.escape(p)}</p>" for p in paragraphs[1:]]
    if s.explorer is not None:
        parts.append(explorers[s.explorer])
    parts += [_img(figures[f], f) for f in s.figures]
    if s.code:
        parts.append(f'<pre><code class="language-python">{html.escape(s.code)}</code></pre>')
    if s.numbers:
        parts.append('<table class="numbers"><caption>measured in this run</caption>')
        parts += [
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in s.numbers
        ]
        parts.append("</table>")
    parts.append(s.extra)
    parts.append("</section>")
    return "\n".join(parts)


def _html(
    sections: Sequence[Section],
    figures: dict[str, Path],
    title: str,
    note: str,
    explorer_data: dict[str, Any],
) -> str:
    from posenc.faces import explorers

    boxes = explorers.containers()
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}{explorers.style()}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="lead">{html.escape(note)}</p><nav>',
        *(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in sections),
        "</nav>",
        *(_section_html(s, figures, boxes) for s in sections),
        explorers.scripts(explorer_data),
        "</body></html>",
    ]
    return "\n".join(parts)


def build(
    out: str | Path = "posenc-report",
    *,
    dim: int = 512,
    length: int = 50,
    preset: str = "vaswani",
    rope_config: str | Path | None = None,
    train_steps: int = 300,
    lab: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Compute every section and write ``out/index.html`` and ``out/figures/*.{png,svg}``.

    Args:
        out: output directory (created).
        dim: channels of the sinusoidal table (even, 4 to :data:`MAX_DIM`); the
            explorer also offers 16 to 512.
        length: positions (3 to :data:`MAX_LENGTH`): the table's rows and the
            slider's range.
        preset: a sinusoidal preset name (``posenc presets``).
        rope_config: a model's ``config.json``: its RoPE schedule is shown first.
        train_steps: steps of the learned-table training run.
        lab: a ``posenc lab run`` output directory whose results replace the
            bundled ones.
        progress: called with a short message as each part starts.

    Raises:
        ValueError: bad sizes, an unknown preset, an unreadable config or lab
            directory, or an output directory that cannot be written.
    """
    from posenc.faces import explorers, plot

    start = time.perf_counter()
    dim = checks.check_int(dim, "dim", minimum=4)
    if dim % 2 or dim > MAX_DIM:
        raise ValueError(
            f"dim must be even (pairs of sin and cos) and at most {MAX_DIM}; got {dim}"
        )
    length = checks.check_int(length, "length", minimum=3)
    if length > MAX_LENGTH:
        raise ValueError(
            f"length must be at most {MAX_LENGTH} (the page embeds the table for every d and "
            f"base its explorer offers); got {length}"
        )
    checks.check_choice(preset, "preset", tuple(PRESETS))
    train_steps = checks.check_int(train_steps, "train_steps", minimum=1)
    rope = rope_settings(rope_config)
    labs = _lab_runs(None if lab is None else Path(lab))
    lab_html = _lab_html(labs)
    out = Path(out)
    figures_dir = out / "figures"
    try:
        figures_dir.mkdir(parents=True, exist_ok=True)
        probe = out / ".posenc-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"cannot write to {str(out)!r}: {exc.strerror}") from None

    say = progress or (lambda _: None)
    say("training a learned table")
    learned = analysis.train_learned(steps=train_steps)
    say("measuring")
    sections = _sections(dim, length, preset, rope, learned, labs)
    for s in sections:
        if s.key == "learned":
            s.extra = lab_html
    say("explorers")
    t5_run = _first(labs, lambda run: any(b.encoding == "t5" for b in run.bias_parameters))
    data = explorers.payload(length=length, preset=preset, dim=dim, rope=rope, lab=t5_run)
    options = _figure_options(dim, length, preset, rope, learned, labs)
    lab_figures = _lab_figures(labs)
    files: dict[str, tuple[Path, Path]] = {}
    for s in sections:
        for name in s.figures:
            say(f"figure {name}")
            png, svg = figures_dir / f"{name}.png", figures_dir / f"{name}.svg"
            made = (
                lab_figures[name]() if name in lab_figures else plot.figure(name, **options[name])
            )
            plot.save(made, svg, png)
            files[name] = (png, svg)
    note = (
        "Positional encodings explained with numbers that posenc computed on this "
        f"machine: the {preset} preset at d = {dim} over {length} positions; RoPE scaling "
        f"for {rope['name']}."
    )
    index = out / "index.html"
    page = _html(
        sections,
        {k: v[1] for k, v in files.items()},
        "Positional encodings, explained and measured",
        note,
        data,
    )
    with atomic_write(index, "w") as f:
        f.write(page)
    return Report(sections, index, files, time.perf_counter() - start)
