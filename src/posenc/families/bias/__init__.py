"""Attention biases: ALiBi, T5, KERPLE, FIRE, Sandwich, NoPE: positions as a bias on the scores.

:mod:`posenc.bias.functional` is the numpy core (ALiBi slopes, T5 buckets);
:mod:`posenc.bias.modules` holds the torch modules, imported on first use.
"""

from typing import Any

from posenc.families.bias.functional import alibi_slopes, t5_bucket

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

__all__ = ["alibi_slopes", "t5_bucket", *_MODULES]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        from posenc.families.bias import modules

        return getattr(modules, name)
    raise AttributeError(f"module 'posenc.bias' has no attribute {name!r}")
