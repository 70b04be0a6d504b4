"""The ``pope`` cases: PoPE's polar channels of q and k, against copying them.

Each row turns q and k ``(batch, heads, seq, head_dim)`` into PoPE's ``2 * head_dim``
polar channels (Gopalakrishnan et al. 2025) and builds its phases in the timed call, as
a training step does: posenc's :class:`~posenc.PoPE` (exact angles, rounded once)
against pope-pytorch (its ``PoPE`` module's ``freqs``, then ``apply_pope_to_qk``) and
x-transformers (``PolarEmbedding``, then ``apply_polar_pos_emb`` of q and of k), both
with float32 angles; posenc's :class:`~posenc.Rotary` (RoPE: ``head_dim`` channels out,
no softplus, cached tables) and a copy of q and k for scale. The backward case also
times the gradients of q, k and the phase bias (RoPE and the copy have none).

Sizes: ``(1, 16, 2048, 64)`` on the CPU (8 MiB per float32 input, 16 MiB per polar
output) and ``(8, 32, 4096, 128)`` on CUDA (512 MiB per input, beyond any L2).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from posenc.faces.bench.harness import Case, Impl, qk_rows


def impls(
    batch: int, heads: int, seq: int, head_dim: int, *, backward: bool, device: str = "cpu"
) -> list[Impl]:
    """PoPE of q and k of ``(batch, heads, seq, head_dim)``; optionally backward too.

    With ``backward`` each row runs ``backward()`` from a fixed upstream gradient (the
    polar rows' twice as wide) into ``q.grad``, ``k.grad`` and the bias's, reset before
    each call.
    """
    shape = (batch, heads, seq, head_dim)

    timed = qk_rows(shape, backward=backward, device=device)

    def phase_bias() -> Any:
        """The same phase bias in every row, uniform in [-2 pi, 0] (the references' option)."""
        import torch

        gen = torch.Generator().manual_seed(2)
        return torch.rand(heads, head_dim, generator=gen).mul(-2 * math.pi).to(device)

    def clone() -> Callable[[], object]:
        return timed(lambda q, k: (q.clone(), k.clone()))

    def ours() -> Callable[[], object]:
        import torch

        import posenc

        pope = posenc.PoPE(head_dim, heads=heads).to(device)
        with torch.no_grad():
            pope.bias.copy_(phase_bias())
        return timed(pope, pope.bias)

    def pope_pytorch() -> Callable[[], object]:
        import torch
        from PoPE_pytorch import PoPE, apply_pope_to_qk

        pope = PoPE(head_dim, heads=heads).to(device)
        with torch.no_grad():
            pope.bias.copy_(phase_bias())
        return timed(lambda q, k: apply_pope_to_qk(pope(seq), q, k), pope.bias)

    def x_transformers() -> Callable[[], object]:
        import torch
        from x_transformers.x_transformers import PolarEmbedding, apply_polar_pos_emb

        polar = PolarEmbedding(head_dim, heads).to(device)
        with torch.no_grad():
            polar.learned_bias.copy_(phase_bias()[:, None])
        positions = torch.arange(seq, device=device)

        def step(q: Any, k: Any) -> tuple[Any, Any]:
            freqs, bias = polar(positions)
            return apply_polar_pos_emb(q, freqs), apply_polar_pos_emb(k, freqs + bias)

        return timed(step, polar.learned_bias)

    def rope() -> Callable[[], object]:
        import posenc

        rotary = posenc.Rotary(head_dim).to(device)
        return timed(rotary)

    return [
        Impl("q.clone(), k.clone()", clone, "baseline", "copy both (float32, reference)"),
        Impl("posenc PoPE", ours, "ours", "exact phases, 2 x head_dim channels out"),
        Impl("pope-pytorch", pope_pytorch, "peer", "PoPE(seq) + apply_pope_to_qk"),
        Impl("x-transformers", x_transformers, "peer", "PolarEmbedding + apply_polar_pos_emb"),
        Impl("posenc Rotary", rope, "ours", "RoPE for scale: head_dim channels out"),
    ]


#: A head_dim of 64 (pope-pytorch's fused kernels' common size), 16 heads, 2048 tokens.
CPU_SIZE = {"batch": 1, "heads": 16, "seq": 2048, "head_dim": 64}
#: On CUDA: 512 MiB per float32 input, so every row is bound by memory bandwidth.
CUDA_SIZE = {"batch": 8, "heads": 32, "seq": 4096, "head_dim": 128}


def _case(backward: bool) -> Case:
    return Case(
        "pope" + ("-backward" if backward else ""),
        "PoPE's polar channels of q and k, phases built per call, "
        + ("forward and backward (q, k, phase bias)" if backward else "forward")
        + ", against pope-pytorch, x-transformers, RoPE and a copy.",
        build=functools.partial(impls, backward=backward),
        full=CPU_SIZE,
        quick=CPU_SIZE,
        quick_repeat=3,
        devices=("cpu", "cuda"),
        cuda_full=CUDA_SIZE,
        cuda_quick=CUDA_SIZE,
    )


#: This module's cases, in the order ``posenc bench`` runs them.
CASES = (_case(False), _case(True))
