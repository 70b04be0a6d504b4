"""Two questions a learner starts from: diffusion timesteps, and why not the index itself.

- :func:`timestep_presets`: the same continuous timestep ``t`` through the three
  timestep conventions diffusion code uses (``ddpm``: diffusers'
  ``get_timestep_embedding`` defaults; ``ldm``: latent diffusion, Stable Diffusion
  and DiT; ``annotated-diffusion``: The Annotated Diffusion Model), how far apart
  they put one ``t`` (the cosine of the mismatched embeddings), and how alike
  neighbouring timesteps are.
- :func:`index_features`: the raw index ``p`` and the index over the length
  ``p / (L - 1)`` as position features, against the bounded sinusoidal table.

Every number is measured on float64 tables of :func:`posenc.sinusoidal`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.families.absolute.sinusoidal import resolve, sinusoidal
from posenc.integration.analysis._table import EPS, real_values

#: The timestep conventions of diffusion code, as posenc presets.
TIMESTEP_PRESETS = ("ddpm", "ldm", "annotated-diffusion")


def cosine_rows(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The cosine similarity of each row of ``a`` with the same row of ``b`` (float64)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.asarray(np.einsum("...i,...i->...", a, b) / norms)


@dataclass(frozen=True)
class TimestepPresets:
    """One timestep grid through several presets (:func:`timestep_presets`).

    Attributes:
        dim: channels.
        presets: the presets compared.
        timesteps: the ``t`` compared, float64.
        cosine: ``(P, P, T)``: ``cosine[a, b, i]`` is the cosine similarity of
            preset ``a``'s and preset ``b``'s embeddings of ``timesteps[i]``.
        offsets: the offsets ``k`` of :attr:`neighbour`.
        neighbour: ``(P, len(offsets))``: the cosine of ``e(t)`` and ``e(t + k)``
            under each preset, averaged over the timesteps.
        neighbour_spread: its largest deviation over the timesteps (float64
            rounding: the cosine depends on ``k`` alone).
        tolerance: the rounding bound the spread is held to.
    """

    dim: int
    presets: tuple[str, ...]
    timesteps: npt.NDArray[np.float64]
    cosine: npt.NDArray[np.float64]
    offsets: tuple[float, ...]
    neighbour: npt.NDArray[np.float64]
    neighbour_spread: float
    tolerance: float

    def mismatch(self, a: str, b: str) -> tuple[float, float, float]:
        """Mean, minimum and maximum over the timesteps of the cosine of ``a``'s and ``b``'s."""
        c = self.cosine[self.presets.index(a), self.presets.index(b)]
        return float(c.mean()), float(c.min()), float(c.max())


def timestep_presets(
    dim: int = 320,
    presets: Iterable[str] = TIMESTEP_PRESETS,
    timesteps: Iterable[float] | None = None,
    offsets: Iterable[float] = (1, 10, 100),
) -> TimestepPresets:
    """How the timestep conventions of diffusion code differ on the same ``t``.

    Args:
        dim: channels (320: Stable Diffusion's UNet).
        presets: preset names (:data:`posenc.PRESETS`).
        timesteps: the ``t`` compared (default ``0, 1, ..., 999``: DDPM's 1000 steps).
        offsets: the ``k`` of the neighbour similarities.

    Raises:
        ValueError: an unknown preset, a bad ``dim``, no timesteps or offsets.

    Examples:
        >>> import posenc.analysis
        >>> got = posenc.analysis.timestep_presets(dim=32, timesteps=range(0, 1000, 100))
        >>> got.presets
        ('ddpm', 'ldm', 'annotated-diffusion')
        >>> [round(c, 3) for c in got.mismatch("ddpm", "ldm")]  # mean, min, max cosine
        [0.097, -0.011, 0.266]
        >>> got.neighbour[0].round(3)  # ddpm: e(t) against e(t + 1), e(t + 10), e(t + 100)
        array([0.959, 0.645, 0.305])
    """
    dim = checks.check_channels(dim, "dim")
    names = tuple(presets)
    if not names:
        raise ValueError("presets must name at least one preset")
    specs = [resolve(name) for name in names]
    t = np.arange(1000, dtype=np.float64) if timesteps is None else np.asarray(
        real_values(timesteps, "timesteps"), dtype=np.float64
    )  # fmt: skip
    ks = real_values(offsets, "offsets")
    tables = [np.asarray(sinusoidal(t, dim, preset=s, dtype="float64")) for s in specs]
    cosine = np.array([[cosine_rows(a, b) for b in tables] for a in tables])
    near = np.empty((len(names), len(ks)))
    spread = 0.0
    for i, spec in enumerate(specs):
        for j, k in enumerate(ks):
            c = cosine_rows(
                tables[i], np.asarray(sinusoidal(t + k, dim, preset=spec, dtype="float64"))
            )
            near[i, j] = c.mean()
            spread = max(spread, float(np.abs(c - c.mean()).max()))
    # a cosine of unit-circle pairs sums dim/2 products of entries exact to a few ulp
    tolerance = 16 * dim * EPS
    return TimestepPresets(dim, names, t, cosine, ks, near, spread, tolerance)


@dataclass(frozen=True)
class IndexFeatures:
    """The raw index and the index over the length as features (:func:`index_features`).

    Attributes:
        position: the position compared across lengths.
        lengths: sequence lengths ``L``.
        normalised: ``position / (L - 1)`` for each length.
        largest_index: the raw index at the end of each sequence, ``L - 1``.
        sinusoidal_bound: the largest magnitude of any sinusoidal value over the
            longest sequence (1: bounded at any length).
        row_norm: the norm of every sinusoidal row, ``sqrt(dim / 2)``.
        nearest: the smallest distance between the sinusoidal encodings of two
            different positions below the longest length (every code is distinct).
        nearest_offset: the offset at which that distance is reached.
        longest_wavelength: positions per turn of the slowest pair.
    """

    position: int
    lengths: tuple[int, ...]
    normalised: tuple[float, ...]
    largest_index: tuple[int, ...]
    sinusoidal_bound: float
    row_norm: float
    nearest: float
    nearest_offset: int
    longest_wavelength: float


def index_features(
    position: int = 5, lengths: Iterable[int] = (11, 101, 4096), dim: int = 512
) -> IndexFeatures:
    """Why a transformer is not given ``p`` or ``p / (L - 1)``: the numbers.

    ``p`` grows without bound with the sequence, far past the scale of the token
    embeddings it would be added to; ``p / (L - 1)`` is bounded, but gives one
    position a different value in every length. The sinusoidal rows stay on a
    sphere of radius ``sqrt(d / 2)`` at every position, and distinct positions
    get distinct rows: the distance of rows ``p`` and ``p + k`` depends on ``k``
    alone (``2 sum_i (1 - cos(k omega_i))``), so the smallest over ``k < L`` is
    the smallest over every pair of positions.

    Raises:
        ValueError: a position outside a length, fewer than 2 positions, bad ``dim``.

    Examples:
        >>> import posenc.analysis
        >>> feats = posenc.analysis.index_features(position=5, lengths=(11, 101, 4096), dim=16)
        >>> feats.normalised  # one position, a different value in every length
        (0.5, 0.05, 0.001221001221001221)
        >>> feats.largest_index, feats.sinusoidal_bound
        ((10, 100, 4095), 1.0)
        >>> round(feats.row_norm, 4), round(feats.nearest, 3), feats.nearest_offset
        (2.8284, 1.015, 1)
    """
    position = checks.check_int(position, "position", minimum=0)
    ls = tuple(checks.check_int(n, "lengths", minimum=2) for n in lengths)
    if not ls:
        raise ValueError("lengths must hold at least one length")
    if position >= min(ls):
        raise ValueError(f"position must lie in every length (below {min(ls)}); got {position}")
    dim = checks.check_channels(dim, "dim")
    longest = max(ls)
    table = np.asarray(sinusoidal(longest, dim, dtype="float64"))
    omega = resolve("vaswani").inv_freq(dim)
    k = np.arange(1, longest, dtype=np.float64)
    squared = 2 * (1 - np.cos(np.outer(k, omega))).sum(axis=1)
    at = int(np.argmin(squared))
    return IndexFeatures(
        position,
        ls,
        tuple(position / (n - 1) for n in ls),
        tuple(n - 1 for n in ls),
        float(np.abs(table).max()),
        float(np.linalg.norm(table, axis=1).max()),
        float(np.sqrt(squared[at])),
        at + 1,
        float(2 * np.pi / omega.min()),
    )
