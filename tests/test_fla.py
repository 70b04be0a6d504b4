"""posenc's Forgetting Transformer and stick-breaking attention against fla-core's references.

flash-linear-attention (fla-org, the maintainers of both methods' kernels) ships dense
torch references beside its Triton kernels: ``fla/ops/forgetting_attn/naive.py``
(``naive_forgetting_attn``) and ``fla/ops/stickbreaking_attn/naive.py``
(``naive_stickbreaking_attn``), which run on CPU tensors. Their conventions, against
posenc's:

- layout ``(batch, seq, heads, dim)``; posenc's is ``(batch, heads, seq, dim)``;
  grouped-query heads alike (query head ``h * group + g`` reads kv head ``h``);
  scale ``1 / sqrt(head_dim)`` by default in both; q_len == k_len only (no KV cache)
  and no packed documents or padding;
- FoX: ``g`` ``(batch, seq, heads)`` the log forget gates, ``c = cumsum(g)`` and
  score ``q.k * scale + c_i - c_j`` over keys ``j <= i`` (the diagonal with 0),
  exactly posenc's ``log_fgate`` (transposed). It computes in float32 whatever the
  input (``q.float()``, ``g.float().cumsum``): posenc in float64 is held to it
  within its float32 error (test_fox.fox_bounds, ``naive``: its float32 cumsum and
  softmax backward) plus posenc's float64 one, on inputs float32 holds exactly;
- stick-breaking: ``A_ij = sigmoid(z_ij) prod_{j < l < i} (1 - sigmoid(z_il))``,
  keys ``j < i`` (``attend_current``: ``j <= i``, the own key first), ``rem = prod_j
  (1 - sigmoid(z_ij))``, returned as ``(out, rem)``: posenc's. float64 inputs stay
  float64, so both are held to test_stick_breaking.grad_bounds twice (two float64
  computations of the same values).

Why not ``import fla``: with a package named ``fla`` importable, transformers routes
the linear-attention layers of several families (Qwen3-Next, OLMo-hybrid, Kimi-Linear,
GLM-5-next, ...) to fla's Triton kernels, which fail without a GPU driver, and the
family test (tests/test_hf_families.py) would no longer see transformers' torch code.
So ``make test`` installs fla-core (pinned in constraints-dev.txt) with ``--no-deps``
into ``$(VENV)/fla-core``, a directory on no import path, and this module loads the two
``naive.py`` files by path (they import only torch and einops).
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from conftest import anchor, missing_anchor

anchor("einops")  # the FoX reference's one import besides torch

import posenc  # noqa: E402
from test_fox import assert_within, fox_bounds, make  # noqa: E402
from test_stick_breaking import U32, U64, grad_bounds  # noqa: E402

#: Where ``make test`` puts fla-core (the Makefile's FLA_CORE): the venv's own folder.
FLA_CORE = Path(sys.prefix) / "fla-core"
CONSTRAINTS = Path(__file__).parents[1] / "constraints-dev.txt"


def _naive(folder: str, name: str):
    """fla-core's reference ``name`` from ``fla/ops/<folder>/naive.py``, loaded by path."""
    pinned = re.search(r"^fla-core==(\S+)$", CONSTRAINTS.read_text(encoding="utf-8"), re.M)
    assert pinned, "constraints-dev.txt pins no fla-core"
    installed = sorted(p.name for p in FLA_CORE.glob("fla_core-*.dist-info"))
    path = FLA_CORE / "fla" / "ops" / folder / "naive.py"
    if installed != [f"fla_core-{pinned.group(1)}.dist-info"] or not path.is_file():
        missing_anchor("fla-core", f"{pinned.group(1)} is not in {FLA_CORE} (found {installed})")
    spec = importlib.util.spec_from_file_location(f"fla_core_naive_{folder}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.fixture(scope="module")
def naive_fox():
    return _naive("forgetting_attn", "naive_forgetting_attn")


@pytest.fixture(scope="module")
def naive_sb():
    return _naive("stickbreaking_attn", "naive_stickbreaking_attn")


def seq_first(t):
    """(batch, heads, seq, ...) <-> (batch, seq, heads, ...)."""
    return t.transpose(1, 2)


# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim)
FOX_SHAPES = {
    "one": (2, 2, 2, 1, 1, 16, 16),
    "gqa-70": (2, 4, 2, 70, 70, 16, 32),
    "mha-130": (1, 2, 2, 130, 130, 32, 16),
}


@pytest.mark.parametrize("shape", FOX_SHAPES.values(), ids=FOX_SHAPES.keys())
def test_fox_is_the_references(shape, naive_fox):
    # float32 draws, so that the reference's q.float() and g.float() change nothing
    q, k, v, dout, lf = (t.double() for t in make(shape, seed=21))
    ours = [t.clone().requires_grad_() for t in (q, k, v, lf)]
    out = posenc.attention(*ours[:3], causal=True, log_fgate=ours[3])
    grads = torch.autograd.grad(out, ours, dout)
    theirs = [seq_first(t).clone().requires_grad_() for t in (q, k, v, lf)]
    ref = naive_fox(*theirs)
    assert ref.dtype == torch.float32  # float32 whatever the input
    ref_grads = torch.autograd.grad(ref, theirs, seq_first(dout).float())
    got = [seq_first(ref)] + [seq_first(g) for g in ref_grads]
    scale = shape[5] ** -0.5
    bounds = [
        a + b
        for a, b in zip(
            fox_bounds(q, k, v, dout, lf, scale=scale, naive=True),
            fox_bounds(q, k, v, dout, lf, scale=scale, u=U64),
            strict=True,
        )
    ]
    assert_within(got, [out, *grads], bounds)


# (batch, heads, kv_heads, length, head_dim, v_dim), and posenc's block of keys
SB_CASES = {
    "mha": {"shape": (2, 3, 3, 37, 8, 5), "block_size": 5},
    "gqa-current": {"shape": (1, 4, 2, 40, 16, 8), "block_size": 16, "attend_current": True},
    "one": {"shape": (1, 2, 1, 1, 4, 3), "attend_current": True},
    "large-z": {"shape": (1, 2, 2, 24, 8, 4), "block_size": 7, "scale": 4.0},  # |z| in the tens
    # float32, dims multiples of 16: posenc's compiled loop, past a block of 64 queries
    # and keys; held to the float32 bound plus the reference's float64 one
    "loop-gqa": {"shape": (1, 4, 2, 70, 16, 16), "dtype": torch.float32},
}


@pytest.mark.parametrize("case", SB_CASES.values(), ids=SB_CASES.keys())
def test_stick_breaking_is_the_references(case, naive_sb):
    b, h, hk, length, d, dv = case["shape"]
    current, scale = case.get("attend_current", False), case.get("scale")
    gen = torch.Generator().manual_seed(22)
    dtype = case.get("dtype", torch.float64)
    q, k, v, dout = (
        torch.randn(size, generator=gen, dtype=dtype).double()  # exact in dtype
        for size in ((b, h, length, d), (b, hk, length, d), (b, hk, length, dv), (b, h, length, dv))
    )
    drem = torch.randn(b, h, length, generator=gen, dtype=dtype).double()
    ours = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out, rem = posenc.stick_breaking_attention(
        *ours, attend_current=current, scale=scale, block_size=case.get("block_size")
    )
    grads = torch.autograd.grad((out, rem), ours, (dout, drem))
    theirs = [seq_first(t).clone().requires_grad_() for t in (q, k, v)]
    ref_out, ref_rem = naive_sb(*theirs, scale=scale, attend_current=current)
    assert ref_out.dtype == ref_rem.dtype == torch.float64
    ref_grads = torch.autograd.grad((ref_out, ref_rem), theirs, (seq_first(dout), seq_first(drem)))
    got = [seq_first(ref_out), seq_first(ref_rem)] + [seq_first(g) for g in ref_grads]
    # two computations, each within its bound of the exact value
    mine, theirs_bound = (
        grad_bounds(q, k, v, dout, drem, attend_current=current, scale=scale, u=u)
        for u in (U32 if dtype == torch.float32 else U64, U64)
    )
    names = ("out", "rem", "dq", "dk", "dv")
    for name, a, want, b1, b2 in zip(
        names, got, (out, rem, *grads), mine, theirs_bound, strict=True
    ):
        err = (a.detach() - want.detach().double()).abs()
        worst = float((err / (b1 + b2)).nan_to_num(nan=0.0, posinf=math.inf).max())
        assert (err <= b1 + b2).all(), f"{name}: {worst:.3g}"
