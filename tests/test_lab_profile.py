"""posenc lab profile: where a training's time goes, by phase and by kind of operation."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from posenc.faces.cli import main
from posenc.faces.lab.profile import KINDS, PHASES, Profile, _kind, format_profile, profile
from posenc.faces.lab.training import LabConfig

TINY = LabConfig(
    task="copy", encodings=("alibi", "rope", "rope-linear", "sinusoidal"), train_len=3,
    test_len=4, seeds=2, steps=40, batch_size=8, d_model=16, layers=1, heads=2,
    eval_examples=4,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny() -> Profile:
    return profile(TINY, steps=3, warmup=1)


def test_every_training_encoding_once_with_every_phase_and_kind(tiny):
    # rope-linear trains as rope: one training, profiled once
    assert list(tiny.phases) == list(tiny.kinds) == list(tiny.evaluation)
    assert list(tiny.phases) == ["alibi", "rope", "sinusoidal"]
    names = [k for k, _ in KINDS] + ["Python, autograd and dispatch"]
    for encoding in tiny.phases:
        assert list(tiny.phases[encoding]) == list(PHASES)
        assert all(v > 0 for v in tiny.phases[encoding].values())
        assert list(tiny.kinds[encoding]) == names
        assert all(v >= 0 for v in tiny.kinds[encoding].values())
        # the operations' own times are within the step, the rest is what remains
        step = sum(tiny.phases[encoding].values())
        assert sum(tiny.kinds[encoding].values()) >= step * (1 - 1e-9)
        assert tiny.kinds[encoding]["linear layers (matmul)"] > 0
        assert tiny.kinds[encoding]["attention kernels"] > 0
        assert tiny.evaluation[encoding] > 0
        expected = step * TINY.steps / 1e3 + tiny.evaluation[encoding]
        assert tiny.training_seconds(encoding) == pytest.approx(expected, rel=1e-12)


def test_the_text_report(tiny):
    text = format_profile(tiny, workers=2)
    for word in [*PHASES, *(k for k, _ in KINDS), "alibi", "rope", "sinusoidal"]:
        assert word in text
    assert "6 trainings" in text  # 3 trainings x 2 seeds
    assert "on 2 worker(s)" in text


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("aten::mm", "linear layers (matmul)"),
        ("aten::addmm", "linear layers (matmul)"),
        ("_AttentionBackward", "attention kernels"),
        ("aten::gelu_backward", "GELU"),
        ("aten::native_layer_norm", "layer norm"),
        ("aten::_log_softmax", "softmax and loss"),
        ("aten::_fused_adamw_", "optimiser"),
        ("aten::linalg_vector_norm", "optimiser"),
        ("aten::copy_", "other operations"),
        ("Optimizer.step#AdamW.step", None),  # a scope around operations, not one
        ("autograd::engine::evaluate_function: MmBackward0", None),
    ],
)
def test_kinds_of_operation(name, kind):
    assert _kind(name) == kind


def test_threads_are_restored_and_bad_input_named():
    before = torch.get_num_threads()
    profile(replace(TINY, encodings=("nope",), seeds=1), steps=1, warmup=0, threads=1)
    assert torch.get_num_threads() == before
    for kwargs, word in (({"steps": 0}, "steps"), ({"threads": 0}, "threads"),
                         ({"warmup": -1}, "warmup")):  # fmt: skip
        with pytest.raises(ValueError, match=word):
            profile(TINY, **kwargs)


def test_the_command_prints_the_tables(capsys):
    code = main(["lab", "profile", "--encodings", "alibi", "--sample", "2", "--steps", "40",
                 "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2",
                 "--train-len", "3", "--test-len", "4", "--eval-examples", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "linear layers (matmul)" in out and "alibi" in out and "per training" in out


def test_the_command_refuses_a_bad_sample(capsys):
    assert main(["lab", "profile", "--sample", "0"]) == 2
    assert "--sample" in capsys.readouterr().err
