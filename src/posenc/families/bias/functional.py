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
        ValueError: more than :data:`posenc.core.checks.MAX_ELEMENTS` heads
            (refused before any work).

    Examples:
        >>> import posenc
        >>> posenc.alibi_slopes(4).tolist()
        [0.25, 0.0625, 0.015625, 0.00390625]
        >>> posenc.alibi_slopes(6).tolist()  # those of 4 heads, then every other one of 8
        [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    """
    n = checks.check_int(num_heads, "num_heads", minimum=1)
    checks.check_elements(n, f"the slopes of num_heads={n}")
    b = checks.check_number(max_bias, "max_bias", positive=True)
    c = 1 << (n.bit_length() - 1)  # largest power of two <= n
    h = np.arange(1, c + 1, dtype=np.float64)
    slopes = np.exp2(-b * h / c)
    if c < n:
        odd = np.arange(1, 2 * c + 1, 2, dtype=np.float64)[: n - c]
        slopes = np.concatenate([slopes, np.exp2(-b * odd / (2 * c))])
    return slopes


# distances are those of int64 relative positions: at most 2**63, which float32 (as HF
# T5 converts them) cannot tell from 2**63 - 1
_INT64_MAX = np.iinfo(np.int64).max


def _log_bucket(n: npt.NDArray[np.int64], buckets: int, max_distance: int) -> npt.NDArray[np.int64]:
    """HF T5's bucket of distances ``n >= max_exact`` in its float32 arithmetic, capped."""
    me = buckets // 2
    ratio = n.astype(np.float32) / np.float32(me)
    scaled = np.log(ratio) / np.float32(math.log(max_distance / me)) * np.float32(buckets - me)
    return np.minimum(me + scaled.astype(np.int64), buckets - 1)


@functools.lru_cache(maxsize=64)
def _t5_thresholds(buckets: int, max_distance: int) -> npt.NDArray[np.int64]:
    """The smallest distance of each logarithmic bucket ``max_exact + 1 .. buckets - 1``.

    ``buckets`` is the count for one direction. Distances ``n >= max_exact``
    fall in ``max_exact + int(log(n / max_exact) / log(max_distance / max_exact)
    * (buckets - max_exact))``, capped at ``buckets - 1``, evaluated as HF T5
    does in float32 (a float32 quotient, log and product; the Python float
    constants rounded to float32), so that the boundaries are HF's own
    wherever float32 rounding moves them (the log is numpy's, which rounds as
    torch's CPU log does at every boundary of ``max_distance`` up to 10**5; in
    the millions and beyond they can differ by an ulp, and a boundary by one
    distance). That bucket never decreases with ``n``: the first distance of
    every bucket is found at once by bisection over ``max_exact ..
    max_distance + 1`` (capped at ``2**63 - 1``, which float32 does not tell
    from ``2**63``), about 63 evaluations of ``buckets`` distances whatever
    ``max_distance`` is, instead of evaluating every distance.
    """
    me = buckets // 2
    wanted = np.arange(me + 1, buckets, dtype=np.int64)
    # invariant: bucket(lo) < wanted <= bucket(hi) (hi: where the bucket is reached)
    lo = np.full(wanted.shape, me, dtype=np.int64)
    hi = np.full(wanted.shape, min(max_distance + 1, _INT64_MAX), dtype=np.int64)
    while True:
        open_ = hi - lo > 1
        if not open_.any():
            return hi
        mid = lo + (hi - lo) // 2
        reached = _log_bucket(mid, buckets, max_distance) >= wanted
        hi = np.where(open_ & reached, mid, hi)
        lo = np.where(open_ & ~reached, mid, lo)


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

    Equal to HF's function (on the CPU) for every integer input, the
    logarithmic boundaries found once by HF's own float32 arithmetic, then
    looked up exactly: no float rounding happens per call, and no array as
    long as ``max_distance`` is made. (With ``max_distance`` in the millions
    and beyond, numpy's float32 log, used here, and torch's can round a log
    apart and so move a boundary by one distance.) Unsigned 64-bit values
    from ``2**63`` and ``-2**63``, which HF's int64 cast or ``abs`` wraps,
    are at distance ``2**63 - 1`` here, which float32, and so HF's formula,
    does not tell from theirs.

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
            decoder) or above ``2**63 - 1`` (no int64 distance is larger);
            more than :data:`posenc.core.checks.MAX_ELEMENTS` logarithmic
            buckets, whose boundaries are a table (refused before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> rel = torch.arange(-3, 4)  # key - query
        >>> posenc.t5_bucket(rel).tolist()  # keys after the query: the upper 16 buckets
        [3, 2, 1, 0, 17, 18, 19]
        >>> posenc.t5_bucket(rel, bidirectional=False).tolist()
        [3, 2, 1, 0, 0, 0, 0]
        >>> posenc.t5_bucket(torch.tensor([-7, -8, -11, -12, -91, -1000])).tolist()
        [7, 8, 8, 9, 15, 15]
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
    rel_np = _int64(arr)
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
    if md > _INT64_MAX:
        raise ValueError(f"max_distance must be <= 2**63 - 1 (an int64 distance); got {md}")
    buckets = nb // 2 if bidirectional else nb
    if md <= buckets // 2:
        raise ValueError(
            f"max_distance must be > {buckets // 2} (the exact range of num_buckets={nb}); got {md}"
        )
    checks.check_elements(
        buckets - buckets // 2 - 1, f"the boundaries of the logarithmic buckets of num_buckets={nb}"
    )
    return buckets, _t5_thresholds(buckets, md)


def _int64(arr: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Integer relative positions as int64 in ``-(2**63 - 1) .. 2**63 - 1``, none wrapped."""
    if arr.dtype == np.uint64:
        arr = np.minimum(arr, _INT64_MAX)
    return np.maximum(arr.astype(np.int64), -_INT64_MAX)


def bucket_torch(rel: Any, thresholds: Any, buckets: int, bidirectional: bool) -> Any:
    """:func:`t5_bucket` of an integer tensor, given :func:`t5_boundaries` as a tensor.

    Only torch ops (no numpy, no cache): what modules call inside ``torch.compile``.
    """
    import torch

    unsigned = rel.dtype == torch.uint64
    rel = rel.long()
    if unsigned:  # values from 2**63 up wrapped to negative ones: none is really negative
        rel = torch.where(rel < 0, _INT64_MAX, rel)
    rel = rel.clamp(min=-_INT64_MAX)  # abs(-2**63) would wrap
    me = buckets // 2
    base = (rel > 0).long() * buckets if bidirectional else torch.zeros_like(rel)
    dist = rel.abs() if bidirectional else (-rel).clamp(min=0)
    large = me + torch.searchsorted(thresholds, dist.contiguous(), right=True)
    return base + torch.where(dist < me, dist, large)
