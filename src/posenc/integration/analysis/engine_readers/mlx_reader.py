"""Read a config's RoPE the way mlx-lm's Llama model does, and print its cos/sin tables.

Runs under MLX's own Python (``.engines/mlx/bin/python``): standard library and mlx
only, never posenc or numpy. ``import mlx_lm`` pulls transformers, so the ``mlx_lm``
package is registered by path without running its ``__init__`` and
``mlx_lm.models.llama`` (with ``rope_utils``, ``base``, ``cache``, ``activations``,
which import only mlx) is imported from the installed wheel.

What mlx-lm 0.32's ``models/llama.py`` reads from a config, and so what this reader
feeds it (``ModelArgs.from_dict`` keeps only the dataclass fields):

- ``rope_theta`` (default 10000), ``rope_traditional`` (default false: HF's half
  layout; true: pairs (2i, 2i + 1)), ``rope_scaling`` (``type`` or ``rope_type``;
  ``rope_parameters``, transformers v5's key, is not read), ``head_dim`` (else
  ``hidden_size // num_attention_heads``), ``max_position_embeddings``;
- no ``partial_rotary_factor``: every channel of the head rotates;
- ``Attention.__init__`` calls ``initialize_rope(head_dim, rope_theta,
  rope_traditional, rope_scaling, max_position_embeddings)`` and applies the module
  to queries and keys with ``offset`` = the cache's length.

The tables come from the module itself: applied to unit vectors (1 in the first
channel of every pair, 0 in the second), the rotated pair holds ``(m cos, m sin)``,
``m`` being any scale the module multiplies in (YaRN's mscale, LongRoPE's). Each
window is one prefill of ``seq_len`` tokens at offset 0 (the length dynamic NTK
reads), rows picked at the asked positions; when that prefill would be too large,
each position is one decode step (``offset = position``, one token) and the note
says so.

Request (stdin): ``{"config": {...}, "windows": [{"seq_len": N, "positions": [...]}]}``.
Answer (stdout): ``{"version", "source", "module", "layout", "rotary_dim", "dtype",
"attention_scaling", "softmax_scale", "windows": [{"seq_len", "positions", "cos",
"sin", "mode"}], "note"}``; cos and sin have one value per pair.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import types
from typing import Any

#: The largest prefill evaluated in one call (elements of the unit-vector input).
MAX_PREFILL_ELEMENTS = 2**26


def _llama() -> Any:
    spec = importlib.util.find_spec("mlx_lm")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mlx_lm is not installed in this environment")
    package = types.ModuleType("mlx_lm")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["mlx_lm"] = package
    import mlx_lm.models.llama as llama

    return llama


def _tables(rope: Any, dims: int, traditional: bool, seq_len: int, positions: list[int]) -> Any:
    import mlx.core as mx

    pairs = dims // 2
    if traditional:
        first = [1.0 if c % 2 == 0 else 0.0 for c in range(dims)]
    else:
        first = [1.0] * pairs + [0.0] * (dims - pairs)
    unit = mx.array(first, dtype=mx.float32)

    def split(out: Any) -> tuple[Any, Any]:
        if traditional:
            return out[..., 0::2], out[..., 1::2]
        return out[..., :pairs], out[..., pairs : 2 * pairs]

    if seq_len * dims <= MAX_PREFILL_ELEMENTS:
        x = mx.broadcast_to(unit, (1, 1, seq_len, dims))
        out = rope(x)[0, 0]
        rows = out[mx.array(positions)]
        c, s = split(rows)
        mode = f"one prefill of {seq_len} tokens at offset 0"
    else:
        cs, ss = [], []
        for p in positions:
            out = rope(unit.reshape(1, 1, 1, dims), offset=p)[0, 0]
            c1, s1 = split(out)
            cs.append(c1)
            ss.append(s1)
        c, s = mx.concatenate(cs), mx.concatenate(ss)
        mode = "one decode step per position (offset = position, one token)"
    mx.eval(c, s)
    return c.tolist(), s.tolist(), mode


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables mlx-lm's Llama attention applies."""
    llama = _llama()
    config = dict(request["config"])
    args = llama.ModelArgs.from_dict(config)
    attention = llama.Attention(args)
    rope = attention.rope
    dims = attention.head_dim
    traditional = bool(args.rope_traditional)
    notes = []
    if config.get("model_type") != "llama":
        notes.append(
            f"read as mlx_lm.models.llama reads it (the config's model_type is "
            f"{config.get('model_type')!r})"
        )
    if "rope_parameters" in config and "rope_scaling" not in config:
        notes.append("rope_parameters is not read by mlx-lm's llama (it reads rope_scaling)")
    if config.get("partial_rotary_factor") not in (None, 1, 1.0):
        notes.append("partial_rotary_factor is not read: every channel rotates")
    windows = []
    for w in request["windows"]:
        positions = [int(p) for p in w["positions"]]
        c, s, mode = _tables(rope, dims, traditional, int(w["seq_len"]), positions)
        windows.append({"seq_len": int(w["seq_len"]), "positions": positions, "cos": c,
                        "sin": s, "mode": mode})  # fmt: skip
    # the scale the module multiplies into the table: |(cos, sin)| at any position
    c0, s0 = windows[0]["cos"][0][0], windows[0]["sin"][0][0]
    return {
        "version": f"mlx {importlib.metadata.version('mlx')}, "
        f"mlx-lm {importlib.metadata.version('mlx-lm')}",
        "source": "installed",
        "module": type(rope).__name__,
        "layout": "interleaved" if traditional else "half",
        "rotary_dim": dims,
        "dtype": "float32",
        "attention_scaling": (c0 * c0 + s0 * s0) ** 0.5,
        "softmax_scale": attention.scale,
        "windows": windows,
        "note": "; ".join(notes),
    }


def main() -> int:
    """Read the request on stdin, print the answer on stdout."""
    request = json.loads(sys.stdin.read())
    json.dump(answer(request), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
