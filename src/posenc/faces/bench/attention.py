"""The ``attention-bias`` case: attention with a positional bias, against attention with none.

posenc's :func:`~posenc.attention` with no bias, ALiBi, T5 and KERPLE, against
SDPA without a bias (the baseline), x-transformers' dense ALiBi bias handed to
SDPA as a mask, and FlexAttention with ALiBi in a compiled score mod. The case
also measures each row's peak memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import posenc
from posenc.faces.bench.harness import Case, Impl

__all__ = ["CASES", "impls"]


def impls(batch: int, heads: int, seq: int, head_dim: int) -> list[Impl]:
    """Forward attention over ``(batch, heads, seq, head_dim)`` float32 q, k, v.

    The baseline is SDPA with no bias and no mask (torch's CPU flash kernel). The
    peers add the bias the way users do today: x-transformers materialises a
    ``(heads, seq, seq)`` ALiBi bias and hands it to SDPA as a float mask;
    FlexAttention (compiled) adds it in a score mod.
    """
    shape = (batch, heads, seq, head_dim)

    def inputs() -> tuple[Any, Any, Any]:
        import torch

        gen = torch.Generator().manual_seed(0)
        return tuple(torch.randn(shape, generator=gen) for _ in range(3))  # type: ignore[return-value]

    def sdpa(causal: bool) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch
            import torch.nn.functional as F

            q, k, v = inputs()

            def call() -> object:
                with torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            return call

        return make

    def ours(kind: str, causal: bool) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            q, k, v = inputs()
            bias = {
                "none": None,
                "alibi": posenc.ALiBi(heads, symmetric=not causal),
                "t5": posenc.T5Bias(heads),
                "kerple": posenc.KERPLE(heads),
            }[kind]

            def call() -> object:
                with torch.no_grad():
                    return posenc.attention(q, k, v, bias=bias, causal=causal)

            return call

        return make

    def materialised() -> Callable[[], object]:
        import torch
        import torch.nn.functional as F
        from x_transformers.x_transformers import AlibiPositionalBias

        q, k, v = inputs()
        alibi = AlibiPositionalBias(heads=heads, total_heads=heads)

        def call() -> object:
            with torch.no_grad():
                alibi.bias = None  # x-transformers caches the dense bias: build it each call
                mask = alibi(seq, seq)  # (heads, seq, seq) float32
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        return call

    def flex() -> Callable[[], object]:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        q, k, v = inputs()
        slopes = torch.tensor(posenc.alibi_slopes(heads), dtype=torch.float32)

        def score_mod(score: Any, b: Any, h: Any, qi: Any, ki: Any) -> Any:
            return score - slopes[h] * (qi - ki).abs()

        compiled = torch.compile(flex_attention)

        def call() -> object:
            with torch.no_grad():
                return compiled(q, k, v, score_mod=score_mod)

        call()  # compile here: the warm-up and the run budget time the kernel
        return call

    return [
        Impl("SDPA, no bias", sdpa(False), "baseline", "torch CPU flash kernel (reference)"),
        Impl("SDPA causal, no bias", sdpa(True), "baseline", "is_causal=True"),
        Impl("posenc, no bias", ours("none", False), "ours", "posenc.attention"),
        Impl("posenc ALiBi", ours("alibi", False), "ours", "symmetric, bidirectional"),
        Impl("posenc ALiBi causal", ours("alibi", True), "ours", "causal=True"),
        Impl("posenc T5", ours("t5", False), "ours", "T5Bias, bidirectional"),
        Impl("posenc KERPLE", ours("kerple", False), "ours", "KERPLE log"),
        Impl("x-transformers ALiBi", materialised, "peer", "dense bias as SDPA mask"),
        Impl("flex_attention ALiBi", flex, "peer", "compiled score_mod"),
    ]


#: This module's cases, in the order ``posenc bench`` runs them.
CASES = (
    Case(
        "attention-bias",
        "Attention with a positional bias (float32, forward), against SDPA with none; "
        "peak MiB is what one call adds.",
        build=impls,
        full={"batch": 1, "heads": 8, "seq": 8192, "head_dim": 64},
        quick={"batch": 1, "heads": 8, "seq": 2048, "head_dim": 64},
        quick_repeat=3,
        memory=True,
    ),
)
