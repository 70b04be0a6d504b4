"""Huge sizes are refused before any work, at every public entry point that makes a table.

The README's guarantee: a result of more than ``2**31`` elements
(:data:`posenc.core.checks.MAX_ELEMENTS`) raises ``ValueError`` before anything is
computed or allocated. Each case below is one entry point whose result grows with a
size ``n`` the caller chooses, ``unit * n`` elements: called with the smallest ``n``
past the limit it must raise, naming the parameter, without the process growing (its
peak RSS); with the limit lowered to ``unit * AT`` (patched, so that no test allocates
gigabytes), ``n = AT`` must work and ``n = AT + 1`` must not: the limit is exactly the
README's, counted exactly.

Sizes are made with ``expand`` (a view of one element): the caller's own positions
cost nothing, so any memory the call takes is the call's.

The entry points that checked their sizes before this file (``sinusoidal``, ``grid``,
``nerf``, ``fourier_features``, ``gaussian_fourier_matrix``, ``shift_matrix``,
``LearnedPositionalEmbedding(...)``) are tested in their own modules.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import posenc
from posenc.core import checks
from posenc.families.absolute.fourier import gaussian_fourier_features
from posenc.families.absolute.modules import LearnedPositionalEmbedding, SinusoidalEmbedding
from posenc.families.bias.functional import alibi_slopes
from posenc.families.bias.modules import FIRE, KERPLE, ALiBi, NoPE, Sandwich, T5Bias
from posenc.families.rotary.config import RopeSpec
from posenc.families.rotary.module import Rotary
from posenc.families.rotary.multiaxis import (
    AxialRotary,
    axial_cos_sin,
    axial_grid,
    mrope_cos_sin,
    pixel_frequencies,
    xpos_scale,
    xpos_tables,
)
from posenc.families.rotary.rerotate import rerotation_cos_sin
from posenc.families.rotary.schedules import frequencies
from posenc.families.rotary.tables import cos_sin
from posenc.integration.hf_module import HFGatheredRotaryEmbedding, HFRotaryEmbedding

#: n at the lowered limit: small, so that the calls that must work cost nothing
AT = 8
#: what a refused call may add to the process's peak RSS (it should add nothing)
RSS_SLACK_KIB = 100 * 1024

ROTARY = frequencies("default", 128, 10000.0)
LONGER = frequencies("default", 128, 500000.0)
BIASES = {"ALiBi": ALiBi, "T5Bias": T5Bias, "KERPLE": KERPLE, "FIRE": FIRE}
BIASES |= {"Sandwich": Sandwich, "NoPE": NoPE}


def _positions(n: int, *lead: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Zeros of shape ``(*lead, n)`` that cost one element: a view."""
    return torch.zeros((1,) * (len(lead) + 1), dtype=dtype).expand(*lead, n)


def _hf_rotary() -> HFRotaryEmbedding:
    module = HFRotaryEmbedding({None: RopeSpec("default", 10000.0, {}, 128, 128)})
    module(torch.zeros(1), torch.zeros(1, 1, dtype=torch.int64))  # its table, made now
    return module


def _hf_gathered() -> HFGatheredRotaryEmbedding:
    # a 2-D vision tower's layout: the first 32 frequencies on rows, then on columns
    axis, freq = [0] * 32 + [1] * 32, list(range(32)) * 2
    return HFGatheredRotaryEmbedding(10000.0, 128, axis + axis, freq + freq, axes=2)


def _none() -> None:
    return None


Setup = Callable[[], Any]
Call = Callable[[Any, int], Any]

#: (id, elements per n, setup (made before the limit is lowered), call, the message)
CASES: list[tuple[str, int, Setup, Call, str]] = [
    # the bias modules' dense block, their forward and their relative table
    *(
        (f"{name}.bias", 2, lambda cls=cls: cls(2), lambda m, n: m.bias(1, n), r"k_len=")
        for name, cls in BIASES.items()
    ),
    *(
        (
            f"{name}.forward",
            2,
            lambda cls=cls: cls(2),
            lambda m, n: m(_positions(1, 1), _positions(n, 1)),
            r"q_pos and k_pos",
        )
        for name, cls in BIASES.items()
    ),
    *(
        (f"{name}.relative_bias", 2, lambda cls=cls: cls(2), lambda m, n: m.relative_bias(
            _positions(n)
        ), r"rel \(")
        for name, cls in BIASES.items()
    ),
    # the bias modules' own tables, sized by num_heads
    ("alibi_slopes", 1, _none, lambda _, n: alibi_slopes(n), r"num_heads="),
    ("ALiBi()", 1, _none, lambda _, n: ALiBi(n), r"num_heads="),
    ("T5Bias()", 32, _none, lambda _, n: T5Bias(n, num_buckets=32), r"num_buckets=32 x num_h"),
    ("KERPLE()", 1, _none, lambda _, n: KERPLE(n), r"num_heads="),
    ("FIRE()", 32, _none, lambda _, n: FIRE(n, mlp_width=32), r"mlp_width=32 x num_heads="),
    ("Sandwich()", 1, _none, lambda _, n: Sandwich(n), r"num_heads="),
    ("NoPE()", 1, _none, lambda _, n: NoPE(n), r"num_heads="),
    # rotary tables
    ("Rotary.cos_sin int", 128, lambda: Rotary(128), lambda m, n: m.cos_sin(_positions(n)),
     r"positions \(shape \(\d+,\)\) x rotary_dim=128"),
    (
        "Rotary.cos_sin float",
        128,
        lambda: Rotary(128),
        lambda m, n: m.cos_sin(_positions(n, dtype=torch.float32)),
        r"positions \(shape \(\d+,\)\) x rotary_dim=128",
    ),
    ("rotary.tables.cos_sin", 128, _none, lambda _, n: cos_sin(_positions(n), ROTARY),
     r"positions \(shape \(\d+,\)\) x rotary_dim=128"),
    ("rerotation_cos_sin", 128, _none,
     lambda _, n: rerotation_cos_sin(_positions(n), ROTARY, LONGER), r"positions .*rotary_dim"),
    ("mrope_cos_sin", 3 * 128, _none,
     lambda _, n: mrope_cos_sin(_positions(n, 3, 1), ROTARY, [16, 24, 24]),
     r"position_ids \(shape \(3, 1, \d+\)\) x rotary_dim=128"),
    ("axial_grid", 4, _none, lambda _, n: axial_grid(2, n), r"sizes \(2, \d+\) x 2 axes"),
    (
        "axial_cos_sin",
        128,
        _none,
        lambda _, n: axial_cos_sin(_positions(2, n), pixel_frequencies(64)),
        r"coords \(shape \(\d+, 2\)\) x 128 channels",
    ),
    ("AxialRotary.cos_sin", 128, lambda: AxialRotary(128),
     lambda m, n: m.cos_sin(_positions(2, n)), r"coords \(shape \(\d+, 2\)\)"),
    ("xpos_scale", 128, _none, lambda _, n: xpos_scale(_positions(n), 128, center=0.0),
     r"positions \(shape \(\d+,\)\) x rotary_dim=128"),
    ("xpos_tables", 128, _none, lambda _, n: xpos_tables(_positions(n), ROTARY, center=0.0),
     r"positions \(shape \(\d+,\)\) x rotary_dim=128"),
    ("HFRotaryEmbedding", 128, _hf_rotary,
     lambda m, n: m(torch.zeros(1), _positions(n, 1)), r"positions .* x rotary_dim=128"),
    ("HFGatheredRotaryEmbedding", 2 * 128, _hf_gathered,
     lambda m, n: m(torch.zeros(1), _positions(n, 2)), r"positions \(shape \(2, \d+\)\)"),
    # absolute encodings
    ("SinusoidalEmbedding.encode", 64, lambda: SinusoidalEmbedding(64),
     lambda m, n: m.encode(_positions(n)), r"positions \(shape \(\d+,\)\) x dim=64"),
    ("LearnedPositionalEmbedding shape", 8, lambda: LearnedPositionalEmbedding(4, 8),
     lambda m, n: m(shape=(n, 1)), r"shape \(\d+, 1\) x dim=8"),
    ("LearnedPositionalEmbedding positions", 8, lambda: LearnedPositionalEmbedding(4, 8),
     lambda m, n: m(_positions(1, n)), r"positions \(shape \(\d+, 1\)\) x dim=8"),
    ("gaussian_fourier_features", 2, _none,
     lambda _, n: gaussian_fourier_features(np.zeros((1, 1)), n), r"num_features="),
    # position helpers
    ("cache_positions", 1, _none, lambda _, n: posenc.cache_positions(n), r"seq_len="),
    ("cache_positions torch", 1, _none,
     lambda _, n: posenc.cache_positions(n, device="cpu"), r"seq_len="),
]  # fmt: skip

IDS = [case[0] for case in CASES]


def _peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize(("name", "unit", "setup", "call", "match"), CASES, ids=IDS)
def test_just_past_the_limit_is_refused_before_any_allocation(name, unit, setup, call, match):
    made = setup()
    n = checks.MAX_ELEMENTS // unit + 1  # unit * n: the fewest elements past the limit
    before = _peak_rss_kib()
    with pytest.raises(ValueError, match=match) as refused:
        call(made, n)
    assert "would hold" in str(refused.value) and str(checks.MAX_ELEMENTS) in str(refused.value)
    grown = _peak_rss_kib() - before
    assert grown < RSS_SLACK_KIB, f"{name} took {grown / 1024:.0f} MiB before refusing"


@pytest.mark.parametrize(("name", "unit", "setup", "call", "match"), CASES, ids=IDS)
def test_the_limit_is_exact(monkeypatch, name, unit, setup, call, match):
    made = setup()
    monkeypatch.setattr(checks, "MAX_ELEMENTS", unit * AT)
    call(made, AT)  # exactly at the limit: works
    with pytest.raises(ValueError, match=match):
        call(made, AT + 1)


def test_the_issues_alibi_block_is_refused():
    # tried to allocate 32 GiB
    with pytest.raises(ValueError, match=r"num_heads=8 x q_len=65536 x k_len=65536 would hold"):
        ALiBi(8).bias(2**16, 2**16)


def test_t5_bucket_boundaries_of_a_huge_count_are_refused():
    # 2**31 + 1 logarithmic buckets a direction: their first distances are a table
    before = _peak_rss_kib()
    with pytest.raises(ValueError, match=r"num_buckets=8589934600 would hold 2147483649"):
        posenc.t5_bucket(0, num_buckets=2**33 + 8, max_distance=2**33)
    assert _peak_rss_kib() - before < RSS_SLACK_KIB


def test_sandwich_dim_is_a_channel_count():
    with pytest.raises(ValueError, match=r"dim must be at most 65536 channels; got 65538"):
        Sandwich(1, dim=65538)
    assert Sandwich(1, dim=65536).inv_freq.shape == (32768,)
