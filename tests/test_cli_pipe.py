"""A closed stdout ends ``posenc`` quietly, as it ends a Unix tool (``posenc presets | head -1``).

The command runs in a child process whose stdout is a pipe the test closes before the
child writes: the child first waits for a line on stdin, so the pipe is closed for
certain when it prints. It must print nothing on stderr (no ``posenc: error: Broken
pipe``, no ``Exception ignored ... BrokenPipeError`` at the interpreter's exit) and exit
with 141, the status the shell reports for a tool SIGPIPE ended (128 + 13).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Runs ``posenc ARGS`` as the console script does, once stdin says the pipe is closed.
CHILD = (
    "import sys; sys.stdin.readline(); "
    "from posenc.faces.cli import main; sys.exit(main(sys.argv[1:]))"
)
SIGPIPE_STATUS = 128 + 13


def run_child(argv: list[str], close_stdout: bool) -> tuple[int, bytes, bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    out = b""
    if close_stdout:
        proc.stdout.close()  # the reader goes away before anything is written
        _, err = proc.communicate(b"go\n", timeout=120)
    else:
        out, err = proc.communicate(b"go\n", timeout=120)
    return proc.returncode, out, err


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                "num_attention_heads": 4, "rope_theta": 10000.0}))  # fmt: skip
    return str(path)


@pytest.mark.parametrize(
    "argv",
    [["presets"], ["--help"], ["rope", "--help"], ["rope", "CONFIG", "--json"]],
    ids=["presets", "help", "rope-help", "rope"],
)
def test_closed_stdout_ends_quietly(argv, config):
    argv = [config if a == "CONFIG" else a for a in argv]
    status, _, err = run_child(argv, close_stdout=True)
    assert err == b"", err.decode()
    assert status == SIGPIPE_STATUS
    # near miss: the same command read to the end prints all and exits 0
    status, out, err = run_child(argv, close_stdout=False)
    assert (status, err) == (0, b""), err.decode()
    assert out.strip()


def test_an_error_still_reports_when_stdout_is_closed(tmp_path):
    # a bad input is still an error (stderr, exit 2), not taken for a closed pipe
    status, _, err = run_child(["rope", str(tmp_path / "missing.json")], close_stdout=True)
    assert status == 2 and err.decode().startswith("posenc: error:"), err.decode()
