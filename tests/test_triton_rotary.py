"""The fused Triton rotation, posenc.core.triton_rotary, run by Triton's interpreter.

References: the eager float32 formula ``_rotate_functional`` of
posenc.families.rotary.apply (bit for bit), a float64 rotation as the truth.

Triton reads ``TRITON_INTERPRET`` when ``triton.jit`` wraps a function, not when
triton is imported, and the module wraps its kernel on first use once per mode.
So a module-scoped fixture sets the variable for these tests only: set at
import, it would stay set for every module collected with this one, and on a
GPU machine their compiled kernels (torch.compile's included) would be
interpreted instead.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import missing_anchor
from gpu_markers import no_cuda
from posenc.core import triton_rotary
from posenc.families.rotary.apply import _rotate_functional

if not triton_rotary.available():
    missing_anchor("triton", "does not import: the fused rotary kernel cannot run")

LAYOUTS = ("half", "interleaved")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
F32_EPS = 2.0**-24  # unit roundoff of float32


@pytest.fixture(autouse=True, scope="module")
def interpreter() -> Iterator[None]:
    # for this module's tests only (see the module docstring); a test may still delete it
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        yield


def angles(lead: tuple[int, ...], half: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin, one per pair, ``(*lead, half)``: several turns of both signs."""
    g = torch.Generator().manual_seed(seed)
    theta = (torch.rand(*lead, half, generator=g, dtype=torch.float64) - 0.5) * 40
    return theta.cos().float(), theta.sin().float()


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def whole(t: torch.Tensor, layout: str) -> torch.Tensor:
    """One value per pair -> each value twice, in ``layout`` order (as the eager path takes cos)."""
    return torch.cat([t, t], -1) if layout == "half" else t.repeat_interleave(2, -1)


def eager(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, layout: str, sign=1.0
) -> torch.Tensor:
    """The eager formula (float32, rounded once to ``x``'s dtype); ``sin * -1`` is exact."""
    return _rotate_functional(x, whole(cos, layout), sin * sign, rotary_dim, layout)


def truncated(y: torch.Tensor) -> torch.Tensor:
    """float32 ``y`` rounded toward zero to bfloat16: its top 16 bits."""
    return (y.view(torch.int32) & -(2**16)).view(torch.float32).to(torch.bfloat16)


def bf16_spacing(v: torch.Tensor) -> torch.Tensor:
    """The gap between bfloat16 numbers at ``|v|``: 2**(e - 8) for |v| in [2**(e-1), 2**e)
    (8 significant bits), never below the subnormal gap 2**-133."""
    _, e = torch.frexp(v.float())
    return torch.ldexp(torch.ones_like(v, dtype=torch.float32), e - 8).clamp_min(2.0**-133)


def check(
    got: torch.Tensor,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary_dim: int,
    layout: str,
    sign: float = 1.0,
) -> None:
    """``got`` is the eager formula's result: bit for bit, but for the interpreter's bfloat16."""
    assert got.shape == x.shape and got.dtype == x.dtype and got.is_contiguous()
    assert got.data_ptr() != x.data_ptr()
    want = eager(x, cos, sin, rotary_dim, layout, sign)
    if x.dtype != torch.bfloat16 or os.environ.get("TRITON_INTERPRET") != "1":
        assert torch.equal(got, want)
        return
    # The interpreter rounds float32 to bfloat16 toward zero, torch to nearest even.
    # Both pick one of the two bfloat16 neighbours of the float32 result y, so got is
    # rne(y) or trunc(y); they differ by at most the gap at |rne(y)| (one ulp; just
    # below a power of two, truncation is half a gap of the larger binade away).
    y = eager(x.float(), cos, sin, rotary_dim, layout, sign)
    assert bool(((got == want) | (got == truncated(y))).all())
    assert bool(((got.float() - want.float()).abs() <= bf16_spacing(want)).all())
    # the pass-through channels are copies, exact in any dtype
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])


def truth(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, layout: str):
    """The rotation in float64 of the float32 inputs, and the sum |x1 c| + |x2 s| per channel."""
    xd, c, s = x.double(), cos.double(), sin.double()
    if layout == "half":
        x1, x2 = xd[..., : rotary_dim // 2], xd[..., rotary_dim // 2 : rotary_dim]
    else:
        x1, x2 = xd[..., 0:rotary_dim:2], xd[..., 1:rotary_dim:2]
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    scale1, scale2 = (x1 * c).abs() + (x2 * s).abs(), (x2 * c).abs() + (x1 * s).abs()
    if layout == "half":
        return torch.cat([y1, y2], -1), torch.cat([scale1, scale2], -1)
    return torch.stack([y1, y2], -1).flatten(-2), torch.stack([scale1, scale2], -1).flatten(-2)


# --------------------------------------------------------------------------------------
# the rotation


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_grouped_query_attention_matches_eager(layout, dtype, sign):
    # q and k with different head counts, in one launch; cos and sin shared (seq, r/2)
    q = randn(2, 4, 3, 16, dtype=dtype, seed=1)
    k = randn(2, 2, 3, 16, dtype=dtype, seed=2)
    cos, sin = angles((3,), 8, seed=3)
    got_q, got_k = triton_rotary.rotate([q, k], cos, sin, rotary_dim=16, layout=layout, sign=sign)
    check(got_q, q, cos, sin, 16, layout, sign)
    check(got_k, k, cos, sin, 16, layout, sign)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_within_rounding_of_float64_truth(layout):
    # y1 = fl(fl(x1 c) - fl(x2 s)): each product is off by at most u |product| and the
    # difference adds u |y1| <= u (1 + u)(|x1 c| + |x2 s|), so |y1 - truth| <= (2u + u^2)
    # (|x1 c| + |x2 s|). In float64 the products of float32 numbers are exact; the
    # truth's difference and the scale are each rounded once, 2^-53 apiece: 2^-52 in all.
    x = randn(3, 5, 2, 24, seed=4) * 100
    cos, sin = angles((5, 1), 12, seed=5)
    (got,) = triton_rotary.rotate([x], cos, sin, rotary_dim=24, layout=layout)
    want, scale = truth(x, cos, sin, 24, layout)
    bound = (2 * F32_EPS + F32_EPS**2 + 2.0**-52) * scale
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_minus_sign_inverts(layout):
    # Forth: y = R x + e1 with |e1| <= (2u + u^2)(|x1| + |x2|) per channel (the bound
    # above, |c|, |s| <= 1). Back: z = R^T y + e2 = (c^2 + s^2) x + R^T e1 + e2, where
    # |c^2 + s^2 - 1| <= 2u + u^2 (c, s each rounded once), |R^T e1| <= (|c| + |s|) max|e1|
    # <= sqrt(2) (2u + u^2)(|x1| + |x2|), and |e2| <= (2u + u^2)(|y1| + |y2|) with
    # |y1| + |y2| <= sqrt(2)(1 + 2u)(|x1| + |x2|). In all, below (2 + 4 sqrt(2)) u + O(u^2)
    # < 8u times |x1| + |x2|.
    x = randn(2, 3, 7, 32, seed=6)
    cos, sin = angles((7,), 16, seed=7)
    (y,) = triton_rotary.rotate([x], cos, sin, rotary_dim=32, layout=layout)
    (z,) = triton_rotary.rotate([y], cos, sin, rotary_dim=32, layout=layout, sign=-1.0)
    if layout == "half":
        x1, x2 = x[..., :16], x[..., 16:]
        pair = torch.cat([x1.abs() + x2.abs()] * 2, -1)
    else:
        pair = (x[..., 0::2].abs() + x[..., 1::2].abs()).repeat_interleave(2, -1)
    assert bool(((z.double() - x.double()).abs() <= 8 * F32_EPS * pair.double()).all())
    assert not torch.equal(y, x)  # it did rotate


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rotary_copies_the_rest(layout, dtype):
    # rotary_dim 6: 3 pairs, not a power of two; the 14 channels past it are copied in
    # chunks of 4 (the tile's pair count), the last one partial
    q = randn(2, 3, 5, 20, dtype=dtype, seed=8)
    k = randn(2, 1, 5, 20, dtype=dtype, seed=9)
    cos, sin = angles((5,), 3, seed=10)
    got_q, got_k = triton_rotary.rotate([q, k], cos, sin, rotary_dim=6, layout=layout)
    for got, x in ((got_q, q), (got_k, k)):
        assert torch.equal(got[..., 6:], x[..., 6:])
        check(got, x, cos, sin, 6, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_pair(layout):
    # rotary_dim 2: one pair per row, 512 rows per tile
    x = randn(3, 700, 4, seed=11)
    cos, sin = angles((700,), 1, seed=12)
    (got,) = triton_rotary.rotate([x], cos, sin, rotary_dim=2, layout=layout)
    check(got, x, cos, sin, 2, layout)


# (x shape, cos leading shape): the layouts callers rotate
SHAPES = {
    "per-batch": ((2, 3, 5, 8), (2, 1, 5)),
    "seq-dim-3": ((2, 5, 3, 8), (5, 1)),
    "packed": ((9, 3, 8), (9, 1)),
    "rows": ((9, 8), (9,)),
    "four-leading": ((2, 3, 2, 4, 8), (3, 1, 4)),
    "one-angle": ((2, 3, 4, 8), ()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", SHAPES)
def test_cos_broadcast_shapes(case, layout, dtype):
    shape, lead = SHAPES[case]
    x = randn(*shape, dtype=dtype, seed=13)
    cos, sin = angles(lead, 4, seed=14)
    (got,) = triton_rotary.rotate([x], cos, sin, rotary_dim=8, layout=layout)
    check(got, x, cos, sin, 8, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_contiguous_inputs(layout):
    # x: a transposed (b, s, h, d) -> (b, h, s, d) view; k: every other channel of a
    # wider tensor (channel stride 2, odd storage offset); cos: every other channel of
    # an interleaved table (as callers slice it), sin: a transposed (r/2, s) table
    # expanded over the batch (stride 0)
    q = randn(2, 5, 3, 12, seed=15).transpose(1, 2)
    k = randn(2, 1, 5, 25, seed=16)[..., 1:25:2]
    cos_pair, sin_pair = angles((5,), 6, seed=17)
    cos = cos_pair.repeat_interleave(2, -1)[..., 0::2]
    sin = sin_pair.T.contiguous().T.expand(2, 1, 5, 6)
    assert not q.is_contiguous() and k.stride(-1) == 2 and cos.stride(-1) == 2
    assert sin.stride(0) == 0 and sin.stride(-1) == 5
    got_q, got_k = triton_rotary.rotate([q, k], cos, sin, rotary_dim=12, layout=layout)
    check(got_q, q, cos, sin, 12, layout)
    check(got_k, k, cos, sin, 12, layout)


def test_mixed_dtypes_and_head_dims():
    # each tensor is rotated in its own dtype, one launch (the kernel is unrolled per tensor)
    q = randn(2, 4, 3, 16, dtype=torch.bfloat16, seed=18)
    k = randn(2, 2, 3, 20, dtype=torch.float32, seed=19)
    cos, sin = angles((3,), 8, seed=20)
    got_q, got_k = triton_rotary.rotate([q, k], cos, sin, rotary_dim=16, layout="half")
    check(got_q, q, cos, sin, 16, "half")
    check(got_k, k, cos, sin, 16, "half")


def test_empty_inputs():
    cos, sin = angles((3,), 8, seed=21)
    q = randn(0, 4, 3, 16, seed=22)
    (got,) = triton_rotary.rotate([q], cos, sin, rotary_dim=16, layout="half")
    assert got.shape == q.shape and got.dtype == q.dtype
    k = randn(2, 2, 3, 16, seed=23)
    got_q, got_k = triton_rotary.rotate((q, k), cos, sin, rotary_dim=16, layout="interleaved")
    assert got_q.shape == q.shape
    check(got_k, k, cos, sin, 16, "interleaved")


def offsets_past_2_31() -> None:
    """Rotate rows and pairs that sit past 2**31 elements (run by the test below)."""
    # x's rows sit at element offsets 0, 2**30 + 64 and 2**31 + 128 of one storage: the
    # row stride fits in int32, its products do not, so an int32 offset anywhere wraps.
    # torch.empty only reserves the 6 GiB; the pages of the elements written are all
    # that is ever touched.
    flat = torch.empty(3 * 2**30 + 16, dtype=torch.bfloat16)
    stride = 2**30 + 64
    x = flat.as_strided((3, 16), (stride, 1))
    x.copy_(randn(3, 16, dtype=torch.bfloat16, seed=24))
    cos, sin = angles((3,), 8, seed=25)
    (got,) = triton_rotary.rotate([x], cos, sin, rotary_dim=16, layout="half")
    check(got, x.clone(), cos, sin, 16, "half")
    # a channel stride in int32 whose products are not: the partners of the pairs
    # (channels 2 and 3) at 2**31 and 3 * 2**30
    y = flat.as_strided((1, 4), (1, 2**30))
    y.copy_(randn(1, 4, dtype=torch.bfloat16, seed=26))
    cos1, sin1 = angles((1,), 2, seed=27)
    (got,) = triton_rotary.rotate([y], cos1, sin1, rotary_dim=4, layout="half")
    check(got, y.clone(), cos1, sin1, 4, "half")


def test_offsets_past_2_31_elements():
    # In a child process: an offset that wraps in int32 reads or writes outside the
    # storage, which ends the process with SIGSEGV rather than a failed assert.
    folder, name = os.path.split(os.path.splitext(os.path.abspath(__file__))[0])
    code = f"import sys; sys.path.insert(0, {folder!r}); import {name}; {name}.offsets_past_2_31()"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (
        f"the child exited with {done.returncode} (negative: killed by that signal)\n"
        f"{done.stderr[-3000:]}"
    )


@settings(max_examples=100, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    dtype=st.sampled_from(DTYPES),
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    pairs=st.integers(1, 9),
    extra=st.integers(0, 5),
    cos_dims=st.integers(0, 4),
    broadcast=st.lists(st.booleans(), min_size=4, max_size=4),
    sign=st.sampled_from([1.0, -1.0]),
    seed=st.integers(0, 2**16),
)
def test_matches_eager_anywhere(layout, dtype, lead, pairs, extra, cos_dims, broadcast, sign, seed):
    # any leading shape, rotary_dim and tail; cos and sin hold x's last cos_dims leading
    # dims (or all), each of size 1 where broadcast says
    rotary_dim = 2 * pairs
    x = randn(*lead, rotary_dim + extra, dtype=dtype, seed=seed)
    dims = lead[len(lead) - min(cos_dims, len(lead)) :]
    cos_lead = tuple(1 if b else n for n, b in zip(dims, broadcast, strict=False))
    cos, sin = angles(cos_lead, pairs, seed=seed + 1)
    (got,) = triton_rotary.rotate([x], cos, sin, rotary_dim=rotary_dim, layout=layout, sign=sign)
    check(got, x, cos, sin, rotary_dim, layout, sign)


# --------------------------------------------------------------------------------------
# refusals


def _call(**override):
    args = {
        "xs": [randn(2, 3, 8)],
        "cos": torch.ones(3, 4),
        "sin": torch.zeros(3, 4),
        "rotary_dim": 8,
        "layout": "half",
    }
    args.update(override)
    xs, cos, sin = args.pop("xs"), args.pop("cos"), args.pop("sin")
    return triton_rotary.rotate(xs, cos, sin, **args)


@pytest.mark.parametrize(
    ("override", "error", "match"),
    [
        ({"xs": randn(2, 3, 8)}, TypeError, "xs must be a sequence"),
        ({"xs": []}, ValueError, "xs must hold 1 or 2"),
        ({"xs": [randn(3, 8)] * 3}, ValueError, "xs must hold 1 or 2"),
        ({"xs": [[1.0]]}, TypeError, r"xs\[0\] must be a torch tensor"),
        ({"xs": [randn(3, 8).double()]}, TypeError, r"xs\[0\] must be float32"),
        ({"xs": [torch.ones(3, 8, dtype=torch.int32)]}, TypeError, r"xs\[0\] must be float32"),
        ({"xs": [randn(8)]}, ValueError, r"xs\[0\] must be \(\.\.\., head_dim\)"),
        ({"xs": [randn(1, 1, 1, 1, 3, 8)]}, ValueError, r"xs\[0\] must be \(\.\.\., head_dim\)"),
        ({"xs": [randn(3, 8), torch.ones(3, 8, device="meta")]}, ValueError, "xs must share"),
        ({"rotary_dim": 8.0}, TypeError, "rotary_dim must be an int"),
        ({"rotary_dim": True}, TypeError, "rotary_dim must be an int"),
        ({"rotary_dim": 7}, ValueError, "rotary_dim must be even"),
        ({"rotary_dim": 0}, ValueError, "rotary_dim must be even"),
        ({"rotary_dim": 10}, ValueError, r"rotary_dim .* at most head_dim \(8\)"),
        ({"layout": "neox"}, ValueError, "layout must be one of"),
        ({"sign": 0.5}, ValueError, "sign must be 1.0"),
        ({"sign": True}, ValueError, "sign must be 1.0"),
        ({"cos": torch.ones(3, 4).double()}, TypeError, "cos must be a float32 tensor"),
        ({"cos": [1.0]}, TypeError, "cos must be a float32 tensor"),
        ({"sin": torch.zeros(3, 4).half()}, TypeError, "sin must be a float32 tensor"),
        ({"cos": torch.ones(3, 4, device="meta")}, ValueError, "cos must be on xs' device"),
        ({"cos": torch.ones(3, 8)}, ValueError, "cos must hold one value per pair"),
        ({"sin": torch.ones(3, 2)}, ValueError, "sin must hold one value per pair"),
        ({"cos": torch.tensor(1.0)}, ValueError, "cos must hold one value per pair"),
        ({"cos": torch.ones(4, 4)}, ValueError, "cos of shape .* does not broadcast"),
        ({"sin": torch.ones(1, 1, 3, 4)}, ValueError, "sin of shape .* does not broadcast"),
    ],
)
def test_refusals_name_the_parameter(override, error, match):
    with pytest.raises(error, match=match):
        _call(**override)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="runs only under TRITON_INTERPRET=1"):
        _call()


def test_one_kernel_per_mode(monkeypatch):
    # triton.jit decides interpreted or compiled when it wraps: each mode keeps its own
    triton = triton_rotary._triton()
    interpreted = triton_rotary._kernel(triton)
    monkeypatch.delenv("TRITON_INTERPRET")
    compiled = triton_rotary._kernel(triton)
    assert isinstance(compiled, triton.runtime.JITFunction)
    assert not isinstance(interpreted, triton.runtime.JITFunction)
    assert triton_rotary._kernel(triton) is compiled


def test_without_triton(monkeypatch):
    # a fresh copy of the module, imported where triton cannot be
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.find_spec("posenc.core.triton_rotary")
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.available() is False
    with pytest.raises(ImportError, match="needs triton"):
        fresh.rotate(
            [randn(3, 8)], torch.ones(3, 4), torch.zeros(3, 4), rotary_dim=8, layout="half"
        )


# --------------------------------------------------------------------------------------
# the compiled kernel


def _signature(names, args, kwargs, mangle_type):
    """The compiler's signature and constants for a launch, as Triton's launcher makes them."""
    signature, constants = {}, {}

    def types(value, path):
        if isinstance(value, tuple):
            return tuple(types(v, (*path, i)) for i, v in enumerate(value))
        kind = mangle_type(value, True)
        if kind == "constexpr":  # Triton folds ints equal to 1 into the kernel
            constants[path] = value
        return kind

    for i, (name, value) in enumerate(zip(names, args, strict=False)):
        signature[name] = types(value, (i,))
    for name in names[len(args) :]:
        signature[name], constants[name] = "constexpr", kwargs[name]
    return signature, constants


def test_compiles_for_gpus_without_fused_multiply_add(monkeypatch):
    # The interpreter runs the kernel as Python; this puts it through Triton's compiler
    # (no GPU needed) with the arguments rotate() launches, for Ampere and Hopper, and
    # checks the PTX multiplies and adds apart, as torch's eager ops round them.
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    triton = triton_rotary._triton()
    build = triton_rotary._kernel
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((args, kwargs))

    monkeypatch.setattr(triton_rotary, "_kernel", lambda triton: Recorder())
    cos, sin = angles((3,), 6, seed=28)
    for layout in LAYOUTS:
        q = randn(2, 4, 3, 16, dtype=torch.bfloat16)
        k = randn(2, 2, 3, 16)
        triton_rotary.rotate([q, k], cos, sin, rotary_dim=12, layout=layout)
    monkeypatch.delenv("TRITON_INTERPRET")
    kernel = build(triton)
    for (args, kwargs), arch in zip(launches, (80, 90), strict=True):
        signature, constants = _signature(kernel.arg_names, args, kwargs, mangle_type)
        options = {k: v for k, v in kwargs.items() if k not in kernel.arg_names}
        source = ASTSource(kernel, signature, constants)
        ptx = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options).asm["ptx"]
        assert "mul.rn.f32" in ptx and "fma" not in ptx


ON_GPU = [pytest.mark.gpu, no_cuda("no CUDA device: the compiled kernel runs only on a GPU")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_GPU)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bit_for_bit(monkeypatch, layout, dtype, device):
    """Both signs, q and k of different head counts in one launch, partial rotary.

    On CUDA compiled (not interpreted), bit for bit in every dtype: bfloat16 rounds to
    nearest even as torch does; that rounding is what stays GPU-only. The CPU variant
    runs the same calls interpreted (smaller), where check() allows the interpreter's
    bfloat16 truncation.
    """
    seq = 5
    if device == "cuda":
        monkeypatch.delenv("TRITON_INTERPRET")
        seq = 33
    q = randn(2, 8, seq, 128, dtype=dtype, seed=29).to(device)
    k = randn(2, 2, seq, 128, dtype=dtype, seed=30).to(device)
    cos, sin = (t.to(device) for t in angles((seq,), 32, seed=31))
    for sign in (1.0, -1.0):
        got_q, got_k = triton_rotary.rotate(
            [q, k], cos, sin, rotary_dim=64, layout=layout, sign=sign
        )
        check(got_q, q, cos, sin, 64, layout, sign)
        check(got_k, k, cos, sin, 64, layout, sign)
