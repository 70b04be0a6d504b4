"""No positional encoding, and layers without RoPE (Llama 4, SmolLM3, Cohere 2): lab numbers."""

from __future__ import annotations

from typing import Any

from posenc.faces.explainer.shared import Inputs, Section, encodings, lab_note, lab_rows, spread

#: The lab encodings compared: RoPE in every layer, in none, in every other.
COMPARED = ("rope", "nope", "hybrid-nope")


def finding(rows: dict[str, dict[str, Any]], train_len: int) -> str:
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


def build(inputs: Inputs) -> Section:
    from posenc.faces.lab import results
    from posenc.integration.analysis.rope_reading import nope_layers

    run: Any = inputs.lab(lambda run: set(COMPARED) <= encodings(run))
    rows = lab_rows(run)

    def cell(encoding: str, key: str) -> str:
        row = rows.get(encoding, {})
        return spread(row[key], 3) if key in row else "-"

    numbers = [
        (
            f"{e}: exact match, lengths 1-{run.config.train_len} / "
            f"{run.config.train_len + 1}-{run.config.test_len}",
            f"{cell(e, 'within')} / {cell(e, 'beyond')}",
        )
        for e in COMPARED
        if e in rows
    ]
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

    def figure() -> Any:
        return results.figure(
            [r for r in run.records if r.encoding in COMPARED],
            run.config.train_len,
            f"lab {run.config.task}: RoPE in every layer, in none, or in every other",
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
        f"The numbers are from {lab_note(run)}: RoPE in every layer, in none (nope), and "
        "in the first layer only (hybrid-nope: every second layer without RoPE, since "
        "the lab's models have two; Llama 4 and SmolLM3 use every fourth). "
        + finding(rows, run.config.train_len),
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
        draw={"nope-layers": figure},
    )
