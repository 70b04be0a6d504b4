"""The ``rotary-*`` cases: RoPE applied to q and k, against copying them.

One case per dtype (float32, bfloat16) and pass (forward; forward and
backward), each timing posenc's :class:`~posenc.Rotary` in both layouts against
HF's ``apply_rotary_pos_emb`` (also under ``torch.compile``: on the CPU for the
float32 forward only, on CUDA for every dtype and pass), rotary-embedding-torch
and the complex multiply of Meta's Llama code; on CUDA also against
Liger-Kernel's Triton kernel (``liger_rotary_pos_emb``).

Sizes: ``(batch, heads, seq, head_dim)`` of ``(1, 32, 2048, 128)`` on the CPU
(32 MiB per float32 tensor, beyond its caches) and ``(8, 32, 4096, 128)`` on
CUDA: 512 MiB per float32 tensor, ten times an H100's 50 MiB L2, so a GPU row
is bound by memory bandwidth, as the copy baseline is, rather than by launching
kernels (at ``(1, 32, 2048, 128)`` one tensor fits in the L2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import posenc
from posenc.faces.bench.harness import Case, Impl, qk_rows


def _hf_rotate_half(x: Any) -> Any:
    """HF's ``rotate_half`` written out (the formula torch.compile is given)."""
    import torch

    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _hf_formula(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    return q * cos + _hf_rotate_half(q) * sin, k * cos + _hf_rotate_half(k) * sin


def impls(
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    *,
    dtype: str,
    backward: bool,
    device: str = "cpu",
) -> list[Impl]:
    """Rotate q and k of ``(batch, heads, seq, head_dim)``; optionally backward too.

    With ``backward`` each row also runs ``backward()`` from a fixed upstream
    gradient into ``q.grad`` and ``k.grad`` (reset to None before each call), as
    a training step does: a fresh gradient is stored as it is, one that is
    still referenced elsewhere (clone's passes the upstream one through) is
    copied, so every row writes both gradients once.

    On ``device="cuda"`` the inputs are drawn on the GPU (seeded: every row
    gets the same numbers), ``torch.compile`` of HF's formula runs for every
    dtype and pass, and Liger-Kernel's Triton RoPE is one more peer (skipped
    where it is not installed).
    """
    shape = (batch, heads, seq, head_dim)
    cuda = device == "cuda"

    timed = qk_rows(shape, backward=backward, device=device, dtype=dtype)

    def clone() -> Callable[[], object]:
        return timed(lambda q, k: (q.clone(), k.clone()))

    def ours(layout: str) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            rope = posenc.Rotary(head_dim, layout=layout).to(device)
            return timed(rope)

        return make

    def hf_tables() -> tuple[Any, Any]:
        import torch

        rope = posenc.Rotary(head_dim)
        positions = torch.arange(seq, device=device)[None]
        cos, sin = rope.cos_sin(positions, dtype=getattr(torch, dtype))
        return cos[:, None], sin[:, None]  # (1, 1, seq, head_dim), as HF unsqueezes

    def hf() -> Callable[[], object]:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cos, sin = hf_tables()
        return timed(lambda q, k: apply_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0]))

    def hf_compiled() -> Callable[[], object]:
        import torch

        cos, sin = hf_tables()
        fn = torch.compile(_hf_formula, fullgraph=True, dynamic=False)
        call = timed(lambda q, k: fn(q, k, cos, sin))
        call()  # compile here, so that the warm-up and the run budget time the kernel
        return call

    def liger() -> Callable[[], object]:
        import importlib

        rope: Callable[..., tuple[Any, Any]]
        try:
            rope = importlib.import_module("liger_kernel.transformers.rope").liger_rotary_pos_emb
        except ImportError:
            # its transformers package imports every patched model: the kernel alone
            rope = importlib.import_module("liger_kernel.ops.rope").LigerRopeFunction.apply

        cos, sin = hf_tables()
        # Liger takes HF's (batch, seq, head_dim) tables; it rotates a contiguous
        # (batch, seq, heads, head_dim) copy of q and k in place, never the inputs
        cos, sin = cos[:, 0], sin[:, 0]
        return timed(lambda q, k: rope(q, k, cos, sin))

    def rotary_embedding_torch() -> Callable[[], object]:
        from rotary_embedding_torch import RotaryEmbedding

        module = RotaryEmbedding(head_dim).to(device)
        return timed(
            lambda q, k: (module.rotate_queries_or_keys(q), module.rotate_queries_or_keys(k))
        )

    def complex_multiply() -> Callable[[], object]:
        import torch

        rope = posenc.Rotary(head_dim, layout="interleaved")
        cos, sin = rope.cos_sin(torch.arange(seq, device=device))
        freqs = torch.complex(cos[:, 0::2], sin[:, 0::2])

        def step(q: Any, k: Any) -> tuple[Any, Any]:
            out = []
            for x in (q, k):
                z = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
                out.append(torch.view_as_real(z * freqs).flatten(-2).to(x.dtype))
            return out[0], out[1]

        return timed(step)

    rows = [
        Impl("q.clone(), k.clone()", clone, "baseline", f"copy both ({dtype}, reference)"),
        Impl("posenc half", ours("half"), "ours", "Rotary(layout='half'): exact tables"),
        Impl("posenc interleaved", ours("interleaved"), "ours", "layout='interleaved'"),
        Impl("HF apply_rotary_pos_emb", hf, "peer", "transformers Llama, half"),
        Impl("rotary-embedding-torch", rotary_embedding_torch, "peer", "interleaved"),
        Impl("complex multiply", complex_multiply, "peer", "Meta's formula, interleaved"),
    ]
    if cuda or (not backward and dtype == "float32"):
        rows.insert(4, Impl("torch.compile(HF)", hf_compiled, "peer", "HF formula, inductor"))
    if cuda:
        rows.insert(5, Impl("Liger-Kernel", liger, "peer", "liger_rotary_pos_emb, Triton, half"))
    return rows


#: The CPU size: 32 MiB per float32 tensor, beyond the caches.
CPU_SIZE = {"batch": 1, "heads": 32, "seq": 2048, "head_dim": 128}
#: The CUDA size: 512 MiB per float32 tensor, ten times an H100's L2.
CUDA_SIZE = {"batch": 8, "heads": 32, "seq": 4096, "head_dim": 128}


def _case(dtype: str, backward: bool) -> Case:
    return Case(
        f"rotary-{dtype}" + ("-backward" if backward else ""),
        f"RoPE on q and k ({dtype}), "
        + ("forward and backward" if backward else "forward")
        + ", against copying them.",
        build=functools.partial(impls, dtype=dtype, backward=backward),
        full=CPU_SIZE,
        # as for the table: quick saves repetitions, not size (memory-bound)
        quick=CPU_SIZE,
        quick_repeat=3,
        devices=("cpu", "cuda"),
        cuda_full=CUDA_SIZE,
        cuda_quick=CUDA_SIZE,
    )


#: This module's cases, in the order ``posenc bench`` runs them.
CASES = tuple(
    _case(dtype, backward) for dtype in ("float32", "bfloat16") for backward in (False, True)
)
