"""``apply_rotary(backend=...)``: which backend runs, what each refuses, and what
``torch.compile`` sees.

Every backend rounds the same float32 products once (no fused multiply-add): the C
kernel, the Triton kernel and the unfused torch formula agree bit for bit on float32
(tests/test_rotary.py and tests/test_triton_rotary.py check the kernels themselves).
"""

from __future__ import annotations

import pytest
import torch

import posenc
from conftest import missing_anchor
from posenc.families.rotary import apply as apply_module
from posenc.families.rotary.apply import apply_rotary


def _tables(seq: int, rotary_dim: int, layout: str = "half"):
    return posenc.Rotary(rotary_dim, layout=layout).cos_sin(torch.arange(seq) + 40)


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_kernel_and_torch_backends_agree_bit_for_bit_in_float32(layout):
    # torch's in-place path fuses one multiply-add (addcmul); its out-of-place formula
    # does not, and neither does the kernel: compare with the formula
    x = torch.randn(2, 3, 17, 32, generator=torch.Generator().manual_seed(0)) * 30
    c, s = _tables(17, 32, layout)
    kernel = apply_rotary(x, c, s, layout=layout, backend="kernel")
    formula = apply_module._rotate_functional(
        x, *apply_module._angles(c, s, layout, x.dtype), 32, layout
    )
    assert torch.equal(kernel, formula)
    torch_ops = apply_rotary(x, c, s, layout=layout, backend="torch")
    # the in-place path's one fused multiply-add: within 6 U max|x| (tests/test_rotary.py)
    assert (torch_ops - kernel).abs().max() <= 12 * 2.0**-24 * float(x.abs().max())


@pytest.mark.usefixtures("compiled_kernels")
def test_auto_takes_the_kernel_on_cpu(monkeypatch):
    calls = []
    real = apply_module._rotate_kernel
    monkeypatch.setattr(apply_module, "_rotate_kernel", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(1, 2, 5, 16)
    c, s = _tables(5, 16)
    apply_rotary(x, c, s)
    apply_rotary(x, c, s, backend="torch")
    assert calls == [1]


def test_auto_takes_triton_on_cuda_where_it_imports(monkeypatch):
    # device-agnostic decision, checked without a GPU: a CUDA tensor's metadata
    x = torch.empty(1, 2, 5, 16, device="meta")
    monkeypatch.setattr(apply_module, "triton_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: torch.device("cuda")))
    assert apply_module._resolve_backend("auto", [x]) == "triton"
    monkeypatch.setattr(apply_module, "triton_available", lambda: False)
    assert apply_module._resolve_backend("auto", [x]) == "torch"
    monkeypatch.setattr(apply_module, "triton_available", lambda: True)
    # float64 and five leading dims are not the kernel's: torch ops
    assert apply_module._resolve_backend("auto", [x.double()]) == "torch"
    assert apply_module._resolve_backend("auto", [x[None, None]]) == "torch"


@pytest.mark.parametrize(
    ("x", "backend", "words"),
    [
        (torch.randn(1, 4, 8), "cuda", "backend must be one of"),
        (torch.randn(1, 4, 8).double(), "kernel", "backend='kernel' rotates CPU float32"),
        (torch.randn(1, 4, 8).half(), "kernel", "backend='kernel' rotates CPU float32"),
        (torch.randn(1, 4, 16)[..., ::2], "kernel", "unit stride"),
        (torch.randn(1, 4, 8).double(), "triton", "backend='triton'"),
    ],
)
def test_backends_refuse_what_they_cannot_rotate(monkeypatch, request, x, backend, words):
    if backend == "kernel":  # without the build it refuses everything, saying so
        request.getfixturevalue("compiled_kernels")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    c, s = _tables(4, 8)
    with pytest.raises(ValueError, match=words):
        apply_rotary(x, c, s, backend=backend)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(apply_module, "triton_available", lambda: True)
    c, s = _tables(4, 8)
    with pytest.raises(ValueError, match=r"backend='triton'.*TRITON_INTERPRET=1"):
        apply_rotary(torch.randn(1, 4, 8), c, s, backend="triton")
    monkeypatch.setattr(apply_module, "triton_available", lambda: False)
    with pytest.raises(ValueError, match=r"backend='triton' needs the triton package"):
        apply_rotary(torch.randn(1, 4, 8), c, s, backend="triton")


def test_kernel_backend_without_the_build_says_so(monkeypatch):
    monkeypatch.setattr(apply_module, "compiled", None)
    c, s = _tables(4, 8)
    with pytest.raises(ValueError, match="backend='kernel' needs posenc's compiled kernel"):
        apply_rotary(torch.randn(1, 4, 8), c, s, backend="kernel")
    # auto goes on in torch's ops
    assert apply_rotary(torch.randn(1, 4, 8), c, s).shape == (1, 4, 8)


def test_gradients_only_for_inputs_that_want_them():
    # q and k rotated together: a k that needs no gradient gets none, and an unused
    # output costs no rotation of zeros
    rope = posenc.Rotary(16)
    q = torch.randn(1, 2, 5, 16, requires_grad=True)
    k = torch.randn(1, 1, 5, 16)
    oq, ok = rope(q, k)
    assert oq.requires_grad and not ok.requires_grad
    (g,) = torch.autograd.grad(oq.sum(), q)
    c, s = rope.cos_sin(torch.arange(5))
    want = apply_rotary(torch.ones_like(q), c, -s)
    assert torch.equal(g, want)
    k.requires_grad_(True)
    oq, ok = rope(q, k)
    gq, gk = torch.autograd.grad(ok.sum(), (q, k), allow_unused=True)
    assert gq is None and torch.equal(gk, apply_rotary(torch.ones_like(k), c, -s))


@pytest.mark.usefixtures("compiled_kernels")  # the reference: the kernel's bits
@pytest.mark.parametrize("backend", ["auto", "kernel", "triton", "torch"])
def test_compile_traces_the_formula_for_every_backend(backend):
    # the documented choice: inside torch.compile every backend is the out-of-place
    # formula, one graph with no break and no opaque op, which inductor fuses
    from torch._dynamo.testing import CompileCounterWithBackend

    c, s = _tables(6, 16)
    x = torch.randn(2, 6, 16)
    counter = CompileCounterWithBackend("eager")
    graphs = []

    def keep(gm, inputs):
        graphs.append(gm)
        return counter(gm, inputs)

    torch._dynamo.reset()
    fn = torch.compile(
        lambda t: apply_rotary(t, c, s, backend=backend), backend=keep, fullgraph=True
    )
    got = fn(x)
    assert counter.frame_count == 1
    targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert not any("posenc" in t for t in targets), targets
    assert torch.equal(got, apply_rotary(x, c, s, backend="kernel"))
    torch._dynamo.reset()


# ------------------------------------------------------------------ Triton, interpreted


@pytest.fixture
def interpreted(monkeypatch):
    """Triton's interpreter on CPU tensors, for one test (the kernel is wrapped per mode)."""
    if not apply_module.triton_available():
        missing_anchor("triton", "does not import: the fused rotary kernel cannot run")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.usefixtures("interpreted", "compiled_kernels")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_triton_backend_equals_the_kernel_forward_and_backward(layout):
    # both round the float32 formula's products and sum once: the same bits in float32;
    # q and k (GQA head counts, partial rotary) in one launch, and their gradients
    gen = torch.Generator().manual_seed(2)
    rope = posenc.Rotary(32, rotary_dim=24, layout=layout)
    c, s = rope.cos_sin(torch.arange(300, 309))
    q = torch.randn(2, 4, 9, 32, generator=gen).requires_grad_(True)
    k = torch.randn(2, 2, 9, 32, generator=gen).requires_grad_(True)
    g = (torch.randn(q.shape, generator=gen), torch.randn(k.shape, generator=gen))
    kw = {"layout": layout, "rotary_dim": 24}
    tri = apply_module.rotate_all((q, k), c, s, backend="triton", **kw)
    ker = apply_module.rotate_all((q, k), c, s, backend="kernel", **kw)
    assert all(torch.equal(a, b) for a, b in zip(tri, ker, strict=True))
    dt = torch.autograd.grad(tri, (q, k), g)
    dk = torch.autograd.grad(ker, (q, k), g)
    assert all(torch.equal(a, b) for a, b in zip(dt, dk, strict=True))
    single = apply_rotary(q.detach(), c, s, backend="triton", **kw)
    assert torch.equal(single, ker[0])


@pytest.mark.usefixtures("interpreted")
def test_triton_backend_takes_strided_and_heads_last_inputs():
    rope = posenc.Rotary(16)
    x = torch.randn(2, 7, 3, 32)[..., ::2]  # (batch, seq, heads, head_dim), stride 2
    c, s = rope.cos_sin(torch.arange(7))
    c, s = c[:, None], s[:, None]
    got = apply_rotary(x, c, s, backend="triton")
    want = apply_module._rotate_functional(
        x, *apply_module._angles(c, s, "half", x.dtype), 16, "half"
    )
    assert torch.equal(got, want) and got.is_contiguous()
