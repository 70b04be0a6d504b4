"""Diffusion timesteps: the sinusoid fed a noise level, in three conventions (timestep explorer)."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, holds, plotted
from posenc.integration import analysis


def odd_timestep_channels(dim: int) -> tuple[int, int, float]:
    """Channels The Annotated Diffusion Model's code and posenc's preset give at odd ``dim``."""
    import torch

    import posenc
    from posenc.faces.bench.sinusoidal import annotated_diffusion_embedding

    theirs = annotated_diffusion_embedding(torch.tensor([10.0]), dim)
    ours = posenc.sinusoidal(torch.tensor([10.0]), dim, preset="annotated-diffusion")
    return int(theirs.shape[-1]), int(ours.shape[-1]), float(ours[0, -1])


def build(inputs: Inputs) -> Section:
    ts = analysis.timestep_presets(320)
    ldm_mean, ldm_lo, ldm_hi = ts.mismatch("ddpm", "ldm")
    _, same_lo, _ = ts.mismatch("ddpm", "annotated-diffusion")
    odd = odd_timestep_channels(33)
    return Section(
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
                holds(1.0 - same_lo, ts.tolerance),
            ),
        ]
        + [
            (f"cos(e(t), e(t + {k:g})), ddpm, d = 320", f"{v:.4f}")
            for k, v in zip(ts.offsets, ts.neighbour[0], strict=True)
        ]
        + [
            (
                "those cosines are the same at every t",
                holds(ts.neighbour_spread, ts.tolerance),
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
        draw={"timesteps": plotted("timesteps")},
    )
