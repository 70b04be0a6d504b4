"""Every posenc torch module can be copied, saved and initialised on the meta device.

The guarantee the README states, checked on one instance of every module class
(after it has run, so its caches are full): ``copy.deepcopy``, ``pickle``,
``torch.save``/``torch.load``, a ``state_dict`` round trip into a fresh module, and
deferred initialisation (built under ``torch.device("meta")``, ``to_empty``, then
``load_state_dict``) all give a module with the same outputs. The family test files
check each family in more depth; this file makes sure no module class is left out.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

import posenc
from posenc.families.rotary.multiaxis import AxialRotary, DINOv3Rope, LieRotary, RoPEMixed

Q = torch.randn(1, 4, 12, 32, generator=torch.Generator().manual_seed(0))
GRID_Q = Q.reshape(1, 4, 3, 4, 32)  # (batch, heads, H, W, head_dim)
COORDS = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij"), -1)


def _attend(bias: Any) -> torch.Tensor:
    return posenc.attention(Q, Q, Q, bias=bias, causal=True)


def _cope() -> Any:
    module = posenc.CoPE(32, 16)
    with torch.no_grad():  # zero at the start: random, so that a lost value shows
        module.pos_emb.normal_()
    return module


# name -> (build, run): run(module) gives the tensor(s) whose values must survive
MODULES: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
    "SinusoidalEmbedding": (
        lambda: posenc.SinusoidalEmbedding(32, max_len=8, preset="fairseq", padding_idx=1),
        lambda m: m(torch.ones(2, 20, 32), offset=3),
    ),
    "LearnedPositionalEmbedding": (
        lambda: posenc.LearnedPositionalEmbedding(16, 32, offset=2),
        lambda m: m(torch.arange(10)),
    ),
    "Rotary": (
        lambda: posenc.Rotary(
            32, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=8
        ),
        lambda m: m(Q, Q),
    ),
    "AxialRotary": (lambda: AxialRotary(32, 2), lambda m: m(GRID_Q, GRID_Q, COORDS)),
    "LieRotary": (
        lambda: LieRotary(32, 2, kind="comrope-ld", block_size=4),
        lambda m: m(Q, Q[:, :2], m.coords(3, 4)),
    ),
    "LieRotary-liere": (lambda: LieRotary(32, 2, block_size=8), lambda m: m(Q, Q, m.coords(3, 4))),
    "RoPEMixed": (
        lambda: RoPEMixed(32, 4, depth=2),
        lambda m: m(Q, Q, m.coords(3, 4), block_index=1),
    ),
    "DINOv3Rope": (
        lambda: DINOv3Rope(32, 4, rescale=2.0).eval(),
        lambda m: m(Q, Q, m.coords(3, 4)),
    ),
    "ALiBi": (lambda: posenc.ALiBi(4), _attend),
    "T5Bias": (lambda: posenc.T5Bias(4), _attend),
    "KERPLE": (lambda: posenc.KERPLE(4), _attend),
    "FIRE": (lambda: posenc.FIRE(4), _attend),
    "Sandwich": (lambda: posenc.Sandwich(4, dim=32), _attend),
    "NoPE": (lambda: posenc.NoPE(4), _attend),
    "FoPE": (
        lambda: posenc.FoPE(32, 2, max_position_embeddings=64),
        lambda m: m(Q, Q[:, :2], torch.arange(12) + 0.5),
    ),
    "DualChunkRotary": (
        lambda: posenc.DualChunkRotary(
            32, chunk_size=5, local_size=1, original_max_position_embeddings=4
        ),
        lambda m: posenc.attention(Q, Q, Q, rotary=m, causal=True),
    ),
    "PoPE": (
        lambda: posenc.PoPE(16, heads=4, bias_uniform_init=True),
        lambda m: posenc.attention(Q, Q[:, :2], Q[:, :2], rotary=m, causal=True),
    ),
    "ForgetGate": (lambda: posenc.ForgetGate(32, 4), lambda m: m(Q[0].transpose(0, 1))),
    "CoPE": (_cope, lambda m: posenc.attention(Q, Q, Q, cope=m, causal=True)),
    "DAPE": (lambda: posenc.DAPE(posenc.KERPLE(4), width=8), _attend),
    "PaTH": (
        lambda: posenc.PaTH(32, 4, kv_heads=2, forget_gate=True),
        lambda m: m(Q[0].transpose(0, 1)),
    ),
}


def _values(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple) else (out,)


def _same(a: Any, b: Any) -> None:
    for x, y in zip(_values(a), _values(b), strict=True):
        assert torch.equal(x, y)


def _copies(module: Any) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return {
        "deepcopy": copy.deepcopy(module),
        "pickle": pickle.loads(pickle.dumps(module)),
        "torch.save": torch.load(buffer, weights_only=False),
    }


@pytest.mark.parametrize("name", sorted(MODULES))
def test_copies_compute_the_same(name: str) -> None:
    build, run = MODULES[name]
    torch.manual_seed(0)
    module = build()
    want = run(module)  # caches filled, dynamic frequencies grown
    for how, clone in _copies(module).items():
        assert type(clone) is type(module), how
        _same(run(clone), want)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_state_dict_round_trip_and_meta_initialisation(name: str) -> None:
    build, run = MODULES[name]
    torch.manual_seed(0)
    module = build()
    want = run(module)
    torch.manual_seed(1)  # other random weights: the state dict must bring them back
    fresh = build()
    fresh.load_state_dict(module.state_dict())
    _same(run(fresh), want)
    with torch.device("meta"):
        deferred = build()
    deferred.to_empty(device="cpu")
    deferred.load_state_dict(module.state_dict())
    _same(run(deferred), want)


def test_every_module_class_is_covered() -> None:
    classes = {
        name
        for name in posenc.__all__
        if isinstance(getattr(posenc, name), type)
        and issubclass(getattr(posenc, name), torch.nn.Module)
        and name != "AttentionBias"  # the abstract base
    }
    assert classes <= set(MODULES), classes - set(MODULES)
