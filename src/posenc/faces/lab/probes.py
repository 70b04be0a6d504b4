"""Where positions live in a trained lab model: linear probes of its residual stream.

After training, the lab asks of every layer's residual stream (layer 0 the
embedding output, layer ``l`` the output of block ``l``;
:meth:`~posenc.lab.model.LabModel.residuals`)
how much of each token's absolute position, its index ``0 .. T - 1`` in the
sequence, a linear read-out recovers:

- ``"r2"``: least squares with an intercept from the features to the index
  (float64, a ridge of :data:`RIDGE` times the mean eigenvalue of the centred
  features' Gram matrix for stability), scored as ``1 - SSE / SST`` on held-out
  sequences (:func:`linear_r2`);
- ``"accuracy"``: a multinomial logistic regression over the ``T`` positions
  (float64, full batch, :data:`STEPS` iterations of L-BFGS, an L2 penalty of
  :data:`L2` on standardised features), scored as held-out argmax accuracy;
  chance is ``1 / T`` (:func:`linear_accuracy`).

The sequences are the longest trained ones: for the synthetic tasks
``make_batch(task, train_len, n, generator)``, ``T = sequence_length(task,
train_len)``; for ``text`` windows of ``train_len`` bytes (the train split to
fit, the test split to score). :data:`FIT_SEQUENCES` are drawn to fit and
:data:`TEST_SEQUENCES` from another generator to score; ``randomized`` draws
its positions from seeded generators too, and its target is still the index
in the sequence. Everything is seeded, so a model's probes are a function of
the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from posenc.core import checks
from posenc.faces.lab import tasks as T

if TYPE_CHECKING:
    from posenc.faces.lab.model import LabModel

#: Sequences the probes are fitted on, and sequences (another draw) they are scored on.
FIT_SEQUENCES, TEST_SEQUENCES = 256, 128
#: The least-squares ridge, relative to the mean eigenvalue of the centred features' Gram matrix.
RIDGE = 1e-6
#: The classifier's L2 penalty on its weights (standardised features), added to the mean loss.
L2 = 1e-4
#: L-BFGS iterations of the classifier (strong Wolfe line search).
STEPS = 100
#: The probe metrics, in the order each layer's probes are listed.
METRICS = ("accuracy", "r2")
_VERSION = 1  # part of the probes' cache key: bump when their data or fitting changes
_FIT_SEED, _TEST_SEED = 515_153, 616_171  # the data's generators (and randomized positions')


@dataclass(frozen=True)
class Probe:
    """One probe's held-out score: tidy, one value per (task, encoding, seed, layer, metric).

    Attributes:
        task: the lab task.
        encoding: the trained encoding (``rope`` for its test-time scalings).
        seed: the model's seed.
        layer: 0 for the embedding output, ``l`` for the output of block ``l``.
        metric: ``"accuracy"`` or ``"r2"``.
        value: the held-out score.
        positions: ``T``, the positions classified (chance accuracy ``1 / T``).
    """

    task: str
    encoding: str
    seed: int
    layer: int
    metric: str
    value: float
    positions: int


def settings() -> dict[str, Any]:
    """What the probes depend on besides the trained model: part of their cache key."""
    return {"version": _VERSION, "fit": FIT_SEQUENCES, "test": TEST_SEQUENCES,
            "ridge": RIDGE, "l2": L2, "steps": STEPS}  # fmt: skip


def _nonnegative(value: Any, name: str) -> float:
    value = checks.check_number(value, name)
    if value < 0:
        raise ValueError(f"{name} must be >= 0; got {value!r}")
    return value


def _check_xy(x: Any, y: Any, x_name: str, y_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``(rows, features)`` as finite float64 and targets ``(rows,)`` as int64."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 2:
        raise TypeError(f"{x_name} must be a 2-D floating-point tensor (rows, features)")
    if not isinstance(y, torch.Tensor) or y.is_floating_point() or y.dim() != 1:
        raise TypeError(f"{y_name} must be a 1-D integer tensor of positions (rows,)")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"{x_name} and {y_name} must have the same rows, at least one; "
                         f"got {x.shape[0]} and {y.shape[0]}")  # fmt: skip
    x = x.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{x_name} must be finite")
    if bool((y < 0).any()):
        raise ValueError(f"{y_name} must be positions >= 0")
    return x, y.detach().to("cpu", torch.int64)


def linear_r2(
    fit_x: torch.Tensor, fit_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
    *, ridge: float = RIDGE,
) -> float:  # fmt: skip
    """Held-out R^2 of least squares with an intercept from features to positions.

    The fit centres ``fit_x`` and ``fit_y`` (the intercept, unpenalised) and solves
    ``(X'X + lam I) w = X'y`` in float64 with ``lam = ridge * trace(X'X) / features``;
    the score is ``1 - SSE / SST`` on ``test_x``, ``test_y``, SST about the held-out
    mean (1: every position recovered exactly; 0: no better than that mean).

    Args:
        fit_x, test_x: features ``(rows, features)``, floating point, finite.
        fit_y, test_y: positions ``(rows,)``, integers >= 0.
        ridge: >= 0; 0 is plain least squares (features must then span their rows).

    Raises:
        TypeError: features or positions of the wrong kind or shape.
        ValueError: rows that disagree, non-finite features, negative positions,
            ``test_y`` of one value (no SST), a negative ``ridge``.
    """
    x, y = _check_xy(fit_x, fit_y, "fit_x", "fit_y")
    xt, yt = _check_xy(test_x, test_y, "test_x", "test_y")
    if xt.shape[1] != x.shape[1]:
        raise ValueError(f"test_x must have fit_x's {x.shape[1]} features; got {xt.shape[1]}")
    ridge = _nonnegative(ridge, "ridge")
    if bool((yt == yt[0]).all()):
        raise ValueError("test_y must hold at least two positions (R^2 divides by their spread)")
    mx, my = x.mean(0), y.double().mean()
    xc = x - mx
    gram = xc.T @ xc
    scale = float(gram.diagonal().mean())
    lam = ridge * scale if scale > 0 else ridge
    eye = torch.eye(gram.shape[0], dtype=torch.float64)
    # gelsd (SVD): also for ridge 0 and a singular Gram matrix; the default driver, gelsy,
    # gave results differing in the last bits from one call to the next on the same input
    w = torch.linalg.lstsq(gram + lam * eye, xc.T @ (y.double() - my), driver="gelsd").solution
    predicted = (xt - mx) @ w + my
    target = yt.double()
    sse = float((target - predicted).pow(2).sum())
    sst = float((target - target.mean()).pow(2).sum())
    return 1.0 - sse / sst


def linear_accuracy(
    fit_x: torch.Tensor, fit_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
    classes: int, *, l2: float = L2, steps: int = STEPS,
) -> float:  # fmt: skip
    """Held-out accuracy of a multinomial logistic regression over ``classes`` positions.

    The features are standardised by ``fit_x``'s mean and standard deviation (a
    feature constant over the fit is only centred); the weights and intercepts
    start at zero and minimise the mean cross-entropy plus ``l2 / 2`` times the
    squared weights (not the intercepts) by full-batch L-BFGS in float64,
    ``steps`` iterations with a strong Wolfe line search. The score is the
    fraction of ``test_x``'s rows whose argmax is ``test_y`` (chance:
    ``1 / classes`` for features that carry no position).

    Args:
        fit_x, test_x: features ``(rows, features)``, floating point, finite.
        fit_y, test_y: positions ``(rows,)``, integers in ``0 .. classes - 1``.
        classes: the positions, an int >= 2.
        l2: >= 0.
        steps: L-BFGS iterations, >= 1.

    Raises:
        TypeError: features or positions of the wrong kind or shape.
        ValueError: rows that disagree, non-finite features, positions outside
            ``0 .. classes - 1``, bad ``classes``, ``l2`` or ``steps``.
    """
    classes = checks.check_int(classes, "classes", minimum=2)
    x, y = _check_xy(fit_x, fit_y, "fit_x", "fit_y")
    xt, yt = _check_xy(test_x, test_y, "test_x", "test_y")
    if xt.shape[1] != x.shape[1]:
        raise ValueError(f"test_x must have fit_x's {x.shape[1]} features; got {xt.shape[1]}")
    for name, labels in (("fit_y", y), ("test_y", yt)):
        if int(labels.max()) >= classes:
            raise ValueError(f"{name} must be positions below classes ({classes})")
    l2 = _nonnegative(l2, "l2")
    steps = checks.check_int(steps, "steps", minimum=1)
    mean, std = x.mean(0), x.std(0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    x, xt = (x - mean) / std, (xt - mean) / std
    weight = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=steps, history_size=20, line_search_fn="strong_wolfe",
        tolerance_grad=1e-10, tolerance_change=1e-14,
    )  # fmt: skip

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(x @ weight + bias, y)
        loss = loss + 0.5 * l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        predicted = (xt @ weight + bias).argmax(1)
    return float((predicted == yt).double().mean())


def _sequences(config: Any, corpus: Any) -> tuple[T.Batch, T.Batch]:
    """The fit and held-out batches, ``(sequences, T)`` tokens: the longest trained sequences."""
    fit, test = torch.Generator().manual_seed(_FIT_SEED), torch.Generator().manual_seed(_TEST_SEED)
    if config.task == "text":
        return (corpus.batch("train", config.train_len, FIT_SEQUENCES, fit),
                corpus.batch("test", config.train_len, TEST_SEQUENCES, test))  # fmt: skip
    return (T.make_batch(config.task, config.train_len, FIT_SEQUENCES, fit),
            T.make_batch(config.task, config.train_len, TEST_SEQUENCES, test))  # fmt: skip


@torch.no_grad()
def _stream(model: LabModel, batch: T.Batch, seed: int) -> list[torch.Tensor]:
    """Every layer's residual stream as rows ``(sequences * T, d_model)``; the layout of
    the numbers goes with the tokens (the encodings that read it need it)."""
    device = next(model.parameters()).device
    positions = torch.Generator().manual_seed(seed)
    batch = batch.to(device)
    layers = model.residuals(batch.tokens, generator=positions, significance=batch.significance)
    return [h.reshape(-1, h.shape[-1]) for h in layers]


def probe_model(model: LabModel, config: Any, seed: int, corpus: Any = None) -> list[Probe]:
    """The probes of every layer of ``model``, trained with ``seed`` under ``config``.

    One :class:`Probe` per layer ``0 .. config.layers`` and metric of :data:`METRICS`,
    in that order, named by the model's trained encoding. ``corpus`` is the
    :class:`~posenc.lab.tasks.TextCorpus` of the text task (unused otherwise). No
    probes (an empty list) where the sequence has a single position (text with
    ``train_len`` 1): there is nothing to locate.

    Raises:
        ValueError: a residual stream that is not finite (a diverged model).
    """
    positions = T.sequence_length(config.task, config.train_len)
    if positions < 2:
        return []
    was_training = model.training
    model.eval()
    fit_batch, test_batch = _sequences(config, corpus)
    fit = _stream(model, fit_batch, _FIT_SEED)
    test = _stream(model, test_batch, _TEST_SEED)
    model.train(was_training)
    fit_y = torch.arange(positions).repeat(fit_batch.tokens.shape[0])
    test_y = torch.arange(positions).repeat(test_batch.tokens.shape[0])
    probes = []
    for layer, (x, xt) in enumerate(zip(fit, test, strict=True)):
        scores = {
            "accuracy": linear_accuracy(x, fit_y, xt, test_y, positions),
            "r2": linear_r2(x, fit_y, xt, test_y),
        }
        for metric in METRICS:
            value = scores[metric]
            if not math.isfinite(value):  # pragma: no cover - finite inputs give finite scores
                raise ValueError(f"the {metric} probe of layer {layer} is not finite")
            probes.append(Probe(config.task, model.encoding, seed, layer, metric, value, positions))
    return probes


def bias_parameters(model: LabModel) -> dict[str, Any] | None:
    """The state of ``model``'s attention-bias module as nested lists of floats (None: no bias).

    Keyed by the module's ``state_dict`` names (``{}`` for ALiBi and Sandwich, whose
    buffers are functions of the sizes and are not saved);
    :func:`posenc.lab.results.bias_module` rebuilds the module from it.
    """
    if model.bias is None:
        return None
    return {name: value.detach().cpu().tolist() for name, value in model.bias.state_dict().items()}
