"""Layer 1, core: what every encoding stands on, and nothing above it.

- :mod:`posenc.core.angles`: the exact angle engine (position x frequency,
  reduced modulo one turn), 40-digit frequencies, pi, fast progression tables.
- :mod:`posenc.core.checks`: numpy/torch dispatch and every input check.
- :mod:`posenc.core.kernels`: the one optional import of the compiled kernels.
- :mod:`posenc.core.positions`: position numbers as the reference
  implementations make them (fairseq, OPT, KV caches).
- :mod:`posenc.core.tables`: the exact-table cache of the torch modules.
"""
