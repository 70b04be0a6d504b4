"""The ``posenc`` command, run in-process through ``posenc.cli.main``."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

import posenc
from posenc import bench
from posenc.core import files
from posenc.faces.cli import main
from posenc.faces.commands import table as table_command


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


# ------------------------------------------------------------------------ atomic writes


class _FullDisk:
    """A file that accepts ``room`` bytes (or characters), then fails as a full disk does."""

    def __init__(self, f, room):
        self._f, self._room = f, room

    def write(self, data):
        if len(data) > self._room:
            self._f.write(data[: self._room])
            self._room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def _disk_full_after(monkeypatch, room):
    """Make every file the faces open fill up after ``room`` bytes."""
    real_open = open

    def full_open(*args, **kwargs):
        return _FullDisk(real_open(*args, **kwargs), room)

    monkeypatch.setattr(files, "open", full_open, raising=False)


@pytest.mark.parametrize("suffix", [".npy", ".csv", ".json", ".pt"])
def test_table_write_that_fails_part_way_keeps_the_previous_file(
    tmp_path, monkeypatch, capsys, suffix
):
    out = tmp_path / f"pe{suffix}"
    assert main(["table", "--dim", "4", "--length", "3", "--out", str(out)]) == 0
    previous = out.read_bytes()
    _disk_full_after(monkeypatch, 100)
    assert main(["table", "--dim", "12", "--length", "130", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"posenc: error: cannot write {str(out)!r}: No space left on device\n"
    assert out.read_bytes() == previous
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left


def test_atomic_write_replaces_the_whole_file(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old content, longer than the new one")
    with files.atomic_write(path) as f:
        f.write(b"new")
        assert path.read_bytes().startswith(b"old")  # not visible before the block ends
    assert path.read_bytes() == b"new"
    with files.atomic_write(tmp_path / "b.txt", "w") as f:
        f.write("caf\u00e9\n")
    assert (tmp_path / "b.txt").read_bytes() == "caf\u00e9\n".encode()
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "b.txt").stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.txt"]


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_atomic_write_failing_writer_leaves_the_previous_file(tmp_path, error):
    path = tmp_path / "table.npy"
    np.save(path, np.arange(3.0))
    previous = path.read_bytes()
    with pytest.raises(error), files.atomic_write(path) as f:
        np.save(f, np.arange(1000.0))
        raise error("interrupted after writing")
    assert path.read_bytes() == previous
    assert [p.name for p in tmp_path.iterdir()] == ["table.npy"]


def test_atomic_write_writes_through_a_link(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to("real.json")
    with files.atomic_write(tmp_path / "link.json", "w") as f:
        f.write("[1]")
    assert (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "real.json").read_text() == "[1]"


def test_atomic_write_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing" / "a.npy"
    with pytest.raises(FileNotFoundError) as info, files.atomic_write(missing):
        pass
    assert info.value.filename == str(missing)
    (tmp_path / "dir.npy").mkdir()
    with pytest.raises(IsADirectoryError) as info, files.atomic_write(tmp_path / "dir.npy") as f:
        f.write(b"x")
    assert info.value.filename == str(tmp_path / "dir.npy")
    assert [p.name for p in tmp_path.iterdir()] == ["dir.npy"]
    with pytest.raises(ValueError, match="mode"), files.atomic_write(tmp_path / "a", "ab"):
        pass


# ------------------------------------------------------- bad sizes and paths: one line, exit 2


def _one_line_error(capsys, *words):
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith("posenc: error: ") and err.endswith("\n") and err.count("\n") == 1
    for word in words:
        assert word in err


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--dim", "100000000"], ["--dim must be at most 65536", "100000000"]),
        (["--dim", "65537", "--length", "1"], ["--dim must be at most 65536"]),
        (["--length", str(10**12)], ["--length 1000000000000 x --dim 512", "elements"]),
        (["--length", "4194305", "--dim", "512"], ["--length 4194305 x --dim 512"]),
    ],
)
def test_table_absurd_size_is_refused_before_any_work(tmp_path, capsys, options, words):
    out = tmp_path / "x.npy"
    assert main(["table", *options, "--out", str(out)]) == 2
    _one_line_error(capsys, *words)
    assert not list(tmp_path.iterdir())


def test_table_into_a_missing_directory_or_onto_a_directory(tmp_path, capsys):
    missing = tmp_path / "missing" / "x.npy"
    assert main(["table", "--dim", "4", "--out", str(missing)]) == 2
    _one_line_error(capsys, f"cannot write {str(missing)!r}: no directory")
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    assert main(["table", "--dim", "4", "--out", str(folder)]) == 2
    _one_line_error(capsys, f"cannot write {str(folder)!r}: it is a directory")
    assert [p.name for p in tmp_path.iterdir()] == ["folder.csv"]
    assert not list(folder.iterdir())


def test_file_system_and_memory_errors_end_with_one_line(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", "/somewhere/x.npy")

    monkeypatch.setattr(table_command, "sinusoidal", refuse)
    assert main(["table", "--dim", "4", "--out", str(tmp_path / "x.npy")]) == 2
    _one_line_error(capsys, "/somewhere/x.npy: Permission denied")

    def exhaust(*args, **kwargs):
        raise MemoryError("Unable to allocate 16.0 GiB")

    monkeypatch.setattr(table_command, "sinusoidal", exhaust)
    assert main(["table", "--dim", "4", "--out", str(tmp_path / "x.npy")]) == 2
    _one_line_error(capsys, "out of memory", "16.0 GiB")
    assert not list(tmp_path.iterdir())


def test_huge_dim_exits_2_at_once(tmp_path):
    # before the size check this computed 50 million exact frequencies for minutes
    argv = [sys.executable, "-m", "posenc.cli", "table", "--dim", "100000000", "--out", "x.npy"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("posenc: error: --dim must be at most 65536")
    assert proc.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------- posenc check at tiny sizes


@pytest.mark.parametrize(
    "options",
    [["--dim", "4"], ["--preset", "tensor2tensor", "--dim", "6"], ["--dim", "8", "--length", "3"]],
)
def test_check_tiny_tables_exit_0(capsys, options):
    assert main(["check", *options]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert "one column (ch 0) at p+10 from itself" in out
    assert out.rstrip().endswith("12 PASS")


def test_check_skip_says_why(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")  # one line per row
    assert main(["check", "--dim", "4", "--override", "scale=0.001"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if "one column" in line]
    assert "no column bends over 50 positions (exact R^2 >= 1.000)" in row and "SKIP" in row
    assert out.rstrip().endswith("11 PASS, 1 SKIP")


def test_rope_help_names_every_engine(capsys):
    from posenc.faces.cli import build_parser
    from posenc.integration.analysis.engines import ENGINES

    with pytest.raises(SystemExit):
        build_parser().parse_args(["rope", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in ENGINES) and len(ENGINES) >= 4


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"posenc {posenc.__version__}"


def test_a_command_that_needs_an_extra_names_it():
    # transformers made unimportable in a child: reading a config class needs it
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from posenc.faces.cli import main\n"
        "sys.exit(main(['rope', 'LlamaConfig']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "pip install 'posenc[hf]'" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1  # one line


def test_info_reports_versions_backends_and_engines(capsys, monkeypatch, tmp_path):
    from posenc.core import kernels
    from posenc.integration.analysis import engine_cache
    from posenc.integration.analysis.engines import ENGINES

    monkeypatch.setenv("POSENC_ENGINES", str(tmp_path))  # no engine there
    found = engine_cache.python(ENGINES["mlx"])
    found.parent.mkdir(parents=True)
    found.write_text("")  # one found
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"posenc                 {posenc.__version__}" in out
    assert f"torch                  {torch.__version__}" in out
    served = "compiled C" if kernels.compiled is not None else "compiled kernels are not built"
    assert out.count(served) >= 3
    for loop in ("attention loop", "stick-breaking", "CoPE loop", "DAPE loop", "PaTH core"):
        assert f"  {loop}, CPU" in out, loop  # each compiled attention loop has its line
    assert f"mlx                    {found}" in out and found.is_relative_to(tmp_path)
    missing = [e for n, e in ENGINES.items() if n != "mlx"]
    for engine in missing:
        where = engine_cache.python(engine)
        assert f"not built (posenc engines build {engine.name} builds {where})" in out


def test_a_missing_kernel_build_is_announced_once_and_info_says_why():
    # the compiled module made unimportable in a child, every warning an error but ours
    code = (
        "import sys, warnings\n"
        "sys.modules['posenc.core._kernels'] = None\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import posenc\n"
        "    from posenc.core import kernels\n"
        "    posenc.sinusoidal(4, 8)\n"
        "    import posenc.faces.info as info\n"
        "ours = [w for w in seen if issubclass(w.category, kernels.KernelWarning)]\n"
        "print(len(ours))\n"
        "print(str(ours[0].message))\n"
        "print(info.report())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    count, message, *report = out.stdout.splitlines()
    assert count == "1"
    assert "gcc or clang" in message and "pip install -v posenc" in message
    table = [line for line in report if "sinusoidal table" in line]
    assert table and "compiled kernels are not built" in table[0]
