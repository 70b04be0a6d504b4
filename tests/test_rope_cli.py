"""``posenc rope``: how a RoPE config is read, golden tables, and another engine's checked.

The expected values are written from the model cards and the papers' formulas
(Llama 3.1's scaling, YaRN's ``0.1 ln(factor) + 1``), not from posenc's reader;
the "other engines" are built here the way they go wrong (interleaved order,
float32 angles as HF computes them, no attention factor, a wrong base).
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from conftest import anchor
from posenc.faces.cli import main

torch = anchor("torch")
transformers = anchor("transformers")

LLAMA31 = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
YARN = {
    "model_type": "qwen2",
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_hidden_layers": 4,
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    },
}


def write_config(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def run(capsys, *argv):
    status = main(["rope", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys, *argv):
    status, out, err = run(capsys, *argv, "--json")
    assert status in (0, 1), err
    return status, json.loads(out)


# --------------------------------------------------------------------------------------
# reading


def llama3_frequencies(base, dim, factor, low, high, original):
    """Meta's apply_scaling (Llama 3.1), in float64."""
    omega = base ** (-np.arange(0, dim, 2) / dim)
    wavelen = 2 * np.pi / omega
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * omega / factor + smooth * omega
    scaled = np.where(wavelen > original / low, omega / factor, blended)
    return np.where(wavelen < original / high, omega, scaled)


def test_llama31_config_json_v4_sources(tmp_path, capsys):
    path = write_config(tmp_path, LLAMA31)
    status, doc = run_json(capsys, path)
    assert status == 0
    (rope,) = doc["ropes"]
    assert rope["rope_type"] == {"value": "llama3", "from": "rope_scaling.rope_type"}
    assert rope["base"] == {"value": 500000.0, "from": "rope_theta"}
    assert rope["head_dim"]["value"] == 128 and "4096 // 32" in rope["head_dim"]["from"]
    assert rope["rotary_dim"]["value"] == 128
    assert rope["layout"]["value"] == "half"
    params = rope["parameters"]
    assert params["factor"] == {"value": 8.0, "from": "rope_scaling.factor"}
    assert params["low_freq_factor"]["from"] == "rope_scaling.low_freq_factor"
    assert params["original_max_position_embeddings"]["value"] == 8192
    assert rope["attention_scaling"]["value"] == 1.0
    waves = rope["wavelengths"]
    assert waves["window"] == 8192 and waves["window_from"] == "original_max_position_embeddings"
    omega = llama3_frequencies(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    assert waves["full_turn_pairs"] == int(np.sum(2 * np.pi / omega <= 8192))
    assert waves["shortest"] == pytest.approx(2 * np.pi, rel=1e-12)
    assert waves["longest"] == pytest.approx(2 * np.pi / omega[-1], rel=1e-9)
    assert doc["nope_layers"] is None
    assert any("reads the same RoPE" in n for n in doc["notes"])  # transformers agrees

    status, out, _ = run(capsys, path)
    assert status == 0
    for text in ("llama3", "rope_scaling.factor", "500000", "original_max_position_embeddings"):
        assert text in out


def test_v5_rope_parameters_sources(tmp_path, capsys):
    data = dict(LLAMA31)
    params = dict(data.pop("rope_scaling"), rope_theta=data.pop("rope_theta"))
    data["rope_parameters"] = params
    _, doc = run_json(capsys, write_config(tmp_path, data))
    (rope,) = doc["ropes"]
    assert rope["parameters"]["factor"]["from"] == "rope_parameters.factor"
    assert rope["base"]["from"] == "rope_parameters.rope_theta"


def test_defaults_named_when_absent(tmp_path, capsys):
    data = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 2048}
    _, doc = run_json(capsys, write_config(tmp_path, data))
    (rope,) = doc["ropes"]
    assert rope["rope_type"]["value"] == "default"
    assert rope["base"]["value"] == 10000.0 and rope["base"]["from"].startswith("default")
    assert rope["parameters"] == {}
    assert rope["wavelengths"]["window_from"] == "max_position_embeddings"


def test_yarn_attention_scaling_and_defaults(tmp_path, capsys):
    path = write_config(tmp_path, YARN)
    _, doc = run_json(capsys, path)
    (rope,) = doc["ropes"]
    expected = 0.1 * math.log(4.0) + 1
    assert rope["attention_scaling"]["value"] == pytest.approx(expected, rel=1e-15)
    assert "0.1 ln(factor) + 1" in rope["attention_scaling"]["from"]
    assert rope["parameters"]["beta_fast"] == {"value": 32.0, "from": "default (yarn)"}
    # an optional key the config leaves out is labelled as a default, its meaning said
    assert rope["parameters"]["attention_factor"] == {
        "value": None,
        "from": "default: none (see attention scaling)",
    }
    for key in ("mscale", "mscale_all_dim"):
        assert rope["parameters"][key] == {"value": None, "from": "default: none"}
    assert rope["softmax_scale_factor"] is None  # no mscale_all_dim: no softmax factor
    _, out, _ = run(capsys, path)
    assert f"{expected:.6g}" in out and "0.1 ln(4) + 1" in out


def test_gemma3_text_config_per_layer_type(capsys):
    status, doc = run_json(capsys, "Gemma3TextConfig")
    assert status == 0 and doc["per_layer_type"]
    config = transformers.Gemma3TextConfig()
    ropes = {r["layer_type"]: r for r in doc["ropes"]}
    assert set(ropes) == {"sliding_attention", "full_attention"}
    for name, rope in ropes.items():
        expected = config.rope_parameters[name]["rope_theta"]
        assert rope["base"] == {
            "value": expected,
            "from": f"rope_parameters.{name}.rope_theta",
        }
        layers = [i for i, t in enumerate(config.layer_types) if t == name]
        assert rope["layers"] == layers
        assert rope["head_dim"]["value"] == config.head_dim
    assert ropes["sliding_attention"]["base"]["value"] == 10000.0
    assert ropes["full_attention"]["base"]["value"] == 1000000.0
    _, out, _ = run(capsys, "Gemma3TextConfig")
    assert "sliding_attention" in out and "full_attention" in out


def test_qwen2_vl_mrope_sections(tmp_path, capsys):
    _, doc = run_json(capsys, "Qwen2VLConfig")
    (rope,) = doc["ropes"]
    assert rope["mrope"]["section"] == [16, 24, 24]
    assert rope["mrope"]["interleaved"] is False
    assert rope["base"]["from"] == "text_config.rope_parameters.rope_theta"

    # the Hub's config.json: v4 rope_scaling with type "mrope", read as default
    data = {
        "model_type": "qwen2_vl",
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    }
    _, doc = run_json(capsys, write_config(tmp_path, data))
    (rope,) = doc["ropes"]
    assert rope["rope_type"]["value"] == "default"
    assert "'mrope'" in rope["rope_type"]["from"]
    assert rope["mrope"] == {
        "section": [16, 24, 24],
        "from": "rope_scaling.mrope_section",
        "interleaved": False,
        "order_from": "transformers' qwen2_vl module",
        "sums_to_pairs": True,
        "pairs": 64,
    }


def test_nope_layers(tmp_path, capsys):
    _, doc = run_json(capsys, "SmolLM3Config")
    config = transformers.SmolLM3Config()
    expected = [i for i, v in enumerate(config.no_rope_layers) if v == 0]
    assert expected and doc["nope_layers"]["layers"] == expected
    assert doc["ropes"][0]["layers"] == [i for i in range(config.num_hidden_layers)
                                         if i not in expected]  # fmt: skip
    data = {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 4,
            "nope_layers": [1, 3]}  # fmt: skip
    _, doc = run_json(capsys, write_config(tmp_path, data))
    assert doc["nope_layers"]["layers"] == [1, 3]
    assert doc["nope_layers"]["from"] == "nope_layers"


def test_set_on_a_config_class(capsys):
    status, doc = run_json(
        capsys, "LlamaConfig",
        "--set", "rope_parameters.rope_type=yarn",
        "--set", "rope_parameters.factor=4",
        "--set", "max_position_embeddings=8192",
        "--set", "rope_theta=500000",
    )  # fmt: skip
    assert status == 0
    (rope,) = doc["ropes"]
    assert rope["rope_type"]["value"] == "yarn"
    assert rope["parameters"]["factor"] == {"value": 4, "from": "rope_parameters.factor"}
    assert rope["base"]["value"] == 500000.0
    assert rope["parameters"]["original_max_position_embeddings"]["value"] == 8192
    assert doc["sets"]["rope_parameters.factor"] == 4

    _, doc = run_json(capsys, "Qwen2VLConfig", "--set", "text_config.rope_theta=250000.0")
    assert doc["ropes"][0]["base"]["value"] == 250000.0


def test_set_on_a_config_json(tmp_path, capsys):
    path = write_config(tmp_path, LLAMA31)
    _, doc = run_json(capsys, path, "--set", "rope_scaling.factor=16",
                      "--set", "text_config.rope_theta=1")  # fmt: skip
    (rope,) = doc["ropes"]
    assert rope["parameters"]["factor"] == {"value": 16, "from": "rope_scaling.factor"}
    assert rope["base"]["value"] == 500000.0  # the RoPE is read at the top level


# --------------------------------------------------------------------------------------
# golden tables and --compare


@pytest.fixture(scope="module")
def yarn_golden(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("golden")
    config = write_config(tmp, YARN)
    golden = tmp / "golden.npz"
    assert main(["rope", config, "--golden", str(golden), "--positions", "0:131072:1024"]) == 0
    return config, golden, tmp


def test_golden_arrays(yarn_golden):
    _, golden, _ = yarn_golden
    with np.load(golden) as g:
        assert set(g.files) == {"inv_freq", "positions", "cos", "sin", "cos_interleaved",
                                "sin_interleaved", "attention_scaling",
                                "softmax_scale"}  # fmt: skip
        positions, inv, cos, sin = g["positions"], g["inv_freq"], g["cos"], g["sin"]
        ci, si = g["cos_interleaved"], g["sin_interleaved"]
        scale = float(g["attention_scaling"])
        softmax = float(g["softmax_scale"])
    # transformers' Qwen2 attention: head_dim ** -0.5 (YaRN's factor is in the tables)
    assert softmax == pytest.approx(64**-0.5, rel=1e-15)  # 1024 // 16
    assert positions.dtype == np.int64 and np.array_equal(positions, np.arange(0, 131072, 1024))
    assert inv.dtype == cos.dtype == np.float64 and cos.shape == (128, 64)
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1, rel=1e-15)
    # the same values in float64 arithmetic: angles err by |angle| * 2**-52 at most
    angle = positions[:, None].astype(np.float64) * inv[None, :]
    bound = scale * (np.abs(angle) * 2.0**-51 + 2.0**-48)
    assert np.all(np.abs(cos[:, :32] - scale * np.cos(angle)) <= bound)
    assert np.all(np.abs(sin[:, 32:] - scale * np.sin(angle)) <= bound)
    assert np.array_equal(ci[:, 0::2], cos[:, :32]) and np.array_equal(si[:, 1::2], sin[:, 32:])


def test_compare_the_golden_itself_agrees(yarn_golden, capsys):
    config, golden, _ = yarn_golden
    status, out, _ = run(capsys, config, "--compare", golden)
    assert status == 0, out
    assert out.rstrip().endswith("agree")


def variant(tmp, name, **arrays):
    path = tmp / f"{name}.npz"
    np.savez(path, **arrays)
    return path


def test_compare_interleaved_layout(yarn_golden, capsys):
    config, golden, tmp = yarn_golden
    with np.load(golden) as g:
        path = variant(tmp, "inter", cos=g["cos_interleaved"], sin=g["sin_interleaved"],
                       positions=g["positions"])  # fmt: skip
    status, doc = run_json(capsys, config, "--compare", path)
    assert status == 0
    (result,) = doc["compare"]["results"]
    assert result["layout"] == "interleaved" and "detected" in result["summary"]
    status, doc = run_json(capsys, config, "--compare", path, "--layout", "half")
    assert status == 1
    assert "interleaved layout" in doc["compare"]["results"][0]["cause"]


def test_compare_float32_angles(yarn_golden, capsys):
    config, golden, tmp = yarn_golden
    with np.load(golden) as g:
        positions, inv, scale = g["positions"], g["inv_freq"], float(g["attention_scaling"])
    # HF's forward: float32 inv_freq, positions.float() * inv_freq, cos/sin in float32
    inv32 = torch.as_tensor(inv, dtype=torch.float32)
    freqs = torch.as_tensor(positions).float()[:, None] * inv32[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    path = variant(tmp, "f32", cos=(emb.cos() * scale).numpy(), sin=(emb.sin() * scale).numpy(),
                   positions=positions)  # fmt: skip
    status, out, _ = run(capsys, config, "--compare", path)
    assert status == 1
    assert "DIVERGE" in out and "likely cause: float32 angles" in out
    status, doc = run_json(capsys, config, "--compare", path)
    first = doc["compare"]["results"][0]["first_divergence"]
    assert first["difference"] > first["tolerance"]


def test_compare_missing_attention_factor(yarn_golden, capsys):
    config, golden, tmp = yarn_golden
    with np.load(golden) as g:
        scale = float(g["attention_scaling"])
        path = variant(tmp, "noattn", cos=g["cos"] / scale, sin=g["sin"] / scale,
                       positions=g["positions"])  # fmt: skip
    status, doc = run_json(capsys, config, "--compare", path)
    assert status == 1
    (result,) = doc["compare"]["results"]
    assert result["cause"].startswith("a missing attention factor")
    assert result["first_divergence"]["position"] == 0  # cos(0) = 1, not the scaling


def default_omega(base, dim):
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def test_compare_wrong_base(yarn_golden, capsys):
    _, _, tmp = yarn_golden
    plain = {k: v for k, v in YARN.items() if k != "rope_parameters"}
    plain["rope_theta"] = 10000.0
    path = write_config(tmp, plain, "plain.json")
    # inv_freq of the default schedule with base 10000 against a base of 500000
    other = dict(plain, rope_theta=500000.0)
    other_path = write_config(tmp, other, "other.json")
    inv = variant(tmp, "base_inv", inv_freq=default_omega(10000.0, 64))
    status, doc = run_json(capsys, other_path, "--compare", inv)
    assert status == 1
    cause = doc["compare"]["results"][0]["cause"]
    assert cause.startswith("a wrong base") and "base 10000 " in cause
    # tables: posenc's golden of the base-10000 config, compared against base 500000
    golden = tmp / "base10k.npz"
    assert main(["rope", path, "--golden", str(golden), "--positions", "0:2048"]) == 0
    capsys.readouterr()
    with np.load(golden) as g:
        tables = variant(tmp, "base_tab", cos=g["cos"], sin=g["sin"])
    status, doc = run_json(capsys, other_path, "--compare", tables)
    assert status == 1
    assert "base 10000 " in doc["compare"]["results"][0]["cause"]


def test_compare_linear_factor(tmp_path, capsys):
    data = {"hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 4096,
            "rope_scaling": {"rope_type": "linear", "factor": 4.0}}  # fmt: skip
    config = write_config(tmp_path, data)
    omega = default_omega(10000.0, 64)
    status, doc = run_json(capsys, config, "--compare", variant(tmp_path, "none", inv_freq=omega))
    assert status == 1 and "scaling was not applied" in doc["compare"]["results"][0]["cause"]
    twice = variant(tmp_path, "twice", inv_freq=omega / 16)
    status, doc = run_json(capsys, config, "--compare", twice)
    assert status == 1 and "applied twice" in doc["compare"]["results"][0]["cause"]
    # HF's float32 inv_freq agrees at float32 precision
    hf = variant(tmp_path, "f32", inv_freq=(omega / 4).astype(np.float32))
    status, _ = run_json(capsys, config, "--compare", hf)
    assert status == 0


def test_golden_per_layer_type(tmp_path, capsys):
    golden = tmp_path / "gemma.npz"
    status, out, _ = run(
        capsys, "Gemma3TextConfig", "--golden", golden, "--positions", "0,1,100000"
    )
    assert status == 0 and "wrote" in out
    with np.load(golden) as g:
        names = set(g.files)
        assert {"sliding_attention/cos", "full_attention/inv_freq"} <= names
        assert g["full_attention/cos"].shape == (3, 256)
        sliding = g["sliding_attention/inv_freq"]
    assert np.allclose(sliding, default_omega(10000.0, 256), rtol=1e-14, atol=0)
    status, doc = run_json(capsys, "Gemma3TextConfig", "--compare", golden)
    assert status == 0 and len(doc["compare"]["results"]) == 6
    # unprefixed arrays: matched to the layer type they agree with
    with np.load(golden) as g:
        path = variant(tmp_path, "full", inv_freq=g["full_attention/inv_freq"])
    status, doc = run_json(capsys, "Gemma3TextConfig", "--compare", path)
    assert status == 0 and doc["compare"]["results"][0]["layer_type"] == "full_attention"


# --------------------------------------------------------------------------------------
# bad input: one line on stderr, exit status 2


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "malformed.json").write_text('{"hidden_size": 64,')
    write_config(tmp_path, {"hidden_size": 64, "num_attention_heads": 2,
                            "rope_scaling": {"rope_type": "nonsense"}}, "unknown.json")  # fmt: skip
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notnpz.npz").write_text("not a zip")
    np.savez(tmp_path / "nothing.npz", weights=np.zeros(3))
    np.savez(tmp_path / "prefixed.npz", **{"other/inv_freq": np.ones(64)})
    write_config(tmp_path, YARN, "yarn.json")
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["malformed.json"],
        ["unknown.json"],
        ["binary.json"],
        ["empty"],
        ["missing.json"],
        ["NoSuchThingConfig"],
        ["yarn.json", "--set", "no-equals-sign"],
        ["yarn.json", "--set", "hidden_size.x=1"],
        ["LlamaConfig", "--set", "not_a_field=1"],
        ["LlamaConfig", "--set", 'hidden_size="wide"'],
        ["yarn.json", "--golden", "g.npz", "--positions", "10:5"],
        ["yarn.json", "--golden", "g.npz", "--positions", "a,b"],
        ["yarn.json", "--golden", "g.npz", "--positions", "0:10:0"],
        ["yarn.json", "--golden", "g.npz", "--positions", "-1,4"],
        ["yarn.json", "--golden", "g.npz"],
        ["yarn.json", "--golden", "g.txt", "--positions", "0:4"],
        ["yarn.json", "--golden", "nodir/g.npz", "--positions", "0:4"],
        ["yarn.json", "--compare", "missing.npz"],
        ["yarn.json", "--compare", "notnpz.npz"],
        ["yarn.json", "--compare", "nothing.npz"],
        ["yarn.json", "--compare", "prefixed.npz"],
        ["yarn.json", "--compare", "nothing.npz", "--layout", "diagonal"],
    ],
)
def test_bad_input_one_line_exit_2(bad_files, capsys, argv, monkeypatch):
    monkeypatch.chdir(bad_files)
    status, out, err = run(capsys, *argv)
    assert status == 2, (out, err)
    assert err.count("\n") == 1 and "error:" in err and "Traceback" not in err, err
    assert out == ""


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_config(tmp_path, capsys):
    path = write_config(tmp_path, YARN)
    os.chmod(path, 0)
    status, _, err = run(capsys, path)
    assert status == 2 and err.count("\n") == 1 and "Permission denied" in err


# --------------------------------------------------------------------------------------
# exit status as --help says: 1 when an engine asked for gives no answer


def test_engines_not_installed_exit_1(tmp_path, capsys, monkeypatch):
    from posenc.integration.analysis.engines import ENGINES

    empty = tmp_path / "no-engines"
    empty.mkdir()
    monkeypatch.setenv("POSENC_ENGINES", str(empty))  # and no --engine-python: none is found
    path = write_config(tmp_path, YARN)
    status, out, err = run(capsys, path, "--engines", "all")
    assert status == 1, err
    for name in ENGINES:
        assert re.search(rf"^  {re.escape(name)} +not installed", out, re.MULTILINE), out
    # one given a Python that does not exist answers nothing either
    status, _, err = run(capsys, path, "--engines", "mlx", "--engine-python", "mlx=/nonexistent")
    assert status == 1, err
    # near miss: an engine that answers "same" exits 0 (tests/test_rope_engines.py::test_same);
    # without --engines nothing is asked, and the reading alone exits 0
    assert run(capsys, path)[0] == 0
    assert main(["rope", "--help"]) == 0
    assert "(not installed included)" in " ".join(capsys.readouterr().out.split())


def test_keys_read_as_the_model_reads_them(tmp_path, capsys):
    # Llama's default RoPE ignores partial_rotary_factor: the whole head rotates
    llama = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "rope_theta": 500000.0,
        "partial_rotary_factor": 0.5,
    }
    _, doc = run_json(capsys, write_config(tmp_path, llama))
    (rope,) = doc["ropes"]
    assert rope["rotary_dim"]["value"] == 128
    assert rope["partial_rotary_factor"]["value"] == 0.5
    assert "ignored by the model" in rope["partial_rotary_factor"]["from"]
    assert any("is ignored" in n for n in doc["notes"])
    # Phi's reads it
    _, doc = run_json(capsys, write_config(tmp_path, {**llama, "model_type": "phi"}))
    assert doc["ropes"][0]["rotary_dim"]["value"] == 64

    # GPT-J: no RoPE key, base 10000 over rotary_dim channels, interleaved pairs
    gptj = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64}
    _, doc = run_json(capsys, write_config(tmp_path, gptj))
    (rope,) = doc["ropes"]
    assert rope["rotary_dim"]["value"] == 64 and rope["head_dim"]["value"] == 256
    assert rope["base"]["value"] == 10000.0
    assert rope["layout"]["value"] == "interleaved"

    # GLM-4 rotates interleaved pairs
    _, doc = run_json(capsys, "Glm4Config")
    assert doc["ropes"][0]["layout"]["value"] == "interleaved"


# --------------------------------------------------------------------------------------
# the golden file's YaRN frequencies against HF's own


LLAMA_YARN = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "max_position_embeddings": 65536,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
    },
}
# v4 keys, the ramp's betas and no truncation; a top-level
# original_max_position_embeddings (Phi-3's) wins over rope_scaling's in HF
LLAMA_YARN_V4 = {
    "model_type": "llama",
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 2048,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 16,
        "beta_slow": 2,
        "truncate": False,
    },
}


@pytest.mark.usefixtures("quiet_transformers")
@pytest.mark.parametrize("config", [LLAMA_YARN, LLAMA_YARN_V4], ids=["v5", "v4-betas-untruncated"])
def test_golden_yarn_inv_freq_equals_hf(config, tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    golden = tmp_path / "golden.npz"
    path = write_config(tmp_path, config)
    assert main(["rope", path, "--golden", str(golden), "--positions", "0:4096:512"]) == 0
    with np.load(golden) as g:
        ours, scaling = g["inv_freq"], float(g["attention_scaling"])
    hf_config = transformers.LlamaConfig(**{k: v for k, v in config.items() if k != "model_type"})
    inv_freq, hf_scaling = ROPE_INIT_FUNCTIONS["yarn"](hf_config, device="cpu")
    theirs = inv_freq.double().numpy()
    assert ours.shape == theirs.shape
    # HF computes in float32: base ** float32(2k / d) with the exponent and the base
    # rounded (x_k = (2k / d) ln base off by |x_k| 2**-24), pow, the reciprocal and the
    # division by the factor one rounding of 2**-24 each, then the blend with a float32
    # ramp whose few 2**-24 move the result by up to factor - 1 times as much: in all
    # (1 + x_k + factor - 1) 2**-23 relative (tests/test_rotary_schedules.py); posenc's
    # float64 is exact before one rounding, 2**-53, far below
    params = config.get("rope_parameters") or config["rope_scaling"]
    base = params.get("rope_theta", config.get("rope_theta"))
    x = 2 * np.arange(ours.size) / (2 * ours.size) * math.log(base)
    tol = (1 + x + params["factor"] - 1) * 2.0**-23
    rel = np.abs(theirs - ours) / ours
    assert (rel <= tol).all(), f"max relative deviation {rel.max():.3g} at {rel.argmax()}"
    # 0.1 ln(factor) + 1 in Python floats: log within an ulp, three roundings
    assert scaling == pytest.approx(hf_scaling, rel=8 * 2.0**-53, abs=0)


@pytest.mark.parametrize("name", ["EomtDinov3Config", "MusicFlamingoConfig"])
def test_config_of_another_kind_refused_with_its_reason(capsys, name):
    # its RoPE module is of another kind: posenc rope says why, as rope_spec does
    from posenc.families.rotary.config import rope_spec

    with pytest.raises(ValueError) as refused:
        rope_spec(getattr(transformers, name)())
    status, out, err = run(capsys, name)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and str(refused.value) in err, err
