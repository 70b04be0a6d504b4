"""Attention biases: ALiBi, T5, KERPLE, FIRE, Sandwich, NoPE: positions as a bias on the scores.

:mod:`posenc.bias.functional` is the numpy core (ALiBi slopes, T5 buckets);
:mod:`posenc.bias.temperature` Llama 4's query scale of its NoPE layers;
:mod:`posenc.bias.modules` holds the torch modules, imported on first use, as is
:mod:`posenc.bias.forget` (the Forgetting Transformer's gate, a bias the tokens choose,
and :class:`ForgetGateTerm`, its score term).
"""

from typing import Any

from posenc.families.bias.functional import alibi_slopes, t5_bucket
from posenc.families.bias.temperature import attn_temperature

_MODULES = (
    "ALiBi",
    "AttentionBias",
    "FIRE",
    "KERPLE",
    "NoPE",
    "Sandwich",
    "ScaledForm",
    "T5Bias",
    "relu_pieces",
)

__all__ = [
    "FIRE",
    "KERPLE",
    "ALiBi",
    "AttentionBias",
    "ForgetGate",
    "ForgetGateTerm",
    "NoPE",
    "Sandwich",
    "ScaledForm",
    "T5Bias",
    "alibi_slopes",
    "attn_temperature",
    "t5_bucket",
]


# the torch names, by the module that defines each
_HOMES = {
    **dict.fromkeys(_MODULES, "posenc.families.bias.modules"),
    **dict.fromkeys(("ForgetGate", "ForgetGateTerm"), "posenc.families.bias.forget"),
}


def __getattr__(name: str) -> Any:
    from posenc.core import extras

    return extras.attribute("posenc.bias", _HOMES, name)
