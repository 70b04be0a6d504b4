"""Score terms and rotations: the two doors of posenc.attention, tried from outside.

A term written here, in a test, with only the public protocol
(``posenc.families.terms``) must get the compiled loop, the blockwise path,
FlexAttention's forward and training; a rotation of a user's class must rotate. The
engine's files must name no family's class, its entry stay small, and a process that
never compiles must not import torch's compiler.
"""

from __future__ import annotations

import ast
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import posenc
from posenc.families.bias.forget import ForgetGateTerm
from posenc.families.bias.forms import table_form
from posenc.families.rotary.rotation import RotaryTables, Rotation
from posenc.families.terms import ScoreTerm, TermContext, TermForm
from posenc.integration.attention import flex as flex_engine
from posenc.integration.attention import kernel

SRC = Path(posenc.__file__).parent
ENGINE = SRC / "integration" / "attention"
U64 = 2.0**-53


class ScaledTable(nn.Module):
    """A user's relative term: a learned multiple of a bias's table over key - query."""

    def __init__(self, base: posenc.AttentionBias, weight: float) -> None:
        super().__init__()
        self.base = base
        self.weight = nn.Parameter(torch.tensor(weight, dtype=torch.float64))

    def score_form(self, ctx: TermContext) -> TermForm:
        rel = torch.arange(-(ctx.k_len - 1), ctx.q_len)
        table = (self.weight * self.base.relative_bias(rel).double()).to(ctx.dtype)
        return table_form(table, ctx, "ScaledTable")


class Cosine(nn.Module):
    """A user's term with no table: ``a_h cos(0.3 (key - query))`` per block."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.amplitude = nn.Parameter(torch.linspace(0.5, 1.5, heads, dtype=torch.float64))

    def score_form(self, ctx: TermContext) -> TermForm:
        offset = ctx.offset

        def block(tensors, q_pos, k_pos):
            rel = (k_pos[None, :] - q_pos[:, None]).to(tensors[0].dtype)
            return tensors[0][:, None, None] * torch.cos(0.3 * rel)

        def flex(tensors):
            a = tensors[0]

            def add(bi, hi, qi, ki):
                return a[hi] * torch.cos(0.3 * (ki - qi - offset).to(a.dtype))

            return add

        return TermForm((self.amplitude.to(ctx.dtype),), block, flex)


def _inputs(b=2, h=4, lq=24, lk=24, d=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) for n in (lq, lk, lk)]


def _dense(q, k, v, add, causal=True):
    """float64 softmax attention with ``add`` (heads, q_len, k_len) on the scaled scores."""
    lq, lk, d = q.shape[2], k.shape[2], q.shape[-1]
    s = q @ k.transpose(-1, -2) / math.sqrt(d) + add
    if causal:
        keep = torch.arange(lk)[None, :] <= torch.arange(lk - lq, lk)[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def _bound(q, k, v, add):
    # each score is a d-term dot product and a sum with the term, rounded: |ds| <= (d + 2)
    # U |q||k| + 2 U |add|; softmax moves by at most 2 |ds|_max relative, the sum over
    # k_len values of v adds k_len U; the float64 reference makes the same error again
    size = float((q.abs().amax() * k.abs().amax() * q.shape[-1]) + add.abs().amax())
    ds = (q.shape[-1] + 2) * U64 * size
    return 2 * (2 * ds + k.shape[2] * U64) * float(v.abs().amax()) * 4


def test_every_position_signal_is_a_score_term():
    for term in (
        posenc.ALiBi(4),
        posenc.FIRE(4),
        posenc.T5Bias(4),
        posenc.NoPE(4),
        posenc.CoPE(16, 8),
        posenc.DAPE(posenc.ALiBi(4)),
        ForgetGateTerm(torch.zeros(1, 4, 3)),
        ScaledTable(posenc.ALiBi(4), 0.5),
    ):
        assert isinstance(term, ScoreTerm), type(term).__name__


@pytest.mark.usefixtures("compiled_kernels")  # without the build: skips, or fails under CI
def test_a_users_table_term_takes_the_compiled_loop_and_sums_with_others(monkeypatch):
    # two halves of ALiBi's table as two terms: the loop sums them into ALiBi's own
    # table (halving and doubling are exact), so the output is ALiBi's, bit for bit
    ran = []
    forward = kernel.forward

    def spy(*args):
        out = forward(*args)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(kernel, "forward", spy)
    q, k, v = _inputs(dtype=torch.float32)
    alibi = posenc.ALiBi(4)
    halves = [ScaledTable(alibi, 0.5), ScaledTable(alibi, 0.5)]
    got = posenc.attention(q, k, v, terms=halves, causal=True)
    want = posenc.attention(q, k, v, bias=alibi, causal=True)
    assert ran == [True, True]
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
def test_a_users_terms_train_as_the_dense_formula(backend):
    q, k, v = (t.requires_grad_(True) for t in _inputs(lq=20, lk=28))
    alibi, cosine = ScaledTable(posenc.ALiBi(4).double(), 0.7), Cosine(4)
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 4, 28, dtype=torch.float64))
    log_f.requires_grad_(True)
    terms = [alibi, cosine, ForgetGateTerm(log_f)]
    out = posenc.attention(q, k, v, terms=terms, causal=True, backend=backend)
    rel = torch.arange(28)[None, :] - torch.arange(8, 28)[:, None]
    c = log_f.cumsum(-1)
    add = (
        alibi.weight * alibi.base.relative_bias(rel).double()
        + cosine.amplitude[:, None, None] * torch.cos(0.3 * rel.double())
        + (c[:, :, 8:, None] - c[:, :, None, :])
    )
    want = _dense(q, k, v, add)
    leaves = [q, k, v, alibi.weight, cosine.amplitude, log_f]
    dout = torch.randn_like(out)
    got_grads = torch.autograd.grad(out, leaves, dout)
    want_grads = torch.autograd.grad(want, leaves, dout)
    bound = _bound(q.detach(), k.detach(), v.detach(), add.detach())
    assert float((out - want).detach().abs().max()) <= bound
    names = "q k v weight amplitude log_fgate".split()
    for name, g, w in zip(names, got_grads, want_grads, strict=True):
        # a gradient sums up to q_len * k_len of those errors, each times |dout|
        err = float((g - w).abs().max())
        assert err <= bound * 28 * 20 * float(dout.abs().max()), name
        assert float(w.abs().max()) > 1e3 * bound  # the bound is far below the values


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_users_term_on_flexattention(monkeypatch):
    # eager FlexAttention (CPU: forward only) against the blockwise path
    monkeypatch.setattr(flex_engine, "compiled", lambda fn: fn)
    q, k, v = _inputs(lq=16, lk=32)
    terms = [ScaledTable(posenc.ALiBi(4).double(), 0.7), Cosine(4)]
    with torch.no_grad():
        got = posenc.attention(q, k, v, terms=terms, causal=True, backend="flex")
        want = posenc.attention(q, k, v, terms=terms, causal=True, backend="blockwise")
    assert float((got - want).abs().max()) <= 1e-12


def test_shorthands_are_their_terms():
    q, k, v = _inputs(dtype=torch.float32)
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 4, 24))
    alibi = posenc.ALiBi(4)
    a = posenc.attention(q, k, v, bias=alibi, log_fgate=log_f, causal=True)
    b = posenc.attention(q, k, v, terms=[alibi, ForgetGateTerm(log_f)], causal=True)
    assert torch.equal(a, b)


def test_bad_terms_are_named():
    q, k, v = _inputs()
    with pytest.raises(TypeError, match=r"terms\[1\] must have score_form"):
        posenc.attention(q, k, v, terms=[posenc.ALiBi(4), object()])
    with pytest.raises(TypeError, match="terms must be a sequence"):
        posenc.attention(q, k, v, terms=posenc.ALiBi(4))
    with pytest.raises(ValueError, match="bias has 3 heads; q has 4"):
        posenc.attention(q, k, v, terms=[posenc.ALiBi(3)])
    with pytest.raises(ValueError, match=r"log_fgate .* needs causal=True"):
        posenc.attention(q, k, v, terms=[ForgetGateTerm(torch.zeros(2, 4, 24))])


# ---------------------------------------------------------------- rotations


class Turn:
    """A user's rotation: every pair turned by ``0.1 * position`` radians (half layout)."""

    def rotate(self, xs, positions):
        angle = 0.1 * positions.double()
        c, s = torch.cos(angle)[..., None], torch.sin(angle)[..., None]
        if positions.ndim == 2:
            c, s = c[:, None], s[:, None]
        out = []
        for x in xs:
            x1, x2 = x.chunk(2, -1)
            out.append(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(x.dtype))
        return tuple(out)


def test_rotations_meet_the_protocol():
    rope = posenc.Rotary(16)
    c, s = rope.cos_sin(torch.arange(40))
    for rotation in (
        rope,
        posenc.FoPE(16, 4, max_position_embeddings=32),
        RotaryTables(c, s),
        Turn(),
    ):
        assert isinstance(rotation, Rotation)
    assert not isinstance(object(), Rotation)


@pytest.mark.parametrize("name", ["fope", "tables", "user"])
def test_any_rotation_rotates_at_the_key_positions(name):
    # a KV cache: queries at positions 16.., keys at 0..; rotated by hand, then attended
    q, k, v = _inputs(lq=8, lk=24)
    rope = posenc.Rotary(16)
    c, s = rope.cos_sin(torch.arange(24), dtype=torch.float64)
    rotation = {
        "fope": posenc.FoPE(16, 4, max_position_embeddings=32, init_gain=0.1).double(),
        "tables": RotaryTables(c, s),
        "user": Turn(),
    }[name]
    got = posenc.attention(q, k, v, rotary=rotation, causal=True)
    (rq,) = rotation.rotate((q,), torch.arange(16, 24))
    (rk,) = rotation.rotate((k,), torch.arange(24))
    want = posenc.attention(rq, rk, v, causal=True)
    assert torch.equal(got, want)
    if name == "tables":  # the tables of a Rotary rotate as the Rotary does
        from_rope = posenc.attention(q, k, v, rotary=rope, causal=True)
        assert float((got - from_rope).abs().max()) <= 1e-6  # rope's tables are float32


def test_fope_restarts_with_each_document():
    q, k, v = _inputs(b=1, lq=12, lk=12)
    fope = posenc.FoPE(16, 4, max_position_embeddings=32, init_gain=0.1).double()
    cu = torch.tensor([0, 5, 12])
    got = posenc.attention(q, k, v, rotary=fope, causal=True, cu_seqlens=cu)
    for a, b in ((0, 5), (5, 12)):
        alone = posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], rotary=fope, causal=True)
        assert float((got[:, :, a:b] - alone).abs().max()) <= 1e-13


def test_a_non_rotation_is_refused():
    q, k, v = _inputs()
    with pytest.raises(TypeError, match=r"rotary must have rotate\(xs, positions\)"):
        posenc.attention(q, k, v, rotary=object())


# ---------------------------------------------------------------- the engine's shape


def _family_classes() -> set[str]:
    names = set()
    for path in (SRC / "families").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
    # the protocols and what they return
    return names - {
        "TermContext",
        "TermForm",
        "ScoreTerm",
        "Rotation",
        "PairRotation",
        "RotatedPair",
    }


def test_the_engine_files_name_no_family_class():
    families = _family_classes()
    assert {"ALiBi", "FIRE", "CoPE", "DAPE", "ForgetGate", "ForgetGateTerm"} <= families
    named = []
    for path in sorted(ENGINE.glob("*.py")):
        if path.name == "__init__.py":  # the entry: bias=, cope= and log_fgate= are shorthands
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found = node.id if isinstance(node, ast.Name) else None
            if isinstance(node, ast.Attribute):
                found = node.attr
            if isinstance(node, ast.alias):
                found = node.asname or node.name
            if found in families:
                named.append(f"{path.name}:{getattr(node, 'lineno', '?')} {found}")
    assert not named, named


def test_the_entry_module_is_small():
    lines = (ENGINE / "__init__.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 350, lines


def test_a_process_that_never_compiles_never_imports_the_compiler():
    # torch.compiler.disable, evaluated at import, used to import torch._dynamo (and
    # with it triton, sympy and inductor: about 1 s and 150 MB) on the first call
    script = textwrap.dedent(
        """
        import sys, torch, posenc
        q, k, v = (torch.randn(1, 4, 64, 16, requires_grad=True) for _ in range(3))
        gate = torch.nn.functional.logsigmoid(torch.randn(1, 4, 64))
        out = posenc.attention(q, k, v, bias=posenc.ALiBi(4), causal=True, log_fgate=gate)
        out.sum().backward()
        posenc.attention(q, k, v, rotary=posenc.Rotary(16), causal=True, backend="blockwise")
        rq, rk = posenc.Rotary(16)(q, k)
        out, rem = posenc.stick_breaking_attention(q, k, v)
        (out.sum() + rem.sum()).backward()
        print(sorted(m for m in ("torch._dynamo", "torch._inductor", "sympy") if m in sys.modules))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout


@pytest.mark.parametrize("name", ["cope", "dape"])
def test_auto_off_the_cpu_reads_the_scores_blockwise(name, monkeypatch):
    # meta tensors stand in for a GPU's: off the CPU "auto" takes FlexAttention, which
    # has no form of a term that reads the scores; those take the blockwise path
    taken = []

    def flex_attend(q, k, v, plan, tensors):
        taken.append("flex")
        return torch.empty(q.shape[:-1] + v.shape[-1:], device=q.device, dtype=q.dtype)

    monkeypatch.setattr(flex_engine, "attend", flex_attend)
    q = torch.empty(1, 2, 8, 16, device="meta")
    if name == "cope":
        given = {"cope": posenc.CoPE(16, 8).to("meta")}
    else:
        given = {"bias": posenc.DAPE(posenc.ALiBi(2)).to("meta")}
    out = posenc.attention(q, q, q, causal=True, **given)
    assert out.shape == (1, 2, 8, 16) and out.device.type == "meta" and taken == []
    posenc.attention(q, q, q, causal=True, bias=posenc.ALiBi(2).to("meta"))
    assert taken == ["flex"]  # every other term takes FlexAttention there
