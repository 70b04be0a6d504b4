"""The JSON protocol every reader script speaks (standard library only).

A reader is run as ``PYTHON reader.py`` by the engine's own Python. Its stdin holds one
JSON object:

- one request, ``{"config": {...}, "windows": [window, ...]}``; or
- a batch, ``{"batch": [request, ...]}`` (one child process answers many configs, so an
  engine whose import takes seconds is imported once).

A window asks for the tables of one sequence:

- ``seq_len``: the sequence's length (what dynamic NTK and LongRoPE read);
- ``positions``: the rows wanted (``0 <= p < seq_len``);
- ``layer_type`` (optional): for a config with one RoPE per layer type (Gemma 3's
  ``sliding_attention`` / ``full_attention``), the layer type whose attention is read;
- ``layer`` (optional): the index of the first layer with this RoPE (a reader that
  builds the whole model reads that layer's attention);
- ``position_ids`` (optional, M-RoPE): three lists (temporal, height, width) as long
  as ``positions``, the multi-axis position of each asked row;
- ``nope`` (optional): ``true`` for a layer transformers leaves without RoPE (SmolLM3's
  ``no_rope_layers``, Cohere 2's full-attention layers): there the engine must not rotate.

The answer to one request is ``{"version", "source", "module", "layout", "rotary_dim",
"dtype", "attention_scaling", "softmax_scale", "windows": [{"seq_len", "positions",
"layer_type", "cos", "sin", "mode"}], "note"}``:

- ``cos`` and ``sin``: one row per asked position, one value per rotated pair, pairs in
  frequency order (pair ``k`` turns with the k-th frequency: channels ``(k, k + r/2)``
  in the half layout, ``(2k, 2k + 1)`` in the interleaved one), times any scale the
  engine multiplies into its tables;
- ``layout``: ``"half"`` or ``"interleaved"``; ``rotary_dim``: channels rotated;
- ``dtype``: the dtype the engine computed its tables in (``"float32"``, ...);
- ``attention_scaling``: the scale multiplied into cos and sin; ``softmax_scale``: the
  factor the engine's attention multiplies q.k by, where the reader can tell (else null);
- ``note``: what the reader did that the engine's own code did not (a restated step,
  a key read the way a model file reads it);
- ``rotates`` (per window, optional): whether the engine rotates q and k in the asked
  layer; a layer it does not rotate answers rows of cos 1 and sin 0;
- ``switching`` (optional): for LongRoPE and dynamic NTK, when the engine switches
  factors or base ("per forward pass, from the sequence length", "once, from
  max_model_len"), read from its code, naming the file and function;
- ``fallback`` (optional): the model file the reader read the config as, when the engine
  has none of its own restated in the reader.

A request ``{"logits": {"checkpoint": DIR, "tokens": [...], "rows": [...]}}`` asks for
the engine's next-token logits: DIR holds a tiny checkpoint as transformers saves it
(:mod:`posenc.integration.analysis.engine_logits`); the reader converts it with the
engine's own converter, runs one prefill of ``tokens`` and answers ``{"version",
"converter", "runtime", "dtype", "mode", "rows", "logits": [[...] per row], "note"}``.

A request whose reading raises is answered ``{"refused": "ExcType: message", "where":
"file:line in function"}``: the engine's own error. :func:`serve` does the framing.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any


def refusal(exc: BaseException) -> dict[str, str]:
    """``{"refused": "ExcType: message", "where": ...}`` for an exception the engine raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        # the engine's own file, named from its package (site-packages/ and the
        # environment's own folder are left out)
        filename = last.filename.rpartition("site-packages/")[2]
        prefix = sys.prefix.rstrip("/") + "/"
        if filename.startswith(prefix):
            filename = filename[len(prefix) :]
        where = f"{filename}:{last.lineno} in {last.name}"
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    return {"refused": text[:500], "where": where}


def serve(answer: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Read one request or a batch on stdin, print the answer(s) on stdout as JSON.

    Whatever the engine prints (its logging, its warnings) goes to stderr: stdout's file
    descriptor is kept for the answer and pointed at stderr while the engine runs.
    """
    request = json.loads(sys.stdin.read())
    sys.stdout.flush()
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        if "batch" in request:
            result: dict[str, Any] = {"batch": [_one(answer, r) for r in request["batch"]]}
        else:
            result = _one(answer, request)
        sys.stdout.flush()
    finally:
        os.dup2(answer_fd, 1)
        os.close(answer_fd)
    json.dump(result, sys.stdout)
    sys.stdout.flush()
    return 0


def _one(answer: Callable[[dict[str, Any]], dict[str, Any]], request: dict[str, Any]) -> Any:
    try:
        return answer(request)
    except Exception as exc:  # the engine refused this config: say so, go on
        return refusal(exc)
