"""posenc lab's position probes, the hybrid-nope encoding, and results.json read back."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace

import pytest
import torch

from conftest import anchor, perturbed_lab_model
from posenc.faces.lab import probes as P
from posenc.faces.lab import results, tasks
from posenc.faces.lab import training as lab_run
from posenc.faces.lab.encodings import REGISTRY, Encoding, lookup
from posenc.faces.lab.model import _ROTATIONS, ModelConfig, _attend
from posenc.faces.lab.training import DEFAULT_ENCODINGS, LabConfig, _World, run, train

#: torch on one thread here (conftest.one_torch_thread): the lab's ops are tiny, and on
#: cores shared with other processes two OpenMP threads made them several times slower
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = LabConfig(
    task="copy", encodings=("alibi",), train_len=3, test_len=5, seeds=1, steps=10,
    batch_size=8, lr=3e-3, d_model=32, layers=2, heads=2, eval_examples=4,
    checkpoint_every=10,
)  # fmt: skip
EPS64 = torch.finfo(torch.float64).eps


# ------------------------------------------------------------------ the probes themselves


def _linear_positions(sequences: int, positions: int, width: int, generator: torch.Generator):
    """Features in which the position is exactly linear, and the positions.

    Columns 1 .. T-1 of the one-hot position (the index is ``sum_c c * onehot_c``;
    column 0 dropped so the centred columns stay independent) next to Gaussian
    noise, all turned by one random orthogonal matrix.
    """
    y = torch.arange(positions).repeat(sequences)
    onehot = torch.nn.functional.one_hot(y, positions)[:, 1:].double()
    noise = torch.randn(len(y), width - positions + 1, generator=generator, dtype=torch.float64)
    turn = torch.linalg.qr(
        torch.randn(width, width, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    ).Q
    index = torch.cat([torch.arange(1, positions), torch.zeros(width - positions + 1)])
    return torch.cat([onehot, noise], 1) @ turn, y, turn.T @ index.double()


def test_a_position_that_is_linear_in_the_features_is_recovered_exactly():
    gen = torch.Generator().manual_seed(0)
    t, width = 35, 64  # the default copy run's positions and width
    x, y, w = _linear_positions(P.FIT_SEQUENCES, t, width, gen)
    xt, yt, _ = _linear_positions(P.TEST_SEQUENCES, t, width, gen)
    assert torch.allclose(x @ w, y.double(), atol=1e-9)  # the position is x @ w exactly
    # the ridge leaves w - w_hat = lam (G + lam)^-1 w: at most lam / (e_min + lam) of |w|
    # (G the centred fit Gram matrix, e_min its least eigenvalue); float64 solving adds at
    # most about width * cond(G) * eps of it. SSE = |(X_test - mean)(w - w_hat)|^2 is at
    # most the largest singular value of X_test - mean, squared, times |w - w_hat|^2.
    xc = x - x.mean(0)
    gram = xc.T @ xc
    eig = torch.linalg.eigvalsh(gram)
    spread = float(torch.linalg.matrix_norm(xt - x.mean(0), ord=2)) ** 2
    sst = float((yt.double() - yt.double().mean()).pow(2).sum())
    rounding = width * float(eig[-1] / eig[0]) * EPS64
    for ridge in (P.RIDGE, 0.0):
        lam = ridge * float(gram.diagonal().mean())
        off = float(w.norm()) * (lam / (float(eig[0]) + lam) + rounding)
        bound = spread * off**2 / sst
        assert bound < 1e-3  # tight enough to say R^2 = 1
        assert 1 - bound <= P.linear_r2(x, y, xt, yt, ridge=ridge) <= 1
    assert P.linear_accuracy(x, y, xt, yt, t) == 1.0


def _chernoff_upper(mean: float, failure: float) -> float:
    """K >= (1 + d) mean has probability at most ``failure`` for a sum K of independent
    Bernoullis of that mean: exp(-d^2 mean / (2 + d)) = failure, solved for d."""
    log = math.log(1 / failure)
    return (1 + (log + math.sqrt(log**2 + 8 * mean * log)) / (2 * mean)) * mean


def test_features_without_position_classify_at_chance():
    # a nope model's layer 0 is the token embedding alone; over i.i.d. uniform tokens the
    # features of a row say nothing of its position. Whatever the fitted classifier, a
    # held-out row at position t is right with probability p_t = P(argmax = t), the
    # rows are independent (distinct tokens), and sum_t p_t = 1 per sequence: the correct
    # count is a sum of independent Bernoullis of mean TEST_SEQUENCES. Chernoff bounds it.
    config = ModelConfig(tasks.vocab_size("copy"), 64, 2, 4, max_positions=70)
    t = tasks.sequence_length("copy", 16)
    gen = torch.Generator().manual_seed(3)
    fit = torch.randint(0, config.vocab, (P.FIT_SEQUENCES, t), generator=gen)
    test = torch.randint(0, config.vocab, (P.TEST_SEQUENCES, t), generator=gen)
    fit_y, test_y = torch.arange(t).repeat(len(fit)), torch.arange(t).repeat(len(test))

    def layer0(encoding: str):
        model = perturbed_lab_model(config, encoding)
        with torch.no_grad():
            return [model.residuals(x)[0].flatten(0, 1) for x in (fit, test)]

    bound = _chernoff_upper(P.TEST_SEQUENCES, 1e-6) / (P.TEST_SEQUENCES * t)
    assert bound < 2 / t  # near chance, 1 / t
    x, xt = layer0("nope")
    assert P.linear_accuracy(x, fit_y, xt, test_y, t) <= bound
    # the bound can fail: the sinusoidal table added to the same tokens is read off
    x, xt = layer0("sinusoidal")
    assert P.linear_accuracy(x, fit_y, xt, test_y, t) > 0.9


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda x, y: P.linear_r2(x.numpy(), y, x, y), TypeError, "fit_x"),
        (lambda x, y: P.linear_r2(x, y.double(), x, y), TypeError, "fit_y"),
        (lambda x, y: P.linear_r2(x, y, x[:-1], y), ValueError, "test_x and test_y"),
        (lambda x, y: P.linear_r2(x, y, x[:, :2], y), ValueError, "test_x must have"),
        (lambda x, y: P.linear_r2(x * math.nan, y, x, y), ValueError, "fit_x must be finite"),
        (lambda x, y: P.linear_r2(x, y, x, y * 0), ValueError, "test_y must hold"),
        (lambda x, y: P.linear_r2(x, y, x, y, ridge=-1.0), ValueError, "ridge"),
        (lambda x, y: P.linear_accuracy(x, y, x, y, 1), ValueError, "classes"),
        (lambda x, y: P.linear_accuracy(x, y, x, y, 3), ValueError, "fit_y must be positions"),
        (lambda x, y: P.linear_accuracy(x, -y, x, y, 5), ValueError, "fit_y must be positions"),
        (lambda x, y: P.linear_accuracy(x, y, x, y, 5, steps=0), ValueError, "steps"),
        (lambda x, y: P.linear_accuracy(x, y, x, y, 5, l2=math.inf), ValueError, "l2"),
    ],
)
def test_probes_refuse_bad_input(call, error, words):
    y = torch.arange(5).repeat(4)
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(error, match=words):
        call(x, y)


# ------------------------------------------------------------------ residuals, hybrid-nope


@pytest.mark.parametrize("encoding", ["sinusoidal", "learned", "hybrid-nope", "t5", "randomized"])
def test_the_residual_stream_is_the_forward_pass(encoding):
    model = perturbed_lab_model(ModelConfig(14, 32, 2, 4, max_positions=40), encoding)
    tokens = torch.randint(0, 14, (3, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stream = model.residuals(tokens, generator=torch.Generator().manual_seed(5))
        logits = model(tokens, generator=torch.Generator().manual_seed(5))
    assert [h.shape for h in stream] == [(3, 23, 32)] * 3
    assert torch.equal(model.head(model.ln(stream[-1])), logits)
    embedded = model.embed(tokens)
    if encoding in ("sinusoidal", "learned"):  # layer 0: the token embedding plus the table
        embedded = embedded + model.get_submodule(encoding)(torch.arange(23))
    assert torch.equal(stream[0], embedded)


@pytest.mark.parametrize("encoding", ["abacus", "coupled"])
def test_encodings_that_read_the_numbers_are_probed_with_their_layout(encoding):
    # their residual stream needs the batch's layout of the numbers (significance)
    config = LabConfig(task="add-reversed", encodings=(encoding,), train_len=4, d_model=32, heads=2)
    model = perturbed_lab_model(ModelConfig(20, 32, 2, 2, max_positions=40, max_ids=8), encoding)
    found = P.probe_model(model, config, 0)
    assert [(p.layer, p.metric) for p in found] == [
        (layer, m) for layer in range(3) for m in P.METRICS
    ]
    assert all(math.isfinite(p.value) for p in found)


def test_hybrid_nope_is_rope_in_all_but_every_kth_layer():
    spec = REGISTRY["hybrid-nope"]
    assert spec.rotary == "rope" and spec.nope_every == 2 and spec.bias is None
    assert "Llama 4" in spec.description and "4" in spec.description
    assert [spec.rotates(i) for i in range(4)] == [True, False, True, False]
    assert not any(REGISTRY["nope"].rotates(i) for i in range(4))
    assert all(REGISTRY["rope"].rotates(i) for i in range(4))
    assert DEFAULT_ENCODINGS.index("hybrid-nope") == DEFAULT_ENCODINGS.index("nope") + 1
    # the layout of HF's configs, every interval
    transformers = anchor("transformers")
    for every in (2, 3, 4):
        for config in (transformers.Llama4TextConfig, transformers.SmolLM3Config):
            layers = config(num_hidden_layers=9, no_rope_layer_interval=every).no_rope_layers
            assert [int(replace(spec, nope_every=every).rotates(i)) for i in range(9)] == layers


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        ({"rotary": "rope", "nope_every": 1}, ValueError, "nope_every"),
        ({"rotary": "rope", "nope_every": 2.0}, TypeError, "nope_every"),
        ({"nope_every": 2}, ValueError, "needs a rotary"),
    ],
)
def test_nope_every_is_checked(fields, error, words):
    with pytest.raises(error, match=words):
        Encoding("x", "x", **fields)
    with pytest.raises(ValueError, match="layer"):
        lookup("hybrid-nope").rotates(-1)


def test_the_hybrids_second_layer_rotates_nothing_and_its_first_does():
    model = perturbed_lab_model(ModelConfig(14, 32, 2, 4, max_positions=40), "hybrid-nope")
    tokens = torch.randint(0, 14, (3, 23), generator=torch.Generator().manual_seed(1))
    rotating = _attend(None, _ROTATIONS["rope"](model, torch.arange(23), 23, None))
    plain = _attend(None, None)  # a model whose rotation is off
    with torch.no_grad():
        h0, h1, h2 = model.residuals(tokens)
        assert torch.equal(model.blocks[0](h0, rotating, 23), h1)
        assert torch.equal(model.blocks[1](h1, plain, 23), h2)
        # and the other way round is another model: rotation matters in either layer
        assert not torch.allclose(model.blocks[0](h0, plain, 23), h1, atol=1e-3)
        assert not torch.allclose(model.blocks[1](h1, rotating, 23), h2, atol=1e-3)


# ------------------------------------------------------------------ the run and results.json

BIASED = ("t5", "kerple", "fire", "alibi", "sandwich")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    config = replace(SMALL, encodings=(*BIASED, "hybrid-nope", "rope-linear"), seeds=2)
    return out, config, run(config, out, progress=False)


def test_results_carry_probes_and_bias_parameters(lab):
    out, config, outcome = lab
    doc = json.loads((out / "results.json").read_text())
    read = results.read(doc)
    assert read.config == config and read.records == outcome.records
    assert read.probes == outcome.probes
    t = tasks.sequence_length("copy", config.train_len)
    trained = [*BIASED, "hybrid-nope", "rope"]  # rope-linear is rope's model, probed once
    assert [(p.encoding, p.seed, p.layer, p.metric) for p in read.probes] == [
        (e, s, layer, metric)
        for s in range(2) for e in trained for layer in range(3) for metric in P.METRICS
    ]  # fmt: skip
    assert {(p.task, p.positions) for p in read.probes} == {("copy", t)}
    assert all(0 <= p.value <= 1 for p in read.probes if p.metric == "accuracy")
    assert all(math.isfinite(p.value) and p.value <= 1 for p in read.probes)
    assert [(b.encoding, b.seed) for b in read.bias_parameters] == [
        (e, s) for s in range(2) for e in BIASED
    ]


def test_a_rebuilt_bias_module_is_the_trained_models_bias(lab):
    out, config, _ = lab
    read = results.read(json.loads((out / "results.json").read_text()))
    length = config.max_positions
    for entry in read.bias_parameters:
        model, _ = train(config, entry.encoding, entry.seed, directory=out / "runs", world=_World())
        rebuilt = results.bias_module(entry, config)
        assert type(rebuilt) is type(model.bias)
        for name, value in model.bias.state_dict().items():
            assert torch.equal(rebuilt.state_dict()[name], value), (entry.encoding, name)
        assert torch.equal(rebuilt.bias(length, length), model.bias.bias(length, length))
    t5 = next(b for b in read.bias_parameters if b.encoding == "t5")
    with pytest.raises(ValueError, match="entry"):
        results.bias_module(replace(t5, encoding="kerple"), config)
    with pytest.raises(ValueError, match="entry"):
        results.bias_module(replace(t5, encoding="rope"), config)
    with pytest.raises(TypeError, match="entry"):
        results.bias_module(asdict(t5), config)


def test_a_rerun_reuses_the_probes(lab, monkeypatch):
    out, config, first = lab

    def fail(*args, **kwargs):
        raise AssertionError("computed again")

    monkeypatch.setattr(lab_run, "probe_model", fail)
    monkeypatch.setattr(lab_run, "evaluate", fail)
    again = run(config, out, progress=False)
    assert not again.trained and not again.probed
    assert again.probes == first.probes and again.bias_parameters == first.bias_parameters


def test_a_run_evaluated_before_probes_existed_only_probes(lab, tmp_path, monkeypatch):
    out, config, first = lab
    # the run as it was before the probes: its trained models and evaluations alone
    (tmp_path / "runs").mkdir()
    for path in (out / "runs").iterdir():
        if "-probes-" not in path.name:
            (tmp_path / "runs" / path.name).write_bytes(path.read_bytes())

    def fail(*args, **kwargs):
        raise AssertionError("evaluated again")

    monkeypatch.setattr(lab_run, "evaluate", fail)
    again = run(config, tmp_path, progress=False)
    assert not again.trained and len(again.reused) == len(config.encodings) * config.seeds
    assert len(again.probed) == 14  # 7 trained models a seed: rope-linear evaluates rope's
    # the probes are a function of the trained model: the same figures again
    assert again.probes == first.probes and again.bias_parameters == first.bias_parameters


def test_a_results_file_from_before_the_probes_reads(lab):
    out, config, outcome = lab
    doc = json.loads((out / "results.json").read_text())
    old = results.read({"config": doc["config"], "records": doc["records"]})
    assert old.config == config and old.records == outcome.records
    assert old.probes == [] and old.bias_parameters == []
    text = results.bundled()[1]  # the bundled text run reads back with its probes
    assert text.config.task == "text" and text.records and text.probes
    with pytest.raises(TypeError, match="doc"):
        results.read([doc])
    with pytest.raises(ValueError, match="'records'"):
        results.read({"config": doc["config"]})
    with pytest.raises(ValueError, match=r"doc\['probes'\]\[0\]"):
        results.read({**doc, "probes": [{"layer": 0}]})


def test_the_page_shows_the_probes_per_layer(lab):
    _, config, outcome = lab
    rows = results.probe_summary(outcome.probes)
    assert [(r["encoding"], r["metric"]) for r in rows][:2] == [("t5", "accuracy"), ("t5", "r2")]
    for row in rows:
        for layer, (mean, lo, hi) in row["layers"].items():
            key = (row["encoding"], row["metric"], layer)
            values = [p.value for p in outcome.probes if (p.encoding, p.metric, p.layer) == key]
            assert len(values) == 2 and (lo, hi) == (min(values), max(values))
            assert mean == pytest.approx(sum(values) / 2, rel=1e-15)
    page = results.section(outcome.records, config, b"<svg/>", outcome.probes)
    t = tasks.sequence_length("copy", config.train_len)
    assert "layer 0 (embedding)" in page and "layer 2" in page
    assert f"{1 / t:.3g} (T = {t})" in page and "hybrid-nope" in page
    assert "layer 0" not in results.section(outcome.records, config, b"<svg/>")
