"""The public surface is pinned: a change to it is deliberate."""

from __future__ import annotations

import subprocess
import sys

import posenc

EXPECTED = {
    "cu_seqlens_from_document_ids",
    "document_positions",
    "mask_positions",
    "packed_document_ids",
    "packed_positions",
    "restart_positions",
    "ALiBi",
    "CoPE",
    "DAPE",
    "AttentionBias",
    "FIRE",
    "ForgetGate",
    "KERPLE",
    "NoPE",
    "Sandwich",
    "T5Bias",
    "alibi_slopes",
    "attention",
    "attn_temperature",
    "t5_bucket",
    "GRID_PRESETS",
    "PRESETS",
    "GridSpec",
    "LearnedPositionalEmbedding",
    "Rotary",
    "Sinusoid",
    "SinusoidalEmbedding",
    "__version__",
    "apply_rotary",
    "cache_positions",
    "fairseq_positions",
    "fourier_features",
    "gaussian_fourier_features",
    "gaussian_fourier_matrix",
    "grid",
    "grid_frequencies",
    "nerf",
    "nerf_frequencies",
    "opt_positions",
    "shift_matrix",
    "sinusoidal",
    "FoPE",
    "PoPE",
    "DualChunkRotary",
    "v2pe_positions",
    "videorope_positions",
    "stick_breaking_attention",
    "path_attention",
    "PaTH",
    "PaTHCache",
}


def test_all_is_pinned():
    assert set(posenc.__all__) == EXPECTED


def test_every_name_resolves():
    for name in posenc.__all__:
        assert getattr(posenc, name) is not None


def test_import_needs_only_numpy():
    # torch (and matplotlib, the anchors) must not be imported by `import posenc`
    code = (
        "import sys, posenc; "
        "bad = [m for m in ('torch', 'matplotlib', 'transformers') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_submodules_resolve_lazily():
    assert posenc.hf.patch_model is not None
    assert posenc.rotary.schedules.SCHEDULES
    assert posenc.bias.ALiBi is posenc.ALiBi


def test_attention_stays_the_function():
    # the function lives in posenc.integration.attention (posenc.attend): importing
    # that module cannot shadow it
    import posenc.integration.attention

    assert (
        callable(posenc.attention) and posenc.attention.__module__ == "posenc.integration.attention"
    )


def test_without_torch_every_torch_name_says_which_extra_to_install():
    # torch made unimportable in a child: each name that needs it, and a short path
    # whose module needs it, raises an ImportError naming the extra (not torch's own
    # ModuleNotFoundError from inside posenc); the numpy names still work
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import posenc\n"
        "needs = []\n"
        "for name in posenc.__all__:\n"
        "    try:\n"
        "        getattr(posenc, name)\n"
        "    except ImportError as e:\n"
        "        assert \"pip install 'posenc[torch]'\" in str(e), str(e)\n"
        "        assert str(e).startswith(f'posenc.{name} needs torch'), str(e)\n"
        "        needs.append(name)\n"
        "from posenc.rotary.multiaxis import mrope_axes  # reading a config: no torch\n"
        "for use in ('posenc.rotary.multiaxis.AxialRotary', 'import posenc.rotary.rerotate'):\n"
        "    try:\n"
        "        exec(use) if use.startswith('import') else eval(use)\n"
        "    except ImportError as e:\n"
        "        assert \"pip install 'posenc[torch]'\" in str(e), str(e)\n"
        "    else:\n"
        "        raise AssertionError(f'{use}: done without torch')\n"
        "print(len(needs), posenc.sinusoidal(3, 4).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    count, shape = out.stdout.split(maxsplit=1)
    import posenc as p

    assert int(count) == len(p._LAZY) and shape.strip() == "(3, 4)"


def test_an_import_error_that_no_extra_fixes_is_left_as_it_is():
    from posenc.core import extras

    other = ModuleNotFoundError("No module named 'flash_attn'", name="flash_attn")
    assert extras.missing("posenc.x", other) is other
    broken = ImportError("cannot import name 'y' from 'torch'", name="torch")  # not missing
    assert extras.missing("posenc.x", broken) is broken
    torch_missing = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert "posenc[torch]" in str(extras.missing("posenc.x", torch_missing))
    hf_missing = ModuleNotFoundError("No module named 'transformers.x'", name="transformers.x")
    assert "posenc[hf]" in str(extras.missing("posenc.x", hf_missing))


def test_the_package_declares_its_licence_and_classifiers():
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "MIT License" in (root / "LICENSE").read_text()
    assert project["version"] == posenc.__version__
    assert any(
        c.startswith("Programming Language :: Python :: 3.1") for c in project["classifiers"]
    )
    assert "transformers" in " ".join(project["optional-dependencies"]["hf"])


def test_reading_an_mrope_config_needs_no_torch(tmp_path):
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "qwen2_vl", "hidden_size": 64, "num_attention_heads": 2,
        "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
    }))  # fmt: skip
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from posenc.faces.cli import main\n"
        f"status = main(['rope', {str(config)!r}, '--json'])\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "sys.exit(status)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ropes"][0]["mrope"]["section"] == [4, 6, 6]
