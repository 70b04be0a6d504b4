"""The how-to's JAX port test, run with JAX against the golden file ``posenc rope`` writes.

``docs/howto/check-engine.md`` shows a JAX port's own test reading ``--golden``'s file
(a ```` ```py ```` block, shown there, not run by ``tests/test_tutorials.py``: posenc's
environment has no JAX). It runs here with the Python of an engine environment that has
JAX (MaxText's, built by ``posenc engines build maxtext``), on the file posenc writes for
the page's config; and it fails on a file one bit of a frequency away, or with the
attention factor the port forgot.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import built_engine
from posenc.faces.cli import main
from posenc.integration.analysis.engines import child_env

PAGE = Path(__file__).resolve().parent.parent / "docs" / "howto" / "check-engine.md"
BLOCK = re.compile(r"<!-- a JAX port's test[^\n]*-->\n```py\n(.*?)^```", re.S | re.M)
CONFIG = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "rope_theta": 500000.0,
    "max_position_embeddings": 32768,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
}


@pytest.fixture(scope="module")
def port(tmp_path_factory) -> tuple[Path, Path]:
    """The page's test file and the golden file posenc writes for the page's config."""
    tmp = tmp_path_factory.mktemp("port")
    (tmp / "config.json").write_text(json.dumps(CONFIG))
    golden = tmp / "golden.npz"
    argv = ["rope", str(tmp / "config.json"), "--golden", str(golden), "--positions",
            "0:32768:256"]  # fmt: skip
    assert main(argv) == 0
    match = BLOCK.search(PAGE.read_text())
    assert match, f"{PAGE}: no JAX port's test block"
    (tmp / "test_rope.py").write_text(match.group(1))
    return tmp / "test_rope.py", golden


def _run(test: Path, golden: Path) -> subprocess.CompletedProcess[str]:
    python = built_engine("maxtext")  # an environment with JAX and numpy
    code = f"import test_rope; test_rope.test_rope_against_golden({str(golden)!r})"
    return subprocess.run([str(python), "-c", code], cwd=test.parent, capture_output=True,
                          text=True, timeout=120, env=child_env())  # fmt: skip


def test_the_port_agrees_with_the_golden_file(port):
    test, golden = port
    proc = _run(test, golden)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("change", ["inv_freq", "attention_scaling", "cos"])
def test_the_port_sees_a_near_miss(port, change, tmp_path):
    """The golden file a step off (every frequency x (1 + 1e-13), the scaling of a YaRN
    with attention_factor 1.2, one cos value four times the port's bound away): the
    port's test fails."""
    test, golden = port
    with np.load(golden) as g:
        arrays = {k: g[k] for k in g.files}
    if change == "inv_freq":
        arrays["inv_freq"] = arrays["inv_freq"] * (1 + 1e-13)
    elif change == "attention_scaling":
        arrays["attention_scaling"] = np.float64(1.2)
    else:
        # four times the port's bound at that position (25600): scaling (p + 1) 2**-50
        bound = float(arrays["attention_scaling"]) * (arrays["positions"][100] + 1) * 2.0**-50
        arrays["cos"] = arrays["cos"].copy()
        arrays["cos"][100, 5] += 4 * bound
    moved = tmp_path / "moved.npz"
    np.savez(moved, **arrays)
    proc = _run(test, moved)
    assert proc.returncode != 0
    assert "AssertionError" in proc.stderr
