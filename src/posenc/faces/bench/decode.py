"""The ``decode*`` cases: RoPE for one decode step, one new token at a late position.

A generating model rotates one query and one key per step, at the position the
KV cache has reached: microseconds of arithmetic, so what a step costs is the
Python and dispatch around it. These cases time that step at position 2047
with a Llama-sized head (32 query heads, 8 key heads of 128, float32; on CUDA
also bfloat16), against copying q and k:

- posenc's :class:`~posenc.Rotary` with ``offset=2047``: the whole step;
- HF's ``LlamaRotaryEmbedding`` forward (built from a ``LlamaConfig`` with the
  same sizes: nothing is downloaded) and ``apply_rotary_pos_emb``: the whole
  step, as a Llama model takes it; and HF's module alone;
- the module :func:`posenc.hf.patch_model` puts in a tiny ``LlamaForCausalLM``'s
  place (random weights), called as HF calls it, ``(x, position_ids)``, alone
  and with ``apply_rotary_pos_emb``: the patched model's step.

A decode step with posenc should cost no more than HF's module plus
``apply_rotary_pos_emb``. Each timed run is the mean of
:data:`INNER` calls (each synchronized on CUDA).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import posenc
from posenc.faces.bench.harness import Case, Impl

#: Calls per timed run: one call takes tens of microseconds.
INNER = 50


def llama_config(heads: int, kv_heads: int, head_dim: int, max_positions: int) -> Any:
    """A ``LlamaConfig`` with these attention sizes and the smallest everything else.

    The hidden size is ``2 * heads`` (HF's rotary module reads only
    ``head_dim`` and the RoPE parameters; the tiny model built from it exists to
    be patched), one layer, a vocabulary of 8.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=2 * heads,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=8,
        num_hidden_layers=1,
        vocab_size=8,
        max_position_embeddings=max_positions,
    )


def impls(
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    offset: int,
    *,
    dtype: str,
    device: str = "cpu",
) -> list[Impl]:
    """One decode step: q ``(batch, heads, 1, head_dim)`` and k ``(batch, kv_heads, 1,
    head_dim)`` rotated to position ``offset``.

    The HF rows get what a Llama model hands its rotary module: the hidden
    states ``x`` of ``(batch, 1, hidden)`` (only their dtype and device are
    read) and ``position_ids`` of ``[[offset]] * batch``, made once, as a model
    has them before the step.
    """
    max_positions = max(4096, offset + 1)

    def tensors() -> dict[str, Any]:
        import torch

        tdtype = getattr(torch, dtype)
        gen = torch.Generator().manual_seed(0)
        q = torch.randn((batch, heads, 1, head_dim), generator=gen).to(device, tdtype)
        k = torch.randn((batch, kv_heads, 1, head_dim), generator=gen).to(device, tdtype)
        x = torch.randn((batch, 1, 2 * heads), generator=gen).to(device, tdtype)
        position_ids = torch.full((batch, 1), offset, dtype=torch.long, device=device)
        return {"q": q, "k": k, "x": x, "position_ids": position_ids}

    def hf_module() -> Any:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        config = llama_config(heads, kv_heads, head_dim, max_positions)
        return LlamaRotaryEmbedding(config=config).to(device)

    def patched_module() -> Any:
        import torch
        from transformers import LlamaForCausalLM

        config = llama_config(heads, kv_heads, head_dim, max_positions)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = LlamaForCausalLM(config)
        posenc.hf.patch_model(model)
        module = model.model.rotary_emb
        if type(module).__module__.startswith("transformers."):
            raise RuntimeError(f"patch_model left {type(module).__name__} in place")
        return module.to(device)

    def copy() -> Callable[[], object]:
        t = tensors()
        q, k = t["q"], t["k"]
        return lambda: (q.clone(), k.clone())

    def rotary() -> Callable[[], object]:
        t = tensors()
        q, k = t["q"], t["k"]
        rope = posenc.Rotary(head_dim).to(device)
        return lambda: rope(q, k, offset=offset)

    def module_alone(build: Callable[[], Any]) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            t = tensors()
            x, ids = t["x"], t["position_ids"]
            module = build()
            return lambda: module(x, ids)

        return make

    def module_and_apply(build: Callable[[], Any]) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            t = tensors()
            q, k, x, ids = t["q"], t["k"], t["x"], t["position_ids"]
            module = build()

            def call() -> object:
                cos, sin = module(x, ids)
                return apply_rotary_pos_emb(q, k, cos, sin)

            return call

        return make

    return [
        Impl("q.clone(), k.clone()", copy, "baseline", f"copy both ({dtype}, reference)"),
        Impl("posenc Rotary", rotary, "ours", f"Rotary({head_dim})(q, k, offset={offset})"),
        Impl(
            "HF module + apply_rotary_pos_emb",
            module_and_apply(hf_module),
            "peer",
            "LlamaRotaryEmbedding(x, position_ids), then apply",
        ),
        Impl("HF module", module_alone(hf_module), "peer", "LlamaRotaryEmbedding alone"),
        Impl(
            "posenc patched + apply_rotary_pos_emb",
            module_and_apply(patched_module),
            "ours",
            "patch_model's module, then HF's apply",
        ),
        Impl(
            "posenc patched module",
            module_alone(patched_module),
            "ours",
            "patch_model's module alone (x, position_ids)",
        ),
    ]


#: One new token at position 2047; Llama-sized heads with grouped keys.
SIZE = {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "offset": 2047}


def _case(dtype: str, devices: tuple[str, ...]) -> Case:
    return Case(
        "decode" if dtype == "float32" else f"decode-{dtype}",
        f"RoPE for one decode step ({dtype}): one query and key at position 2047, against "
        "copying them.",
        build=functools.partial(impls, dtype=dtype),
        full=SIZE,
        # tiny tensors: quick saves repetitions only
        quick=SIZE,
        quick_repeat=5,
        devices=devices,
        inner=INNER,
    )


#: This module's cases, in the order ``posenc bench`` runs them: float32 on the CPU and
#: CUDA, bfloat16 on CUDA only (a CPU decodes in float32).
CASES = (_case("float32", ("cpu", "cuda")), _case("bfloat16", ("cuda",)))
