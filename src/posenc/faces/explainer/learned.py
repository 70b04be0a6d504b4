"""Learned versus sinusoidal tables beyond the trained length, and the lab's runs that test it."""

from __future__ import annotations

from typing import Any

from posenc.faces.explainer.shared import Inputs, Section, lab_rows


def findings(run: Any) -> str:
    """What one lab run measured beyond its trained lengths, in a sentence of its numbers.

    The numbers are those of the run's table (the mean of its models, 3 significant digits).
    """
    c = run.config
    rows = [r for r in lab_rows(run).values() if "within" in r and "beyond" in r]
    if not rows:
        return ""
    metric = rows[0]["metric"]
    where = (
        f"In the {c.task} run (trained on lengths up to {c.train_len}, tested on "
        f"{c.train_len + 1}-{c.test_len})"
    )
    if metric == "perplexity":  # lower is better
        shown = ", ".join(
            f"{r['encoding']} {r['within'][0]:.3g} / {r['beyond'][0]:.3g}" for r in rows
        )
        lower = [r["encoding"] for r in rows if r["beyond"][0] < r["within"][0]]
        higher = [r["encoding"] for r in rows if r["beyond"][0] > r["within"][0]]
        moved = [f"lower beyond for {words(lower)}"] if lower else []
        moved += [f"higher beyond for {words(higher)}"] if higher else []
        return (
            f"{where}, perplexity within / beyond the trained lengths (lower is better) is "
            f"{shown}: {'; '.join(moved) or 'the same beyond'}."
        )
    rows.sort(key=lambda r: r["beyond"][0])
    shown = ", ".join(f"{r['encoding']} {r['beyond'][0]:.3g}" for r in rows)
    top = f"{rows[-1]['beyond'][0]:.3g}"
    best = [r for r in rows if f"{r['beyond'][0]:.3g}" == top]
    kept = [
        (r["encoding"], f"{100 * r['beyond'][0] / r['within'][0]:.0f}% of its {r['within'][0]:.3g}")
        for r in best
        if r["within"][0]
    ]
    said = f"{where}, {metric} beyond the trained lengths is {shown}: "
    if len(best) == 1:
        return (
            said
            + f"{best[0]['encoding']} keeps the most"
            + (f", {kept[0][1]} within." if kept else ".")
        )
    each = ", ".join(f"{e} {share}" for e, share in kept)
    return said + f"{words([r['encoding'] for r in best])} keep the most ({each} within)."


def words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(items) if len(items) < 3 else f"{', '.join(items[:-1])} and {items[-1]}"


def build(inputs: Inputs) -> Section:
    from posenc.faces.lab import results

    learned = inputs.learned
    lt = learned.table
    near, far_sim = learned.similarity(apart=8)
    found = " ".join(filter(None, (findings(run) for run in inputs.labs)))
    source = (
        " The table shown is the run bundled with posenc: training on the CPU is "
        "deterministic, so it is the one this build would train (posenc report "
        "--train-steps N trains another)."
        if inputs.learned_bundled
        else ""
    )
    return Section(
        "learned",
        "Learned versus sinusoidal: what happens beyond the trained length?",
        f"A learned table is a free parameter per position. Here one of "
        f"{lt.shape[0]} positions x {lt.shape[1]} channels is trained from random "
        f"numbers for {learned.steps} steps on a task that needs positions (copy the "
        f"previous token, one causal attention layer).{source} It learns a structure for the "
        "positions it sees, and nothing for the others: a row it never trained is "
        "its random initialisation, and a position past the table does not exist. "
        "The sinusoidal table is a fixed rule, defined at every position, but a "
        "model trained on short sequences has never seen the hands' readings of "
        "the long ones.\n\n"
        "The lab below trains small transformers at one length and tests them "
        "beyond it. " + found,
        [
            (
                "copy accuracy of the tiny run" + (" (bundled)" if inputs.learned_bundled else ""),
                f"{100 * learned.accuracy:.1f}%",
            ),
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
        extra="\n".join(
            results.section(run.records, run.config, probes=run.probes) for run in inputs.labs
        ),
        draw={"learned": lambda: _figure(lt)},
    )


def _figure(table: Any) -> Any:
    from posenc.faces import plot

    return plot.figure("learned", learned_table=table)
