"""Layer 3, integration: the families put to work, on top of core and families.

- :mod:`posenc.integration.attention`: ``posenc.attention``, one entry point
  for attention with a rotary encoding and/or a bias.
- :mod:`posenc.integration.stick_breaking`: ``posenc.stick_breaking_attention``,
  attention by stick-breaking (a sigmoid share per key, the nearest first).
- :mod:`posenc.integration.hf`: patching HF transformers models.
- :mod:`posenc.integration.analysis`: every measured property that the report,
  the figures and ``posenc check`` show.

Users import them as ``posenc.attention``, ``posenc.hf`` and ``posenc.analysis``.
"""
