"""Layer 3, integration: the families put to work, on top of core and families.

- :mod:`posenc.integration.attention`: the attention engine, a package whose
  parts show it (layout, the softmax engine, the compiled loop's operands,
  FlexAttention, the checkpointed path for terms that read the scores); its entry
  ``posenc.attention`` takes a rotary encoding and any score terms;
  ``posenc.stick_breaking_attention`` (a sigmoid share per key, the nearest
  first) is an engine with its own normaliser on the same layout.
- :mod:`posenc.integration.context_parallel`: ring attention and sharding.
- :mod:`posenc.integration.hf`: patching HF transformers models.
- :mod:`posenc.integration.analysis`: every measured property that the report,
  the figures and ``posenc check`` show.

Users import them as ``posenc.attention``, ``posenc.hf`` and ``posenc.analysis``.
"""
