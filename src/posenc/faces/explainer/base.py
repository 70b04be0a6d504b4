"""Why 10000, and what the base controls: the range of the wavelengths (the explorer's base)."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section, plotted
from posenc.integration.analysis.bases import BASES, STILL, base_sweep

#: The length the bases are compared over (a common trained context).
LENGTH = 4096


def _each(values: tuple[float | int | None, ...], form: str = "{:,.0f}") -> str:
    return ", ".join(f"> {LENGTH - 1}" if v is None else form.format(v) for v in values)


def build(inputs: Inputs) -> Section:
    dim, rope = inputs.dim, inputs.rope
    sweep = base_sweep(dim, LENGTH, BASES, shown=inputs.length, preset=inputs.preset)
    at = {b: i for i, b in enumerate(sweep.bases)}
    low, paper, high = at[min(BASES)], at[10000.0], at[max(BASES)]
    pairs = dim // 2

    def reach(i: int) -> str:
        r = sweep.reach[i]
        return f"beyond offset {LENGTH - 1}" if r is None else f"at offset {r:,}"

    nearest = (
        "the nearest two rows are neighbours at every base here"
        if set(sweep.nearest_offset) == {1}
        else "the nearest two rows are "
        + ", ".join(
            f"{k} apart at base {b:,g}"
            for b, k in zip(sweep.bases, sweep.nearest_offset, strict=True)
        )
    )
    text = (
        "Vaswani et al. give no derivation for 10000. They write that the wavelengths "
        "form a geometric progression from 2\u03c0 to 10000 \u00b7 2\u03c0, and the base is "
        "the number that sets the far end: pair i turns once every "
        "2\u03c0 \u00b7 base^(2i/d) positions, so the fastest pair turns every 2\u03c0 "
        "\u2248 6.3 positions at any base and the slowest every 2\u03c0 \u00b7 "
        f"base^((d \u2212 2)/d), a little under 2\u03c0 \u00b7 base "
        f"({sweep.longest_wavelength[paper]:,.0f} positions at base 10000, d = {dim}).\n\n"
        "The base is the range of the clock. A hand that turns a full circle within a "
        "sequence comes back to the same reading one wavelength later, and once every hand "
        "has turned, no single hand says which of two far positions is the farther. "
        "The codes stay distinct (the hands' speeds never line up: "
        + nearest
        + "), but the dot product of two rows, which falls as "
        "the positions move apart, falls only over a range the base sets: past the "
        "offset where it first reaches 0 it ripples around 0 and no longer says how far "
        f"apart two positions are. Over {LENGTH} positions at d = {dim}: at base "
        f"{sweep.bases[low]:,g}, {sweep.wrapped[low]} of the {pairs} pairs turn a full "
        f"circle and the dot product reaches 0 {reach(low)}; at 10000, "
        f"{sweep.wrapped[paper]} pairs turn and it reaches 0 {reach(paper)}.\n\n"
        "A larger base slows the low frequencies down: fewer pairs wrap, the range "
        "grows, and the price is paid at short range. Neighbours' codes move closer "
        f"together (distance {sweep.nearest[low]:.3g} at base {sweep.bases[low]:,g}, "
        f"{sweep.nearest[high]:.3g} at {sweep.bases[high]:,g}), and over a short "
        "sequence more channels hardly move. 10000 puts the slowest wavelength far "
        "beyond the sentences Vaswani et al. translated while the fast pairs still "
        "turn many times within one. RoPE turns its pairs by the same rule, its base called "
        f"rope_theta (10000 in RoFormer; {rope['base']:,g} for {rope['name']}, the "
        "extension section's model): long-context models raise it so that fewer slow "
        "pairs wrap within their context.\n\n"
        "The sinusoidal explorer's base selector ("
        + ", ".join(f"{b:,g}" for b in sweep.bases)
        + ") redraws its table, hands and values with that base in place of 10000: the "
        "slow hands speed up as the base falls, and the right of the table freezes as it "
        f"grows. Over the {inputs.length} positions shown, {sweep.still[low]} of its {dim} "
        f"channels stand still (change by less than {STILL:g}) at base "
        f"{sweep.bases[low]:,g} and {sweep.still[high]} at {sweep.bases[high]:,g}."
    )
    return Section(
        "why-10000",
        "Why 10000? What the base controls",
        text,
        [
            ("bases compared (those of the sinusoidal explorer)", _each(sweep.bases, "{:,g}")),
            ("wavelength of the slowest pair, positions per turn", _each(sweep.longest_wavelength)),
            (
                f"pairs (of {pairs}) whose hand turns a full circle within {LENGTH} positions",
                _each(sweep.wrapped),
            ),
            (
                "first offset k at which PE(p) \u00b7 PE(p + k) reaches 0 (the same at every p)",
                _each(sweep.reach),
            ),
            (
                f"smallest distance between the codes of two different positions below "
                f"{LENGTH} (offset {', '.join(map(str, sorted(set(sweep.nearest_offset))))})",
                _each(sweep.nearest, "{:.4g}"),
            ),
            (
                f"channels (of {dim}) that change by less than {STILL:g} over positions "
                f"0-{inputs.length - 1}, the explorer's table",
                _each(sweep.still),
            ),
        ],
        ["bases"],
        [
            r"\lambda_i = \frac{2\pi}{\omega_i} = 2\pi\,\mathrm{base}^{2i/d},\quad "
            r"\lambda_0 = 2\pi,\quad \lambda_{d/2-1} = 2\pi\,\mathrm{base}^{(d-2)/d}",
            r"\frac{\mathrm{PE}(p) \cdot \mathrm{PE}(p + k)}{d/2} = "
            r"\frac{2}{d} \sum_{i=0}^{d/2-1} \cos\!\big(k\,\mathrm{base}^{-2i/d}\big)",
        ],
        "import posenc\n"
        "for base in (100.0, 10000.0):\n"
        "    pe = posenc.sinusoidal(2001, 64, base=base, dtype='float64')\n"
        "    print(base, pe[0] @ pe[[1, 10, 100, 2000]].T / 32)  # offsets 1 to 2000",
        draw={"bases": plotted("bases", dim=dim, length=LENGTH, preset=inputs.preset)},
    )
