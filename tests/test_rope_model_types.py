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

from conftest import anchor

torch = anchor("torch")
transformers = anchor("transformers")

import hf_families  # noqa: E402
from posenc.families.rotary import model_types  # noqa: E402
from posenc.families.rotary.config import rope_layer_types, rope_spec  # noqa: E402
from posenc.families.rotary.module import Rotary  # noqa: E402

FAMILIES = hf_families.families()


def assert_table(name: str, table: Any, derived: Any) -> None:
    """``model_types.<name>`` equals what the installed transformers' modeling code does.

    Checked on every version: on the pinned one it holds, on another it names the drift
    (the tables are read from one version's code; a stale entry is a silent misreading).
    """
    if isinstance(table, dict):
        keys = set(table) | set(derived)
        wrong = sorted(k for k in keys if table.get(k) != derived.get(k))
        assert not wrong, (
            f"model_types.{name} differs from transformers {transformers.__version__}: "
            + ", ".join(f"{k}: table {table.get(k)}, modeling code {derived.get(k)}" for k in wrong)
        )
        return
    missing, stale = sorted(set(derived) - set(table)), sorted(set(table) - set(derived))
    assert not missing and not stale, (
        f"model_types.{name} differs from transformers {transformers.__version__}'s modeling "
        f"code: missing {missing}, not (or no longer) so there {stale}"
    )


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
    assert_table("DEFAULT_READS_PARTIAL", model_types.DEFAULT_READS_PARTIAL, derived["reads"])
    assert_table("DEFAULT_IGNORES_PARTIAL", model_types.DEFAULT_IGNORES_PARTIAL, derived["ignores"])


def test_mrope_default_sections_table(derived: dict[str, Any]) -> None:
    assert_table("MROPE_DEFAULT_SECTIONS", model_types.MROPE_DEFAULT_SECTIONS, derived["sections"])


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
    assert_table("INTERLEAVED", model_types.INTERLEAVED, found)


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


@pytest.mark.parametrize(
    "v4",
    [
        {"global_rope_theta": 160_000.0, "local_rope_theta": 10_000.0},
        {},  # the config class's own bases
        {"global_rope_theta": 80_000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ],
    ids=["both-bases", "defaults", "scaling-on-both"],
)
@pytest.mark.parametrize("model_type", ["modernbert", "modernbert_decoder"])
def test_modernbert_v4_bases_are_read_per_layer_type(model_type: str, v4: dict) -> None:
    # a v4 config.json names global_rope_theta and local_rope_theta; transformers reads
    # them into one RoPE per layer type, rope_scaling applying to both (unlike Gemma 3's)
    config = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, **v4}
    assert set(rope_layer_types(config)) == {"sliding_attention", "full_attention"}
    name = {"modernbert": "ModernBertConfig", "modernbert_decoder": "ModernBertDecoderConfig"}
    hf = _config(name[model_type], **v4, hidden_size=64, num_attention_heads=4)
    for layer_type in ("sliding_attention", "full_attention"):
        ours, theirs = rope_spec(config, layer_type), rope_spec(hf, layer_type)
        assert (ours.base, ours.rope_type, dict(ours.params)) == (
            theirs.base,
            theirs.rope_type,
            dict(theirs.params),
        )
        assert ours.base == hf.rope_parameters[layer_type]["rope_theta"]


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


# --------------------------------------------------------------------------------------
# Rotary modules that are not HF's contract: GPT-J's table, and modules of another kind.

#: HF's rotary contract: ``forward(x, position_ids)``, per layer type with ``layer_type``.
CONTRACTS = {("x", "position_ids"), ("x", "position_ids", "layer_type")}
#: The table as posenc has it (a test empties model_types.OTHER_KIND to re-derive it)
OTHER_KIND = dict(model_types.OTHER_KIND)


def _init_config_class(module: Any, cls: type) -> Any:
    """The config class ``cls.__init__``'s first argument is annotated with, or None."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    annotation = params[0].annotation if params else None
    if isinstance(annotation, str):
        name = annotation.strip("\"'").split("|")[0].strip()
        annotation = getattr(module, name, None) or getattr(transformers, name, None)
    return annotation if isinstance(annotation, type) else None


def _contract(cls: type) -> tuple[str, ...]:
    return tuple(inspect.signature(cls.forward).parameters)[1:]


@pytest.fixture(scope="module")
def rotary_classes() -> list[tuple[str, Any, type]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _rotary_classes()


def test_fixed_rope_tables(rotary_classes: list[tuple[str, Any, type]]) -> None:
    # HF's forward(x, position_ids), but no config or rope_type kept: a table made at
    # construction from the config's FIXED_ROPE key (GPT-J, CodeGen)
    derived = {
        family
        for family, _, cls in rotary_classes
        if _contract(cls) in CONTRACTS
        and not {"self.config", "self.rope_type"}
        & set(re.findall(r"self\.\w+", inspect.getsource(cls.__init__)))
    }
    assert_table("FIXED_ROPE", set(model_types.FIXED_ROPE), derived)
    for family, _, cls in rotary_classes:
        if family in model_types.FIXED_ROPE:
            key = model_types.FIXED_ROPE[family]
            assert f"config.{key}" in inspect.getsource(cls.__init__), (family, key)
    defaults = {
        t: getattr(transformers.CONFIG_MAPPING[t](), key)
        for t, key in model_types.FIXED_ROPE.items()
    }
    assert_table("FIXED_ROPE_DIM", model_types.FIXED_ROPE_DIM, defaults)
    # a config.json that omits the key gets the config class's default, as transformers does
    for model_type, dim in model_types.FIXED_ROPE_DIM.items():
        spec = rope_spec({"model_type": model_type, "n_embd": 4096, "n_head": 16})
        assert (spec.head_dim, spec.rotary_dim, spec.layout) == (256, dim, "interleaved")
        assert any("omits it" in note for note in spec.notes)


@pytest.mark.parametrize("family", sorted(model_types.FIXED_ROPE))
def test_from_hf_config_rotates_gptj_and_codegen_as_the_model(family: str) -> None:
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config = transformers.CONFIG_MAPPING[family](n_embd=64, n_head=4, rotary_dim=8, n_positions=16)
    rotary = next(
        obj
        for name, obj in vars(module).items()
        if name.endswith("RotaryEmbedding") and obj.__module__ == module.__name__
    )(config)
    gen = torch.Generator().manual_seed(0)
    # (batch, seq, heads, head_dim): the layout their attention rotates in
    q = torch.randn(1, 9, 4, 16, generator=gen, dtype=torch.float64)
    positions = torch.arange(9)[None]
    sin, cos = rotary(q.float(), positions)
    theirs = torch.cat([module.apply_rotary_pos_emb(q[..., :8].float(), sin, cos), q[..., 8:]], -1)
    ours = Rotary.from_hf_config(config, seq_dim=-3)
    assert (ours.rotary_dim, ours.layout) == (8, "interleaved")
    rotated, _ = ours(q, q, positions[0])
    bound = 5 * TABLE_BOUND + 2.0**-21
    assert (rotated - theirs.double()).abs().max().item() <= bound


#: RoPE modules by name: HF's ``*RotaryEmbedding`` (what patch_model finds) and the others
#: (DINOv3's ``*RopePositionEmbedding``, the conformers' ``*RotaryPositionalEmbedding``)
ROPE_MODULE = re.compile(r"^class (\w*(?:Rotary|Rope|RoPE)\w*Embedding)\(", re.M)


def _rope_modules() -> list[tuple[str, Any, type]]:
    """``(family, modeling module, class)`` of every RoPE module of the installed transformers."""
    out = []
    for path in sorted(hf_families._models_dir().glob("*/modeling_*.py")):
        names = ROPE_MODULE.findall(path.read_text(encoding="utf-8"))
        if names:
            module = importlib.import_module(f"transformers.models.{path.parent.name}.{path.stem}")
            out += [(path.parent.name, module, getattr(module, n)) for n in names]
    return out


def test_other_kind_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # A RoPE module of another kind: another calling contract than HF's, or HF's with
    # frequencies that patch_model does not recognise (Pixtral's axial ones). Its model
    # type must be in OTHER_KIND when its config names RoPE settings posenc would read
    # (a rotary module's always counts: patch_model refuses it). Derived with the table
    # emptied, since rope_spec refuses every entry because of it.
    from posenc import hf
    from posenc.families.rotary.config import has_rope_settings

    monkeypatch.setattr(model_types, "OTHER_KIND", {})
    derived: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for family, module, cls in _rope_modules():
            config_cls = _init_config_class(module, cls)
            # ESMFold2's atom encoder config has no model type: its model's config holds it
            model_type = getattr(config_cls, "model_type", "") or family
            if _contract(cls) not in CONTRACTS:
                rotary = cls.__name__.endswith("RotaryEmbedding")
                if rotary or (config_cls is not None and has_rope_settings(config_cls())):
                    derived.add(model_type)
            elif config_cls is not None and model_type in OTHER_KIND:
                holder = torch.nn.Module()
                holder.rotary_emb = cls(config_cls())
                try:
                    hf.patch_model(holder)
                except ValueError:
                    derived.add(model_type)
    assert_table("OTHER_KIND", set(OTHER_KIND), derived)


@pytest.mark.parametrize("model_type", sorted(OTHER_KIND))
def test_configs_of_another_kind_are_refused_naming_why(model_type: str) -> None:
    config = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    }
    why = rf"model_type '{model_type}'.*{re.escape(OTHER_KIND[model_type])}"
    with pytest.raises(ValueError, match=why):
        rope_spec(config)
    with pytest.raises(ValueError, match=why):
        Rotary.from_hf_config(config)


def test_eomt_and_musicflamingo_configs_are_refused() -> None:
    # their settings read as default RoPE before: frequencies neither model uses
    with pytest.raises(ValueError, match=r"eomt_dinov3.*patch-centre coordinates"):
        Rotary.from_hf_config(_config("EomtDinov3Config"))
    flamingo = _config("MusicFlamingoConfig")
    with pytest.raises(ValueError, match=r"musicflamingo.*timestamps.*config\.text_config"):
        rope_spec(flamingo)
    # its language model's RoPE is read, as the error says
    text = flamingo.text_config
    assert Rotary.from_hf_config(text).rotary_dim == text.hidden_size // text.num_attention_heads


# --------------------------------------------------------------------------------------
# A config.json without rope_theta: the base its config class defaults to.


def test_default_theta_table() -> None:
    # transformers' config classes set default_theta per model type (RotaryEmbeddingConfigMixin's
    # 10000 otherwise) and standardize rope_parameters with it when rope_theta is omitted; kept:
    # the scalar ones that every layer type of the class's own rope_parameters takes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        derived = {}
        for model_type in transformers.CONFIG_MAPPING:
            cls = transformers.CONFIG_MAPPING[model_type]
            theta = getattr(cls, "default_theta", None)
            if not isinstance(theta, (int, float)) or theta == 10_000.0:
                continue  # the mixin's default, or one base per layer type (Gemma 3, ModernBERT)
            parameters = getattr(cls(), "rope_parameters", None) or {}
            layers = [p for p in parameters.values() if isinstance(p, dict)] or [parameters]
            if {p.get("rope_theta") for p in layers} == {theta}:
                derived[cls.model_type] = float(theta)
    assert_table("DEFAULT_THETA_BY_TYPE", model_types.DEFAULT_THETA_BY_TYPE, derived)


DEFAULT_THETA_CASES = {
    "cohere": ("CohereConfig", 500_000.0),
    "exaone": ("ExaoneConfig", 500_000.0),  # a config class with no modeling code of its own
    "nomic_bert": ("NomicBertConfig", 1_000.0),
}


@pytest.mark.parametrize("model_type", sorted(DEFAULT_THETA_CASES))
def test_config_json_without_rope_theta_takes_the_model_types_default(model_type: str) -> None:
    name, theta = DEFAULT_THETA_CASES[model_type]
    config = {"model_type": model_type, **SMALL}
    spec = rope_spec(config)
    hf = _config(name, **SMALL)
    assert spec.base == hf.rope_parameters["rope_theta"] == theta
    assert any(f"defaults rope_theta to {theta:g}" in note for note in spec.notes)
    ours = torch.as_tensor(spec.frequencies().inv_freq, dtype=torch.float64)
    try:
        _, rotary = _hf_rotary(model_type, hf)
    except ModuleNotFoundError:
        theirs = 1.0 / theta ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    else:
        theirs = rotary.inv_freq.double()
    torch.testing.assert_close(ours, theirs, rtol=8 * 2.0**-24, atol=0.0)
    # a rope_theta the config gives wins, and says nothing of the default
    given = rope_spec({**config, "rope_theta": 10_000.0})
    assert given.base == 10_000.0
    assert not any("defaults rope_theta" in note for note in given.notes)
