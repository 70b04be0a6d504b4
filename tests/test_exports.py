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
