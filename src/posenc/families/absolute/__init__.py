"""Absolute encodings: a vector per position, added to the token embeddings.

- :mod:`posenc.absolute.sinusoidal`: one axis, every convention, the shift operator.
- :mod:`posenc.absolute.grid`: 2-D and 3-D grids of image and video patches.
- :mod:`posenc.absolute.fourier`: Fourier features of coordinates (NeRF, random).

The public functions are re-exported from :mod:`posenc`.
"""
