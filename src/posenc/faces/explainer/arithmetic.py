"""Arithmetic beyond the trained length: the lab's arithmetic study (bundled), if posenc has one."""

from __future__ import annotations

from posenc.faces.explainer.shared import Inputs, Section


def build(inputs: Inputs) -> Section | None:
    from posenc.faces.lab import arithmetic

    doc = arithmetic.bundled()
    if doc is None:
        return None
    numbers = [
        (f"{name}: longest operand length with every length up to it at "
         f"{arithmetic.GOAL} exact match or more (trained 1-{doc['trained_max']})",
         str(reach))
        for name, reach in doc["reach"].items()
    ]  # fmt: skip
    return Section(
        "arithmetic",
        "Arithmetic beyond the trained length: why digits far out are lost",
        "\n\n".join(arithmetic.EXPLAINER),
        numbers,
        ["arithmetic"],
        list(arithmetic.FORMULAS),
        arithmetic.CODE,
        extra=arithmetic.section(doc, explainer=False),
        draw={"arithmetic": lambda: arithmetic.figure(arithmetic.bundled() or {})},
    )
