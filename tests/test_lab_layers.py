"""The lab's per-layer position modules (PER_LAYER) and rotations through the protocol."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import pytest
import torch

from conftest import perturbed_lab_model
from posenc import attention
from posenc.faces.lab import encodings
from posenc.faces.lab import model as lab_model
from posenc.faces.lab.encodings import PER_LAYER, REGISTRY, Encoding
from posenc.faces.lab.layers import Householder, PositionModule
from posenc.faces.lab.model import _ROTATIONS, LabModel, ModelConfig, _attend
from posenc.families.bias.modules import ALiBi

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = ModelConfig(14, 32, 2, 4, max_positions=40)


def tokens(seq: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 14, (3, seq), generator=torch.Generator().manual_seed(seed))


def block_by_hand(block: Any, x: torch.Tensor, attend: Any) -> torch.Tensor:
    """A lab block's output for every position, its attention ``attend(q, k, v)``."""
    b, t, d = x.shape
    h = block.ln1(x)
    q, k, v = (y.transpose(1, 2) for y in block.qkv(h).view(b, t, 3, block.heads, -1).unbind(2))
    y = attend(q, k, v)
    x = x + block.out(y.transpose(1, 2).reshape(b, t, d))
    return x + block.mlp(block.ln2(x))


def test_every_per_layer_encoding_names_a_registered_module():
    used = {e.per_layer for e in REGISTRY.values() if e.per_layer is not None}
    assert used == set(PER_LAYER) == {
        "forget-gate", "cope", "dape", "path", "path-fox", "pope", "dual-chunk"
    }  # fmt: skip
    for name, build in PER_LAYER.items():
        assert isinstance(build(CONFIG), PositionModule), name
    with pytest.raises(ValueError, match="per_layer must be one of"):
        Encoding("x", "x", per_layer="gates")


def test_saved_names_of_the_per_layer_modules_are_posencs_own():
    # the modules subclass posenc's: a model saved before keeps loading
    named = {
        "fox": ["proj.bias", "proj.weight"],
        "cope": ["pos_emb"],
        "dape": ["mlp.0.bias", "mlp.0.weight", "mlp.2.bias", "mlp.2.weight"],
        "pope": ["bias"],  # pope-pytorch's name
        "dual-chunk": [],  # no parameters: the rotation's tables are derived
    }
    for encoding, names in named.items():
        state = LabModel(CONFIG, encoding).state_dict()
        mine = sorted(
            k.removeprefix("blocks.1.position.") for k in state if "blocks.1.position" in k
        )
        assert mine == names, encoding


@pytest.mark.parametrize("encoding", ["fox", "cope", "dape", "pope", "dual-chunk"])
def test_a_layers_terms_are_its_attentions_own(encoding):
    # what posenc.attention is given for each, by its own keyword
    given = {
        "fox": lambda position, h: {"log_fgate": position(h)},
        "cope": lambda position, h: {"cope": position},
        "dape": lambda position, h: {"bias": position},
        "pope": lambda position, h: {"rotary": position},
        "dual-chunk": lambda position, h: {"rotary": position},
    }[encoding]
    model = perturbed_lab_model(CONFIG, encoding)
    x = model.embed(tokens())
    block = model.blocks[0]
    kwargs = given(block.position, block.ln1(x))
    with torch.no_grad():
        want = block_by_hand(block, x, lambda q, k, v: attention(q, k, v, causal=True, **kwargs))
        assert torch.equal(block(x, _attend(None, None), x.shape[1]), want)


class _LayerALiBi(PositionModule):
    """A per-layer method of a test's own: ALiBi as each layer's term."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.alibi = ALiBi(heads)

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        return {"terms": [self.alibi]}


def test_a_new_per_layer_method_is_one_registry_entry(monkeypatch):
    added = MappingProxyType({**PER_LAYER, "layer-alibi": lambda c: _LayerALiBi(c.heads)})
    monkeypatch.setattr(encodings, "PER_LAYER", added)
    monkeypatch.setattr(lab_model, "PER_LAYER", added)  # the name the model imported
    spec = Encoding("layer-alibi", "ALiBi as a term of every layer", per_layer="layer-alibi")
    monkeypatch.setattr(encodings, "REGISTRY", MappingProxyType({**REGISTRY, spec.name: spec}))
    monkeypatch.setattr(encodings, "ENCODINGS", (*encodings.ENCODINGS, spec.name))
    torch.manual_seed(0)
    mine = LabModel(CONFIG, "layer-alibi")
    torch.manual_seed(0)
    shared = LabModel(CONFIG, "alibi")  # the same bias, shared by the layers
    assert isinstance(mine.blocks[1].position, _LayerALiBi)
    with torch.no_grad():
        assert torch.equal(mine(tokens()), shared(tokens()))
        assert not torch.allclose(mine(tokens()), LabModel(CONFIG, "nope")(tokens()), atol=1e-3)


# ------------------------------------------------------------------ PaTH


def test_householder_transforms():
    torch.manual_seed(0)
    module = Householder(32, 4, forget_gate=True)
    h = torch.randn(3, 11, 32)
    inputs = module.attend_inputs(h)
    w, beta, log_fgate = inputs["w"], inputs["beta"], inputs["log_fgate"]
    assert w.shape == (3, 4, 11, 8) and beta.shape == log_fgate.shape == (3, 4, 11)
    # fla's l2_norm, w / sqrt(|w|^2 + 1e-6): unit up to 1e-6 / (2 |w|^2) below 1
    norm = w.norm(dim=-1)
    assert bool((norm <= 1).all()) and bool((norm > 1 - 1e-3).all())
    assert bool(((beta > 0) & (beta < 2)).all()) and bool((log_fgate <= 0).all())
    # causal: a token's transform reads its own input and the two before it
    later = h.clone()
    later[:, 7:] += 1.0
    moved = module.attend_inputs(later)
    for name in ("w", "beta", "log_fgate"):
        assert torch.equal(moved[name][:, :, :7], inputs[name][:, :, :7]), name
        assert not torch.allclose(moved[name][:, :, 7:], inputs[name][:, :, 7:]), name
    earlier = h.clone()
    earlier[:, 4] += 1.0  # tokens 4, 5 and 6 see it (a convolution of width 3)
    changed = (module.attend_inputs(earlier)["w"] != inputs["w"]).any(-1).any(1).any(0)
    assert changed.nonzero().flatten().tolist() == [4, 5, 6]
    assert set(Householder(32, 4).attend_inputs(h)) == {"w", "beta"}  # PaTH without gates
    with pytest.raises(ValueError, match="split into heads"):
        Householder(30, 4)


def path_by_hand(q, k, v, w, beta, log_fgate=None):  # type: ignore[no-untyped-def]
    """PaTH (Yang et al. 2025) written out: ``q_i^T H_i .. H_{j+1} k_j`` with ``H_s = I -
    beta_s w_s w_s^T``, the gates' sum over ``(j, i]`` added before the scale (fla's)."""
    b, h, t, d = q.shape
    eye = torch.eye(d, dtype=q.dtype)
    transforms = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]
    gates = torch.zeros(b, h, t) if log_fgate is None else log_fgate.cumsum(-1)
    out = torch.empty_like(v)
    for n in range(b):
        for head in range(h):
            scores = torch.full((t, t), -math.inf, dtype=q.dtype)
            for i in range(t):
                carried = eye
                for j in range(i, -1, -1):
                    key = carried @ k[n, head, j]
                    scores[i, j] = q[n, head, i] @ key + gates[n, head, i] - gates[n, head, j]
                    carried = carried @ transforms[n, head, j]
            out[n, head] = (scores / math.sqrt(d)).softmax(-1) @ v[n, head]
    return out


@pytest.mark.parametrize("encoding", ["path", "path-fox"])
def test_a_path_layer_attends_through_its_transforms(encoding):
    model = perturbed_lab_model(ModelConfig(14, 16, 1, 2, max_positions=12), encoding).double()
    block = model.blocks[0]
    x = model.embed(tokens(9)).double()
    inputs = block.position.attend_inputs(block.ln1(x))
    assert ("log_fgate" in inputs) == (encoding == "path-fox")
    with torch.no_grad():
        want = block_by_hand(block, x, lambda q, k, v: path_by_hand(q, k, v, **inputs))
        got = block(x, _attend(None, None, kernel="path"), 9)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ rotations


def test_fope_rotates_through_the_protocol():
    model = LabModel(ModelConfig(14, 32, 2, 4, max_positions=40, trained_positions=20), "fope")
    q, k, v = torch.randn(3, 2, 4, 11, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    attend = _attend(None, _ROTATIONS["fope"](model, torch.arange(11), 11, None))
    for first in (0, 4):  # every query, and the last ones only
        want = attention(q[:, :, first:], k, v, rotary=model.fope, causal=True)
        assert torch.equal(attend(q[:, :, first:], k, v), want)
