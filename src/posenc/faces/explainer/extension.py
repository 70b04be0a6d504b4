"""Context extension: how the scaling schedules stretch RoPE's clocks (the extension explorer)."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section


def build(inputs: Inputs) -> Section:
    from posenc.faces import engine_table
    from posenc.integration.analysis import explorer as ex

    rope = inputs.rope
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
    return Section(
        "extension",
        "Context extension: how the schedules stretch the clocks",
        f"A RoPE model trained on {rope['original']} positions has seen each pair "
        "turn through angles up to trained length x \u03b8\u1d62. Run it on longer "
        "inputs and the slow pairs reach angles it never saw. The scaling schedules "
        "slow some hands down so that the target length looks like the trained one. "
        "Linear interpolation (Chen et al. 2023) divides every frequency by the factor "
        "(the fast pairs, which turned many times in training, lose resolution). "
        "NTK-aware scaling raises the base: fast pairs almost kept, slow ones divided. "
        "YaRN (Peng et al. 2023) and llama3 keep the fast pairs, interpolate the slow "
        "ones and blend between, by each pair's wavelength against the trained length. "
        "A pair is in range when every angle it reaches at the target length was "
        "reached in training.\n\n"
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
