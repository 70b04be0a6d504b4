"""The lab on a device: every encoding trains, is evaluated and probed there.

``posenc lab run --device cuda`` runs every piece of posenc a GPU takes: FlexAttention
with each score term (biases, FoX's gates, chunks), the blockwise path of the terms
that read the scores (CoPE, DAPE), stick-breaking, PaTH, the rotations and the
absolute tables. Each mechanism's numbers on CUDA are checked against float64 in its
own module (tests/test_gpu_attention.py, test_fox.py, test_llama4.py, test_path.py,
test_stick_breaking.py, test_contextual.py, test_gpu.py); this one checks that the
lab's whole loop runs on the device for every registered encoding: a few steps of
training, the evaluation at every length (test-time scalings included) and the
probes, everything finite. Learning itself is checked on CPU
(tests/test_lab.py, ``test_every_encoding_trains``) and on CUDA for RoPE over 50
steps (tests/test_gpu.py).

The CUDA variant is marked ``gpu`` (``make gpu-check`` runs it); the CPU variant runs
the same body in the CPU suite, tiny and on one thread.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from conftest import one_thread
from gpu_markers import no_cuda
from posenc.faces.lab.encodings import ENCODINGS, REGISTRY, training_encoding
from posenc.faces.lab.training import LabConfig, run


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, no_cuda()])])
def device(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    if request.param == "cuda":
        yield torch.device("cuda")
        return
    with one_thread():
        yield torch.device("cpu")


# the encodings that read a layout of numbers train on arithmetic, the others copy
GROUPS = {
    "copy": tuple(e for e in ENCODINGS if not REGISTRY[e].ids),
    "add-reversed": tuple(e for e in ENCODINGS if REGISTRY[e].ids),
}


@pytest.mark.parametrize("task", GROUPS)
def test_every_encoding_trains_evaluates_and_probes_on_the_device(task, device, tmp_path):
    config = LabConfig(
        task=task, encodings=GROUPS[task], train_len=4, test_len=6, seeds=1, steps=3,
        batch_size=8, lr=3e-3, d_model=32, layers=2, heads=2, eval_examples=4,
        checkpoint_every=3,
    )  # fmt: skip
    # on CPU the probes' fits (L-BFGS, on CPU wherever the model ran) take most of the
    # time: only the arithmetic group's there; tests/test_lab_probes.py probes on CPU
    probe = device.type != "cpu" or task == "add-reversed"
    outcome = run(config, tmp_path, progress=False, device=device, probe=probe)
    assert {r.encoding for r in outcome.records} == set(GROUPS[task])
    assert all(math.isfinite(r.value) for r in outcome.records)
    probed = {training_encoding(e) for e in GROUPS[task]} if probe else set()
    assert {p.encoding for p in outcome.probes} == probed
    assert all(math.isfinite(p.value) for p in outcome.probes)
