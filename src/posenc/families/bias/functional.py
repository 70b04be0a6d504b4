"""The numpy core of attention biases: ALiBi slopes and T5's relative-position buckets.

Both take and give numpy arrays (``t5_bucket`` also torch tensors, on their
device); the torch modules of :mod:`posenc.bias.modules` call them.
Conventions: ALiBi's slopes as the official code (Press et al. 2022) computes them
for any head count; T5's buckets as HF's ``T5Attention._relative_position_bucket``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks

__all__ = ["alibi_slopes", "bucket_torch", "t5_boundaries", "t5_bucket"]


def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> npt.NDArray[np.float64]:
    """The ALiBi head slopes, float64, ``(num_heads,)``.

    For ``n`` a power of two, ``slope_h = 2 ** (-max_bias * h / n)`` for
    ``h = 1 .. n`` (Press et al. 2022, section 3). Otherwise, with ``c`` the
    largest power of two below ``n``: the ``c`` slopes of ``c`` heads, then
    every other slope of ``2c`` heads (the odd ``h``), the first ``n - c`` of
    them: the official fairseq code's recursion, which BLOOM's and MPT's slopes
    (``alibi_bias_max`` = ``max_bias``) equal. ``n = 12`` gives ``2**-1 ..
    2**-8`` then ``2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5``.

    Args:
        num_heads: number of attention heads, >= 1.
        max_bias: the exponent scale (8 in the paper; MPT's ``alibi_bias_max``).

    Raises:
        TypeError, ValueError: ``num_heads`` not an int >= 1; ``max_bias`` not
            a finite number > 0.
    """
    n = checks.check_int(num_heads, "num_heads", minimum=1)
    b = checks.check_number(max_bias, "max_bias", positive=True)
    c = 1 << (n.bit_length() - 1)  # largest power of two <= n
    h = np.arange(1, c + 1, dtype=np.float64)
    slopes = np.exp2(-b * h / c)
    if c < n:
        odd = np.arange(1, 2 * c + 1, 2, dtype=np.float64)[: n - c]
        slopes = np.concatenate([slopes, np.exp2(-b * odd / (2 * c))])
    return slopes


@functools.lru_cache(maxsize=64)
def _t5_thresholds(buckets: int, max_distance: int) -> npt.NDArray[np.int64]:
    """The smallest distance of each logarithmic bucket ``max_exact + 1 .. buckets - 1``.

    ``buckets`` is the count for one direction. Distances ``n >= max_exact``
    fall in ``max_exact + int(log(n / max_exact) / log(max_distance / max_exact)
    * (buckets - max_exact))``, capped at ``buckets - 1``, evaluated as HF T5
    does in float32 (a float32 quotient, log and product; the Python float
    constants rounded to float32), so that the boundaries are HF's own
    wherever float32 rounding moves them. Every distance from ``max_exact`` to
    past the cap is evaluated once and the first of each bucket kept.
    """
    me = buckets // 2
    n = np.arange(me, max_distance + 2, dtype=np.int64)
    ratio = n.astype(np.float32) / np.float32(me)
    scaled = np.log(ratio) / np.float32(math.log(max_distance / me)) * np.float32(buckets - me)
    large = np.minimum(me + scaled.astype(np.int64), buckets - 1)
    firsts = np.searchsorted(large, np.arange(me + 1, buckets), side="left")
    return n[firsts]


def t5_bucket(
    relative_position: Any,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Any:
    """T5's bucket of each relative position (``key - query``), as HF T5 computes it.

    ``T5Attention._relative_position_bucket``: distances below ``max_exact``
    (half the buckets of a direction) get a bucket each; larger ones share
    logarithmically wider buckets up to ``max_distance``, beyond which all
    fall in the last bucket. ``bidirectional`` gives keys after the query the
    upper half of the buckets; otherwise keys after the query (``rel > 0``)
    share bucket 0 with distance 0 (a causal decoder never sees them). With
    the defaults (bidirectional, 32, 128) bucket boundaries lie at distances
    0 .. 8, 12, 16, 23, 32, 46, 64, 91.

    Equal to HF's function for every integer input: the logarithmic boundaries
    are found once by HF's own float32 arithmetic, then looked up exactly, so
    no float rounding happens per call.

    Args:
        relative_position: integer numpy array or torch tensor (any shape), or
            a Python int.
        bidirectional: encoder (True) or decoder (False) buckets.
        num_buckets: total buckets (both directions when bidirectional).
        max_distance: the distance from which the last bucket starts to apply.

    Returns:
        int64 buckets shaped like ``relative_position``: a torch tensor on its
        device for torch input, else a numpy array.

    Raises:
        TypeError: non-integer ``relative_position``; non-bool
            ``bidirectional``; non-int counts.
        ValueError: fewer than 4 buckets (2 for a decoder), or ``max_distance``
            not above the exact range (``num_buckets / 4``, or ``/ 2`` for a
            decoder).
    """
    buckets, thresholds = t5_boundaries(bidirectional, num_buckets, max_distance)
    if checks.is_torch(relative_position):
        import torch

        rel = relative_position
        if rel.is_floating_point() or rel.is_complex() or rel.dtype == torch.bool:
            raise TypeError(f"relative_position must be an integer tensor; got {rel.dtype}")
        thr = torch.as_tensor(thresholds, device=rel.device)
        return bucket_torch(rel, thr, buckets, bidirectional)
    arr = np.asarray(relative_position)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"relative_position must hold integers; got dtype {arr.dtype}")
    rel_np = arr.astype(np.int64)
    me = buckets // 2
    base_np = (rel_np > 0) * buckets if bidirectional else np.zeros_like(rel_np)
    dist_np = np.abs(rel_np) if bidirectional else np.maximum(-rel_np, 0)
    large_np = me + np.searchsorted(thresholds, dist_np, side="right")
    return (base_np + np.where(dist_np < me, dist_np, large_np)).astype(np.int64)


def t5_boundaries(
    bidirectional: bool, num_buckets: int, max_distance: int
) -> tuple[int, npt.NDArray[np.int64]]:
    """Validated settings as ``(buckets per direction, first distance of each log bucket)``.

    Raises:
        TypeError, ValueError: as :func:`t5_bucket`.
    """
    checks.check_bool(bidirectional, "bidirectional")
    nb = checks.check_int(num_buckets, "num_buckets", minimum=4 if bidirectional else 2)
    md = checks.check_int(max_distance, "max_distance", minimum=1)
    buckets = nb // 2 if bidirectional else nb
    if md <= buckets // 2:
        raise ValueError(
            f"max_distance must be > {buckets // 2} (the exact range of num_buckets={nb}); got {md}"
        )
    return buckets, _t5_thresholds(buckets, md)


def bucket_torch(rel: Any, thresholds: Any, buckets: int, bidirectional: bool) -> Any:
    """:func:`t5_bucket` of an integer tensor, given :func:`t5_boundaries` as a tensor.

    Only torch ops (no numpy, no cache): what modules call inside ``torch.compile``.
    """
    import torch

    rel = rel.long()
    me = buckets // 2
    base = (rel > 0).long() * buckets if bidirectional else torch.zeros_like(rel)
    dist = rel.abs() if bidirectional else (-rel).clamp(min=0)
    large = me + torch.searchsorted(thresholds, dist.contiguous(), right=True)
    return base + torch.where(dist < me, dist, large)
