"""The ``rope-mixed`` cases: RoPE-Mixed on a ViT's q and k, against copying them.

Each row rotates the 196 patch tokens of a ViT-B/16 at 224 pixels (``(batch, 12 heads,
1 + 14 * 14 tokens, 64)``; the class token passes through) and builds its tables in
the timed call, as a training step must (the frequencies are learned): posenc's
:class:`~posenc.rotary.multiaxis.RoPEMixed` (float64 angles, rounded once) against
timm's ``RotaryEmbeddingMixed`` (``get_embed`` then ``apply_rot_embed_cat``, as timm's
``Attention`` applies it; float32 angles), posenc's axial RoPE
(:class:`~posenc.rotary.multiaxis.AxialRotary`: fixed frequencies, the same work
without the mixing) and a copy of q and k. The backward case also times the
gradients of q, k and the learned frequencies.

timm's package ``__init__`` imports torchvision; where torchvision is missing the
peer's one file, ``timm/layers/pos_embed_sincos.py``, is loaded without it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import pathlib
import sys
import types
from collections.abc import Callable
from typing import Any

from posenc.faces.bench.harness import Case, Impl, qk_rows

_GRID = 14  # 224 / 16 patches per side
_ALIAS = "_posenc_bench_timm"


def timm_sincos() -> types.ModuleType:
    """``timm.layers.pos_embed_sincos``, without timm's ``__init__`` if torchvision is missing.

    Raises:
        ImportError: timm is not installed (the row is skipped).
    """
    try:
        return importlib.import_module("timm.layers.pos_embed_sincos")
    except ImportError as error:
        if "torchvision" not in str(error):
            raise
    spec = importlib.machinery.PathFinder.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("timm is not installed", name="timm")
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    # parents stubbed under a private name: the real "timm" stays as it is for others
    for name, path in ((_ALIAS, root), (f"{_ALIAS}.layers", root / "layers")):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(path)]
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            stub.__spec__.submodule_search_locations = stub.__path__
            sys.modules[name] = stub
    return importlib.import_module(f"{_ALIAS}.layers.pos_embed_sincos")


def impls(
    batch: int, heads: int, grid: int, head_dim: int, *, backward: bool, device: str = "cpu"
) -> list[Impl]:
    """Rotate q and k of ``(batch, heads, 1 + grid**2, head_dim)``; optionally backward too."""
    seq = 1 + grid * grid

    timed = qk_rows((batch, heads, seq, head_dim), backward=backward, device=device)

    def clone() -> Callable[[], object]:
        return timed(lambda q, k: (q.clone(), k.clone()))

    def ours() -> Callable[[], object]:
        from posenc.families.rotary.multiaxis.mixed import RoPEMixed

        rope = RoPEMixed(head_dim, heads).to(device)
        coords = rope.coords(grid, grid)
        return timed(lambda q, k: rope(q, k, coords), rope.freqs)

    def timm() -> Callable[[], object]:
        import torch

        sincos = timm_sincos()
        rope = sincos.RotaryEmbeddingMixed(
            heads * head_dim, 1, heads, grid_indexing="xy", device=device
        )

        def step(q: Any, k: Any) -> tuple[Any, Any]:
            emb = rope.get_embed([grid, grid])[0]  # (heads, grid**2, 2 head_dim)
            out = []
            for x in (q, k):  # timm's Attention: the prefix token, then the rotated rest
                rotated = sincos.apply_rot_embed_cat(x[:, :, 1:], emb)
                out.append(torch.cat([x[:, :, :1], rotated], dim=2))
            return out[0], out[1]

        return timed(step, rope.freqs)

    def axial() -> Callable[[], object]:
        import torch

        from posenc.families.rotary.multiaxis.axial import AxialRotary, axial_grid

        rope = AxialRotary(head_dim, 2).to(device)
        coords = axial_grid(grid, grid, device=device).flatten(0, 1)

        def step(q: Any, k: Any) -> tuple[Any, Any]:
            qr, kr = rope(q[:, :, 1:], k[:, :, 1:], coords)
            return torch.cat([q[:, :, :1], qr], dim=2), torch.cat([k[:, :, :1], kr], dim=2)

        return timed(step)

    return [
        Impl("q.clone(), k.clone()", clone, "baseline", "copy both (float32, reference)"),
        Impl("posenc RoPEMixed", ours, "ours", "tables from float64 angles, each call"),
        Impl("timm RotaryEmbeddingMixed", timm, "peer", "get_embed + apply_rot_embed_cat"),
        Impl("posenc AxialRotary", axial, "ours", "fixed axial frequencies, no mixing"),
    ]


#: ViT-B/16 at 224 pixels: 12 heads of 64, 14 x 14 patches and a class token.
CPU_SIZE = {"batch": 32, "heads": 12, "grid": _GRID, "head_dim": 64}
#: The same model at batch 256 on CUDA: 150 MiB per float32 tensor, beyond the L2.
CUDA_SIZE = {"batch": 256, "heads": 12, "grid": _GRID, "head_dim": 64}


def _case(backward: bool) -> Case:
    return Case(
        "rope-mixed" + ("-backward" if backward else ""),
        "RoPE-Mixed on a ViT-B/16's q and k, tables built per call, "
        + ("forward and backward (q, k, frequencies)" if backward else "forward")
        + ", against copying them.",
        build=functools.partial(impls, backward=backward),
        full=CPU_SIZE,
        quick=CPU_SIZE,
        quick_repeat=3,
        devices=("cpu", "cuda"),
        cuda_full=CUDA_SIZE,
        cuda_quick=CUDA_SIZE,
    )


#: This module's cases, in the order ``posenc bench`` runs them.
CASES = (_case(False), _case(True))
