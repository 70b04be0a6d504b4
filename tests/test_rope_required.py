"""``posenc rope`` judges a config's RoPE keys as transformers judges them.

The sweep: every rope type transformers knows (``ROPE_INIT_FUNCTIONS`` and the
``_validate_<type>_rope_parameters`` methods of its ``RotaryEmbeddingConfigMixin``) times
every key transformers requires for it, read off transformers itself (its validation
called on ``{"rope_type": type}`` raises a ``KeyError`` naming them). For each pair, a
Llama ``config.json`` with everything else in place goes without that key, in v4 form
(``rope_scaling`` beside a top-level ``rope_theta``) and in v5 form (``rope_parameters``
holding ``rope_theta``); ``LlamaConfig.from_dict`` says whether transformers refuses it,
and ``posenc rope`` must refuse it if and only if transformers does, with transformers'
own reason. What transformers accepts without the key, it has filled in: posenc's row for
that key is labelled a default, and posenc's reading equals transformers'.

Also here: Gemma 3's v4 keys named as they stand in the file, and the softmax-scale
factor that DeepSeek's ``mscale_all_dim`` sets, checked against transformers' own
attention.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys

import pytest

from conftest import anchor
from posenc.faces.cli import main
from posenc.families.rotary.config import HF_ORIGINAL_MAX_TYPES, HF_REQUIRED
from posenc.integration.analysis.rope_reading import SOFTMAX_RTOL, softmax_verdict

transformers = anchor("transformers")
anchor("torch")
rope_utils = anchor("transformers.modeling_rope_utils")

HEAD_PAIRS = 8  # hidden_size 64 over 4 heads: head_dim 16, 8 pairs
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "vocab_size": 32,
    "max_position_embeddings": 4096,
}
#: A value for every key any rope type requires (valid for the type that reads it).
VALUES = {
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 1024,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "short_factor": [1.0] * HEAD_PAIRS,
    "long_factor": [2.0] * HEAD_PAIRS,
}


def hf_types() -> list[str]:
    """Every rope type transformers knows: its init functions and its validation methods."""
    mixin = rope_utils.RotaryEmbeddingConfigMixin
    validated = {
        m.group(1)
        for name in dir(mixin)
        if (m := re.fullmatch(r"_validate_(\w+)_rope_parameters", name))
    }
    return sorted(set(rope_utils.ROPE_INIT_FUNCTIONS) | validated)


def hf_required(rope_type: str) -> set[str]:
    """The keys transformers requires for ``rope_type``: its validation names them."""
    validate = getattr(
        rope_utils.RotaryEmbeddingConfigMixin, f"_validate_{rope_type}_rope_parameters"
    )
    try:
        validate(transformers.LlamaConfig(), {"rope_type": rope_type})
    except KeyError as exc:
        named = re.search(r"\{.*\}", exc.args[0])
        assert named is not None, exc.args[0]
        return {"rope_type", *eval(named.group(0))}  # a set literal of str
    return {"rope_type"}


TYPES = hf_types()
CASES = [(t, k) for t in TYPES for k in sorted(hf_required(t))]


def test_the_table_is_transformers_own():
    assert set(HF_REQUIRED) == set(TYPES)
    for rope_type in TYPES:
        assert HF_REQUIRED[rope_type] == hf_required(rope_type), rope_type
    # the types whose original_max_position_embeddings transformers fills in itself
    filled = set()
    for rope_type in TYPES:
        params = {"rope_type": rope_type, **{k: VALUES[k] for k in hf_required(rope_type)
                                             if k != "rope_type"}}  # fmt: skip
        params.pop("original_max_position_embeddings", None)
        with_key = _hf_config({**LLAMA, "rope_parameters": params})
        if "original_max_position_embeddings" in with_key.rope_parameters:
            filled.add(rope_type)
    assert filled == set(HF_ORIGINAL_MAX_TYPES)
    assert len(CASES) >= 20  # 8 types in transformers 5.24: 21 (type, key) pairs


def _hf_config(data):
    from posenc.integration.analysis.rope_reading import quiet

    with quiet():
        return transformers.LlamaConfig.from_dict(copy.deepcopy(data))


def full_config(rope_type: str, form: str) -> dict:
    """A Llama config.json whose rope dict has every key transformers requires."""
    params = {k: VALUES[k] for k in hf_required(rope_type) if k != "rope_type"}
    params = {"rope_type": rope_type, **params}
    if form == "v5":
        params.setdefault("rope_theta", VALUES["rope_theta"])
        return {**LLAMA, "rope_parameters": params}
    theta = params.pop("rope_theta", VALUES["rope_theta"])
    return {**LLAMA, "rope_theta": theta, "rope_scaling": params}


def without(data: dict, key: str) -> dict:
    """``data`` without ``key``, at the top level and in its rope dict."""
    data = copy.deepcopy(data)
    data.pop(key, None)
    for group in ("rope_scaling", "rope_parameters"):
        if group in data:
            data[group].pop(key, None)
    return data


def transformers_verdict(data: dict) -> str | None:
    """transformers' reason for refusing ``data``, ``None`` when it accepts it."""
    try:
        _hf_config(data)
    except Exception as exc:  # its KeyError (or any refusal): the reason as it says it
        return str(exc.args[0]) if exc.args else repr(exc)
    return None


def posenc_rope(tmp_path, capsys, data: dict, *argv: str) -> tuple[int, str, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    status = main(["rope", str(path), *argv])
    out, err = capsys.readouterr()
    return status, out, err


#: The row of ``posenc rope --json`` that shows each key transformers may fill in.
ROW = {"rope_type": "rope_type", "rope_theta": "base"}


@pytest.mark.parametrize("form", ["v4", "v5"])
@pytest.mark.parametrize(("rope_type", "key"), CASES, ids=[f"{t}-{k}" for t, k in CASES])
def test_refused_iff_transformers_refuses(tmp_path, capsys, rope_type, key, form):
    data = without(full_config(rope_type, form), key)
    reason = transformers_verdict(data)
    status, out, err = posenc_rope(tmp_path, capsys, data, "--json")
    if reason is not None:
        assert status == 2, (reason, out)
        assert err.count("\n") == 1 and "posenc: error:" in err
        assert reason in err  # transformers' own words, the missing key named
        assert f"{{'{key}'}}" in reason
        return
    assert status == 0, (out, err)
    doc = json.loads(out)
    (rope,) = doc["ropes"]
    row = rope[ROW[key]] if key in ROW else rope["parameters"][key]
    assert row["from"].startswith(("default", "= max_position_embeddings")), row
    if key == "original_max_position_embeddings":
        assert "HF's default" in row["from"] and row["value"] == LLAMA["max_position_embeddings"]
    # what transformers filled in is what posenc reads
    assert any("reads the same RoPE" in n for n in doc["notes"]), doc["notes"]


@pytest.mark.parametrize("form", ["v4", "v5"])
@pytest.mark.parametrize("rope_type", [t for t in TYPES if t != "axial"])
def test_nothing_missing_both_accept(tmp_path, capsys, rope_type, form):
    # the near miss of the sweep: the same configs with every key in place
    data = full_config(rope_type, form)
    assert transformers_verdict(data) is None
    status, out, err = posenc_rope(tmp_path, capsys, data, "--json")
    assert status == 0, err
    assert any("reads the same RoPE" in n for n in json.loads(out)["notes"])


def test_axial_is_not_a_token_rope(tmp_path, capsys):
    # 'axial' (Pixtral's 2-D patch RoPE) gives no frequencies over token positions: posenc
    # refuses it whole, whatever its keys; without rope_type it is 'default' in both
    status, _, err = posenc_rope(tmp_path, capsys, full_config("axial", "v5"))
    assert status == 2 and "unknown rope type 'axial'" in err


def test_the_issue_yarn_without_factor(tmp_path, capsys):
    yarn = {"rope_type": "yarn", "original_max_position_embeddings": 1024}
    data = {**LLAMA, "rope_theta": 10000.0, "rope_scaling": yarn}
    status, out, err = posenc_rope(tmp_path, capsys, data)
    assert status == 2 and out == ""
    assert ("Missing required keys in `rope_parameters` for 'rope_type'='yarn': {'factor'}"
            in err)  # fmt: skip
    # near miss: the factor given as null is derived, as transformers' yarn derives it
    data["rope_scaling"]["factor"] = None
    assert transformers_verdict(data) is None
    status, out, err = posenc_rope(tmp_path, capsys, data, "--json")
    assert status == 0, err
    (rope,) = json.loads(out)["ropes"]
    factor = rope["parameters"]["factor"]
    assert factor["value"] == 4096 / 1024
    assert factor["from"] == ("= max_position_embeddings / original_max_position_embeddings "
                              "(rope_scaling.factor is null)")  # fmt: skip


def test_no_rope_type_reads_default_and_shows_what_is_ignored(tmp_path, capsys):
    data = without(full_config("llama3", "v4"), "rope_type")
    status, out, err = posenc_rope(tmp_path, capsys, data, "--json")
    assert status == 0, err
    doc = json.loads(out)
    (rope,) = doc["ropes"]
    assert rope["rope_type"] == {"value": "default", "from": "default (no rope_type given)"}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        assert rope["parameters"][key] == {
            "value": VALUES[key],
            "from": f"rope_scaling.{key}: ignored by 'default' RoPE",
        }
    assert any("names no rope_type" in n and "Unrecognized keys" in n for n in doc["notes"])


# --------------------------------------------------------------------------------------
# Gemma 3: the sliding layers' base is rope_local_base_freq, named so.

GEMMA3_1B = {  # google/gemma-3-1b-it's config.json, its RoPE part
    "model_type": "gemma3_text",
    "head_dim": 256,
    "hidden_size": 1152,
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "max_position_embeddings": 32768,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
}
GEMMA3_4B = {  # google/gemma-3-4b-it's config.json: RoPE in text_config, bases left out
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "head_dim": 256,
        "hidden_size": 2560,
        "num_attention_heads": 8,
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model"},
}


def _sources(doc) -> dict:
    return {
        r["layer_type"]: {
            "rope_type": r["rope_type"]["from"],
            "base": r["base"]["from"],
            **{k: v["from"] for k, v in r["parameters"].items()},
        }
        for r in doc["ropes"]
    }


def test_gemma3_1b_names_rope_local_base_freq(tmp_path, capsys):
    status, out, err = posenc_rope(tmp_path, capsys, GEMMA3_1B, "--json")
    assert status == 0, err
    doc = json.loads(out)
    src = _sources(doc)
    assert src["sliding_attention"]["base"] == "rope_local_base_freq"
    assert src["full_attention"]["base"] == "rope_theta"
    assert src["sliding_attention"]["rope_type"] == (
        "default (rope_scaling applies to the full_attention layers only)"
    )
    assert not any("None" in s or "_attention." in s for r in src.values() for s in r.values())
    bases = {r["layer_type"]: r["base"]["value"] for r in doc["ropes"]}
    assert bases == {"sliding_attention": 10000, "full_attention": 1000000}
    assert any("reads the same RoPE" in n for n in doc["notes"])
    _, text, _ = posenc_rope(tmp_path, capsys, GEMMA3_1B)
    assert "None." not in text and "rope_local_base_freq" in text


def test_gemma3_4b_names_text_config_keys_and_defaults(tmp_path, capsys):
    status, out, err = posenc_rope(tmp_path, capsys, GEMMA3_4B, "--json")
    assert status == 0, err
    doc = json.loads(out)
    src = _sources(doc)
    full, sliding = src["full_attention"], src["sliding_attention"]
    assert full["rope_type"] == "text_config.rope_scaling.rope_type"
    assert full["factor"] == "text_config.rope_scaling.factor"
    # neither base is in this file: Gemma3TextConfig's defaults, labelled so
    assert full["base"] == "default (the config class's rope_theta: 1000000)"
    assert sliding["base"] == "default (the config class's rope_local_base_freq: 10000)"
    assert any("reads the same RoPE" in n for n in doc["notes"])
    # near miss: the local base given in the file is named by its key there
    given = copy.deepcopy(GEMMA3_4B)
    given["text_config"]["rope_local_base_freq"] = 20000.0
    _, out, _ = posenc_rope(tmp_path, capsys, given, "--json")
    doc = json.loads(out)
    assert _sources(doc)["sliding_attention"]["base"] == "text_config.rope_local_base_freq"
    (sliding_rope,) = [r for r in doc["ropes"] if r["layer_type"] == "sliding_attention"]
    assert sliding_rope["base"]["value"] == 20000.0


# --------------------------------------------------------------------------------------
# The softmax-scale factor DeepSeek's mscale_all_dim sets.

DEEPSEEK_V3 = {  # DeepSeek-V3's RoPE and attention settings on tiny layers
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 32,
    "moe_intermediate_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 32,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}  # fmt: skip


def test_deepseek_v3_shows_its_softmax_scale_factor(tmp_path, capsys):
    status, out, err = posenc_rope(tmp_path, capsys, DEEPSEEK_V3, "--json")
    assert status == 0, err
    doc = json.loads(out)
    (rope,) = doc["ropes"]
    expected = (0.1 * 1.0 * math.log(40) + 1.0) ** 2  # YaRN's mscale, squared
    row = rope["softmax_scale_factor"]
    assert row["value"] == pytest.approx(expected, rel=SOFTMAX_RTOL)
    assert "get_mscale(factor, mscale_all_dim) ** 2" in row["from"]
    assert rope["attention_scaling"]["value"] == 1.0  # mscale / mscale_all_dim: 1
    # transformers' own attention: scaling = (16 + 8) ** -0.5 times the factor
    assert any("transformers applies the softmax scale factor" in n for n in doc["notes"])
    _, text, _ = posenc_rope(tmp_path, capsys, DEEPSEEK_V3)
    assert "softmax scale factor" in text and f"{expected:.6g}" in text


def test_no_softmax_row_where_the_config_sets_none(tmp_path, capsys):
    # near misses: mscale_all_dim 0 (yarn_apply_mscale's "if mscale_all_dim:"), and absent
    for value in (0.0, None):
        data = copy.deepcopy(DEEPSEEK_V3)
        if value is None:
            del data["rope_scaling"]["mscale_all_dim"]
        else:
            data["rope_scaling"]["mscale_all_dim"] = value
        _, out, _ = posenc_rope(tmp_path, capsys, data, "--json")
        doc = json.loads(out)
        assert doc["ropes"][0]["softmax_scale_factor"] is None
        assert not any("softmax" in n for n in doc["notes"])


def test_a_model_that_does_not_apply_it_is_told(tmp_path, capsys):
    # a Llama config with DeepSeek's yarn keys: LlamaAttention keeps head_dim ** -0.5
    data = {**LLAMA, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 1024, "mscale": 1.0,
                             "mscale_all_dim": 1.0}}  # fmt: skip
    status, out, err = posenc_rope(tmp_path, capsys, data, "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["ropes"][0]["softmax_scale_factor"]["value"] == pytest.approx(
        (0.1 * math.log(4.0) + 1) ** 2, rel=SOFTMAX_RTOL
    )
    (note,) = [n for n in doc["notes"] if "softmax" in n]
    assert note.startswith("WARNING:") and "does not apply" in note


def test_softmax_verdict_tolerance_near_misses():
    base, factor = 192**-0.5, (0.1 * math.log(40) + 1) ** 2
    eps = sys.float_info.epsilon
    assert softmax_verdict(base * factor * (1 + 16 * eps), base, factor) == "applied"
    assert softmax_verdict(base * factor * (1 + 64 * eps), base, factor) == "other"
    assert softmax_verdict(base * (1 - 16 * eps), base, factor) == "not applied"
    assert softmax_verdict(base * (1 - 64 * eps), base, factor) == "other"
