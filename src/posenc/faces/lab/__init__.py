"""posenc lab: train small transformers with every encoding and measure length extrapolation.

- :mod:`posenc.lab.tasks`: copy, reverse, sort, associative recall, addition
  (generated on the fly, seeded) and a byte-level language model over the
  Python standard library's sources;
- :mod:`posenc.lab.encodings`: every encoding as data (its position pieces
  and test-time scaling), importable without torch;
- :mod:`posenc.lab.model`: a small decoder-only transformer from posenc's
  pieces, one positional encoding per model;
- :mod:`posenc.lab.run`: training (cached, resumable; under torchrun DDP, and
  context parallelism with ring attention) and evaluation at every length;
- :mod:`posenc.lab.probes`: linear probes of where each layer's residual stream
  keeps the absolute position;
- :mod:`posenc.lab.results`: the figure and HTML page, and ``results.json`` read
  back (probes and trained bias modules included).

``posenc lab run`` is the command. Needs torch (and matplotlib for the figure).
"""

__all__ = []
