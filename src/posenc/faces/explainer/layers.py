"""How positions survive through the layers: the lab's linear probes, layer by layer."""

from __future__ import annotations

from typing import Any

from posenc.faces.explainer.shared import Inputs, Section, lab_note, spread


def finding(by: dict[str, dict[str, dict[int, tuple[float, float, float]]]], chance: float) -> str:
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


def build(inputs: Inputs) -> Section:
    from posenc.faces.lab import results

    run: Any = inputs.lab(lambda run: bool(run.probes))
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
                " \u2192 ".join(spread(acc[v]) for v in layers)
                + (f"; R\u00b2 {spread(r2[layers[-1]])} after the last" if r2 else ""),
            )
        )
    numbers.append(("chance accuracy (1 / positions)", f"{chance:.3f} (1/{positions})"))
    text = (
        "A transformer block never replaces its input: it adds to it. Each block reads "
        "the residual stream x, computes attention and an MLP from a normalised copy, and "
        "adds their outputs back, so what the embedding put in (the token, and an absolute "
        "position if one was added) stays in x unless a later block writes over it. "
        "Whether it does is a question of measurement, not of diagrams: fit a linear probe "
        "from each layer's residual stream to the token's absolute position, on sequences "
        "the probe was not fitted on, and see how much of the position it reads back.\n\n"
        f"The probes here were fitted on the models of {lab_note(run)}: a classifier over "
        f"the {positions} positions (accuracy) and a least-squares read-out of the index "
        "(R\u00b2), per layer. The absolute encodings (sinusoidal, learned) put the "
        "position into the stream at the embedding, where a linear read-out finds it "
        "almost whole. RoPE, ALiBi and T5 put nothing into the vectors: they act on the "
        "attention scores, so their embedding output carries no position beyond what the "
        "tokens themselves tell, and whatever more a probe reads after a block, attention "
        "wrote there. Causal attention can count: a "
        "query at position i averages over i + 1 keys, and how spread its weights are "
        "tells the position.\n\n" + finding(by, chance)
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
        draw={"probes": lambda: results.probe_figure(run.probes)},
    )
