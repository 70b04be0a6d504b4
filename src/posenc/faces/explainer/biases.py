"""ALiBi and T5: positions as a bias on the scores (the bias explorer)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from posenc.faces.explainer.shared import Inputs, Section, encodings, lab_rows, plotted


def lab_result(run: Any) -> str:
    """ALiBi's and T5's means within and beyond the trained lengths of ``run``, in words."""
    rows = lab_rows(run)
    shown = [
        f"{name} {rows[e]['within'][0]:.3g} within and {rows[e]['beyond'][0]:.3g} beyond"
        for e, name in (("alibi", "ALiBi"), ("t5", "T5"))
        if "within" in rows.get(e, {}) and "beyond" in rows.get(e, {})
    ]
    if not shown:
        return ""
    metric = next(iter(rows.values()))["metric"]
    return (
        f" (the lab's {run.config.task} run, trained on lengths up to "
        f"{run.config.train_len}, {metric}: {'; '.join(shown)})"
    )


def build(inputs: Inputs) -> Section:
    import posenc
    from posenc.faces.lab import tasks

    copy = inputs.lab(lambda run: "t5" in encodings(run))
    config = copy.config
    seen = tasks.sequence_length(config.task, config.train_len) - 1
    reach = config.max_positions - 1
    trained_buckets = sorted(set(posenc.t5_bucket(-np.arange(seen + 1), bidirectional=False)))
    beyond_buckets = sorted(
        set(posenc.t5_bucket(-np.arange(seen + 1, reach + 1), bidirectional=False))
    )
    slopes = posenc.alibi_slopes(8)
    boundaries = posenc.t5_bucket(-np.arange(200))
    starts = [int(d) for d in np.arange(1, 200)[np.diff(boundaries) != 0]]
    measured = lab_result(inputs.lab(lambda run: {"alibi", "t5"} <= encodings(run)))
    return Section(
        "biases",
        "ALiBi and T5: positions as a bias on the scores",
        "Instead of touching the vectors, add a number to each attention score "
        "that depends on the distance. ALiBi (Press et al. 2022) adds "
        "\u2212m\u2095 (i \u2212 j): a straight penalty, steeper for some heads than "
        "others (slopes 2^(\u22128h/H)). Nothing is learned and nothing depends on "
        "the trained length: the bias is defined at every distance, which is why it was "
        "proposed for extrapolation; how much a model keeps beyond its trained lengths "
        "is measured in the lab" + measured + ". T5 "
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
        draw={"alibi": plotted("alibi"), "t5": plotted("t5")},
    )
