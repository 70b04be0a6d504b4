"""The ``attention-bias*`` cases: attention with a positional bias, against attention with none.

``attention-bias`` times the forward: posenc's :func:`~posenc.attention` with no
bias, ALiBi, T5 and KERPLE, against SDPA without a bias (the baseline),
x-transformers' dense ALiBi bias handed to SDPA as a mask, and FlexAttention
with ALiBi in a compiled score mod.

``attention-bias-train`` times one causal training step, forward and backward
into q, k, v and the bias module's parameters: posenc with no bias, ALiBi, T5,
FIRE and the Forgetting Transformer's gates (``log_fgate``), against SDPA's causal
forward and backward (the baseline) and the same two peers with the causal mask
added.

``attention-context-train`` times the same training step for the methods whose
scores depend on the context, not on positions alone: stick-breaking attention,
PaTH and PaTH-FoX, CoPE and DAPE (over ALiBi), with FoX beside them, against SDPA
causal. Their papers' code is GPU-only or dense; on CPU posenc runs each in a
compiled loop of its own (float32).

The cases also measure each row's peak memory.

On CUDA (``posenc bench --device cuda``) both cases are causal and bfloat16, at
``(1, 16, 8192, 128)``: a long-context training shape where attention, not the
copy, is the cost (:func:`cuda_impls`). Their first row is the memory-bound
baseline the harness asks for, a copy of the output's size, and SDPA's causal
flash kernel is the case's *reference* row: the ``x ref`` column is each row's
ratio to it, the one that says what a bias costs. The peers are FlexAttention
with a hand-written ALiBi ``score_mod`` and a causal block mask made once, and
x-transformers' dense ALiBi bias (a ``(heads, seq, seq)`` float32 tensor, 4 GiB
at 8192, plus its masked copy: where that exhausts the GPU's memory the row is
an error, with torch's message).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import posenc
from posenc.faces.bench.harness import Case, Impl


def impls(batch: int, heads: int, seq: int, head_dim: int, *, device: str = "cpu") -> list[Impl]:
    """Forward attention over ``(batch, heads, seq, head_dim)`` float32 q, k, v.

    The baseline is SDPA with no bias and no mask (torch's CPU flash kernel). The
    peers add the bias the way users do today: x-transformers materialises a
    ``(heads, seq, seq)`` ALiBi bias and hands it to SDPA as a float mask;
    FlexAttention (compiled) adds it in a score mod. On ``device="cuda"``:
    :func:`cuda_impls`, forward only.
    """
    if device == "cuda":
        return cuda_impls(batch, heads, seq, head_dim, backward=False)
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


def _step(
    shape: tuple[int, ...],
    device: str,
    dtype: str,
    backward: bool,
    forward: Callable[[Any, Any, Any], Any],
    params: Sequence[Any] = (),
) -> Callable[[], object]:
    """One row's call: ``forward(q, k, v)`` on seeded inputs, under ``no_grad``, or with
    ``backward`` a training step: gradients reset to None, the forward, and backward
    from a seeded upstream gradient into q, k, v and ``params``, returning them. The
    first call runs here (one-time costs out of the timed runs)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    tdtype = getattr(torch, dtype)
    q, k, v, g = (torch.randn(shape, generator=gen, device=device, dtype=tdtype) for _ in range(4))
    if backward:
        leaves = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), *params)

        def call() -> object:
            for t in leaves:
                t.grad = None  # each run stores fresh gradients, as the first one does
            forward(q, k, v).backward(g)
            return tuple(t.grad for t in leaves)

    else:

        def call() -> object:
            with torch.no_grad():
                return forward(q, k, v)

    call()
    return call


def train_impls(
    batch: int, heads: int, seq: int, head_dim: int, *, device: str = "cpu"
) -> list[Impl]:
    """One causal training step of attention over ``(batch, heads, seq, head_dim)`` float32.

    Each call resets the gradients to None, runs the forward, and backward from a
    fixed random upstream gradient into q, k, v and the bias module's
    parameters (ALiBi has none); it returns those gradients. Inputs and the
    modules' initial parameters are seeded, so every row starts from the same
    numbers. The baseline is SDPA with ``is_causal=True``. The peers are the
    forward case's, made causal: x-transformers' dense ALiBi bias with ``-inf``
    above the diagonal as SDPA's float mask, and compiled FlexAttention with
    an ALiBi score mod and a causal block mask (made once, as a training loop
    reuses it). torch 2.13 has no FlexAttention backward on CPU: that row then
    reports torch's refusal as its reason, with no time. On ``device="cuda"``:
    :func:`cuda_impls` with the backward.
    """
    if device == "cuda":
        return cuda_impls(batch, heads, seq, head_dim, backward=True)
    return causal_impls(batch, heads, seq, head_dim, backward=True)


def cuda_impls(
    batch: int, heads: int, seq: int, head_dim: int, *, backward: bool, device: str = "cuda"
) -> list[Impl]:
    """Causal bfloat16 attention on CUDA: the forward, or a training step with ``backward``.

    :func:`causal_impls` in bfloat16 (``device`` is ``"cuda"`` but for tests of these
    rows on CPU tensors).
    """
    return causal_impls(
        batch, heads, seq, head_dim, backward=backward, device=device, dtype="bfloat16",
        copy_baseline=True,
    )  # fmt: skip


def causal_impls(
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    *,
    backward: bool,
    device: str = "cpu",
    dtype: str = "float32",
    copy_baseline: bool = False,
) -> list[Impl]:
    """Causal attention rows: the forward, or a training step with ``backward``.

    q, k, v (and the upstream gradient) are drawn on ``device`` from one seed, so
    every row gets the same numbers. The forward runs under ``no_grad``; a
    training step resets the gradients to None, runs the forward and backward from
    the upstream gradient into q, k, v and the bias module's parameters, and
    returns those gradients. The bias modules keep float32 parameters, as under
    autocast. Each row's first call (loading posenc's compiled kernels,
    FlexAttention's and inductor's compilation) happens while it is built, so the
    warm-up and the run budget time the kernels.

    Rows: SDPA causal is the baseline (the CPU cases' convention), or, with
    ``copy_baseline`` (the CUDA cases), the copy baseline (``v.clone()``, the
    output's size) comes first and SDPA causal is the reference. Then posenc's
    :func:`~posenc.attention` with no bias, ALiBi, T5 and FIRE (its default ``L``
    and ``L = seq``), ``causal=True`` (FlexAttention on CUDA), and the Forgetting
    Transformer (``log_fgate``: seeded log forget gates ``(batch, heads, seq)``,
    float32, a leaf the training step differentiates too); x-transformers' dense
    bias; FlexAttention with an ALiBi ``score_mod`` and a causal block mask made
    once.
    """
    shape = (batch, heads, seq, head_dim)

    def step(
        forward: Callable[[Any, Any, Any], Any], params: Sequence[Any] = ()
    ) -> Callable[[], object]:
        return _step(shape, device, dtype, backward, forward, params)

    def module(kind: str) -> Any:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the same initial parameters in every run of the bench
            made = {
                "alibi": lambda: posenc.ALiBi(heads, symmetric=False),
                "t5": lambda: posenc.T5Bias(heads, bidirectional=False),
                "fire": lambda: posenc.FIRE(heads),
                "fire-long": lambda: posenc.FIRE(heads, init_L=seq),
            }[kind]()
        return made.to(device)

    def copy() -> Callable[[], object]:
        return step(lambda q, k, v: v.clone())

    def sdpa() -> Callable[[], object]:
        import torch.nn.functional as F

        return step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def ours(kind: str) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            bias = None if kind == "none" else module(kind)
            params = () if bias is None or not backward else tuple(bias.parameters())
            return step(lambda q, k, v: posenc.attention(q, k, v, bias=bias, causal=True), params)

        return make

    def fox() -> Callable[[], object]:
        import torch

        gen = torch.Generator(device=device).manual_seed(1)
        logits = torch.randn((batch, heads, seq), generator=gen, device=device)
        # float32 whatever q's dtype, as ForgetGate makes them
        gates = torch.nn.functional.logsigmoid(logits).requires_grad_(backward)
        params = (gates,) if backward else ()
        return step(lambda q, k, v: posenc.attention(q, k, v, causal=True, log_fgate=gates), params)

    def materialised() -> Callable[[], object]:
        import torch
        import torch.nn.functional as F
        from x_transformers.x_transformers import AlibiPositionalBias

        alibi = AlibiPositionalBias(heads=heads, total_heads=heads).to(device)

        def forward(q: Any, k: Any, v: Any) -> Any:
            alibi.bias = None  # x-transformers caches the dense bias: build it each call
            future = torch.ones((seq, seq), dtype=torch.bool, device=device).triu(1)
            mask = alibi(seq, seq).masked_fill(future, float("-inf"))  # (heads, seq, seq) fp32
            # as its Attend does; SDPA takes a float mask in the query's dtype
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))

        return step(forward)

    def flex() -> Callable[[], object]:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        slopes = torch.tensor(posenc.alibi_slopes(heads), dtype=torch.float32, device=device)

        def score_mod(score: Any, b: Any, h: Any, qi: Any, ki: Any) -> Any:
            return score - slopes[h] * (qi - ki)

        def causal(b: Any, h: Any, qi: Any, ki: Any) -> Any:
            return qi >= ki

        # made once and reused by every call, as a training loop does
        block_mask = torch.compile(create_block_mask)(causal, None, None, seq, seq, device=device)
        compiled = torch.compile(flex_attention)
        return step(lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask))

    # FIRE's bias is one of key - query for queries below its threshold L, and
    # depends on the query too from L on: with the default L, at seq > 512, posenc
    # evaluates its MLP as linear pieces per score
    fire = "init_L=512: " + ("MLP as linear pieces" if seq > 512 else "key - query")
    pass_ = "training step" if backward else "forward"
    if not copy_baseline:
        rows = [Impl("SDPA causal", sdpa, "baseline", "is_causal=True (reference)")]
    else:
        rows = [
            Impl("v.clone()", copy, "baseline", f"copy of the output's size ({pass_}, reference)"),
            Impl("SDPA causal", sdpa, "baseline", "no bias, is_causal=True: x ref", reference=True),
        ]
    return [
        *rows,
        Impl("posenc, no bias", ours("none"), "ours", "posenc.attention, causal"),
        Impl("posenc ALiBi", ours("alibi"), "ours", "causal, no parameters"),
        Impl("posenc T5", ours("t5"), "ours", "T5Bias, decoder buckets"),
        Impl("posenc FIRE", ours("fire"), "ours", fire),
        Impl("posenc FIRE, L=seq", ours("fire-long"), "ours", f"init_L={seq}: key - query"),
        Impl("posenc FoX", fox, "ours", "log_fgate: forget gates, gradients into them"),
        Impl("x-transformers ALiBi", materialised, "peer", "dense bias, causal -inf, SDPA mask"),
        Impl("flex_attention ALiBi", flex, "peer", "compiled score_mod + block mask, made once"),
    ]


def context_impls(
    batch: int, heads: int, seq: int, head_dim: int, *, device: str = "cpu"
) -> list[Impl]:
    """One causal training step of the context-reading methods, float32 on the CPU.

    As :func:`causal_impls`' training step (seeded q, k, v and upstream gradient;
    gradients into them and into every parameter a row has), against SDPA causal:
    the Forgetting Transformer (``log_fgate``, seeded log forget gates), stick-breaking
    attention (:func:`posenc.stick_breaking_attention`, the remainder given to the
    query's own value, as the lab does), PaTH and PaTH-FoX (:func:`posenc.path_attention`:
    seeded unit directions ``w``, ``beta = 2 sigmoid``, and gates, all differentiated),
    CoPE (:class:`posenc.CoPE`, 64 positions) and DAPE over ALiBi (:class:`posenc.DAPE`,
    width 32), their parameters seeded.
    """
    shape = (batch, heads, seq, head_dim)

    def step(
        forward: Callable[[Any, Any, Any], Any], params: Sequence[Any] = ()
    ) -> Callable[[], object]:
        return _step(shape, device, "float32", True, forward, params)

    def seeded(seed: int, *size: int) -> Any:
        import torch

        return torch.randn(size, generator=torch.Generator().manual_seed(seed)).to(device)

    def sdpa() -> Callable[[], object]:
        import torch.nn.functional as F

        return step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def fox() -> Callable[[], object]:
        import torch.nn.functional as F

        gates = F.logsigmoid(seeded(1, batch, heads, seq)).requires_grad_()
        return step(
            lambda q, k, v: posenc.attention(q, k, v, causal=True, log_fgate=gates), (gates,)
        )

    def stick() -> Callable[[], object]:
        def forward(q: Any, k: Any, v: Any) -> Any:
            out, rem = posenc.stick_breaking_attention(q, k, v)
            return out + rem[..., None] * v

        return step(forward)

    def path(gated: bool) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch
            import torch.nn.functional as F

            w = F.normalize(seeded(2, *shape), dim=-1).requires_grad_()
            beta = (2 * torch.sigmoid(seeded(3, batch, heads, seq))).requires_grad_()
            gates = F.logsigmoid(seeded(4, batch, heads, seq)).requires_grad_() if gated else None
            params = (w, beta) if gates is None else (w, beta, gates)
            return step(
                lambda q, k, v: posenc.path_attention(q, k, v, w, beta, log_fgate=gates), params
            )

        return make

    def seeded_module(make: Callable[[], Any]) -> Any:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the same initial parameters in every run of the bench
            return make().to(device)

    def cope() -> Callable[[], object]:
        import torch

        module = seeded_module(lambda: posenc.CoPE(head_dim, npos_max=64))
        with torch.no_grad():  # its zero initialisation would leave the positions unused
            module.pos_emb.copy_(seeded(5, *module.pos_emb.shape) * head_dim**-0.5)
        return step(
            lambda q, k, v: posenc.attention(q, k, v, cope=module, causal=True),
            tuple(module.parameters()),
        )

    def dape() -> Callable[[], object]:
        module = seeded_module(lambda: posenc.DAPE(posenc.ALiBi(heads, symmetric=False)))
        return step(
            lambda q, k, v: posenc.attention(q, k, v, bias=module, causal=True),
            tuple(module.parameters()),
        )

    return [
        Impl("SDPA causal", sdpa, "baseline", "is_causal=True (reference)"),
        Impl("posenc FoX", fox, "ours", "log_fgate: forget gates, gradients into them"),
        Impl("posenc stick-breaking", stick, "ours", "out + rem * v, attend_current=False"),
        Impl("posenc PaTH", path(False), "ours", "path_attention: w, beta, gradients into them"),
        Impl("posenc PaTH-FoX", path(True), "ours", "PaTH with forget gates (fla's scaling)"),
        Impl("posenc CoPE", cope, "ours", "CoPE(npos_max=64), gradients into pos_emb"),
        Impl("posenc DAPE", dape, "ours", "DAPE(ALiBi), width 32, gradients into the MLP"),
    ]


#: The CUDA size of both cases: 16 heads of 128 over 8192 positions, bfloat16.
CUDA_SIZE = {"batch": 1, "heads": 16, "seq": 8192, "head_dim": 128}
CUDA_QUICK = {"batch": 1, "heads": 16, "seq": 2048, "head_dim": 128}

#: This module's cases, in the order ``posenc bench`` runs them.
CASES = (
    Case(
        "attention-bias",
        "Attention with a positional bias (float32, forward), against SDPA with none; "
        "peak MiB is what one call adds. On CUDA: causal bfloat16, against a copy and SDPA.",
        build=impls,
        full={"batch": 1, "heads": 8, "seq": 8192, "head_dim": 64},
        quick={"batch": 1, "heads": 8, "seq": 2048, "head_dim": 64},
        quick_repeat=3,
        memory=True,
        devices=("cpu", "cuda"),
        cuda_full=CUDA_SIZE,
        cuda_quick=CUDA_QUICK,
    ),
    Case(
        "attention-bias-train",
        "One causal training step of attention with a positional bias (float32, forward + "
        "backward into q, k, v and the bias parameters), against SDPA's; peak MiB is what one "
        "step adds. On CUDA: bfloat16, against a copy and SDPA.",
        build=train_impls,
        full={"batch": 1, "heads": 8, "seq": 2048, "head_dim": 64},
        quick={"batch": 1, "heads": 8, "seq": 512, "head_dim": 64},
        quick_repeat=3,
        memory=True,
        devices=("cpu", "cuda"),
        cuda_full=CUDA_SIZE,
        cuda_quick=CUDA_QUICK,
    ),
    Case(
        "attention-context-train",
        "One causal training step (float32, forward + backward into q, k, v and every "
        "parameter) of the methods whose scores read the context: stick-breaking, PaTH, "
        "CoPE, DAPE, with FoX, against SDPA causal; peak MiB is what one step adds.",
        build=context_impls,
        full={"batch": 1, "heads": 8, "seq": 2048, "head_dim": 64},
        quick={"batch": 1, "heads": 8, "seq": 512, "head_dim": 64},
        quick_repeat=3,
        memory=True,
    ),
)
