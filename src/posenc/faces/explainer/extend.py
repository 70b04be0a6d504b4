"""Context extension, measured: every schedule on one trained model (the bundled study)."""

from __future__ import annotations

from typing import Any

from posenc.faces.explainer.shared import Inputs, Section

CODE = (
    "from posenc.rotary.schedules import stretched\n"
    "# the rope_scaling that runs a model trained at 8192 tokens at 4x\n"
    "scaling = stretched('yarn', 4.0, 8192, rotary_dim=128, base=500000.0)\n"
    "import posenc\n"
    "rope = posenc.Rotary(128, base=500000.0, scaling=scaling)\n"
    "# the study itself, on the lab's small models: posenc lab extend --quick"
)

FORMULAS = [
    r"\mathrm{bits\ per\ byte} = \frac{1}{N \ln 2}\sum_{t=1}^{N} -\ln p(x_t \mid x_{<t})",
    r"\theta'_i = \theta_i / \mathrm{ext}_i(s),\quad s = \frac{\text{length run}}{L}"
    r"\ \text{(each schedule its own }\mathrm{ext}_i\text{)}",
]


def _numbers(doc: dict[str, Any]) -> list[tuple[str, str]]:
    from posenc.faces.lab import extend

    factor = str(doc["config"]["fine_tune_multiple"])
    at = str(int(factor) * doc["base_length"])
    last = str(doc["config"]["fine_tune_steps"][-1])
    rows = []
    text = doc["zero_shot"].get("text", {})
    if text:
        best = min((v.get(factor, v.get("1"))[at]["mean"], name) for name, v in text.items())
        none = text["none"]["1"][at]["mean"]
        rows.append((f"text at {at} tokens, zero-shot: RoPE extrapolated (bits per byte)",
                     f"{none:.3f}"))  # fmt: skip
        rows.append((f"text at {at} tokens, zero-shot: the best line, set for {factor}x",
                     f"{best[1]} {best[0]:.3f}"))  # fmt: skip
    if doc["zero_shot"].get("passkey"):
        for name in doc["zero_shot"]["passkey"]:
            n, f = extend.zero_shot_reach(doc, name)
            tuned = doc["fine_tuned"].get("passkey", {}).get(name)
            after = f"; {extend.reach(tuned[last])} after {last} fine-tuning steps" if tuned else ""
            zero = f"{n} zero-shot ({f}x)" if f != "1" and n else f"{n} zero-shot"
            rows.append((f"passkey reach ({extend.GOAL} of the keys): {name}", zero + after))
    return rows


def build(inputs: Inputs) -> Section | None:
    from posenc.faces.lab import extend

    doc = extend.bundled()
    if doc is None:
        return None
    seeds = doc["config"]["seeds"]
    return Section(
        "extend",
        "Which schedule runs a model past its trained length? Every one, on the same model",
        "Each schedule above is a recipe; whether it works is measured on a trained model. "
        f"posenc's lab trains small RoPE models at L = {doc['base_length']} tokens, a "
        "byte-level language model and one that must find a five-digit pass key hidden "
        "in filler text (Mohtashami & Jaggi 2023), and runs them at 2L, 4L and 8L with "
        "each schedule set for the factor, as a config's rope_scaling would be: zero-shot, "
        "and after a short fine-tune at 4L. Beside them: RoPE trained at 4L from the start, "
        f"and ALiBi, FIRE and NoPE, which need no schedule ({seeds} seed"
        f"{'s' if seeds > 1 else ''}; mean, and the seeds' range where they differ).\n\n"
        "Read the text tables for what a schedule costs at the trained length and gains "
        "beyond it, and the passkey tables for whether attention still finds one span far "
        "away. The how-to \u201cChoose a context-extension schedule\u201d reads the same "
        "tables against the papers' claims.",
        _numbers(doc),
        ["extend"],
        FORMULAS,
        CODE,
        extra=extend.html_tables(doc, zero_shot_only=True),
        # the zero-shot panels (the fine-tuned curves are in the tables): the page's size
        draw={"extend": lambda: extend.figure(extend.bundled() or {}, fine_tuned=False)},
    )
