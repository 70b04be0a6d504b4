"""transformers' own RoPE as an engine's Transformers backend runs it (vLLM's, SGLang's).

Imported by the vLLM and SGLang readers (a sibling script, under each engine's own Python:
standard library, torch and transformers, never posenc). Both engines run an architecture
they have no model file for through a backend that builds the model with
``AutoModel.from_config`` and keeps its ``rotary_emb``: the model's rotary module computes
cos/sin and each attention layer of the transformers modeling file applies them (its
``apply_rotary_pos_emb``) or not (SmolLM3's and Llama 4's ``use_rope``). The model is built
on the meta device to find those classes and attributes; its rotary class is built again
on the CPU, and the layout of its pairs read from one rotation of the first channel.
"""

from __future__ import annotations

import sys
from typing import Any


class TransformersRope:
    """The rotary module, each layer's ``use_rope`` and the pair layout of a backend model.

    Attributes:
        cls: the modeling file's rotary class; ``module`` its instance on the CPU.
        use_rope, attention: per decoder layer, whether it rotates and its attention class.
        apply: the modeling file's ``apply_rotary_pos_emb``.
        head_size, dtype, rotary_dim, is_neox_style: the rotation's geometry.
    """

    def __init__(self, config: Any, text: Any, dtype: Any, head_size: int) -> None:
        import torch
        from transformers import AutoModel

        with torch.device("meta"):
            model = AutoModel.from_config(config)
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
        rotary = getattr(decoder, "rotary_emb", None)
        if rotary is None:
            raise ValueError(f"{type(decoder).__name__} has no rotary_emb: not read here")
        self.cls = type(rotary)
        self.module = self.cls(config=text)
        layers = list(getattr(decoder, "layers", []) or [])
        self.use_rope = [bool(getattr(getattr(layer, "self_attn", None), "use_rope", True))
                         for layer in layers]  # fmt: skip
        self.attention = [type(getattr(layer, "self_attn", None)).__name__ for layer in layers]
        self.apply = sys.modules[self.cls.__module__].apply_rotary_pos_emb
        self.head_size = head_size
        self.dtype = dtype
        # the layout, from one rotation of the first channel at position 1
        probe = torch.zeros(1, 1, 1, self.head_size, dtype=dtype)
        probe[..., 0] = 1.0
        cos, sin = self.module(probe, torch.ones(1, 1, dtype=torch.long))
        self.rotary_dim = int(cos.shape[-1])
        out = self.apply(probe, probe.clone(), cos, sin)[0].reshape(-1).float()
        if abs(float(out[self.rotary_dim // 2])) > 0:
            self.is_neox_style = True
        elif abs(float(out[1])) > 0:
            self.is_neox_style = False
        else:
            raise ValueError(f"{self.cls.__name__}: the layout of its pairs is not read here")

    def rotates(self, layer: int) -> bool:
        """The attention's ``use_rope`` of ``layer`` (True where the class has none)."""
        return self.use_rope[layer] if layer < len(self.use_rope) else True
