"""The ``posenc`` command, run in-process through ``posenc.cli.main``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import posenc
from posenc import bench
from posenc.faces.cli import main


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("suffix", [".npy", ".csv", ".json", ".pt"])
def test_table_round_trips(tmp_path, capsys, suffix, dtype):
    out = tmp_path / f"pe{suffix}"
    argv = ["table", "--dim", "12", "--length", "130", "--dtype", dtype, "--out", str(out)]
    assert main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    expected = posenc.sinusoidal(130, 12, dtype=dtype)
    if suffix == ".npy":
        got = np.load(out)
    elif suffix == ".csv":
        lines = out.read_text().splitlines()
        assert lines[0] == ",".join(f"ch{j}" for j in range(12))
        got = np.loadtxt(out, delimiter=",", skiprows=1, dtype=dtype)
    elif suffix == ".json":
        doc = json.loads(out.read_text())
        assert doc["shape"] == [130, 12] and doc["dtype"] == dtype
        got = np.array(doc["values"], dtype=dtype)
    else:
        tensor = torch.load(out)
        assert tensor.dtype == getattr(torch, dtype)
        got = tensor.numpy()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_table_bfloat16_pt(tmp_path):
    out = tmp_path / "pe.pt"
    argv = ["table", "--preset", "ldm", "--dim", "8", "--dtype", "bfloat16", "--out", str(out)]
    assert main(argv) == 0
    expected = posenc.sinusoidal(50, 8, preset="ldm", dtype=torch.bfloat16)
    assert torch.equal(torch.load(out), expected)


def test_table_offset_preset_and_overrides(tmp_path):
    out = tmp_path / "pe.npy"
    argv = [
        "table", "--preset", "ddpm", "--dim", "16", "--length", "9", "--offset", "7",
        "--override", "max_period=500", "--override", "flip_sin_to_cos=true", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    expected = posenc.sinusoidal(
        np.arange(7, 16), 16, preset="ddpm", max_period=500, flip_sin_to_cos=True
    )
    np.testing.assert_array_equal(np.load(out), expected)


def test_check_passes(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") >= 10
    assert "FAIL" not in out
    for words in ("shift", "row norm = 16", "PE(p).PE(p+10)", "one column", "p=1e+07"):
        assert words in out


def test_check_other_presets_and_lone_channel(capsys):
    assert main(["check", "--dim", "64", "--preset", "ldm", "--length", "200"]) == 0
    assert "FAIL" not in capsys.readouterr().out
    assert main(["check", "--dim", "63"]) == 0  # vaswani extends: a lone channel
    out = capsys.readouterr().out
    assert "SKIP" in out and "lone channel" in out and "FAIL" not in out


def test_check_fails_with_exit_1(monkeypatch, capsys):
    from posenc import analysis

    real = analysis.sinusoidal.shift_matrix
    monkeypatch.setattr(
        analysis.sinusoidal, "shift_matrix", lambda k, d, **kw: real(k + 1, d, **kw)
    )
    assert main(["check", "--dim", "16"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["table", "--dim", "0", "--out", "x.npy"], "--dim"),
        (["table", "--length", "-1", "--out", "x.npy"], "--length"),
        (["table", "--out", "x.txt"], "--out"),
        (["table", "--preset", "nope", "--out", "x.npy"], "--preset"),
        (["table", "--dtype", "bfloat16", "--out", "x.csv"], "bfloat16"),
        (["table", "--override", "nope=1", "--out", "x.npy"], "nope"),
        (["table", "--override", "base", "--out", "x.npy"], "key=value"),
        (["table", "--override", "base=-2", "--out", "x.npy"], "base"),
        (["table", "--offset", "1", "--override", "offset=2", "--out", "x.npy"], "offset"),
        (["check", "--preset", "whisper", "--dim", "7"], "dim"),
        (["check", "--length", "0"], "--length"),
        (["bench", "--repeat", "0"], "--repeat"),
        (["bench", "--case", "nope"], "--case"),
    ],
)
def test_bad_input_exits_2_naming_the_parameter(tmp_path, monkeypatch, capsys, argv, names):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert names in err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("command", [[], ["table"], ["check"], ["bench"], ["presets"]])
def test_help(capsys, command):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: posenc")
    options = {
        "table": ["--out", "--dtype", "--offset", "--override"],
        "bench": ["--quick", "--json", "--case", "--repeat"],
        "check": ["--dim", "--length", "--preset"],
    }
    for option in options.get("".join(command), []):
        assert option in out


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name, spec in posenc.PRESETS.items():
        assert f"{name}\n" in out
        assert spec.anchor in out


def _tiny_case(length, dim):
    return [
        bench.Impl("fill", lambda: lambda: np.empty((length, dim), np.float32).fill(1.0),
                   "baseline"),
        bench.Impl("posenc", lambda: lambda: posenc.sinusoidal(length, dim), "ours"),
    ]  # fmt: skip


def test_bench_json(monkeypatch, capsys):
    case = bench.Case("tiny", "test", _tiny_case, {"length": 8, "dim": 4}, {"length": 4, "dim": 4})
    monkeypatch.setitem(bench.CASES, "tiny", case)
    assert main(["bench", "--case", "tiny", "--json", "--repeat", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["impl"] for r in doc["results"]] == ["fill", "posenc"]
    assert all(r["runs"] == 2 and r["size"] == {"length": 8, "dim": 4} for r in doc["results"])


def test_bench_table_quick(monkeypatch, capsys):
    case = bench.Case("tiny", "test", _tiny_case, {"length": 8, "dim": 4}, {"length": 4, "dim": 4})
    monkeypatch.setitem(bench.CASES, "tiny", case)
    assert main(["bench", "--case", "tiny", "--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "tiny (4 x 4)" in out and "posenc" in out and "x baseline" in out


def test_module_entry_point_exit_status(tmp_path):
    # the console script calls main() and exits with its status
    argv = [sys.executable, "-m", "posenc.cli", "table", "--out", str(tmp_path / "x.txt")]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("posenc: error: --out must end in")
