"""``posenc rope --engines``: another engine's own code run on a config, against transformers.

The runner is checked with a fake engine, a small reader script run by this
environment's Python that answers the way an engine can (the right tables, a wrong
base, an exception, no answer at all). MLX itself is checked when ``posenc engines
build mlx`` has built it: its expected verdicts are written from mlx-lm's source
(``models/llama.py``, ``models/rope_utils.py`` of mlx-lm 0.32.2), not from the runner.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
import textwrap

import pytest

import background
from conftest import anchor, built_engine
from posenc.faces.cli import main
from posenc.integration.analysis import engines

torch = anchor("torch")
transformers = anchor("transformers")

BASE = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 8,
    "rms_norm_eps": 1e-5,
    "vocab_size": 10,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
}

#: The fake engine: exact half-layout tables of a default RoPE, or what ``fake_mode`` says.
FAKE_READER = textwrap.dedent(
    """
    import json, math, sys, time
    request = json.load(sys.stdin)
    config = request["config"]
    mode = config.get("fake_mode", "same")
    if mode == "crash":
        raise ValueError("Unsupported RoPE type 'bogus'")
    if mode == "hang":
        time.sleep(60)
    if mode == "garbage":
        print("not json")
        sys.exit(0)
    base = config["rope_theta"] * (1.5 if mode == "different" else 1.0)
    dims = config["hidden_size"] // config["num_attention_heads"]
    omega = [base ** (-2 * k / dims) for k in range(dims // 2)]
    windows = []
    for w in request["windows"]:
        ps = w["positions"]
        windows.append({"seq_len": w["seq_len"], "positions": ps, "mode": "fake",
                        "cos": [[math.cos(p * o) for o in omega] for p in ps],
                        "sin": [[math.sin(p * o) for o in omega] for p in ps]})
    json.dump({"version": "fake 1.0", "source": "installed", "layout": "half",
               "rotary_dim": dims, "attention_scaling": 1.0, "windows": windows,
               "note": ""}, sys.stdout)
    """
)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Register the fake reader as engine ``mlx`` (timeout 3 s) run by this Python."""
    reader = tmp_path / "fake_reader.py"
    reader.write_text(FAKE_READER)
    monkeypatch.setitem(engines.ENGINES, "mlx", engines.Engine("mlx", reader, timeout_s=3.0))
    return sys.executable


def write_config(tmp_path, **changes):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **changes}))
    return str(path)


def run_engines(capsys, config, *argv):
    status = main(["rope", config, "--json", *argv])
    out, err = capsys.readouterr()
    assert status in (0, 1), err
    return status, json.loads(out)


def test_same(tmp_path, capsys, fake):
    status, doc = run_engines(capsys, write_config(tmp_path), "--engines", "mlx",
                              "--engine-python", f"mlx={fake}")  # fmt: skip
    assert status == 0
    assert doc["config"].endswith("config.json")
    mlx = doc["engines"]["mlx"]
    assert set(mlx) >= {"verdict", "version", "source", "max_abs_diff", "first_difference",
                        "attention_scaling", "note"}  # fmt: skip
    assert mlx["verdict"] == "same"
    assert mlx["version"] == "fake 1.0" and mlx["source"] == "installed"
    assert mlx["first_difference"] is None
    assert mlx["attention_scaling"] == {"engine": 1.0, "reference": 1.0}
    # a default RoPE has one window: max_position_embeddings, its ends and middle
    assert [w["seq_len"] for w in mlx["windows"]] == [4096]
    assert mlx["windows"][0]["positions"] == [0, 1, 2, 2048, 4094, 4095]


def test_different_names_the_first_pair(tmp_path, capsys, fake):
    config = write_config(tmp_path, fake_mode="different")
    status, doc = run_engines(capsys, config, "--engines", "all", "--engine-python",
                              f"mlx={fake}")  # fmt: skip
    assert status == 1
    mlx = doc["engines"]["mlx"]
    assert mlx["verdict"] == "different"
    first = mlx["first_difference"]
    # pair 0 turns at omega = 1 whatever the base: the first wrong value is pair 1 at position 1
    assert (first["position"], first["pair"]) == (1, 1)
    assert mlx["max_abs_diff"] > 0.1


def test_a_dying_reader_is_an_error_with_its_message(tmp_path, capsys, fake):
    config = write_config(tmp_path, fake_mode="crash")
    status, doc = run_engines(capsys, config, "--engines", "mlx", "--engine-python",
                              f"mlx={fake}")  # fmt: skip
    assert status == 1
    mlx = doc["engines"]["mlx"]
    # a refusal comes as the protocol's JSON; a reader that dies is an error, summarised
    assert mlx["verdict"] == "error"
    assert mlx["note"] == ("the reader exited with status 1: ValueError: Unsupported RoPE "
                           "type 'bogus'")  # fmt: skip


def test_hang_times_out(tmp_path, capsys, fake):
    config = write_config(tmp_path, fake_mode="hang")
    status, doc = run_engines(capsys, config, "--engines", "mlx", "--engine-python",
                              f"mlx={fake}")  # fmt: skip
    assert status == 1
    mlx = doc["engines"]["mlx"]
    assert mlx["verdict"] == "error"
    assert "no answer within 3 s" in mlx["note"]


def test_no_json_is_an_error(tmp_path, capsys, fake):
    config = write_config(tmp_path, fake_mode="garbage")
    _, doc = run_engines(capsys, config, "--engines", "mlx", "--engine-python", f"mlx={fake}")
    assert doc["engines"]["mlx"]["verdict"] == "error"
    assert "no JSON" in doc["engines"]["mlx"]["note"]


def test_missing_env_is_not_installed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POSENC_ENGINES", str(tmp_path / "nowhere"))
    status, doc = run_engines(capsys, write_config(tmp_path), "--engines", "mlx")
    assert status == 1  # no answer from an engine asked for: --help's exit 1
    mlx = doc["engines"]["mlx"]
    assert mlx["verdict"] == "not installed"
    assert str(tmp_path / "nowhere") in mlx["note"] and "/bin/python" in mlx["note"]
    assert "posenc engines build mlx" in mlx["note"]


def test_human_table(tmp_path, capsys, fake):
    status = main(["rope", write_config(tmp_path, fake_mode="different"), "--engines", "mlx",
                   "--engine-python", f"mlx={fake}"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 1
    assert "engine     verdict" in out
    assert "mlx        different" in out
    assert "first difference: seq_len 4096, position 1, pair 1" in out


#: what the errors list: every registered engine, then "all"
ACCEPTED = ", ".join([*engines.ENGINES, "all"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--engines", "vlm"],
            f"--engines 'vlm': unknown engine 'vlm' (accepted: {ACCEPTED})",
        ),
        (["--engines", ","], f"no engine named (accepted: {ACCEPTED})"),
        (["--engine-python", "mlx=/x"], "--engine-python goes with --engines"),
        (["--engines", "mlx", "--engine-python", "mlx"], "must look like NAME=PATH"),
        (["--engines", "mlx", "--engine-python", "foo=/x"], "unknown engine 'foo'"),
    ],
)
def test_errors(tmp_path, capsys, argv, message):
    status = main(["rope", write_config(tmp_path), *argv])
    err = capsys.readouterr().err
    assert status == 2
    assert message in err


# --------------------------------------------------------------------------------------
# MLX itself (when `posenc engines build mlx` has built it), on the cross-engine cases.

#: case -> (verdict, the windows (seq_len) that differ, the likely cause's start), from
#: mlx-lm 0.32.2's source (models/<model_type>.py, models/rope_utils.py).
MLX_EXPECTED = {
    "default": ("same", [], None),
    "linear": ("same", [], None),
    "dynamic": ("same", [], None),  # DynamicNTKScalingRoPE: recomputes its base per call
    "yarn": ("same", [], None),
    # YarnRoPE computes its mscale from the factor and never reads attention_factor
    "yarn attention_factor": ("different", [32768, 131072], None),
    # deepseek_v3.py: traditional (interleaved) pairs, as transformers' rope_interleave
    "yarn deepseek mscale": ("same", [], None),
    # SuScaledRoPE always applies long_factor: within the original context it differs
    "longrope": ("different", [4096], "LongRoPE's long_factor"),
    "longrope inside": ("different", [4096], "LongRoPE's long_factor"),
    "llama3": ("same", [], None),
    "proportional": ("same", [], None),
    "partial_rotary_factor": ("same", [], None),  # stablelm.py: nn.RoPE(partial dims)
    # mlx-lm is text only: the rotary modules take a token offset, no multi-axis positions
    "mrope sections": ("different", [32768], "text positions only"),
    "mrope interleaved": ("different", [262144], "text positions only"),
    # llama.py / qwen2.py read rope_theta and rope_scaling only, not rope_parameters
    "v5 llama3": ("different", [8192, 131072], "the config's RoPE was not read at all"),
    "v5 yarn": ("different", [32768, 131072], "the yarn scaling was not applied"),
    "gemma3": ("same", [], None),  # gemma3_text.py: rope_local_base_freq on sliding layers
    # gemma3_text.py reads rope_theta (default 1e6) and rope_local_base_freq (default 1e4):
    # the sliding layers agree by their defaults, the global ones miss the linear factor
    "v5 gemma3": ("different", [131072], "the linear scaling was not applied"),
    # rope_utils.py YarnRoPE.yarn_find_correction_range always floors and ceils the
    # correction range (truncate is not read): GPT-OSS's truncate false keeps it unrounded,
    # so the ramp's pairs turn at other frequencies (first at pair 9; the angles part by
    # radians at long positions); with truncate true the same module agrees (below)
    "gpt-oss yarn truncate": ("different", [4096, 131072], None),
    # gpt_oss.py ModelArgs reads rope_theta and rope_scaling, not rope_parameters: nn.RoPE
    # at its default base 150000, no YaRN
    "v5 gpt-oss yarn truncate": ("different", [4096, 131072], "the yarn scaling was not"),
    # deepseek_v3.py: initialize_rope's YarnRoPE carries mscale / mscale_all_dim (1 here),
    # the attention's scale apply_yarn_mscale's mscale(factor, mscale_all_dim)^2
    "deepseek-v2 mscale 0.707": ("same", [], None),
    # deepseek_v3.py reads rope_scaling only: no YaRN, and a softmax scale without mscale^2
    "v5 deepseek mscale": ("different", [4096, 163840], "the yarn scaling was not applied"),
    # smollm3.py Model.__init__ puts NoPE() (returns x) as layers[3].self_attn.rope: the
    # forward calls it, it rotates nothing (the nope window, layer 3)
    "smollm3 no_rope_layers": ("same", [], None),
    # smollm3.py's ModelArgs is llama.py's: rope_theta (default 10000), not rope_parameters;
    # the NoPE layer still agrees
    "v5 smollm3 no_rope_layers": ("different", [65536], "a wrong base"),
    # cohere2.py Attention.__call__ applies self.rope only if use_sliding_window
    # ((layer_idx + 1) % sliding_window_pattern != 0): layer 3 holds a rope it never calls
    "cohere2 nope": ("same", [], None),
    # cohere2.py reads sliding_window_pattern (default 4), not layer_types, and rope_theta
    # (default 50000), not rope_parameters: both defaults are the config's values
    "v5 cohere2 nope": ("same", [], None),
    # phi3.py reads rope_scaling only: nn.RoPE, no LongRoPE factors, no magnitude
    "v5 longrope": ("different", [4096, 131072], "the longrope scaling was not applied"),
    # qwen3_5.py DecoderLayer: is_linear = (layer_idx + 1) % full_attention_interval != 0
    # (layer_types is not read; the case gives full_attention_interval 1, as the released
    # configs give both keys); its rotary module takes a token offset (text positions
    # agree: a quarter of the head, interleave and base right), never multi-axis positions
    "mrope interleaved partial": ("different", [262144], "text positions only"),
}
#: Cases whose softmax scale mlx does not give as transformers does (or not at all).
MLX_SOFTMAX_DIFFERS = {
    "partial_rotary_factor",  # stablelm.py computes its scale inline
    "v5 deepseek mscale",  # deepseek_v3.py: no rope_scaling, so no mscale(factor)^2
}
#: Phi-3's layout read by llama.py: original_max_position_embeddings must be inside.
LLAMA_TOP_LEVEL_ORIGINAL = {**BASE, "model_type": "llama", "hidden_size": 3072,
                            "num_attention_heads": 32, "max_position_embeddings": 131072,
                            "original_max_position_embeddings": 4096,
                            "rope_scaling": {"rope_type": "longrope",
                                             "short_factor": [1.0] * 48,
                                             "long_factor": [2.0] * 48}}  # fmt: skip


def _gpt_oss_truncate() -> dict:
    from posenc.integration.analysis.engine_cases import CASES

    config = CASES["gpt-oss yarn truncate"].data()
    config["rope_scaling"]["truncate"] = True
    return config


#: GPT-OSS's config with truncate true: YaRN's rounded correction range, as mlx-lm's.
GPT_OSS_TRUNCATE = _gpt_oss_truncate()


def batch():
    """Every cross-engine case and the llama.py refusal, run by MLX in one child process;
    the suite runs it in the background (tests/background.py)."""
    from posenc.integration.analysis.engine_cases import CASES

    configs = [c.data() for c in CASES.values()] + [LLAMA_TOP_LEVEL_ORIGINAL, GPT_OSS_TRUNCATE]
    results = engines.run_cases("mlx", configs)
    names = [*CASES, "llama top-level original", "gpt-oss yarn truncate true"]
    return dict(zip(names, results, strict=True))


@pytest.fixture(scope="module")
def mlx_results():
    built_engine("mlx")
    return background.result("batch-test_rope_engines")


def test_every_case_has_an_expected_mlx_verdict():
    from posenc.integration.analysis.engine_cases import CASES

    assert set(MLX_EXPECTED) == set(CASES)


@pytest.mark.parametrize("case", list(MLX_EXPECTED))
def test_mlx_reading(mlx_results, case):
    verdict, differing, cause = MLX_EXPECTED[case]
    mlx = mlx_results[case]
    assert mlx.verdict == verdict, (mlx.note, mlx.cause)
    assert mlx.version.startswith("mlx 0.32")
    assert [w["seq_len"] for w in mlx.windows if not w["same"]] == differing
    if cause is not None:
        assert mlx.cause.startswith(cause), mlx.cause
    # the attention's own softmax scale (where its module keeps one), against transformers'
    softmax = mlx.attention_scaling.get("softmax_scale")
    if case not in MLX_SOFTMAX_DIFFERS:
        assert softmax["engine"] == pytest.approx(softmax["reference"], rel=1e-6)
    # every window says whether mlx rotates its layer; only the nope windows do not
    assert [w["rotates"] for w in mlx.windows] == [not w["nope"] for w in mlx.windows]


def test_mlx_yarn_attention_factor_is_its_own_mscale(mlx_results):
    mlx = mlx_results["yarn attention_factor"]
    assert mlx.attention_scaling["reference"] == pytest.approx(1.2)
    yarn_mscale = 0.1 * math.log(4.0) + 1  # YaRN's 0.1 ln(factor) + 1
    assert mlx.attention_scaling["engine"] == pytest.approx(yarn_mscale, rel=1e-6)
    assert "attention scaling: mlx 1.13863, transformers 1.2" in mlx.note


def test_mlx_deepseek_softmax_scale_carries_mscale_all_dim(mlx_results):
    mlx = mlx_results["yarn deepseek mscale"]
    mscale = 0.1 * 1.0 * math.log(40.0) + 1  # get_mscale(factor 40, mscale_all_dim 1)
    expected = (32 + 64) ** -0.5 * mscale**2  # qk_head_dim ** -0.5 * mscale ** 2
    assert mlx.attention_scaling["softmax_scale"]["engine"] == pytest.approx(expected)
    assert mlx.layout == {"engine": "interleaved", "reference": "interleaved"}


def test_mlx_nope_layers_read_from_the_forward(mlx_results):
    # smollm3.py: layers[3].self_attn.rope is NoPE (called, returns x); cohere2.py: layer
    # 3's attention never calls its nn.RoPE (use_sliding_window false)
    smol = mlx_results["smollm3 no_rope_layers"].windows[-1]
    assert smol["nope"] and smol["layer"] == 3 and smol["rotates"] is False
    assert "NoPE leaves q/k as they are" in smol["mode"]
    cohere = mlx_results["cohere2 nope"].windows[-1]
    assert cohere["nope"] and cohere["layer"] == 3 and cohere["rotates"] is False
    assert "the forward never called layers[3].self_attn.rope" in cohere["mode"]


def test_mlx_gpt_oss_differs_by_truncate_only(mlx_results):
    # the same YarnRoPE agrees once transformers rounds the correction range too
    assert mlx_results["gpt-oss yarn truncate"].verdict == "different"
    assert mlx_results["gpt-oss yarn truncate true"].verdict == "same"


def test_mlx_switching(mlx_results):
    # rope_utils.py SuScaledRoPE: long_factor at every length, from initialisation
    assert mlx_results["longrope"].switching.startswith("never: long_factor at every length")
    assert "SuScaledRoPE.__init__" in mlx_results["longrope inside"].switching
    # rope_utils.py DynamicNTKScalingRoPE.__call__: the base from each call's length
    assert mlx_results["dynamic"].switching.startswith("per forward pass, from the call's")
    # phi3.py reads no rope_parameters: a plain nn.RoPE, no switch
    assert mlx_results["v5 longrope"].switching.startswith("never: the module applied is mlx")
    assert mlx_results["yarn"].switching is None and mlx_results["default"].switching is None


def test_mlx_refusal_names_its_error_and_place(mlx_results):
    mlx = mlx_results["llama top-level original"]
    assert mlx.verdict == "refused"
    # the engine's own error, and where in mlx-lm it was raised
    assert mlx.note.startswith("KeyError: 'original_max_position_embeddings' (at ")
    assert "mlx_lm/models/rope_utils.py" in mlx.note


def test_windows_around_the_original_length(tmp_path, capsys, fake):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    config = write_config(tmp_path, max_position_embeddings=131072, rope_scaling=scaling)
    _, doc = run_engines(capsys, config, "--engines", "mlx", "--engine-python", f"mlx={fake}")
    got = [(w["seq_len"], w["positions"]) for w in doc["engines"]["mlx"]["windows"]]
    assert got == [
        (8192, [0, 1, 2, 4096, 8190, 8191]),
        (131072, [0, 1, 2, 8191, 8192, 8193, 65536, 131070, 131071]),
    ]
    # the fake computes unscaled frequencies: llama3's low-frequency pairs differ
    assert doc["engines"]["mlx"]["verdict"] == "different"


# --------------------------------------------------------------------------------------
# Batches, layer types and M-RoPE, with a fake engine that speaks the readers' protocol.

#: Exact default-RoPE tables per layer type and per M-RoPE axis; ``fake_mode`` misreads.
BATCH_READER = textwrap.dedent(
    """
    import math, struct, sys
    sys.path.insert(0, {readers!r})
    from protocol import serve

    def answer(request):
        config = request["config"]
        mode = config.get("fake_mode", "same")
        if mode == "crash":
            raise KeyError("original_max_position_embeddings")
        params = config.get("rope_parameters") or {{}}
        dims = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        windows = []
        for w in request["windows"]:
            lt = w.get("layer_type")
            if mode == "swap-types" and lt is not None:
                lt = {{"full_attention": "sliding_attention",
                      "sliding_attention": "full_attention"}}[lt]
            base = (params[lt] if lt else params).get("rope_theta") or config["rope_theta"]
            omega = [base ** (-2 * k / dims) for k in range(dims // 2)]
            ids = w.get("position_ids")
            rows = []
            for i, p in enumerate(w["positions"]):
                if ids is None or mode == "token-index":
                    rows.append([p * o for o in omega])
                else:
                    axes = config["fake_axes"]
                    rows.append([ids[axes[k]][i] * o for k, o in enumerate(omega)])
            cut = bf16 if mode.startswith("bf16") else float
            windows.append({{"seq_len": w["seq_len"], "positions": w["positions"],
                            "layer_type": w.get("layer_type"), "mode": "fake",
                            "cos": [[cut(math.cos(a)) for a in r] for r in rows],
                            "sin": [[cut(math.sin(a)) for a in r] for r in rows]}})
        dtype = {{"bf16": "bfloat16", "bf16-as-float32": "float32"}}.get(mode, "float64")
        return {{"version": "fake 2.0", "source": "installed", "layout": "half",
                "dtype": dtype, "attention_scaling": 1.0, "windows": windows,
                "note": ""}}

    def bf16(x):
        # round to bfloat16 (8 significant bits, to nearest even) through float32's bits
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", bits))[0]

    sys.exit(serve(answer))
    """
)


@pytest.fixture
def batch_fake(tmp_path, monkeypatch):
    """Register the protocol-speaking fake as engine ``mlx``, run by this Python."""
    reader = tmp_path / "batch_reader.py"
    reader.write_text(BATCH_READER.format(readers=str(engines.READERS)))
    monkeypatch.setitem(engines.ENGINES, "mlx", engines.Engine("mlx", reader, timeout_s=20.0))
    return pathlib.Path(sys.executable)


GEMMA = {**BASE, "model_type": "gemma3_text", "head_dim": 256, "num_hidden_layers": 6,
         "max_position_embeddings": 8192, "sliding_window": 512,
         "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
         "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 1e4}}}  # fmt: skip
QWEN2_VL = {**BASE, "model_type": "qwen2_vl", "hidden_size": 512, "num_attention_heads": 4,
            "rope_theta": 1e6, "max_position_embeddings": 32768,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}  # fmt: skip


def sections():
    """The axis each of QWEN2_VL's 64 pairs reads (Qwen2-VL's contiguous [16, 24, 24])."""
    from posenc.families.rotary.multiaxis.mrope import mrope_axes

    return list(mrope_axes((16, 24, 24), 64))


def test_a_batch_is_one_child_and_a_refusal_does_not_stop_it(batch_fake):
    configs = [{**BASE}, {**BASE, "fake_mode": "crash"}, {**BASE, "rope_theta": 500000.0}]
    results = engines.run_cases("mlx", configs, batch_fake)
    assert [r.verdict for r in results] == ["same", "refused", "same"]
    refused = results[1]
    # the engine's own error and where it was raised
    assert refused.note.startswith("KeyError: 'original_max_position_embeddings' (at ")
    assert "in answer" in refused.note
    assert all(r.version == "fake 2.0" for r in (results[0], results[2]))


def test_run_cases_refuses_a_config_posenc_cannot_read(batch_fake):
    with pytest.raises(ValueError, match="config 0"):
        engines.run_cases("mlx", [{**BASE, "rope_scaling": {"rope_type": "bogus"}}], batch_fake)


def test_per_layer_type_windows_are_read_per_type(batch_fake):
    from posenc.integration.analysis import rope_reading

    wins = engines.windows(rope_reading.read(rope_reading.Loaded(GEMMA, "g", "file")))
    assert [(w["layer_type"], w["layer"]) for w in wins] == [("full_attention", 5),
                                                            ("sliding_attention", 0)]  # fmt: skip
    same, swapped = engines.run_cases("mlx", [GEMMA, {**GEMMA, "fake_mode": "swap-types"}],
                                      batch_fake)  # fmt: skip
    assert same.verdict == "same", same.note
    assert swapped.verdict == "different"
    assert swapped.first_difference["layer_type"] == "full_attention"
    assert {w["layer_type"] for w in swapped.windows if not w["same"]} == {
        "full_attention", "sliding_attention"}  # fmt: skip


def test_gemma3_layer_types_from_the_pattern():
    from posenc.integration.analysis import rope_reading

    config = {k: v for k, v in GEMMA.items() if k not in ("layer_types", "rope_parameters")}
    config.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=3)
    readings = rope_reading.read(rope_reading.Loaded(config, "g", "file"))
    layers = {r.layer_type: r.layers for r in readings}
    # Gemma3TextConfig: every n-th layer (1-based) is full attention
    assert layers == {"sliding_attention": [0, 1, 3, 4], "full_attention": [2, 5]}


def test_deepseek_v3_pairs_the_checkpoint_channels_by_default():
    from posenc.integration.analysis import rope_reading

    config = {**BASE, "model_type": "deepseek_v3", "qk_rope_head_dim": 64,
              "qk_nope_head_dim": 32, "kv_lora_rank": 64, "v_head_dim": 32}  # fmt: skip
    (reading,) = rope_reading.read(rope_reading.Loaded(config, "d", "file"))
    assert rope_reading.checkpoint_layout(reading) == "interleaved"
    (off,) = rope_reading.read(rope_reading.Loaded({**config, "rope_interleave": False}, "d",
                                                   "file"))  # fmt: skip
    assert rope_reading.checkpoint_layout(off) == "half"


@pytest.mark.parametrize(
    ("changes", "verdict", "cause"),
    [
        ({"fake_axes": sections()}, "same", None),
        # the rotary module took the token index: every pair at the temporal position
        ({"fake_axes": sections(), "fake_mode": "token-index"}, "different",
         "text positions only"),
        # Qwen2-VL's contiguous sections where Qwen3-VL's interleave is meant
        ({"rope_scaling": {"type": "mrope", "mrope_section": [24, 20, 20],
                           "mrope_interleaved": True},
          "fake_axes": [0] * 24 + [1] * 20 + [2] * 20}, "different", "the other order"),
    ],
)  # fmt: skip
def test_mrope_is_judged_at_multi_axis_positions(batch_fake, changes, verdict, cause):
    (result,) = engines.run_cases("mlx", [{**QWEN2_VL, **changes}], batch_fake)
    assert result.verdict == verdict, result.note
    multi = [w for w in result.windows if w["position_ids"] is not None]
    assert len(multi) == 1 and multi[0]["position_ids"][1][:4] == [0, 0, 1, 8192]
    if cause is None:
        assert all(w["same"] for w in result.windows)
        return
    assert result.cause.startswith(cause)
    # text positions (all axes equal) cannot tell the sections apart
    assert [w["same"] for w in result.windows] == [True, False]


def test_compare_mrope_shapes_and_a_plain_rope():
    import numpy as np

    from posenc.integration.analysis import rope_compare, rope_reading

    (plain,) = rope_reading.read(rope_reading.Loaded({**BASE}, "b", "file"))
    with pytest.raises(ValueError, match="not an M-RoPE"):
        rope_compare.compare_mrope(plain, np.zeros((3, 2), int), np.ones((2, 64)), np.ones((2, 64)))
    (mrope,) = rope_reading.read(rope_reading.Loaded(QWEN2_VL, "q", "file"))
    with pytest.raises(ValueError, match=r"\(2, 64\)"):
        rope_compare.compare_mrope(mrope, np.zeros((3, 2), int), np.ones((2, 63)), np.ones((2, 63)))


def test_a_broken_environment_is_an_error_not_a_hang(tmp_path, capsys, fake):
    # a "python" that is no program, and one that dies before reading the request
    broken = tmp_path / "env" / "bin" / "python"
    broken.parent.mkdir(parents=True)
    broken.write_text("not a program")
    _, doc = run_engines(capsys, write_config(tmp_path), "--engines", "mlx",
                         "--engine-python", f"mlx={broken}")  # fmt: skip
    assert doc["engines"]["mlx"]["verdict"] == "error"
    assert "cannot start" in doc["engines"]["mlx"]["note"]
    dying = tmp_path / "dying"
    dying.write_text("#!/bin/sh\necho 'ImportError: libfoo.so: cannot open shared object' >&2\n"
                     "exit 1\n")  # fmt: skip
    dying.chmod(0o755)
    _, doc = run_engines(capsys, write_config(tmp_path), "--engines", "mlx",
                         "--engine-python", f"mlx={dying}")  # fmt: skip
    assert doc["engines"]["mlx"]["verdict"] == "error"
    assert doc["engines"]["mlx"]["note"] == (
        "the reader exited with status 1: ImportError: libfoo.so: cannot open shared object"
    )


def test_bfloat16_tables_are_judged_within_bfloat16s_rounding(batch_fake):
    same, claimed = engines.run_cases(
        "mlx",
        [{**BASE, "fake_mode": "bf16"}, {**BASE, "fake_mode": "bf16-as-float32"}],
        batch_fake,
    )
    assert same.verdict == "same", same.note
    assert "mlx keeps its tables in bfloat16" in same.note
    assert 2.0**-10 < same.max_abs_diff <= 2.0**-8  # bfloat16's rounding, seen and allowed
    # the same values said to be float32 are far outside float32's rounding
    assert claimed.verdict == "different"
