"""``posenc lab extend``: every context-extension schedule on the same trained models.

A model trained with RoPE at ``L`` tokens is run at ``2L``, ``4L`` and ``8L`` with each
schedule set for a factor ``s`` (:func:`posenc.rotary.schedules.stretched`: the
``rope_scaling`` a config would carry), zero-shot and after a short fine-tune, beside
encodings that need no schedule. Two tasks, each on its own base models:

- ``text``: the lab's byte-level language model (:class:`posenc.lab.tasks.TextCorpus`,
  the standard library's source or ``--data``), measured in bits per byte;
- ``passkey``: passkey retrieval (:mod:`posenc.lab.passkey`: Mohtashami & Jaggi 2023,
  as YaRN's ``eval/passkey.py``), trained at lengths up to ``L`` and measured as the
  share of keys retrieved, by length and by the depth of the key.

The lines of the study (:func:`lines`) come from the schedules' registry: ``none`` (RoPE
extrapolated as trained), one line per schedule with a ``stretch``
(:func:`posenc.lab.encodings.test_time_variants`: Resonance YaRN on the Resonance RoPE
model), YaRN without its temperature, and ``base``: the larger
base Liu et al. 2023 ("Scaling laws of RoPE-based extrapolation") derive for a context
(:func:`liu_base`), as an NTK factor. A schedule registered later is a line with no
change here. The references: RoPE trained at the fine-tuning length (``rope-long``, the
same steps), and ALiBi, FIRE and NoPE trained at ``L``.

A schedule set for factor ``s`` is applied at every length, as a config's
``rope_scaling`` is (a static schedule changes the trained length's frequencies too);
``dynamic`` and ``longrope`` read the length themselves. Zero-shot, each line runs at
each factor of :attr:`ExtendConfig.multiples` on lengths ``1, 2, 4, 8 x L``. Fine-tuned,
each line at factor :attr:`ExtendConfig.fine_tune_multiple` continues the base's training
on sequences of that many times ``L`` for :attr:`ExtendConfig.fine_tune_steps` steps,
measured after each count of steps (step 0 is the zero-shot model).

Everything trained is cached under ``out``: the base models by :func:`posenc.lab.run`
(``out/base-TASK``, ``out/long-TASK``), each fine-tune in ``out/fine-tune`` (its curve
once finished, and a checkpoint at each measured step), so a stopped run resumes where
it stopped and a finished one is read back. :func:`run_extend` writes ``extend.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.faces.lab.encodings import ROPE_BASE, Encoding, lookup, test_time_variants
from posenc.faces.lab.model import LabModel
from posenc.faces.lab.training import (
    LabConfig,
    batch_loss,
    exact_match,
    param_groups,
    perplexity,
    run,
    scored_logits,
    text_corpus,
    trained_model,
    update,
)

#: Bump when training, fine-tuning or measuring changes (part of every cache key).
VERSION = 1
#: The tasks of the study.
TASKS = ("text", "passkey")
#: The encodings trained at ``L`` besides RoPE's, that need no schedule.
REFERENCES = ("alibi", "fire", "nope")
#: What each task's measure is.
METRICS = {"text": "bits per byte", "passkey": "keys retrieved"}


@dataclass(frozen=True)
class ExtendConfig:
    """One context-extension study: the trained length, the factors, the training.

    Attributes:
        train_len: ``L``, the trained length in tokens (bytes for text; passkey trains
            on lengths 16, 32, .. up to it).
        multiples: the factors ``s`` each schedule is set for; the lengths measured are
            ``L`` and these multiples of it.
        seeds: seeds ``0 .. seeds - 1`` of every model.
        steps: optimiser steps of each base model (and of ``rope-long``).
        batch_size, d_model, layers, heads, lr: the lab's training and sizes.
        eval_examples: windows (text) or keys (passkey) per measured length.
        depths: the key's depths the passkey table reads (0: first, 1: last).
        fine_tune_multiple: the fine-tuning length over ``L``, and its schedules' factor.
        fine_tune_steps: the step counts after which the fine-tuned models are measured.
        fine_tune_lr: the fine-tune's constant learning rate (after a warm-up of a tenth
            of the first count).
        data: the text task's own text (``--data``), or None for the standard library.
    """

    train_len: int = 64
    multiples: tuple[int, ...] = (2, 4, 8)
    seeds: int = 3
    steps: int = 1500
    batch_size: int = 32
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    lr: float = 1e-3
    eval_examples: int = 64
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    fine_tune_multiple: int = 4
    fine_tune_steps: tuple[int, ...] = (10, 20, 50, 100, 200)
    fine_tune_lr: float = 3e-4
    data: str | None = None

    def __post_init__(self) -> None:
        for name in ("train_len", "seeds", "steps", "batch_size", "eval_examples"):
            checks.check_int(getattr(self, name), name, minimum=1)
        if self.train_len < 16:
            raise ValueError(f"train_len must be >= 16 (passkey's shortest length); "
                             f"got {self.train_len}")  # fmt: skip
        if not self.multiples or any(
            not isinstance(m, int) or isinstance(m, bool) or m < 2 for m in self.multiples
        ):
            raise ValueError(f"multiples must be ints >= 2; got {self.multiples!r}")
        if self.fine_tune_multiple not in self.multiples:
            raise ValueError(f"fine_tune_multiple ({self.fine_tune_multiple}) must be one of "
                             f"multiples {self.multiples}")  # fmt: skip
        steps = self.fine_tune_steps
        if not steps or list(steps) != sorted(set(steps)) or steps[0] < 1:
            raise ValueError(f"fine_tune_steps must be increasing ints >= 1; got {steps!r}")
        for depth in self.depths:
            if not 0.0 <= depth <= 1.0:
                raise ValueError(f"depths must lie within [0, 1]; got {self.depths!r}")
        checks.check_number(self.lr, "lr", positive=True)
        checks.check_number(self.fine_tune_lr, "fine_tune_lr", positive=True)

    @property
    def lengths(self) -> list[int]:
        """The lengths measured: ``L`` and each multiple of it."""
        return [self.train_len] + [m * self.train_len for m in self.multiples]

    def lab(self, task: str, encodings: Sequence[str], train_len: int) -> LabConfig:
        """The lab run that trains ``task``'s base models of ``encodings`` at ``train_len``."""
        return LabConfig(
            task=task, encodings=tuple(encodings), train_len=train_len,
            test_len=max(self.lengths), seeds=self.seeds, steps=self.steps,
            batch_size=self.batch_size, lr=self.lr, d_model=self.d_model, layers=self.layers,
            heads=self.heads, eval_examples=self.eval_examples,
            data=self.data if task == "text" else None,
        )  # fmt: skip


#: ``posenc lab extend --quick``: one seed, fine-tunes measured at 20 and 200 steps.
QUICK = ExtendConfig(seeds=1, fine_tune_steps=(20, 200))


def liu_base(base: float, trained: int, target: int) -> float:
    """The base that makes a RoPE trained at ``trained`` tokens cover ``target``.

    Liu et al. 2023 (section 3, the extrapolation bound of a larger base): the
    critical dimension's period must grow from ``trained`` to ``target``, which a base
    ``base ** (ln(target / 2 pi) / ln(trained / 2 pi))`` gives.
    """
    return base ** (math.log(target / (2 * math.pi)) / math.log(trained / (2 * math.pi)))


@dataclass(frozen=True)
class Line:
    """One line of the study: a trained model and the ``rope_scaling`` it runs with.

    Attributes:
        name: the line's name in the tables (``none``, ``yarn``, ``rope-long``, ...).
        model: the lab encoding whose trained model the line runs.
        description: one line for people.
        scaling: ``(factor, trained, rotary_dim) ->`` the ``rope_scaling`` at ``factor``,
            or None for a line that runs as trained.
        trained_at: the trained length over ``L`` (``rope-long``: the fine-tuning
            multiple).
    """

    name: str
    model: str
    description: str
    scaling: Callable[[float, int, int], dict[str, Any] | None] = field(
        default=lambda factor, trained, rotary_dim: None
    )
    trained_at: int = 1

    @property
    def scheduled(self) -> bool:
        """Whether the line applies a schedule (the lines that fine-tune)."""
        return self.scaling(2.0, 64, 8) is not None


def _variant(spec: Encoding) -> Line:
    assert spec.trains_as is not None

    def scaling(factor: float, trained: int, rotary_dim: int) -> dict[str, Any] | None:
        return spec.scaling(math.ceil(factor * trained), trained, rotary_dim=rotary_dim)

    return Line(spec.name.removeprefix("rope-"), spec.trains_as, spec.description, scaling)


def _base_line(factor: float, trained: int, rotary_dim: int) -> dict[str, Any]:
    # base' = base * phi ** (d / (d - 2)) is NTK's form: phi for Liu et al.'s base
    wanted = liu_base(ROPE_BASE, trained, math.ceil(factor * trained))
    phi = (wanted / ROPE_BASE) ** ((rotary_dim - 2) / rotary_dim)
    return {"rope_type": "ntk", "factor": phi}


def lines(fine_tune_multiple: int = 4) -> list[Line]:
    """The study's lines: ``none``, each test-time variant of the registry, ``base``, the
    references (``rope-long`` trained at ``fine_tune_multiple`` times ``L``, ALiBi, FIRE,
    NoPE)."""
    return [
        Line("none", "rope", "RoPE as trained, extrapolated"),
        *[_variant(spec) for spec in test_time_variants()],
        Line("base", "rope", "a larger base, Liu et al. 2023's for the length (as NTK's "
             "factor)", _base_line),
        Line("rope-long", "rope", "reference: RoPE trained at the fine-tuning length",
             trained_at=fine_tune_multiple),
        *[Line(n, n, f"reference: {lookup(n).description}") for n in REFERENCES],
    ]  # fmt: skip


# --------------------------------------------------------------------------------------
# measuring


def _batch(task: str, length: int, config: ExtendConfig, corpus: Any, depth: float | None):
    if task == "text":
        return corpus.windows("test", length, config.eval_examples)
    from posenc.faces.lab import passkey

    gen = torch.Generator().manual_seed(424_243 + length + (0 if depth is None else 7919))
    return passkey.make_batch(length, config.eval_examples, gen, depth=depth)


@torch.no_grad()
def measure(
    model: LabModel,
    task: str,
    length: int,
    scaling: dict[str, Any] | None,
    config: ExtendConfig,
    corpus: Any,
    depth: float | None = None,
) -> float:
    """Bits per byte (text) or the share of keys retrieved (passkey) at ``length``."""
    model.eval()
    logits, targets = scored_logits(model, _batch(task, length, config, corpus, depth),
                                    scaling=scaling)  # fmt: skip
    if task == "text":
        return math.log2(perplexity(logits, targets))
    return exact_match(logits, targets)


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


# --------------------------------------------------------------------------------------
# fine-tuning


def _key(*parts: Any) -> str:
    text = json.dumps([VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _train_batch(task: str, length: int, config: ExtendConfig, corpus: Any, gen: torch.Generator):
    if task == "text":
        return corpus.batch("train", length, config.batch_size, gen)
    from posenc.faces.lab import passkey

    choices = passkey.lengths(length)
    n = choices[int(torch.randint(0, len(choices), (1,), generator=gen))]
    return passkey.make_batch(n, config.batch_size, gen)


def fine_tune(
    task: str, line: Line, seed: int, config: ExtendConfig, out: Path
) -> dict[int, dict[int, float]]:
    """Fine-tune ``line``'s base model at the fine-tuning length; its measures by step.

    Returns ``{steps: {length: value}}``, step 0 being the base model with the line's
    schedule. Resumes from the last measured step's checkpoint; a finished curve is
    read back.
    """
    lab = config.lab(task, (line.model,), config.train_len)
    rotary_dim = lab.model.head_dim
    factor = float(config.fine_tune_multiple)
    scaling = line.scaling(factor, config.train_len, rotary_dim)
    # what the curve depends on: the base model, the schedule, the fine-tune and the measures
    fields = ("batch_size", "eval_examples", "fine_tune_multiple", "fine_tune_steps",
              "fine_tune_lr", "train_len", "multiples")  # fmt: skip
    tuned = {name: getattr(config, name) for name in fields}
    key = _key(task, line.name, scaling, seed, tuned, lab.training_key(line.model, seed))
    directory = out / "fine-tune"
    directory.mkdir(parents=True, exist_ok=True)
    done, partial = directory / f"{key}.json", directory / f"{key}.partial.pt"
    if done.exists():
        stored = json.loads(done.read_text())
        return {int(s): {int(n): v for n, v in row.items()} for s, row in stored.items()}
    corpus = text_corpus(lab)
    model = trained_model(lab, line.model, seed, out / f"base-{task}")
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(param_groups(model, config.fine_tune_lr), lr=config.fine_tune_lr,
                            betas=(0.9, 0.98), weight_decay=0.01)  # fmt: skip
    warm = max(1, config.fine_tune_steps[0] // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    gen = torch.Generator().manual_seed(2_000_003 * (seed + 1))
    positions = torch.Generator().manual_seed(7 * seed + 5)
    curve: dict[int, dict[int, float]] = {}
    step = 0
    if partial.exists():
        saved = torch.load(partial, map_location="cpu", weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        gen.set_state(saved["gen"])
        curve, step = saved["curve"], saved["step"]
    length = config.fine_tune_multiple * config.train_len
    for target in (0, *config.fine_tune_steps):
        model.train()
        while step < target:
            batch = _train_batch(task, length, config, corpus, gen)
            loss = batch_loss(model, batch, positions, scaling=scaling)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            update(model, opt, sched)
            step += 1
        if target not in curve:
            curve[target] = {n: measure(model, task, n, scaling, config, corpus)
                             for n in config.lengths}  # fmt: skip
            state = {"model": model.state_dict(), "opt": opt.state_dict(),
                     "sched": sched.state_dict(), "gen": gen.get_state(), "curve": curve,
                     "step": step}  # fmt: skip
            with atomic_write(partial) as f:
                torch.save(state, f)
    with atomic_write(done, "w") as f:
        json.dump({str(s): {str(n): v for n, v in row.items()} for s, row in curve.items()}, f)
    partial.unlink(missing_ok=True)
    return curve


def _fine_tune_job(job: tuple[str, str, int, ExtendConfig, Path]) -> dict[int, dict[int, float]]:
    """One fine-tune in a worker process: the line by name (its schedule is a closure)."""
    task, name, seed, config, out = job
    torch.set_num_threads(1)
    (line,) = [line for line in lines(config.fine_tune_multiple) if line.name == name]
    return fine_tune(task, line, seed, config, out)


# --------------------------------------------------------------------------------------
# the study


@dataclass
class Study:
    """What :func:`run_extend` measured (``extend.json``)."""

    config: dict[str, Any]
    zero_shot: dict[str, Any] = field(default_factory=dict)
    depth: dict[str, Any] = field(default_factory=dict)
    fine_tuned: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def run_extend(
    config: ExtendConfig,
    out: str | Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    tasks: Sequence[str] = TASKS,
) -> Study:
    """Train the base models, measure every line zero-shot and fine-tuned; write ``extend.json``.

    ``extend.json`` holds ``config``, ``base_length``, ``lines`` (name: description),
    ``zero_shot[task][line][factor][length]``, ``depth[line][factor][length][depth]``
    (passkey) and ``fine_tuned[task][line][steps][length]``, each a ``{"mean", "min",
    "max"}`` over seeds; factor ``"1"`` is a line that runs as trained, and
    ``seconds``, the run's wall time.
    """
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        checks.check_choice(task, "task", TASKS)
    every = lines(config.fine_tune_multiple)
    study = Study(asdict(config), lines={line.name: line.description for line in every})
    fine_jobs = []
    for task in tasks:
        models = sorted({line.model for line in every if line.trained_at == 1})
        base = config.lab(task, models, config.train_len)
        run(base, out / f"base-{task}", progress=progress, workers=workers, probe=False)
        long = config.lab(task, ("rope",), config.fine_tune_multiple * config.train_len)
        run(long, out / f"long-{task}", progress=progress, workers=workers, probe=False)
        corpus = text_corpus(base)
        rotary_dim = base.model.head_dim
        zero: dict[str, Any] = {}
        depth: dict[str, Any] = {}
        models_of: dict[tuple[str, int], list[LabModel]] = {}  # loaded once for every line
        for line in every:
            lab, where = (base, f"base-{task}") if line.trained_at == 1 else (long, f"long-{task}")
            if (line.model, line.trained_at) not in models_of:
                models_of[line.model, line.trained_at] = [
                    trained_model(lab, line.model, s, out / where) for s in range(config.seeds)
                ]
            trained = models_of[line.model, line.trained_at]
            factors = config.multiples if line.scheduled else (1,)
            zero[line.name] = {}
            for factor in factors:
                scaling = line.scaling(float(factor), config.train_len, rotary_dim)
                zero[line.name][str(factor)] = {
                    str(n): _spread([measure(m, task, n, scaling, config, corpus)
                                     for m in trained])
                    for n in config.lengths
                }  # fmt: skip
                if task == "passkey":
                    depth.setdefault(line.name, {})[str(factor)] = {
                        str(n): {str(d): _spread([measure(m, task, n, scaling, config, corpus, d)
                                                  for m in trained]) for d in config.depths}
                        for n in config.lengths
                    }  # fmt: skip
        study.zero_shot[task] = zero
        if task == "passkey":
            study.depth = depth
        tuned = [line.name for line in every if line.scheduled or line.name == "none"]
        fine_jobs += [(task, name, s, config, out) for name in tuned for s in range(config.seeds)]
    curves = _fine_tune_all(fine_jobs, workers)
    for (task, name, _seed, _, _), curve in zip(fine_jobs, curves, strict=True):
        study.fine_tuned.setdefault(task, {}).setdefault(name, []).append(curve)
    for by_line in study.fine_tuned.values():
        for name, runs in by_line.items():
            by_line[name] = {
                str(s): {str(n): _spread([c[s][n] for c in runs]) for n in config.lengths}
                for s in (0, *config.fine_tune_steps)
            }
    study.seconds = round(time.perf_counter() - start, 1)
    doc = {"config": study.config, "base_length": config.train_len, "lines": study.lines,
           "zero_shot": study.zero_shot, "depth": study.depth, "fine_tuned": study.fine_tuned,
           "metrics": {t: METRICS[t] for t in tasks}, "seconds": study.seconds}  # fmt: skip
    with atomic_write(out / "extend.json", "w") as f:
        json.dump(doc, f, indent=1)
    from posenc.faces.plot import encode, pyplot

    fig = figure(doc)
    svg = encode(fig, "svg")
    pyplot().close(fig)
    with atomic_write(out / "extend.svg") as f:
        f.write(svg)
    with atomic_write(out / "index.html", "w") as f:
        f.write(page(doc, svg))
    return study


def _fine_tune_all(jobs: list[Any], workers: int | None) -> list[dict[int, dict[int, float]]]:
    from posenc.faces.lab.training import usable_cpus

    count = max(1, min(len(jobs), workers if workers is not None else usable_cpus()))
    if count == 1:
        return [_fine_tune_job(job) for job in jobs]
    with ProcessPoolExecutor(count, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_fine_tune_job, jobs))


# --------------------------------------------------------------------------------------
# reading a study: tables, reach, figure, page


#: The share of keys a line must retrieve to count as reaching a length.
GOAL = 0.9


def _cell(v: Mapping[str, float], digits: int) -> str:
    if v["min"] == v["max"]:
        return f"{v['mean']:.{digits}f}"
    return f"{v['mean']:.{digits}f} ({v['min']:.{digits}f}-{v['max']:.{digits}f})"


def _digits(task: str) -> int:
    return 3 if task == "text" else 2


def reach(by_length: Mapping[str, Mapping[str, float]]) -> int:
    """The longest length up to which every measured length retrieves :data:`GOAL` (mean);
    0 where the shortest does not."""
    best = 0
    for n, v in sorted(by_length.items(), key=lambda item: int(item[0])):
        if v["mean"] < GOAL:
            break
        best = int(n)
    return best


def zero_shot_reach(doc: Mapping[str, Any], line: str) -> tuple[int, str]:
    """A line's longest passkey reach over the factors it is set for, and that factor."""
    factors = doc["zero_shot"]["passkey"][line]
    return max((reach(by_length), factor) for factor, by_length in factors.items())


def _factor(doc: Mapping[str, Any]) -> str:
    return str(doc["config"]["fine_tune_multiple"])


def _zero_table(doc: Mapping[str, Any], task: str) -> tuple[list[str], list[list[str]]]:
    factor, lengths = _factor(doc), [str(n) for n in _lengths(doc)]
    head = ["line", *[f"{int(n) // doc['base_length']}L ({n})" for n in lengths]]
    rows = []
    for name, by_factor in doc["zero_shot"][task].items():
        cells = by_factor.get(factor) or by_factor["1"]
        rows.append([name, *[_cell(cells[n], _digits(task)) for n in lengths]])
    return head, rows


def _tuned_table(doc: Mapping[str, Any], task: str) -> tuple[list[str], list[list[str]]]:
    at = str(int(_factor(doc)) * doc["base_length"])
    steps = list(next(iter(doc["fine_tuned"][task].values())))
    head = ["line", *[f"{s} steps" for s in steps]]
    rows = [[name, *[_cell(curve[s][at], _digits(task)) for s in steps]]
            for name, curve in doc["fine_tuned"][task].items()]  # fmt: skip
    return head, rows


def _depth_table(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    factor = _factor(doc)
    at = str(int(factor) * doc["base_length"])
    depths = list(doc["config"]["depths"])
    head = ["line", *[f"depth {d:g}" for d in depths]]
    rows = []
    for name, by_factor in doc["depth"].items():
        cells = (by_factor.get(factor) or by_factor["1"])[at]
        rows.append([name, *[_cell(cells[str(float(d))], 2) for d in depths]])
    return head, rows


def _reach_table(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    last = str(doc["config"]["fine_tune_steps"][-1])
    head = ["line", "zero-shot reach (factor)", f"after {last} fine-tuning steps"]
    rows = []
    for name in doc["zero_shot"]["passkey"]:
        n, factor = zero_shot_reach(doc, name)
        tuned = doc["fine_tuned"].get("passkey", {}).get(name)
        after = str(reach(tuned[last])) if tuned else "-"
        rows.append([name, f"{n} ({factor}x)" if factor != "1" and n else str(n), after])
    return head, rows


def _lengths(doc: Mapping[str, Any]) -> list[int]:
    return [doc["base_length"]] + [m * doc["base_length"] for m in doc["config"]["multiples"]]


def _separated(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """Whether ``a``'s seeds all lie above ``b``'s (their ranges do not meet)."""
    return a["min"] > b["max"]


def claims(doc: Mapping[str, Any]) -> list[list[str]]:
    """The anchors' claims, each with what this study measured and whether it agrees.

    Rows ``[source, claim, measured, verdict]``; a verdict compares the seeds' ranges
    (a difference within them is no difference), so a one-seed run separates any two
    values and says so. Claims whose lines or tasks the study lacks are left out.
    """
    rows: list[list[str]] = []
    L, last = str(doc["base_length"]), str(doc["config"]["fine_tune_steps"][-1])
    seeds = doc["config"]["seeds"]
    caveat = " (one seed: no spread to compare with)" if seeds == 1 else ""
    text = doc["zero_shot"].get("text", {})
    if {"none", "linear", "ntk", "dynamic"} <= set(text):
        none = text["none"]["1"][L]
        raised = {f: v[L] for f, v in text["linear"].items()}
        cells = ", ".join(f"{f}x {v['mean']:.3f}" for f, v in raised.items())
        verdict = all(_separated(v, none) for v in raised.values())
        rows.append(["Peng et al. 2023", "position interpolation raises perplexity at the "
                     "trained length without fine-tuning",
                     f"bits per byte at L: none {none['mean']:.3f}; linear {cells}",
                     ("reproduced" if verdict else "not reproduced") + caveat])  # fmt: skip
        for name in ("ntk", "dynamic"):
            kept = {f: v[L] for f, v in text[name].items()}
            same = all(not _separated(v, none) and not _separated(none, v) for v in kept.values())
            cells = ", ".join(f"{f}x {v['mean']:.3f}" for f, v in kept.items())
            rows.append(["Peng et al. 2023", f"{name} keeps the trained length's perplexity",
                         f"bits per byte at L: none {none['mean']:.3f}; {name} {cells}",
                         ("reproduced" if same else "not reproduced") + caveat])  # fmt: skip
    # against the lines of the paper's own comparison (position interpolation, NTK-aware
    # and dynamic NTK): the passkey's reach, and the text's bits per byte at the longest
    # length, each at the factor that serves the line best
    compared = ("linear", "ntk", "dynamic", "yarn")
    passkey = doc["zero_shot"].get("passkey", {})
    if set(compared) <= set(passkey) and set(compared) <= set(text):
        longest = str(max(_lengths(doc)))
        reaches = {n: zero_shot_reach(doc, n)[0] for n in compared}
        bits = {n: min(v[longest]["mean"] for v in text[n].values()) for n in compared}
        far = max(reaches.values())
        agrees = reaches["yarn"] == far and bits["yarn"] == min(bits.values())
        cells = ", ".join(f"{n} {reaches[n]}" for n in compared)
        at_longest = ", ".join(f"{n} {bits[n]:.3f}" for n in compared)
        rows.append(["Peng et al. 2023", "YaRN extrapolates furthest without fine-tuning "
                     "(against PI, NTK-aware and dynamic NTK)",
                     f"passkey reach: {cells}; bits per byte at {longest}: {at_longest}",
                     "reproduced" if agrees else "not reproduced"])  # fmt: skip
    steps = [int(x) for x in doc["config"]["fine_tune_steps"]]
    pairs = [(a, 10 * a) for a in steps if 10 * a in steps]
    at = str(int(doc["config"]["fine_tune_multiple"]) * doc["base_length"])
    for task, better in (("text", -1), ("passkey", 1)):
        curves = doc["fine_tuned"].get(task, {})
        if pairs and {"yarn", "linear"} <= set(curves):
            yarn, pi = curves["yarn"], curves["linear"]
            cells = "; ".join(f"yarn@{a} {yarn[str(a)][at]['mean']:.3f} vs linear@{b} "
                              f"{pi[str(b)][at]['mean']:.3f}" for a, b in pairs)  # fmt: skip
            agrees = all(better * (yarn[str(a)][at]["mean"] - pi[str(b)][at]["mean"]) >= 0
                         for a, b in pairs)  # fmt: skip
            rows.append(["Peng et al. 2023", f"fine-tuned, YaRN needs about 10x fewer steps "
                         f"than position interpolation ({task})", f"at {at} tokens: {cells}",
                         "reproduced" if agrees else "not reproduced"])  # fmt: skip
    curves = doc["fine_tuned"].get("text", {})
    if "linear" in curves and "rope-long" in text:
        start, end = curves["linear"]["0"][at]["mean"], curves["linear"][last][at]["mean"]
        goal = text["rope-long"]["1"][at]["mean"]
        closed = (start - end) / (start - goal) if start != goal else 1.0
        rows.append(["Chen et al. 2023", "a short fine-tune (about 1000 steps) recovers "
                     "position interpolation",
                     f"bits per byte at {at}: linear {start:.3f} before, {end:.3f} after "
                     f"{last} steps; RoPE trained at {at}: {goal:.3f} ({closed:.0%} of the "
                     "gap closed)",
                     "reproduced" if end <= goal else f"not within {last} steps"])  # fmt: skip
    return rows


def tables(doc: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The study's tables: ``(caption, head, rows)``, each cell a mean with the seeds'
    min-max where they differ."""
    factor, last = _factor(doc), doc["config"]["fine_tune_steps"][-1]
    at = int(factor) * doc["base_length"]
    out = []
    for task in doc["zero_shot"]:
        what = METRICS[task]
        out.append((f"{task}, zero-shot: {what} by length, each schedule set for {factor}x "
                    f"(trained at L = {doc['base_length']})", *_zero_table(doc, task)))  # fmt: skip
        if task in doc["fine_tuned"]:
            out.append((f"{task}, fine-tuned at {factor}x: {what} at {at} tokens after 0 to "
                        f"{last} steps", *_tuned_table(doc, task)))  # fmt: skip
    if doc.get("depth"):
        out.append((f"passkey, zero-shot: keys retrieved at {at} tokens by the key's depth, "
                    f"each schedule set for {factor}x", *_depth_table(doc)))  # fmt: skip
        out.append((f"passkey: the longest length with {GOAL} of the keys retrieved at every "
                    "length up to it", *_reach_table(doc)))  # fmt: skip
    found = claims(doc)
    if found:
        out.append(("the papers' claims, measured", ["source", "claim", "measured", "verdict"],
                    found))  # fmt: skip
    return out


def markdown(doc: Mapping[str, Any]) -> str:
    """The tables as Markdown, each under its caption in bold."""
    parts = []
    for caption, head, rows in tables(doc):
        lines = [f"**{caption}**", "", "| " + " | ".join(head) + " |",
                 "|---" * len(head) + "|"]  # fmt: skip
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def html_tables(doc: Mapping[str, Any], *, zero_shot_only: bool = False) -> str:
    """The tables as HTML (the run's page); ``zero_shot_only``: the zero-shot tables by
    length, the reach and the claims (the explainer's, whose page has a size budget)."""
    import html

    out = []
    for caption, head, rows in tables(doc):
        if zero_shot_only and ("fine-tuned" in caption or "depth" in caption):
            continue
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                       for row in rows)  # fmt: skip
        heads = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        out.append(f'<table class="numbers"><caption>{html.escape(caption)}</caption>'
                   f"<tr>{heads}</tr>{body}</table>")  # fmt: skip
    return "\n".join(out)


def _zero_panel(ax: Any, doc: Mapping[str, Any], task: str) -> None:
    factor = _factor(doc)
    for i, (name, by_factor) in enumerate(doc["zero_shot"][task].items()):
        cells = by_factor.get(factor) or by_factor["1"]
        ax.plot([int(n) for n in cells], [v["mean"] for v in cells.values()],
                "-" if i < 10 else "--", color=f"C{i % 10}", label=name)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(_lengths(doc), [str(n) for n in _lengths(doc)])
    ax.minorticks_off()
    ax.axvline(doc["base_length"], color="0.6", lw=0.8, ls=":")
    ax.set_xlabel("tokens")
    ax.set_ylabel(METRICS[task])
    ax.set_title(f"{task}: zero-shot, schedules set for {factor}x")


def _tuned_panel(ax: Any, doc: Mapping[str, Any], task: str) -> None:
    factor = _factor(doc)
    at = str(int(factor) * doc["base_length"])
    for i, name in enumerate(doc["zero_shot"][task]):  # the zero-shot panel's colours
        curve = doc["fine_tuned"].get(task, {}).get(name)
        if curve:
            ax.plot([int(s) for s in curve], [curve[s][at]["mean"] for s in curve],
                    "-" if i < 10 else "--", color=f"C{i % 10}", label=name)  # fmt: skip
    steps = [0, *doc["config"]["fine_tune_steps"]]
    ax.set_xscale("symlog", linthresh=max(1, steps[1]))
    ax.set_xticks(steps, [str(n) for n in steps])
    ax.minorticks_off()
    ax.set_xlabel("fine-tuning steps")
    ax.set_ylabel(METRICS[task])
    ax.set_title(f"{task}: at {at} tokens, fine-tuned at {factor}x")


def figure(doc: Mapping[str, Any], *, fine_tuned: bool = True) -> Any:
    """Zero-shot quality against length, and (``fine_tuned``) fine-tuned quality against
    steps: a row per task, or one row of the zero-shot panels."""
    from posenc.faces.plot import new_figure

    tasks = list(doc["zero_shot"])
    if fine_tuned:
        fig, axes = new_figure(9.0, 3.6 * len(tasks), ncols=2, nrows=len(tasks))
        grid = axes.reshape(len(tasks), 2)
        panels = [(grid[r][0], t, _zero_panel) for r, t in enumerate(tasks)]
        panels += [(grid[r][1], t, _tuned_panel) for r, t in enumerate(tasks)]
    else:
        fig, axes = new_figure(4.5 * len(tasks), 3.6, ncols=len(tasks))
        flat = [axes] if len(tasks) == 1 else list(axes)
        panels = [(ax, t, _zero_panel) for ax, t in zip(flat, tasks, strict=True)]
    for ax, task, draw in panels:
        draw(ax, doc, task)
        if task == "passkey":
            ax.set_ylim(-0.02, 1.02)
    panels[0][0].legend(fontsize=6.5, ncol=2)
    return fig


def page(doc: Mapping[str, Any], svg: bytes) -> str:
    """The run's page: the figure and the tables."""
    import base64

    image = base64.b64encode(svg).decode()
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            "<title>posenc lab extend</title></head><body>"
            "<h1>Context extension, measured</h1>"
            f'<img alt="quality against length and fine-tuning steps" '
            f'src="data:image/svg+xml;base64,{image}">'
            + html_tables(doc) + "</body></html>")  # fmt: skip


# --------------------------------------------------------------------------------------
# the bundled study

#: The study bundled with posenc (``posenc/faces/data``): ``posenc lab extend``'s document.
BUNDLED = "lab-extend.json"
#: The how-to page's tables sit between these two lines.
MARKERS = ("<!-- extend-tables -->", "<!-- /extend-tables -->")
#: The page, relative to the repository, that shows the bundled study.
GUIDE = "docs/howto/choose-schedule.md"


def bundled() -> dict[str, Any] | None:
    """The bundled ``extend.json`` (None where the package has none)."""
    from posenc.faces import bundle

    return bundle.read(BUNDLED)


def readme(text: str, doc: Mapping[str, Any]) -> str:
    """``text`` (the how-to page) with :func:`markdown` of ``doc`` between :data:`MARKERS`.

    Raises:
        ValueError: the page has not both markers.
    """
    from posenc.faces import bundle

    return bundle.between(text, MARKERS, markdown(doc), "context-extension tables")


def publish(run_dir: str | Path, repository: str | Path | None = None) -> Path:
    """Bundle a finished study: its ``extend.json`` as :data:`BUNDLED`, the how-to page's
    tables and ``docs/lab-extend.png`` of the checkout (each written atomically).

    Returns the bundled file's path.

    Raises:
        ValueError: ``run_dir`` has no ``extend.json``, or the page no table markers.
    """
    from posenc.faces import bundle

    root = Path(__file__).resolve().parents[4] if repository is None else Path(repository)
    return bundle.publish(Path(run_dir) / "extend.json", BUNDLED, root / GUIDE, readme, figure,
                          root / "docs" / "lab-extend.png")  # fmt: skip


if __name__ == "__main__":  # python -m posenc.faces.lab.extend RUN_DIR: bundle a study
    import sys

    print(publish(sys.argv[1] if len(sys.argv) > 1 else "posenc-extend"))
