"""posenc lab on tiny settings: every encoding trains, caching and resuming, DDP equivalence."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import perturbed_lab_model
from posenc.faces.cli import main
from posenc.faces.lab import names, tasks
from posenc.faces.lab.encodings import REGISTRY, training_encoding
from posenc.faces.lab.model import _ROTATIONS, ENCODINGS, LabModel, ModelConfig, scaling_for
from posenc.faces.lab.training import (
    LabConfig,
    Record,
    _World,
    param_groups,
    run,
    text_lengths,
    train,
)

#: torch on one thread here (conftest.one_torch_thread): the lab's ops are tiny, and on
#: cores shared with other processes two OpenMP threads made them several times slower
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = LabConfig(
    task="copy", encodings=("alibi",), train_len=3, test_len=5, seeds=1, steps=40,
    batch_size=16, lr=3e-3, d_model=32, layers=1, heads=2, eval_examples=8,
    checkpoint_every=10,
)  # fmt: skip


def test_names_match_the_modules():
    assert names.TASKS == tasks.TASKS and names.ENCODINGS == ENCODINGS


def test_the_registry_is_the_list_of_encodings():
    assert tuple(REGISTRY) == ENCODINGS
    assert [e.name for e in REGISTRY.values()] == list(ENCODINGS)
    assert all(e.description for e in REGISTRY.values())


def test_names_import_without_torch():
    # the command line's help reads both
    code = (
        "import sys, posenc.faces.lab.names, posenc.faces.lab.suite; print('torch' in sys.modules)"
    )
    shown = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert shown.stdout.strip() == "False"


def test_test_time_variants_are_their_trained_encoding_plus_a_scaling():
    variants = [e for e in REGISTRY.values() if e.trains_as is not None]
    # one per context-extension schedule of the registry, and YaRN without its temperature
    assert {e.name: e.test_scaling for e in variants} == {
        "rope-linear": "linear", "rope-ntk": "ntk", "rope-dynamic": "dynamic",
        "rope-yarn": "yarn", "rope-llama3": "llama3", "rope-longrope": "longrope",
        "rope-yarn-flat": "yarn", "rope-resonance-yarn": "resonance_yarn",
    }  # fmt: skip
    assert REGISTRY["rope-resonance-yarn"].trains_as == "rope-resonance"
    for e in variants:
        trained = REGISTRY[e.trains_as]
        assert trained.trains_as is None and trained.test_scaling is None
        as_trained = replace(e, name=trained.name, description=trained.description,
                             trains_as=None, test_scaling=None, test_params=())  # fmt: skip
        assert as_trained == trained
        assert training_encoding(e.name) == trained.name


def layout(tokens):
    """A layout of numbers for ``tokens`` (their values aside): runs of 3 digits, each after
    a token outside the numbers and before an operator, as the arithmetic tasks carry."""
    columns = torch.arange(tokens.shape[1]) % 5 - 2  # -2 -1 0 1 2 -2 -1 0 ...
    return columns.expand(tokens.shape).clone()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_registered_encoding_builds_and_runs(encoding):
    spec = REGISTRY[encoding]
    config = ModelConfig(14, 16, 1, 2, max_positions=12)
    torch.manual_seed(0)
    model = LabModel(config, encoding)
    tokens = torch.randint(0, 14, (2, 10), generator=torch.Generator().manual_seed(0))
    scaling = spec.scaling(10, 5, rotary_dim=config.head_dim)
    assert (scaling is None) == (spec.test_scaling is None)
    logits = model(
        tokens, scaling=scaling, generator=torch.Generator().manual_seed(1),
        significance=layout(tokens),
    )  # fmt: skip
    assert logits.shape == (2, 10, 14) and bool(torch.isfinite(logits).all())
    assert model.encoding == training_encoding(encoding)
    # the pieces the entry names, and nothing else
    assert ("learned.weight" in model.state_dict()) == (spec.absolute == "learned")
    assert (model.bias is None) == (spec.bias is None)
    if spec.trains_as is not None:  # the very model of the encoding it trains as
        torch.manual_seed(0)
        trained = LabModel(config, spec.trains_as)
        assert model.state_dict().keys() == trained.state_dict().keys()
        assert all(torch.equal(v, trained.state_dict()[k]) for k, v in model.state_dict().items())
        torch.testing.assert_close(model(tokens), trained(tokens), rtol=0, atol=0)


# the span's pass sums the same products as the whole pass, in other orders (GEMMs
# blocked over fewer rows): each logit differs by a few roundings of sums of at most
# 4 * d_model terms of order max|logit|; 32 eps of it is ten times what any encoding shows
SPAN_ATOL = 32 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_span_of_logits_is_those_of_the_whole_pass(encoding):
    spec = REGISTRY[encoding]
    config = ModelConfig(14, 32, 2, 4, max_positions=40)
    model = perturbed_lab_model(config, encoding)
    tokens = torch.randint(0, 14, (3, 23), generator=torch.Generator().manual_seed(1))
    # beyond the trained length: the scalings act
    scaling = spec.scaling(23, 10, rotary_dim=config.head_dim)

    @torch.no_grad()
    def logits(span=None):
        # the same randomized positions on every call: one generator state
        positions = torch.Generator().manual_seed(5)
        return model(
            tokens, scaling=scaling, generator=positions, span=span, significance=layout(tokens)
        )

    whole = logits()
    bound = SPAN_ATOL * float(whole.abs().max())
    for start, stop in [(11, 22), (0, 23), (22, 23), (0, 1), (5, 6), (3, 20)]:
        part = logits((start, stop))
        assert part.shape == (3, stop - start, 14)
        torch.testing.assert_close(part, whole[:, start:stop], rtol=0, atol=bound)
    assert torch.equal(logits((0, 23)), whole)  # the whole span is the whole pass


def test_the_rotations_are_posencs_own():
    from posenc import attention
    from posenc.faces.lab.model import _attend
    from posenc.families.rotary.multiaxis import xpos_rotate
    from posenc.families.rotary.schedules import frequencies

    config = ModelConfig(14, 32, 2, 4, max_positions=40)
    q, k, v = torch.randn(3, 2, 4, 11, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    # xPos: xpos_rotate over the whole sequence, the queries a suffix of it
    model = LabModel(config, "xpos")
    attend = _attend(None, _ROTATIONS["xpos"](model, torch.arange(11), 11, None))
    rq, rk = xpos_rotate(q, k, frequencies("default", 8, 10000.0), layout="half")
    assert torch.equal(attend(q, k, v), attention(rq, rk, v, causal=True))
    assert torch.equal(attend(q[:, :, 4:], k, v), attention(rq[:, :, 4:], rk, v, causal=True))
    # randomized: Rotary at the drawn positions
    model = LabModel(config, "randomized")
    positions = model._positions(11, torch.device("cpu"), torch.Generator().manual_seed(1))
    attend = _attend(None, _ROTATIONS["rope"](model, positions, 11, None))
    rq, rk = model._rotary(None)(q, k, positions=positions)
    assert torch.equal(attend(q, k, v), attention(rq, rk, v, causal=True))
    # rope with a scaling: posenc.attention's own rotary, KV-cache alignment included
    model = LabModel(config, "rope")
    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 6}
    attend = _attend(None, _ROTATIONS["rope"](model, torch.arange(11), 11, scaling))
    rope = model._rotary(scaling)
    assert torch.equal(
        attend(q[:, :, 7:], k, v), attention(q[:, :, 7:], k, v, rotary=rope, causal=True)
    )


@pytest.mark.parametrize("encoding", ["alibi", "t5", "rope", "xpos", "learned", "randomized"])
def test_the_loss_of_the_scored_span_is_the_whole_loss(encoding):
    from posenc.faces.lab.training import batch_loss

    model = perturbed_lab_model(ModelConfig(14, 32, 2, 4, max_positions=40), encoding)
    batch = tasks.make_batch("copy", 6, 8, torch.Generator().manual_seed(2))
    assert batch.scored == (7, 14)
    span = batch_loss(model, batch, torch.Generator().manual_seed(3))
    span.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    logits = model(batch.tokens, generator=torch.Generator().manual_seed(3))
    whole = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch.targets.flatten(), ignore_index=tasks.IGNORE
    )
    whole.backward()
    torch.testing.assert_close(span, whole, rtol=0, atol=SPAN_ATOL * float(whole.detach()))
    for name, p in model.named_parameters():
        assert p.grad is not None and grads[name] is not None, name
        bound = SPAN_ATOL * float(p.grad.abs().max())
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=bound, msg=name)


@pytest.mark.parametrize(
    ("span", "error", "words"),
    [
        ((3, 3), ValueError, "span stop"),
        ((-1, 2), ValueError, "span start"),
        ((0, 9), ValueError, "within the 8 tokens"),
        ((0.0, 2), TypeError, "span start"),
        ([0, 2], TypeError, "span must be a"),
    ],
)
def test_a_span_must_lie_within_the_tokens(span, error, words):
    model = LabModel(ModelConfig(14, 16, 1, 2, max_positions=8), "alibi")
    with pytest.raises(error, match=words):
        model(torch.zeros(1, 8, dtype=torch.long), span=span)


@pytest.mark.parametrize("encoding", [e for e in ENCODINGS if REGISTRY[e].test_scaling is None])
def test_only_rope_accepts_a_test_time_scaling(encoding):
    model = LabModel(ModelConfig(14, 16, 1, 2, max_positions=8), encoding)
    tokens = torch.zeros(1, 4, dtype=torch.long)
    scaling = {"rope_type": "linear", "factor": 2.0}
    # the models a test-time variant evaluates: rope's, and Resonance RoPE's
    if training_encoding(encoding) in ("rope", "rope-resonance"):
        assert model(tokens, scaling=scaling).shape == (1, 4, 14)
    else:
        words = f"applies to rope, rope-resonance only; this model is '{encoding}'"
        with pytest.raises(ValueError, match=words):
            model(tokens, scaling=scaling)


# a test-time variant trains as the model it evaluates: rope-linear stands for them all
@pytest.mark.parametrize(
    "encoding", [e for e in ENCODINGS if not REGISTRY[e].test_scaling or e == "rope-linear"]
)
def test_every_encoding_trains(tmp_path, encoding):
    # the encodings that read a layout of numbers train on arithmetic
    task = "add-reversed" if REGISTRY[encoding].ids else TINY.task
    config = replace(TINY, task=task, encodings=(encoding,), steps=60)
    _, losses = train(config, encoding, 0, directory=tmp_path, world=_World())
    assert len(losses) == config.steps
    # batches of different lengths make single losses noisy: compare tens of steps
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.85 * first, (first, last)


def test_test_time_scaling_variants_share_the_rope_model(tmp_path):
    config = replace(TINY, encodings=("rope", "rope-linear", "rope-ntk", "rope-yarn"))
    outcome = run(config, tmp_path, progress=False)
    assert len(outcome.trained) == 1  # one RoPE model, four evaluations
    assert {r.encoding for r in outcome.records} == set(config.encodings)
    assert scaling_for("rope-yarn", 20, 10, rotary_dim=8) == {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 10,
    }  # fmt: skip
    assert scaling_for("rope-yarn-flat", 20, 10, rotary_dim=8) == {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 10,
        "attention_factor": 1.0,
    }  # fmt: skip
    assert scaling_for("rope-linear", 10, 10, rotary_dim=8) is None
    assert scaling_for("alibi", 30, 10, rotary_dim=8) is None


def test_results_are_tidy_records(tmp_path):
    outcome = run(replace(TINY, seeds=2), tmp_path, progress=False)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["config"]["task"] == "copy"
    records = [Record(**r) for r in doc["records"]]
    assert records == outcome.records
    assert {(r.seed, r.length) for r in records} == {(s, n) for s in (0, 1) for n in range(1, 6)}
    assert all(r.metric == "accuracy" and 0 <= r.value <= 1 for r in records)


def test_cache_trains_only_what_is_new(tmp_path):
    first = run(TINY, tmp_path, progress=False)
    assert len(first.trained) == 1 and not first.reused
    again = run(TINY, tmp_path, progress=False)
    assert not again.trained and len(again.reused) == 1
    assert again.records == first.records
    more = run(replace(TINY, encodings=("alibi", "nope")), tmp_path, progress=False)
    assert len(more.trained) == 1 and len(more.reused) == 1  # only nope is new


def test_interrupted_run_resumes_to_the_same_model(tmp_path):
    class Killed(Exception):
        pass

    def kill_at(step: int):
        def on_step(done: int) -> None:
            if done == step:
                raise Killed

        return on_step

    with pytest.raises(Killed):
        train(TINY, "alibi", 0, directory=tmp_path / "a", world=_World(), on_step=kill_at(25))
    assert any(p.name.endswith(".partial.pt") for p in (tmp_path / "a").iterdir())
    _, resumed = train(TINY, "alibi", 0, directory=tmp_path / "a", world=_World())
    _, straight = train(TINY, "alibi", 0, directory=tmp_path / "b", world=_World())
    # the checkpoint at step 20 holds the model, optimiser, schedule and both generators
    assert resumed == straight
    assert not any(p.name.endswith(".partial.pt") for p in (tmp_path / "a").iterdir())


def test_a_training_in_pieces_is_the_training_in_one_go(tmp_path):
    # randomized: the positions' generator is handed over too
    _, straight = train(TINY, "randomized", 0, directory=tmp_path / "a", world=_World())
    _, first = train(TINY, "randomized", 0, directory=tmp_path / "b", world=_World(), until=17)
    assert first == straight[:17]  # 17: between the periodic checkpoints, at its own
    assert [p.name.endswith(".partial.pt") for p in (tmp_path / "b").iterdir()] == [True]
    _, pieces = train(TINY, "randomized", 0, directory=tmp_path / "b", world=_World())
    assert pieces == straight


def test_worker_processes_train_as_this_process_does(tmp_path, one_torch_thread):
    config = replace(TINY, encodings=("alibi", "t5", "rope", "rope-linear"))
    # this process on the threads it had before the module's one: as a user's, which hands
    # each of its workers its share of them
    torch.set_num_threads(one_torch_thread)
    try:
        here = run(config, tmp_path / "here", progress=False, workers=1)
        pool = run(config, tmp_path / "pool", progress=False, workers=2)
    finally:
        torch.set_num_threads(1)
    assert len(pool.trained) == len(here.trained) == 3  # rope-linear evaluates rope's model
    assert [(r.encoding, r.seed, r.length) for r in pool.records] == [
        (r.encoding, r.seed, r.length) for r in here.records
    ]
    # the same updates; a worker's one thread orders some float32 sums differently (a few
    # ulps per step, as between one process and two under torchrun)
    assert pool.losses.keys() == here.losses.keys()
    for name, losses in pool.losses.items():
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(here.losses[name]), rtol=1e-4, atol=1e-6
        )
    # an example whose answer sits that close to a tie may flip: at most one per length
    assert all(abs(a.value - b.value) <= 1 / TINY.eval_examples
               for a, b in zip(pool.records, here.records, strict=True))  # fmt: skip


@pytest.mark.parametrize("workers", [0, -1])
def test_workers_must_be_positive(tmp_path, workers):
    with pytest.raises(ValueError, match="workers"):
        run(replace(TINY, seeds=2), tmp_path, progress=False, workers=workers)


@pytest.mark.parametrize("encoding", ["t5", "kerple", "fire", "alibi", "rope", "learned"])
def test_position_biases_step_in_proportion_to_their_scale(encoding):
    torch.manual_seed(0)
    model = LabModel(TINY.model, encoding)
    groups = param_groups(model, 1e-3)
    grouped = [p for g in groups for p in g["params"]]
    assert sorted(map(id, grouped)) == sorted(id(p) for p in model.parameters())
    assert "lr" not in groups[0]  # everything but the bias at the optimiser's lr
    own = [] if model.bias is None else list(model.bias.parameters())
    assert [g["params"] for g in groups[1:]] == [[p] for p in own]

    def rms(t):
        return t.detach().double().pow(2).mean().sqrt().item()

    reference = rms(model.blocks[0].qkv.weight)
    for group in groups[1:]:
        (p,) = group["params"]
        assert group["lr"] == pytest.approx(1e-3 * max(1.0, rms(p) / reference), rel=1e-12)
    if encoding == "t5":  # a unit-normal table against nn.Linear's 1/sqrt(3 fan_in) weights
        assert groups[1]["lr"] > 5e-3


def test_killed_run_keeps_finished_results(tmp_path, monkeypatch):
    from posenc.faces.lab import training as lab_run

    real = lab_run.train

    def failing(config, encoding, seed, **kw):
        if encoding == "nope":
            raise KeyboardInterrupt
        return real(config, encoding, seed, **kw)

    monkeypatch.setattr(lab_run, "train", failing)
    with pytest.raises(KeyboardInterrupt):  # in this process: spawned workers see no monkeypatch
        run(replace(TINY, encodings=("alibi", "nope")), tmp_path, progress=False, workers=1)
    monkeypatch.setattr(lab_run, "train", real)
    outcome = run(replace(TINY, encodings=("alibi", "nope")), tmp_path, progress=False)
    assert len(outcome.reused) == 1 and len(outcome.trained) == 1


def test_text_task_measures_perplexity(tmp_path):
    config = replace(
        TINY, task="text", encodings=("alibi", "sinusoidal"), train_len=16, test_len=40,
        steps=5, eval_examples=2, text_bytes=1 << 18,
    )  # fmt: skip
    outcome = run(config, tmp_path, progress=False)
    assert text_lengths(config) == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    assert {r.metric for r in outcome.records} == {"perplexity"}
    assert all(1 < r.value < 1000 for r in outcome.records)


@pytest.mark.parametrize("encoding", ["learned", "randomized"])
def test_learned_and_randomized_positions_have_a_limit(encoding):
    model = LabModel(ModelConfig(14, 16, 1, 2, max_positions=8), encoding)
    assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 14)
    with pytest.raises(ValueError, match=f"max_positions=8 \\({encoding} has no positions beyond"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_two_gloo_processes_equal_one(tmp_path, capsys, torchrun_gloo):
    argv = [
        "lab", "run", "--task", "copy", "--encodings", "t5", "--train-len", "3",
        "--test-len", "4", "--seeds", "1", "--steps", "6", "--batch-size", "8",
        "--d-model", "16", "--layers", "1", "--heads", "2", "--eval-examples", "4",
        "--no-progress",
    ]  # fmt: skip
    # the one process is this one, on one thread (one_torch_thread) as each gloo process
    one = tmp_path / "one"
    assert torch.get_num_threads() == 1
    assert main([*argv, "--out", str(one)]) == 0, capsys.readouterr().err
    two = tmp_path / "two"
    torchrun_gloo([*argv, "--out", str(two)])  # 2 gloo processes, a free port of their own

    def losses(out: Path) -> list[float]:
        (final,) = [p for p in (out / "runs").iterdir() if p.suffix == ".pt"]
        return torch.load(final, weights_only=False)["losses"]

    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 6
    # the same updates; only the order of float32 sums differs (a few ulps per step)
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--task", "nope"], "--task"),
        (["--encodings", "alibi,bogus"], "encoding"),
        (["--train-len", "8", "--test-len", "4"], "test_len"),
        (["--seeds", "0"], "--seeds"),
        (["--device", "tpu"], "--device"),
    ]
    + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "--device")]),
)
def test_bad_options_end_with_one_line(tmp_path, capsys, argv, words):
    assert main(["lab", "run", *argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err and "Traceback" not in err


def test_page_and_report_embed_the_results(tmp_path, figure_placeholders):
    from posenc import report
    from posenc.faces.lab import results

    outcome = run(replace(TINY, encodings=("alibi", "nope")), tmp_path / "lab", progress=False)
    paths = results.write(tmp_path / "lab", outcome.records, TINY)
    page = paths["html"].read_text()
    assert 'id="lab-copy"' in page and "data:image/svg+xml;base64," in page and "nope" in page
    assert paths["svg"].read_text().lstrip().startswith("<?xml")
    rows = results.summary(outcome.records, TINY.train_len)
    assert [r["encoding"] for r in rows] == ["alibi", "nope"]
    # the report: the figures drawn from the lab run (the position probes and the
    # NoPE-in-some-layers comparison) are rendered; the explainer's others (rendered and
    # checked by test_report.py, two thirds of this test's time) as placeholders
    lab_figures = {"probes", "nope-layers"}
    rendered = figure_placeholders(keep=lab_figures)
    built = report.build(tmp_path / "report", dim=8, length=4, train_steps=2, lab=tmp_path / "lab")
    page = built.index.read_text()
    assert 'id="lab-copy"' in page and 'id="lab-text"' not in page  # replaces the bundled runs
    assert sorted(rendered) == sorted(lab_figures) and lab_figures <= set(built.figures)


def _partial_then_full(target, data=b"partial"):
    """Write a little to ``target`` (a path or an open file), then fail as a full disk does."""
    if isinstance(target, (str, os.PathLike)):
        with open(target, "wb") as f:
            f.write(data)
    else:
        target.write(data)
    raise OSError(errno.ENOSPC, "No space left on device")


def test_save_failing_part_way_keeps_the_previous_file(tmp_path, monkeypatch):
    from posenc.faces.lab import training as lab_run

    checkpoint, records = tmp_path / "key.pt", tmp_path / "key.json"
    lab_run._save({"step": 10}, checkpoint)
    lab_run._save([{"value": 1.0}], records)
    previous = checkpoint.read_bytes(), records.read_bytes()
    monkeypatch.setattr(torch, "save", lambda obj, f: _partial_then_full(f))
    with pytest.raises(OSError, match="No space left"):
        lab_run._save({"step": 20}, checkpoint)
    monkeypatch.setattr(lab_run.json, "dumps", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        lab_run._save([{"value": 2.0}], records)
    assert (checkpoint.read_bytes(), records.read_bytes()) == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key.json", "key.pt"]


def test_results_write_failing_part_way_keeps_the_previous_page(tmp_path, monkeypatch):
    from posenc.faces.lab import results

    records = [Record("copy", "alibi", 0, n, "accuracy", 1.0 / n) for n in (1, 2, 3, 4, 5)]
    paths = results.write(tmp_path, records, TINY)
    previous = {name: path.read_bytes() for name, path in paths.items()}
    figure = results.figure

    def failing_figure(*args, **kwargs):
        fig = figure(*args, **kwargs)
        fig.savefig = lambda target, **kw: _partial_then_full(target, b"<svg partial")
        return fig

    monkeypatch.setattr(results, "figure", failing_figure)
    with pytest.raises(OSError, match="No space left"):
        results.write(tmp_path, records[:2], TINY)
    assert {name: path.read_bytes() for name, path in paths.items()} == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths.values())


def test_lab_device_defaults_to_a_gpu_where_one_exists(monkeypatch):
    from posenc.faces.lab.training import lab_device

    assert lab_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert lab_device(None) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device \(--device\).*no CUDA device"):
        lab_device("cuda")
    for bad in ("tpu", "meta", 3.5):
        with pytest.raises(ValueError, match=r"device \(--device\)"):
            lab_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert lab_device(None) == torch.device("cuda")
