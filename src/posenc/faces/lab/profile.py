"""``posenc lab profile``: where a lab training's time goes, per phase and per operation.

Each training encoding of a :class:`~posenc.lab.training.LabConfig` is trained for a
sample of steps exactly as :func:`posenc.lab.training.run` trains it (the same
model, batches, optimiser and schedule), on the threads a ``posenc lab run``
worker has (one by default). The wall time of every step is split into its
phases (drawing the batch, forward and loss, backward, gradient clipping plus
the optimiser), and a second sample runs under :mod:`torch.profiler` to split
the step by operation: the operations' own times, by kind, and the rest of the
step (Python, autograd bookkeeping and dispatch between operations). One
evaluation (every test length) is timed whole. Figures per training are scaled
to ``config.steps``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from posenc.core import checks
from posenc.faces.lab.encodings import training_encoding
from posenc.faces.lab.model import LabModel
from posenc.faces.lab.training import (
    LabConfig,
    batch_loss,
    evaluate,
    text_corpus,
    training_state,
    update,
)

#: The phases of one training step, in order.
PHASES = ("data", "forward", "backward", "optimiser")

#: Kinds of operation, each with the test of a profiler event's name; the first match wins.
KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("linear layers (matmul)", lambda n: n in ("aten::mm", "aten::addmm", "aten::bmm")),
    ("attention kernels", lambda n: not n.startswith("aten::") and "Attention" in n),
    ("GELU", lambda n: n.startswith("aten::gelu")),
    ("layer norm", lambda n: "layer_norm" in n),
    ("softmax and loss", lambda n: "log_softmax" in n or n.startswith("aten::nll_loss")),
    ("optimiser", lambda n: "adamw" in n or n.startswith("aten::_foreach") or "norm" in n),
    ("other operations", lambda n: n.startswith("aten::")),
)
_REST = "Python, autograd and dispatch"


@dataclass
class Profile:
    """Per training encoding: milliseconds per step by phase and by kind, evaluation seconds."""

    config: LabConfig
    steps: int
    threads: int
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # ms per step
    kinds: dict[str, dict[str, float]] = field(default_factory=dict)  # ms per step
    evaluation: dict[str, float] = field(default_factory=dict)  # s per training

    def training_seconds(self, encoding: str) -> float:
        """One whole training and its evaluation: phases times ``config.steps``, plus evaluation."""
        step = sum(self.phases[encoding].values())
        return step * self.config.steps / 1e3 + self.evaluation[encoding]


def _kind(name: str) -> str | None:
    for kind, test in KINDS:
        if test(name):
            return kind
    return None


def profile(
    config: LabConfig,
    *,
    steps: int = 100,
    warmup: int = 10,
    threads: int = 1,
    corpus: Any = None,
) -> Profile:
    """Time ``steps`` training steps of every training encoding of ``config``, by phase and kind.

    Args:
        config: the run to profile (its encodings, sizes, batch and task).
        steps: steps timed by phase, after ``warmup`` untimed ones; as many again
            run under the profiler for the split by kind.
        threads: torch's threads while profiling (a ``posenc lab run`` worker has one).
        corpus: the text task's :class:`~posenc.lab.tasks.TextCorpus` (read if None).

    Raises:
        ValueError: ``steps`` or ``threads`` < 1, ``warmup`` < 0.
    """
    steps = checks.check_int(steps, "steps", minimum=1)
    warmup = checks.check_int(warmup, "warmup", minimum=0)
    threads = checks.check_int(threads, "threads", minimum=1)
    if config.task == "text" and corpus is None:
        corpus = text_corpus(config)
    result = Profile(config, steps, threads)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for encoding in dict.fromkeys(training_encoding(e) for e in config.encodings):
            _profile_one(result, encoding, warmup, corpus)
    finally:
        torch.set_num_threads(before)
    return result


def _profile_one(result: Profile, encoding: str, warmup: int, corpus: Any) -> None:
    config, device = result.config, torch.device("cpu")
    torch.manual_seed(0)
    model = LabModel(config.model, encoding)
    opt, sched, data, positions = training_state(model, config, 0, device, corpus)
    model.train()
    clock = time.perf_counter

    def step(times: dict[str, float] | None) -> None:
        t0 = clock()
        batch = data.next()
        t1 = clock()
        loss = batch_loss(model, batch, positions)
        t2 = clock()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t3 = clock()
        update(model, opt, sched)
        float(loss.detach())  # the training loop reads every loss
        if times is not None:
            for phase, spent in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, clock() - t3), strict=True):
                times[phase] += spent

    for _ in range(warmup):
        step(None)
    times = dict.fromkeys(PHASES, 0.0)
    for _ in range(result.steps):
        step(times)
    result.phases[encoding] = {p: 1e3 * t / result.steps for p, t in times.items()}

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(result.steps):
            step(None)
    kinds = dict.fromkeys([k for k, _ in KINDS], 0.0)
    for event in prof.key_averages():
        kind = _kind(event.key)
        if kind is not None:
            kinds[kind] += event.self_cpu_time_total / 1e3 / result.steps  # us -> ms per step
    # the rest of the step's wall time (from the unprofiled sample: the profiler's own
    # bookkeeping would count here otherwise) ran outside any operation
    kinds[_REST] = max(0.0, sum(result.phases[encoding].values()) - sum(kinds.values()))
    result.kinds[encoding] = kinds

    start = clock()
    evaluate(model, config, encoding, 0, corpus)
    result.evaluation[encoding] = clock() - start


def format_profile(result: Profile, workers: int = 1) -> str:
    """Plain-text tables of a :class:`Profile`: mean over its encodings, then per encoding."""
    encodings: Sequence[str] = list(result.phases)
    c = result.config

    def mean(table: dict[str, dict[str, float]], key: str) -> float:
        return sum(table[e][key] for e in encodings) / len(encodings)

    step = sum(mean(result.phases, p) for p in PHASES)
    lines = [
        f"lab {c.task}: {c.steps} steps of batch {c.batch_size}, width {c.d_model}, "
        f"{c.layers} layers; {result.steps} steps sampled per encoding on "
        f"{result.threads} thread(s), mean over {', '.join(encodings)}",
        "",
        f"{'phase':34s} {'ms/step':>8s} {'share':>6s}",
    ]
    for phase in PHASES:
        value = mean(result.phases, phase)
        lines.append(f"{phase:34s} {value:8.2f} {100 * value / step:5.1f}%")
    lines += ["", f"{'operation':34s} {'ms/step':>8s} {'share':>6s}"]
    for kind in [k for k, _ in KINDS] + [_REST]:
        value = mean(result.kinds, kind)
        lines.append(f"{kind:34s} {value:8.2f} {100 * value / step:5.1f}%")
    lines.append("")
    total = 0.0
    for e in encodings:
        seconds = result.training_seconds(e)
        total += seconds
        lines.append(
            f"{e:12s} {sum(result.phases[e].values()):6.2f} ms/step, evaluation "
            f"{result.evaluation[e]:5.2f} s: {seconds:6.1f} s per training"
        )
    trainings = len(encodings) * c.seeds
    lines.append(
        f"whole run: {trainings} trainings, about {total * c.seeds:.0f} s of work "
        f"({total * c.seeds / workers:.0f} s on {workers} worker(s) at once)"
    )
    return "\n".join(lines)
