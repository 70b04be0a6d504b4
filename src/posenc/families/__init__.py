"""Layer 2, families: the encodings themselves, on top of :mod:`posenc.core` only.

- :mod:`posenc.families.absolute`: a vector per position (sinusoidal, grids,
  Fourier features) and its torch modules.
- :mod:`posenc.families.rotary`: rotary embeddings, their frequency schedules
  and the reading of HF rope configs.
- :mod:`posenc.families.bias`: attention biases (ALiBi, T5, KERPLE, FIRE,
  Sandwich, NoPE).
- :mod:`posenc.families.contextual`: position signals that read the
  attention scores (CoPE, DAPE).
- :mod:`posenc.families.terms`: the score-term protocol every bias, FoX's
  gates, CoPE and DAPE implement: what attention's engines read of them.

Users import them as ``posenc.absolute``, ``posenc.rotary`` and ``posenc.bias``.
"""
