"""The ``sinusoidal-table`` case: a float32 sinusoidal table, against filling an array.

Two of the peers are recipes users copy rather than import, written out here
as published: :func:`numpy_tutorial_table` (the numpy recipe
``sin/cos(pos / 10000**(2i/d))``, in float64 as published and in float32
arithmetic) and :func:`annotated_diffusion_embedding` (the timestep embedding
of The Annotated Diffusion Model, in torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

import posenc
from posenc.faces.bench.harness import Case, Impl


def numpy_tutorial_table(sequence_length: int, d_model: int, dtype: Any = np.float64) -> np.ndarray:
    """A numpy tutorial's ``positional_encoding``: the Vaswani et al. 2017 table.

    The common recipe: channel ``2i`` holds ``np.sin(pos / 10000**(2i/d))`` and
    channel ``2i + 1`` its ``np.cos`` (interleaved), the frequencies computed as
    ``exp(-2i ln(1e4) / d)``. With ``dtype=np.float64`` it is the code as
    published; with ``np.float32`` every array is float32 (faster, and inexact at
    large positions).
    """
    positions = np.arange(sequence_length, dtype=dtype)[:, np.newaxis]
    div_terms = np.exp(np.arange(0, d_model, 2, dtype=dtype) * -(np.log(dtype(10000.0)) / d_model))
    pos_enc = np.zeros((sequence_length, d_model), dtype=dtype)
    pos_enc[:, 0::2] = np.sin(positions * div_terms)
    pos_enc[:, 1::2] = np.cos(positions * div_terms)
    return pos_enc


def annotated_diffusion_embedding(time: Any, dim: int) -> Any:
    """The timestep embedding of The Annotated Diffusion Model.

    Its ``SinusoidalPositionEmbeddings.forward``: ``[sin, cos]`` halves,
    ``exp(-k ln(1e4) / (h - 1))``, float32 on the device of ``time``.
    """
    import torch

    device = time.device
    half_dim = dim // 2
    embeddings: Any = math.log(10000) / (half_dim - 1)
    embeddings = torch.exp(torch.arange(half_dim, device=device) * -embeddings)
    embeddings = time[:, None] * embeddings[None, :]
    embeddings = torch.cat((embeddings.sin(), embeddings.cos()), dim=-1)
    return embeddings


def impls(length: int, dim: int) -> list[Impl]:
    """The rows of a float32 ``(length, dim)`` sinusoidal table; fills first, as baselines."""
    shape = (length, dim)

    def np_fill() -> Callable[[], object]:
        return lambda: np.empty(shape, dtype=np.float32).fill(1.0)

    def np_full() -> Callable[[], object]:
        return lambda: np.full(shape, 1.0, dtype=np.float32)

    def torch_fill() -> Callable[[], object]:
        import torch

        return lambda: torch.empty(shape, dtype=torch.float32).fill_(1.0)

    def ours_numpy() -> Callable[[], object]:
        return lambda: posenc.sinusoidal(length, dim)

    def ours_torch() -> Callable[[], object]:
        import torch

        return lambda: posenc.sinusoidal(length, dim, dtype=torch.float32)

    def tutorial_f64() -> Callable[[], object]:
        return lambda: numpy_tutorial_table(length, dim).astype(np.float32)

    def tutorial_f32() -> Callable[[], object]:
        return lambda: numpy_tutorial_table(length, dim, np.float32)

    def annotated_diffusion() -> Callable[[], object]:
        import torch

        time = torch.arange(length)
        return lambda: annotated_diffusion_embedding(time, dim)

    def positional_encodings() -> Callable[[], object]:
        import torch
        from positional_encodings.torch_encodings import PositionalEncoding1D

        module = PositionalEncoding1D(dim)
        x = torch.zeros((1, length, dim))

        def call() -> object:
            # it caches its output by shape: clear it so every call computes
            module.cached_penc = None
            return module(x)

        return call

    def hf_distilbert() -> Callable[[], object]:
        import torch
        from transformers.models.distilbert.modeling_distilbert import (
            create_sinusoidal_embeddings,
        )

        out = torch.empty(shape, dtype=torch.float32)
        return lambda: create_sinusoidal_embeddings(length, dim, out)

    return [
        Impl("np.empty().fill", np_fill, "baseline", "allocate + fill float32 (reference)"),
        Impl("np.full", np_full, "baseline", "allocate + fill float32"),
        Impl("torch.empty().fill_", torch_fill, "baseline", "allocate + fill float32"),
        Impl("posenc numpy", ours_numpy, "ours", "posenc.sinusoidal(n, d): exact"),
        Impl("posenc torch", ours_torch, "ours", "dtype=torch.float32: exact"),
        Impl("numpy tutorial (float64)", tutorial_f64, "peer", "as published: float64, cast"),
        Impl("numpy tutorial (float32)", tutorial_f32, "peer", "float32 arithmetic: inexact"),
        Impl(
            "annotated diffusion (torch)",
            annotated_diffusion,
            "peer",
            "timestep embedding: float32",
        ),
        Impl(
            "positional-encodings",
            positional_encodings,
            "peer",
            "PositionalEncoding1D, cache cleared",
        ),
        Impl(
            "HF DistilBERT",
            hf_distilbert,
            "peer",
            "create_sinusoidal_embeddings: Python loop",
        ),
    ]


#: This module's cases, in the order ``posenc bench`` runs them.
CASES = (
    Case(
        "sinusoidal-table",
        "A float32 sinusoidal table (positions 0..n-1, d channels) against filling "
        "an array of the same size.",
        build=impls,
        full={"length": 8192, "dim": 1024},
        # quick saves repetitions, not size: a smaller table sits in cache, and then
        # "fill" is no longer the memory-bound reference the ratio is meant against
        quick={"length": 8192, "dim": 1024},
    ),
)
