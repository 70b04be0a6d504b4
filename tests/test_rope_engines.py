"""``posenc rope --engines``: another engine's own code run on a config, against transformers.

The runner is checked with a fake engine, a small reader script run by this
environment's Python that answers the way an engine can (the right tables, a wrong
base, an exception, no answer at all). MLX itself is checked when ``make engines``
has built ``.engines/mlx``: its expected verdicts are written from mlx-lm's source
(``models/llama.py``, ``models/rope_utils.py`` of mlx-lm 0.32.2), not from the runner.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest

from conftest import anchor, unavailable
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
    monkeypatch.setitem(engines.ENGINES, "mlx", engines.Engine("mlx", reader, "nothing", 3.0))
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


def test_crash_is_refused_with_its_message(tmp_path, capsys, fake):
    config = write_config(tmp_path, fake_mode="crash")
    status, doc = run_engines(capsys, config, "--engines", "mlx", "--engine-python",
                              f"mlx={fake}")  # fmt: skip
    assert status == 1
    mlx = doc["engines"]["mlx"]
    assert mlx["verdict"] == "refused"
    assert mlx["note"] == "ValueError: Unsupported RoPE type 'bogus'"


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
    assert status == 0  # a missing engine is reported, not a failure
    mlx = doc["engines"]["mlx"]
    assert mlx["verdict"] == "not installed"
    assert str(tmp_path / "nowhere" / "mlx" / "bin" / "python") in mlx["note"]
    assert "make engines" in mlx["note"]


def test_human_table(tmp_path, capsys, fake):
    status = main(["rope", write_config(tmp_path, fake_mode="different"), "--engines", "mlx",
                   "--engine-python", f"mlx={fake}"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 1
    assert "engine    verdict" in out
    assert "mlx       different" in out
    assert "first difference: seq_len 4096, position 1, pair 1" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "vllm"], "--engines 'vllm': unknown engine 'vllm' (accepted: mlx, all)"),
        (["--engines", ","], "no engine named (accepted: mlx, all)"),
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
# MLX itself (when `make engines` has built .engines/mlx).

LLAMA = {**BASE, "hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
         "max_position_embeddings": 131072}  # fmt: skip
LONG = [1.0 + 0.5 * i for i in range(48)]
SHORT = [1.0 + 0.01 * i for i in range(48)]
#: (config changes, verdict, the windows (seq_len) that differ), from mlx-lm 0.32.2's source.
MLX_CASES = {
    "default": ({"max_position_embeddings": 8192}, "same", []),
    "linear": ({"max_position_embeddings": 16384,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "same", []),
    "yarn": ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32768}}, "same", []),
    # YarnRoPE computes its mscale from the factor and never reads attention_factor
    "yarn attention_factor": ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 32768,
                                                "attention_factor": 1.2}},
                              "different", [32768, 131072]),
    "llama3": ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}}, "same", []),
    # dynamic NTK at 2 x max_position_embeddings, one prefill of that length
    "dynamic": ({"max_position_embeddings": 4096, "rope_theta": 10000.0,
                 "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "same", []),
    # SuScaledRoPE always applies long_factor: within the original context it differs
    "longrope": ({"hidden_size": 3072, "rope_theta": 10000.0,
                  "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT,
                                   "long_factor": LONG,
                                   "original_max_position_embeddings": 4096}},
                 "different", [4096]),
    # Phi-3's layout: original_max_position_embeddings at the top; llama.py needs it inside
    "longrope top-level original": ({"hidden_size": 3072, "rope_theta": 10000.0,
                                     "original_max_position_embeddings": 4096,
                                     "rope_scaling": {"rope_type": "longrope",
                                                      "short_factor": SHORT,
                                                      "long_factor": LONG}},
                                    "refused", []),
    # transformers v5's rope_parameters: llama.py reads rope_scaling and rope_theta only
    "v5 rope_parameters": ({"rope_theta": None,
                            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                                "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 8192}},
                           "different", [8192, 131072]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MLX_CASES))
def test_mlx_reading(tmp_path, capsys, case):
    python = engines.engine_python("mlx")
    if not python.exists():
        # skips here, fails under CI=true: .ci/run builds the engines
        unavailable(
            f"MLX's environment is not built ({python}): run `make engines`",
            provided_by=".ci/run builds it (make engines)",
        )
    changes, verdict, differing = MLX_CASES[case]
    data = {**LLAMA, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    _, doc = run_engines(capsys, str(path), "--engines", "mlx")
    mlx = doc["engines"]["mlx"]
    assert mlx["verdict"] == verdict, mlx
    if verdict == "refused":
        assert mlx["note"] == "KeyError: 'original_max_position_embeddings'"
        return
    assert mlx["version"].startswith("mlx 0.32")
    assert [w["seq_len"] for w in mlx["windows"] if not w["same"]] == differing
    if case == "yarn attention_factor":
        assert mlx["attention_scaling"]["reference"] == pytest.approx(1.2)
        yarn_mscale = 0.1 * math.log(4.0) + 1  # YaRN's 0.1 ln(factor) + 1
        assert mlx["attention_scaling"]["engine"] == pytest.approx(yarn_mscale, rel=1e-6)


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
