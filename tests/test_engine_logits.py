"""End-to-end logits (``posenc engines logits``): the judge, the harness, and the engines.

The judge and the harness are checked here with a stand-in reader (this environment's
Python running transformers itself, on the checkpoint as given or with its base moved);
the engines (MLX, llama.cpp) run where ``posenc engines build`` has built them, and their
expected verdicts are written from their code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import anchor, built_engine
from posenc.integration.analysis import engine_logits as el
from posenc.integration.analysis import engines

anchor("transformers")
anchor("sentencepiece")


# --------------------------------------------------------------------------------------
# The judge and its tolerance.


def _ref() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.normal(0, 1.0, (5, el.VOCAB))  # the tiny models' logits: |x| up to about 4


CONFIG = el.LOGIT_CASES["default"].data()
LENGTH = el.prompt_length(CONFIG)
ROWS = el.rows(LENGTH)


def test_tolerance_is_the_products_bound():
    ref = _ref()
    tol = el.tolerance(ref, CONFIG, LENGTH)
    # 2 layers: 13 products in a row, the longest inner dimension the prompt's 192
    assert tol == pytest.approx(13 * 192 * 2.0**-24 * np.max(np.abs(ref)))
    # far above float32's own rounding of a forward pass (about 5e-6 on these models)
    # and far below what a misread RoPE does (a base off by 1 in 10000: about 8e-4)
    assert 1e-5 < tol < 8e-4


@pytest.mark.parametrize("scale", [0.99, 1.01])
def test_the_verdict_turns_at_the_tolerance(scale):
    """A near miss: one logit moved by 0.99 or 1.01 times the tolerance."""
    ref = _ref()
    tol = el.tolerance(ref, CONFIG, LENGTH)
    theirs = ref.copy()
    theirs[3, 17] += scale * tol
    answer = {"logits": theirs.tolist(), "rows": ROWS, "version": "x"}
    r = el.judge("e", "default", answer, ref, ROWS, CONFIG, LENGTH)
    assert r.verdict == ("same" if scale < 1 else "different")
    assert [p["same"] for p in r.per_row] == [True, True, True, scale < 1, True]
    if scale > 1:
        assert f"first row past the tolerance: {ROWS[3]}" in r.note


def test_refusals_and_unreadable_answers():
    ref = _ref()
    r = el.judge("e", "c", {"refused": "KeyError: 'x'", "where": "conv.py:3 in f"}, ref, ROWS,
                 CONFIG, LENGTH)  # fmt: skip
    assert r.verdict == "refused" and "conv.py:3" in r.note
    for bad in ({"logits": ref[:4].tolist(), "rows": ROWS[:4]}, {"rows": ROWS},
                {"logits": np.full_like(ref, np.nan).tolist(), "rows": ROWS},
                {"logits": ref.tolist(), "rows": ROWS[::-1]}):  # fmt: skip
        assert el.judge("e", "c", bad, ref, ROWS, CONFIG, LENGTH).verdict == "error"


# --------------------------------------------------------------------------------------
# The harness, with a stand-in reader: transformers itself in a child process.

STAND_IN = """
import json, sys
sys.path.insert(0, {src!r})
from posenc.integration.analysis import engine_logits as el
request = json.loads(sys.stdin.read())
out = []
for r in request["batch"]:
    ask = r["logits"]
    directory = ask["checkpoint"]
    if {theta!r} is not None:  # the same weights, the base moved
        config = json.loads(open(directory + "/config.json").read())
        config["rope_theta"] = {theta!r}
        open(directory + "/config.json", "w").write(json.dumps(config))
    logits = el.reference_logits(directory, ask["tokens"], ask["rows"], dtype="float32")
    out.append({{"logits": logits.tolist(), "rows": ask["rows"], "version": "stand-in"}})
print(json.dumps({{"batch": out}}))
"""


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theta: float | None) -> None:
    reader = tmp_path / "reader.py"
    src = str(Path(el.__file__).resolve().parents[3])
    reader.write_text(STAND_IN.format(src=src, theta=theta))
    monkeypatch.setitem(engines.ENGINES, "stand-in",
                        engines.Engine("stand-in", reader, logits=True))  # fmt: skip


@pytest.mark.parametrize(("theta", "verdict"), [(None, "same"), (10010.0, "different")])
def test_the_harness_sees_a_moved_base(tmp_path, monkeypatch, theta, verdict):
    """transformers in float32 is "same"; the same weights with the base 10000 read as
    10010 (a RoPE misread by 0.1 %) are "different" past position 0."""
    _stand_in(tmp_path, monkeypatch, theta)
    (r,) = el.run_logits("stand-in", ["default"], python=Path(sys.executable))
    assert r.verdict == verdict, r.note
    assert r.per_row[0]["same"]  # position 0 turns no angle
    if verdict == "same":
        assert r.max_abs_diff is not None and r.max_abs_diff < r.tolerance
    else:
        assert not any(p["same"] for p in r.per_row[1:])


def test_unknown_cases_and_missing_engines(tmp_path):
    with pytest.raises(ValueError, match=r"unknown logits case 'nope'.*default"):
        el.run_logits("mlx", ["nope"])
    (r,) = el.run_logits("mlx", ["default"], python=tmp_path / "no-python")
    assert r.verdict == "not installed" and "posenc engines build mlx" in r.note


def test_the_checkpoint_keeps_the_config_layout(tmp_path):
    """save_pretrained writes transformers 5's rope_parameters; the engine must get the
    config as given (transformers 4's rope_scaling here)."""
    config = el.LOGIT_CASES["yarn"].data()
    el.write_checkpoint(config, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_scaling"] == config["rope_scaling"] and "rope_parameters" not in saved
    assert saved["vocab_size"] == el.VOCAB
    for name in ("model.safetensors", "tokenizer.model", "tokenizer_config.json"):
        assert (tmp_path / name).exists()


# --------------------------------------------------------------------------------------
# The engines.

#: Expected verdicts per engine and case; every other case is "same".
EXPECTED: dict[str, dict[str, str]] = {
    # mlx_lm/models/rope_utils.py: initialize_rope builds YarnRoPE with mscale from
    # factor and mscale / mscale_all_dim only: attention_factor is never read (the
    # table's "yarn attention_factor" row differs by the same factor 1.2)
    "mlx": {"yarn attention_factor": "different"},
    # llama.cpp: convert_hf_to_gguf.py writes no attention_factor for YaRN (the context
    # derives yarn_attn_factor from the factor alone), and llama.cpp has no dynamic NTK
    # (the converter writes no dynamic scaling type; the graph rotates with the base
    # unchanged at every length)
    "llama.cpp": {"yarn attention_factor": "different", "dynamic": "different"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_engine_logits(name):
    python = built_engine(name)
    results = el.run_logits(name, python=python)
    got = {r.case: r.verdict for r in results}
    want = {c: EXPECTED[name].get(c, "same") for c in el.LOGIT_CASES}
    assert got == want, [(r.case, r.verdict, r.note) for r in results]
    for r in results:
        # where they differ, they differ by far more than rounding, past position 0 only
        if r.verdict == "different":
            assert r.max_abs_diff is not None and r.tolerance is not None
            assert r.max_abs_diff > 100 * r.tolerance
            assert r.per_row[0]["same"]


def test_the_cli(capsys, tmp_path, monkeypatch):
    from posenc.faces.cli import main

    _stand_in(tmp_path, monkeypatch, None)
    monkeypatch.setattr(engines, "engine_python", lambda name, overrides=None: Path(sys.executable))
    assert main(["engines", "logits", "stand-in", "--cases", "default", "--json"]) == 0
    doc: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    assert doc[0]["engine"] == "stand-in" and doc[0]["case"] == "default"
    assert doc[0]["verdict"] == "same" and doc[0]["tolerance"] > 0
    # an engine that loads no checkpoint is named, with those that do
    assert main(["engines", "logits", "vllm"]) == 2
    assert "vllm cannot load a checkpoint here" in capsys.readouterr().err


def test_the_table():
    same = el.LogitsResult("mlx", "default", "same", max_abs_diff=6e-6, tolerance=5.8e-4)
    off = el.LogitsResult("llama.cpp", "dynamic", "different", max_abs_diff=3.53,
                          tolerance=6.1e-4, note="first row past the tolerance: 63")  # fmt: skip
    lines = el.table([same, off])
    assert lines[0].split() == ["engine", "case", "verdict", "max", "|diff|", "tolerance"]
    assert lines[1].split() == ["mlx", "default", "same", "6e-06", "0.00058"]
    assert lines[2].split() == ["llama.cpp", "dynamic", "different", "3.53", "0.00061"]
    assert lines[3] == "  note: first row past the tolerance: 63"
