"""Reading a config as its model's own code does: posenc.rotary.model_types against transformers.

Every table of :mod:`posenc.rotary.model_types` is derived here again from the
installed transformers' modeling code, and compared: which default RoPE reads
``partial_rotary_factor``, which models rotate interleaved pairs, which rotary
modules fall back on their own M-RoPE sections. Then ``Rotary.from_hf_config`` is
checked against the models themselves: the queries it rotates equal the ones the
model's own rotary module and ``apply_rotary_pos_emb`` give.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_families  # noqa: E402
from posenc.families.rotary import model_types  # noqa: E402
from posenc.families.rotary.config import rope_layer_types, rope_spec  # noqa: E402
from posenc.families.rotary.module import Rotary  # noqa: E402

PINNED = transformers.__version__ == "5.23.0"
FAMILIES = hf_families.families()


def _rotary_classes() -> list[tuple[str, Any, type]]:
    out = []
    for family in FAMILIES:
        for module in hf_families._family_modules(family):
            for name, obj in vars(module).items():
                if (
                    isinstance(obj, type)
                    and name.endswith("RotaryEmbedding")
                    and obj.__module__ == module.__name__
                ):
                    out.append((family, module, obj))
    return out


def _config_model_type(module: Any, function: Any) -> str | None:
    """The model type of the config class ``function``'s ``config`` argument is annotated with."""
    annotation = inspect.signature(function).parameters["config"].annotation
    if isinstance(annotation, str):
        name = annotation.strip("\"'").split("|")[0].strip()
        annotation = getattr(module, name, None) or getattr(transformers, name, None)
    return getattr(annotation, "model_type", None) if isinstance(annotation, type) else None


@pytest.fixture(scope="module")
def derived() -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        classes = _rotary_classes()
    reads: set[str] = set()
    ignores: set[str] = set()
    for _family, module, cls in classes:
        compute = getattr(cls, "compute_default_rope_parameters", None)
        if compute is None:
            continue
        model_type = _config_model_type(module, compute)
        if not model_type:
            continue  # a config class with no model type of its own (Evolla's SaProt)
        source = inspect.getsource(compute)
        (reads if "partial_rotary_factor" in source else ignores).add(model_type)
    sections = {}
    pattern = re.compile(r"\"mrope_section\",\s*(\[[\d,\s]+\])")
    for family in FAMILIES:
        for module in hf_families._family_modules(family):
            found = pattern.search(inspect.getsource(module))
            if found:
                sections[family] = tuple(int(v) for v in re.findall(r"\d+", found.group(1)))
    return {"reads": reads, "ignores": ignores, "sections": sections}


def test_default_rope_partial_factor_table(derived: dict[str, Any]) -> None:
    assert not derived["reads"] & derived["ignores"]
    assert not model_types.DEFAULT_READS_PARTIAL & model_types.DEFAULT_IGNORES_PARTIAL
    # a model type in the wrong table is a silent misreading, whatever the version
    assert not derived["reads"] & model_types.DEFAULT_IGNORES_PARTIAL
    assert not derived["ignores"] & model_types.DEFAULT_READS_PARTIAL
    if PINNED:
        assert derived["reads"] == model_types.DEFAULT_READS_PARTIAL
        assert derived["ignores"] == model_types.DEFAULT_IGNORES_PARTIAL


def test_mrope_default_sections_table(derived: dict[str, Any]) -> None:
    for family, section in derived["sections"].items():
        if family in model_types.MROPE_DEFAULT_SECTIONS or PINNED:
            assert model_types.MROPE_DEFAULT_SECTIONS.get(family) == section, family
    if PINNED:
        assert set(derived["sections"]) == set(model_types.MROPE_DEFAULT_SECTIONS)


def _pairing(rotate: Any) -> str:
    """``"interleaved"`` if ``rotate`` pairs channel 0 with 1, ``"half"`` if with the middle one."""
    x = torch.zeros(1, 1, 1, 8)
    x[..., 0] = 1.0
    moved = torch.nonzero(rotate(x).flatten()).flatten().tolist()
    return {1: "interleaved", 4: "half"}[moved[0]]


def test_interleaved_table() -> None:
    found = set()
    for family in [*FAMILIES, "gptj", "codegen"]:
        for module in hf_families._family_modules(family):
            source = inspect.getsource(module)
            # the text model's pairing: its own function where the module has a vision one too
            names = ("rotate_half_llm", "rotate_half_text", "rotate_half", "rotate_every_two")
            rotate = next((getattr(module, n) for n in names if hasattr(module, n)), None)
            if rotate is not None and rotate.__module__ == module.__name__:
                pairing = _pairing(rotate)
            elif "view_as_complex" in source:
                pairing = "interleaved"  # complex numbers over reshape(..., -1, 2)
            else:
                continue
            if pairing == "interleaved":
                found.add(family)
    if PINNED:
        assert found == model_types.INTERLEAVED
    else:
        assert found & set(FAMILIES) <= model_types.INTERLEAVED


# --------------------------------------------------------------------------------------
# from_hf_config against the models' own rotary modules.


def _config(name: str, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, name)(**kwargs)


def _hf_rotary(family: str, config: Any) -> tuple[Any, Any]:
    """The family's modeling module and its rotary module built from ``config``."""
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    rotary = next(
        obj
        for name, obj in vars(module).items()
        if name.endswith("RotaryEmbedding") and obj.__module__ == module.__name__
    )(config)
    return module, rotary


SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
# HF's float32 angles at positions < 9: |error| <= 9 * 2**-24 per angle, plus the
# rounding of cos/sin and of the product; times |q| (at most about 5 here) when rotating
TABLE_BOUND = 9 * 2.0**-24 + 4 * 2.0**-24

TABLE_CASES = {
    # Llama's default RoPE covers the whole head whatever partial_rotary_factor says
    "llama-partial": ("llama", "LlamaConfig", {**SMALL, "partial_rotary_factor": 0.5}),
    # Phi's reads it: half the head rotates
    "phi-partial": ("phi", "PhiConfig", {**SMALL, "partial_rotary_factor": 0.5}),
    # every other rope type reads it through ROPE_INIT_FUNCTIONS, Llama's too
    "llama-linear-partial": (
        "llama",
        "LlamaConfig",
        {**SMALL, "rope_parameters": {**LINEAR, "partial_rotary_factor": 0.5}},
    ),
}


@pytest.mark.parametrize("case", sorted(TABLE_CASES))
def test_from_hf_config_reads_partial_factor_as_the_model(case: str) -> None:
    family, name, kwargs = TABLE_CASES[case]
    config = _config(name, **kwargs)
    _, rotary = _hf_rotary(family, config)
    positions = torch.arange(9)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    ours = Rotary.from_hf_config(config)
    assert ours.rotary_dim == cos.shape[-1]
    our_cos, our_sin = ours.cos_sin(positions[0], dtype=torch.float64)
    torch.testing.assert_close(our_cos, cos[0].double(), rtol=0, atol=TABLE_BOUND)
    torch.testing.assert_close(our_sin, sin[0].double(), rtol=0, atol=TABLE_BOUND)


APPLY_CASES = {
    # GLM-4 rotates interleaved pairs of the first half of each head
    "glm4": ("glm4", "Glm4Config", {**SMALL, "head_dim": 16}),
    # Cohere rotates interleaved pairs of the whole head
    "cohere": ("cohere", "CohereConfig", SMALL),
    "llama": ("llama", "LlamaConfig", SMALL),
}


@pytest.mark.parametrize("case", sorted(APPLY_CASES))
def test_from_hf_config_rotates_as_the_model(case: str) -> None:
    family, name, kwargs = APPLY_CASES[case]
    config = _config(name, **kwargs)
    module, rotary = _hf_rotary(family, config)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 9, 16, generator=gen, dtype=torch.float64)
    positions = torch.arange(9)[None]
    cos, sin = rotary(q.float(), positions)
    theirs, _ = module.apply_rotary_pos_emb(q.float(), q.float(), cos, sin)
    ours, _ = Rotary.from_hf_config(config)(q, q, positions[0])
    bound = 5 * TABLE_BOUND + 2.0**-21
    assert (ours - theirs.double()).abs().max().item() <= bound


def test_from_hf_config_for_a_config_json_dict_without_head_dim() -> None:
    # a DeepSeek-V3 config.json names no head_dim: only qk_rope_head_dim channels rotate
    config = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "rope_theta": 10000,
        "max_position_embeddings": 163840,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    }
    spec = rope_spec(config)
    assert (spec.head_dim, spec.rotary_dim) == (64, 64)
    assert any("qk_rope_head_dim" in n for n in spec.notes)
    hf = _config(
        "DeepseekV3Config",
        **{k: v for k, v in config.items() if k != "model_type"},
    )
    module = importlib.import_module("transformers.models.deepseek_v3.modeling_deepseek_v3")
    theirs = module.DeepseekV3RotaryEmbedding(hf).inv_freq.double()
    ours = torch.as_tensor(spec.frequencies().inv_freq, dtype=torch.float64)
    # HF's float32 inv_freq: a few float32 roundings of each value
    torch.testing.assert_close(ours, theirs, rtol=8 * 2.0**-24, atol=0.0)


def test_gptj_config_has_rope_without_a_rope_key() -> None:
    config = {"model_type": "gptj", "n_embd": 256, "n_head": 4, "rotary_dim": 16}
    rotary = Rotary.from_hf_config(config)
    spec = rope_spec(config)
    assert (spec.base, spec.rotary_dim, spec.layout) == (10000.0, 16, "interleaved")
    assert rotary.rotary_dim == 16
    from transformers.models.gptj import modeling_gptj

    table = modeling_gptj.create_sinusoidal_positions(8, 16).double()  # [sin | cos] halves
    cos, sin = rotary.cos_sin(torch.arange(8), dtype=torch.float64)
    torch.testing.assert_close(sin[:, 0::2], table[:, :8], rtol=0, atol=4 * 2.0**-24 * 8)
    torch.testing.assert_close(cos[:, 0::2], table[:, 8:], rtol=0, atol=4 * 2.0**-24 * 8)


def test_gemma3_v4_local_base_is_the_sliding_layers_base() -> None:
    config = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 16,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    assert set(rope_layer_types(config)) == {"sliding_attention", "full_attention"}
    sliding = rope_spec(config, "sliding_attention")
    full = rope_spec(config, "full_attention")
    assert (sliding.rope_type, sliding.base) == ("default", 10_000.0)
    assert (full.rope_type, full.base, full.params["factor"]) == ("linear", 1e6, 8.0)
    hf = _config("Gemma3TextConfig", **{k: v for k, v in config.items() if k != "model_type"})
    for layer_type in ("sliding_attention", "full_attention"):
        assert rope_spec(hf, layer_type).base == rope_spec(config, layer_type).base


def test_mrope_without_sections_and_ernie_vl_refuse() -> None:
    # Qwen2-VL's rotary module falls back on its own sections: M-RoPE, so Rotary refuses
    qwen = {"model_type": "qwen2_vl_text", "hidden_size": 128, "num_attention_heads": 1}
    qwen["rope_theta"] = 1e6
    assert rope_spec(qwen).mrope_section == (16, 24, 24)
    with pytest.raises(ValueError, match=r"M-RoPE \(mrope_section=\[16, 24, 24\]\)"):
        Rotary.from_hf_config(qwen)
    ernie = {"model_type": "ernie4_5_vl_moe_text", "hidden_size": 128, "num_attention_heads": 1}
    ernie["rope_theta"] = 500000.0
    assert rope_spec(ernie).mrope_permuted
    with pytest.raises(ValueError, match="permutes the frequencies"):
        Rotary.from_hf_config(ernie)
