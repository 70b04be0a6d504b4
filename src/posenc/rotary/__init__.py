"""Rotary position embeddings (RoPE): frequency schedules and their application.

- :mod:`posenc.rotary.schedules`: the registry of frequency schedules (HF
  ``rope_type``), each returning exact frequencies and the attention scaling.

Work in progress (issue 3); the public names are re-exported from
:mod:`posenc` once the family is complete.
"""
