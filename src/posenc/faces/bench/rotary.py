"""The ``rotary-*`` cases: RoPE applied to q and k, against copying them.

One case per dtype (float32, bfloat16) and pass (forward; forward and
backward), each timing posenc's :class:`~posenc.Rotary` in both layouts against
HF's ``apply_rotary_pos_emb`` (also under ``torch.compile``, float32 forward
only), rotary-embedding-torch and the complex multiply of Meta's Llama code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import posenc
from posenc.faces.bench.harness import Case, Impl

__all__ = ["CASES", "impls"]


def _hf_rotate_half(x: Any) -> Any:
    """HF's ``rotate_half`` written out (the formula torch.compile is given)."""
    import torch

    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _hf_formula(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    return q * cos + _hf_rotate_half(q) * sin, k * cos + _hf_rotate_half(k) * sin


def impls(
    batch: int, heads: int, seq: int, head_dim: int, *, dtype: str, backward: bool
) -> list[Impl]:
    """Rotate q and k of ``(batch, heads, seq, head_dim)``; optionally backward too.

    With ``backward`` each row also runs ``backward()`` from a fixed upstream
    gradient into ``q.grad`` and ``k.grad`` (reset to None before each call), as
    a training step does: a fresh gradient is stored as it is, one that is
    still referenced elsewhere (clone's passes the upstream one through) is
    copied, so every row writes both gradients once.
    """
    shape = (batch, heads, seq, head_dim)

    def inputs() -> tuple[Any, Any, Any]:
        import torch

        gen = torch.Generator().manual_seed(0)
        tdtype = getattr(torch, dtype)
        q, k, g = (torch.randn(shape, generator=gen).to(tdtype) for _ in range(3))
        if backward:
            q.requires_grad_(True)
            k.requires_grad_(True)
        return q, k, g

    def timed(step: Callable[[Any, Any], tuple[Any, Any]]) -> Callable[[], object]:
        import torch

        q, k, g = inputs()
        if not backward:
            return lambda: step(q, k)

        def call() -> object:
            q.grad = k.grad = None
            a, b = step(q, k)
            torch.autograd.backward((a, b), (g, g))
            return q.grad, k.grad

        return call

    def clone() -> Callable[[], object]:
        return timed(lambda q, k: (q.clone(), k.clone()))

    def ours(layout: str) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            rope = posenc.Rotary(head_dim, layout=layout)
            return timed(rope)

        return make

    def hf_tables() -> tuple[Any, Any]:
        import torch

        rope = posenc.Rotary(head_dim)
        cos, sin = rope.cos_sin(torch.arange(seq)[None], dtype=getattr(torch, dtype))
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

    def rotary_embedding_torch() -> Callable[[], object]:
        from rotary_embedding_torch import RotaryEmbedding

        module = RotaryEmbedding(head_dim)
        return timed(
            lambda q, k: (module.rotate_queries_or_keys(q), module.rotate_queries_or_keys(k))
        )

    def complex_multiply() -> Callable[[], object]:
        import torch

        rope = posenc.Rotary(head_dim, layout="interleaved")
        cos, sin = rope.cos_sin(torch.arange(seq))
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
    if not backward and dtype == "float32":
        rows.insert(4, Impl("torch.compile(HF)", hf_compiled, "peer", "HF formula, inductor"))
    return rows


def _case(dtype: str, backward: bool) -> Case:
    return Case(
        f"rotary-{dtype}" + ("-backward" if backward else ""),
        f"RoPE on q and k ({dtype}), "
        + ("forward and backward" if backward else "forward")
        + ", against copying them.",
        build=functools.partial(impls, dtype=dtype, backward=backward),
        full={"batch": 1, "heads": 32, "seq": 2048, "head_dim": 128},
        # as for the table: quick saves repetitions, not size (memory-bound)
        quick={"batch": 1, "heads": 32, "seq": 2048, "head_dim": 128},
        quick_repeat=3,
    )


#: This module's cases, in the order ``posenc bench`` runs them.
CASES = tuple(
    _case(dtype, backward) for dtype in ("float32", "bfloat16") for backward in (False, True)
)
