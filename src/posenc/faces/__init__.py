"""Layer 4, faces: what a person runs or reads; nothing below imports them.

- :mod:`posenc.faces.plot`: one figure per question.
- :mod:`posenc.faces.report`: the explainer page.
- :mod:`posenc.faces.bench`: side-by-side timings against the peers.
- :mod:`posenc.faces.lab`: small transformers trained per encoding.
- :mod:`posenc.faces.cli`: the ``posenc`` command (imported by nothing).

Users import them as ``posenc.plot``, ``posenc.report``, ``posenc.bench``,
``posenc.lab`` and ``posenc.cli``.
"""
