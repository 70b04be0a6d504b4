"""The package as users get it: the sdist, the wheel built from it, installed outside the checkout.

``python -m build`` (a background job) makes the sdist and then the wheel from the sdist,
so a file the sdist leaves out is missing from the wheel too. The wheel is installed into
a fresh virtual environment in a temporary folder, with no access to the checkout:
posenc itself comes from the wheel only. Its dependencies (numpy, torch, transformers)
are lent by the suite's own environment through a path file, after the wheel's own
site-packages, instead of being installed again (torch is a large download). A smoke
test then runs there, from a folder outside the checkout: the import, a table, the
compiled kernels, ``posenc.Rotary``, ``posenc.attention``, ``posenc rope`` on a config
through the console script, the report's package data, and the engines' recipes (the
wheel names each engine's build in the user cache as the checkout does, so ``posenc rope
--engines`` from the wheel runs what ``make engines`` built). The same test, on a copy of
the wheel with one data file taken out, must fail.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import background
from conftest import built_engine

ROOT = Path(__file__).resolve().parents[1]

SMOKE = r"""
import json, subprocess, sys, tempfile
from importlib import resources
from pathlib import Path

import posenc
where = Path(posenc.__file__).resolve()
assert Path(sys.prefix).resolve() in where.parents, where  # the wheel's, not the checkout's
assert posenc.sinusoidal(8, 16).shape == (8, 16)

from posenc.core import kernels
assert kernels.compiled is not None, kernels.missing_reason

import torch
rope = posenc.Rotary(16)
q = torch.randn(1, 2, 8, 16)
q_rot, k_rot = rope(q, q)
out = posenc.attention(q_rot, k_rot, q, bias=posenc.ALiBi(2), causal=True)
assert out.shape == (1, 2, 8, 16)

config = Path(tempfile.mkdtemp()) / "config.json"
config.write_text(json.dumps({"model_type": "llama", "rope_theta": 500000.0,
    "hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 8192}))
command = Path(sys.prefix) / "bin" / "posenc"
ran = subprocess.run([str(command), "rope", str(config)], capture_output=True, text=True)
assert ran.returncode == 0 and "500000" in ran.stdout, ran.stderr

from posenc.faces.lab import results
assert [len(r.records) > 0 for r in results.bundled()] == [True] * len(results.BUNDLED)
web = resources.files("posenc.faces") / "web"
assert all((web / name).is_file() for name in ("d3.min.js", "explorer.js", "explorer.css"))
data = resources.files("posenc.faces") / "data"
assert (data / "rope-engines.json").is_file()

# the engines' recipes ship: each engine's cache directory is named by their pins
from posenc.integration.analysis import engine_cache
from posenc.integration.analysis.engines import ENGINES
listed = subprocess.run([str(command), "engines"], capture_output=True, text=True)
assert listed.returncode == 0, listed.stderr
for engine in ENGINES.values():
    assert str(engine_cache.directory(engine)) in listed.stdout, listed.stdout
    print("engine", engine.name, engine_cache.directory(engine).name)
print("smoke test passed")
"""


def built() -> tuple[Path, Path]:
    """The sdist and the wheel the background job built."""
    out = background.wait("wheel").out
    (sdist,) = out.glob("posenc-*.tar.gz")
    (wheel,) = out.glob("posenc-*.whl")
    return sdist, wheel


def installed(wheel: Path, where: Path) -> Path:
    """A fresh environment at ``where`` with ``wheel`` installed (and nothing of the
    checkout); its Python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    subprocess.run([*install, "--no-deps", "--no-index", str(wheel)], check=True)
    # the suite's third-party packages, lent after the wheel's own site-packages; a path
    # file only adds the folder: the checkout's editable finder there stays inactive
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "zz-lent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def smoke(python: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-c", SMOKE], capture_output=True, text=True, cwd=cwd)


def test_the_sdist_holds_the_licence_and_the_sources() -> None:
    import tarfile

    sdist, _ = built()
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "pyproject.toml", "setup.py", "src/posenc/core/csrc/module.c"} <= names
    assert "src/posenc/faces/data/lab-copy.json" in names


def test_the_wheel_installed_outside_the_checkout_passes_the_smoke_test(tmp_path: Path) -> None:
    _, wheel = built()
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert any(n.startswith("posenc/core/_kernels") for n in names)  # compiled in the wheel
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    python = installed(wheel, tmp_path / "env")
    ran = smoke(python, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "smoke test passed" in ran.stdout
    # the same cache directories as the checkout's: what `make engines` built is found
    from posenc.integration.analysis import engine_cache
    from posenc.integration.analysis.engines import ENGINES

    named = [f"engine {e.name} {engine_cache.directory(e).name}" for e in ENGINES.values()]
    assert sorted(ran.stdout.splitlines()[:-1]) == sorted(named)


def test_the_wheel_runs_an_engine_from_the_user_cache(tmp_path: Path) -> None:
    built_engine("mlx")  # skips, or under CI=true fails, where it is not built
    _, wheel = built()
    python = installed(wheel, tmp_path / "env")
    config = tmp_path / "config.json"
    # what mlx-lm's ModelArgs requires besides the RoPE keys
    llama = {"model_type": "llama", "rope_theta": 500000.0, "hidden_size": 64,
             "num_attention_heads": 2, "max_position_embeddings": 512, "num_hidden_layers": 1,
             "intermediate_size": 8, "rms_norm_eps": 1e-5, "vocab_size": 16}  # fmt: skip
    config.write_text(json.dumps(llama))
    command = [str(python.parent / "posenc"), "rope", str(config), "--engines", "mlx"]
    ran = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"^ +mlx +same ", ran.stdout, re.MULTILINE), ran.stdout


@pytest.mark.parametrize(
    "left_out",
    [
        "posenc/faces/data/lab-copy.json",
        "posenc/faces/web/d3.min.js",
        "posenc/integration/analysis/engine_recipes/vllm.txt",
    ],
)
def test_the_smoke_test_fails_on_a_wheel_missing_a_data_file(tmp_path: Path, left_out: str) -> None:
    _, wheel = built()
    broken = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(broken, "w") as target:
        assert left_out in source.namelist()
        for item in source.infolist():
            if item.filename != left_out:
                target.writestr(item, source.read(item.filename))
    python = installed(broken, tmp_path / "env")
    ran = smoke(python, cwd=tmp_path)
    assert ran.returncode != 0 and "smoke test passed" not in ran.stdout
