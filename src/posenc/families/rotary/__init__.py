"""Rotary position embeddings (RoPE), one mechanism for every variant.

- :mod:`posenc.rotary.schedules`: the registry of frequency schedules (HF
  ``rope_type``: default, linear, ntk, dynamic, yarn, llama3, longrope,
  proportional; Resonance RoPE's resonance and resonance_yarn), each returning
  exact frequencies and the attention scaling.
- :mod:`posenc.rotary.tables`: exact cos/sin tables in the half (GPT-NeoX, HF)
  and interleaved (GPT-J, Meta) orders.
- :mod:`posenc.rotary.apply`: :func:`posenc.apply_rotary`, whose backward is the
  inverse rotation.
- :mod:`posenc.rotary.module`: the :class:`posenc.Rotary` module (GQA, per-batch
  positions, KV-cache offsets, packed sequences, ``from_hf_config``).
- :mod:`posenc.rotary.rerotate`: :func:`~posenc.rotary.rerotate.rerotate_keys`, KV-cache keys
  moved from one length's tables to another's (``dynamic``, ``longrope``), exactly;
  :meth:`posenc.Rotary.rerotate` and :func:`posenc.hf.rerotate_cache` use it.
- :mod:`posenc.rotary.multiaxis`: M-RoPE (Qwen2-VL contiguous, Qwen3-VL
  interleaved sections, VideoRoPE's low-frequency time), axial 2-D/3-D RoPE
  (:class:`posenc.rotary.multiaxis.AxialRotary`) and xPos.
- :mod:`posenc.rotary.fope`: :class:`posenc.FoPE`, the Fourier Position Embedding (each
  pair rotated by a learned mix of the frequencies).

``Rotary`` and ``apply_rotary`` are re-exported from :mod:`posenc`.
"""
