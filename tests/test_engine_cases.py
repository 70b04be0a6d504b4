"""The cross-engine cases against transformers itself, and each bug-report case's near miss.

posenc's reading of a case is the reference every engine is judged against, so it is
checked here against what transformers' own model does with the config, built from it
with random weights: the tables of its rotary module at every window the engines are
asked for (``engines.windows``: both sides of LongRoPE's switch, dynamic NTK past its
length, the multi-axis positions of an M-RoPE, each layer type), the layers its attention
rotates (``apply_rotary_pos_emb`` called, watched in one forward pass: SmolLM3's
``no_rope_layers``, Cohere 2's full-attention layers), the layout of its pairs, and the
factor its attention multiplies ``q . k`` by (DeepSeek's ``mscale_all_dim``).

Then, for each case users filed bugs about, posenc's reading is mutated the way the bug
misread it (``truncate`` dropped, ``no_rope_layers`` inverted, the NoPE layers missed,
``mscale_all_dim`` ignored, the LongRoPE factor sets swapped, the M-RoPE interleave
lost, Gemma 3's two bases swapped): the same check must fail.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conftest import anchor
from posenc.integration.analysis import engine_cases, engines
from posenc.integration.analysis.rope_compare import compare, compare_mrope
from posenc.integration.analysis.rope_reading import Loaded, Reading, nope_layers, read

torch = anchor("torch")
transformers = anchor("transformers")


def _model(config: dict[str, Any]) -> Any:
    from posenc.integration.analysis.rope_reading import quiet

    with quiet():
        hf = transformers.AutoConfig.for_model(**copy.deepcopy(config))
        torch.manual_seed(0)
        try:
            model = transformers.AutoModelForCausalLM.from_config(hf)
        except ValueError:  # a composite config: its base model
            model = transformers.AutoModel.from_config(hf)
    return model.eval()


def _rotary(model: Any) -> Any:
    return next(m for n, m in model.named_modules()
                if n.endswith("rotary_emb") and "visual" not in n)  # fmt: skip


def _attentions(model: Any) -> dict[int, Any]:
    return {m.layer_idx: m for n, m in model.named_modules()
            if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")
            and "visual" not in n}  # fmt: skip


def rotated_layers(model: Any) -> set[int]:
    """The layers whose attention calls its module's ``apply_rotary_pos_emb`` in one pass."""
    attentions = _attentions(model)
    module = sys.modules[type(next(iter(attentions.values()))).__module__]
    names = [n for n in vars(module) if n.startswith("apply_rotary_pos_emb")]
    current: list[int] = []
    seen: set[int] = set()
    hooks = [a.register_forward_pre_hook(lambda m, *_: current.append(m.layer_idx))
             for a in attentions.values()]  # fmt: skip
    saved = {n: getattr(module, n) for n in names}

    def recorder(f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.add(current[-1])
            return f(*args, **kwargs)

        return call

    try:
        for n, f in saved.items():
            setattr(module, n, recorder(f))
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    finally:
        for n, f in saved.items():
            setattr(module, n, f)
        for h in hooks:
            h.remove()
    return seen


def hf_tables(model: Any, window: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' rotary module at the window's positions (``max + 1`` = its seq_len)."""
    rotary = _rotary(model)
    positions = torch.tensor(window["positions"])
    ids = positions[None]
    if window.get("position_ids") is not None:
        ids = torch.tensor(window["position_ids"])[:, None, :]
    elif getattr(rotary, "mrope_section", None) is not None or "VL" in type(rotary).__name__:
        ids = positions[None, None].expand(3, 1, -1)
    x = torch.zeros(1, len(window["positions"]), 1)
    kwargs = {"layer_type": window["layer_type"]} if window.get("layer_type") else {}
    with torch.no_grad():
        cos, sin = rotary(x, ids, **kwargs)
    return cos[0].double().numpy(), sin[0].double().numpy()


def disagreements(
    config: dict[str, Any], readings: list[Reading], rope_layers: set[int]
) -> list[str]:
    """Where posenc's reading (``readings``, the layers it rotates) differs from transformers."""
    model = _model(config)
    by_type = {r.layer_type: r for r in readings}
    out = []
    for w in engines.windows(readings, config):
        if w.get("nope"):
            continue
        lt = w.get("layer_type")
        reading = by_type[lt] if lt in by_type else readings[0]
        cos, sin = hf_tables(model, w)
        if cos.shape[-1] == reading.spec.rotary_dim // 2:
            # GPT-OSS's module returns one value per pair (its _apply_rotary_emb splits q
            # into halves): the half layout's table
            cos, sin = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)
        rot = cos.shape[-1]
        if rot != reading.spec.rotary_dim:
            out.append(f"rotary dim: transformers {rot}, posenc {reading.spec.rotary_dim}")
            continue
        if w.get("position_ids") is not None:
            pairs = rot // 2
            ids = np.asarray(w["position_ids"], dtype=np.int64)
            v = compare_mrope(reading, ids, cos[:, :pairs], sin[:, :pairs], source="hf")
            verdicts = [v]
        else:
            arrays = {"positions": np.asarray(w["positions"]), "cos": cos, "sin": sin}
            verdicts = compare([reading], arrays, source="hf", layer_type=lt)
            for v in verdicts:
                if v.layout is not None and v.layout != reading.layout:
                    out.append(f"layout: transformers {v.layout}, posenc {reading.layout}")
        for v in verdicts:
            if not v.agree and not (v.cause or "").startswith("float32 angles"):
                out.append(f"seq_len {w['seq_len']} [{lt}]: {v.summary}")
    theirs = rotated_layers(model)
    if theirs != rope_layers:
        out.append(f"rotated layers: transformers {sorted(theirs)}, posenc {sorted(rope_layers)}")
    softmax = next((r.softmax for r in readings if r.softmax is not None), None)
    attention = _attentions(model)[0]
    if softmax is not None:
        head = int(getattr(attention, "qk_head_dim", 0) or attention.head_dim)
        theirs_factor = float(attention.scaling) * head**0.5
        if not np.isclose(theirs_factor, float(softmax.value), rtol=1e-6):
            out.append(f"softmax factor: transformers {theirs_factor}, posenc {softmax.value}")
    return out


def posenc_reading(config: dict[str, Any]) -> tuple[list[Reading], set[int]]:
    readings = read(Loaded(copy.deepcopy(config), "case", "file", original=copy.deepcopy(config)))
    layers = {i for r in readings for i in (r.layers or [])}
    return readings, layers


@pytest.mark.parametrize("name", list(engine_cases.CASES))
def test_posenc_reads_each_case_as_transformers_runs_it(name):
    config = engine_cases.CASES[name].data()
    readings, layers = posenc_reading(config)
    assert disagreements(config, readings, layers) == []


# --------------------------------------------------------------------------------------
# The near misses: each bug report's misreading, applied to posenc's reading.


def _spec(reading: Reading, **changes: Any) -> Reading:
    return dataclasses.replace(reading, spec=dataclasses.replace(reading.spec, **changes))


def _params(reading: Reading, **changes: Any) -> Reading:
    return _spec(reading, params={**reading.spec.params, **changes})


def _drop_truncate(readings: list[Reading], layers: set[int]) -> Any:
    # vllm #28244: GPT-OSS's YaRN read with its correction range rounded (truncate true)
    return [_params(r, truncate=True) for r in readings], layers


def _no_mscale_all_dim(readings: list[Reading], layers: set[int]) -> Any:
    # llama.cpp #17945: mscale_all_dim's factor left out of the softmax scale
    return [dataclasses.replace(r, softmax=dataclasses.replace(r.softmax, value=1.0))
            for r in readings], layers  # fmt: skip


def _inverted_mask(readings: list[Reading], layers: set[int]) -> Any:
    # transformers #43756: no_rope_layers read as 1 = NoPE
    return readings, {0, 1, 2, 3} - layers


def _nope_missed(readings: list[Reading], layers: set[int]) -> Any:
    return readings, layers | {3}


def _half_pairs(readings: list[Reading], layers: set[int]) -> Any:
    return [dataclasses.replace(r, layout="half") for r in readings], layers


def _swapped_factors(readings: list[Reading], layers: set[int]) -> Any:
    # llama.cpp #24823, vllm #27431: the short and long factor sets confused
    p = readings[0].spec.params
    return [_params(readings[0], short_factor=p["long_factor"],
                    long_factor=p["short_factor"])], layers  # fmt: skip


def _contiguous_sections(readings: list[Reading], layers: set[int]) -> Any:
    r = readings[0]
    assert r.mrope is not None
    return [dataclasses.replace(_spec(r, mrope_interleaved=False),
                                mrope={**r.mrope, "interleaved": False})], layers  # fmt: skip


def _swapped_bases(readings: list[Reading], layers: set[int]) -> Any:
    a, b = readings
    return [_spec(a, base=b.spec.base), _spec(b, base=a.spec.base)], layers


NEAR_MISSES = [
    ("gpt-oss yarn truncate", _drop_truncate),
    ("v5 gpt-oss yarn truncate", _drop_truncate),
    ("yarn deepseek mscale", _no_mscale_all_dim),
    ("deepseek-v2 mscale 0.707", _no_mscale_all_dim),
    ("v5 deepseek mscale", _no_mscale_all_dim),
    ("smollm3 no_rope_layers", _inverted_mask),
    ("v5 smollm3 no_rope_layers", _inverted_mask),
    ("cohere2 nope", _nope_missed),
    ("v5 cohere2 nope", _nope_missed),
    ("cohere2 nope", _half_pairs),
    ("longrope", _swapped_factors),
    ("v5 longrope", _swapped_factors),
    ("mrope interleaved partial", _contiguous_sections),
    ("gemma3", _swapped_bases),
    ("v5 gemma3", _swapped_bases),
]


@pytest.mark.parametrize(("name", "mutate"), NEAR_MISSES,
                         ids=[f"{n}-{m.__name__.strip('_')}" for n, m in NEAR_MISSES])  # fmt: skip
def test_each_misreading_is_seen(name, mutate):
    config = engine_cases.CASES[name].data()
    readings, layers = mutate(*posenc_reading(config))
    assert disagreements(config, readings, layers) != []


def test_the_bug_report_cases_have_their_windows():
    """Both sides of the LongRoPE switch; a NoPE window where a layer has none."""
    for name in ("longrope", "v5 longrope"):
        config = engine_cases.CASES[name].data()
        asked = engines.windows(posenc_reading(config)[0], config)
        assert [w["seq_len"] for w in asked] == [4096, 131072]
    for name, layer in (("smollm3 no_rope_layers", 3), ("cohere2 nope", 3)):
        config = engine_cases.CASES[name].data()
        assert nope_layers(config)["layers"] == [layer]
        asked = engines.windows(posenc_reading(config)[0], config)
        assert [(w.get("layer"), w.get("nope", False)) for w in asked][-1] == (layer, True)
