"""``posenc lab suite``: Kazemnejad et al. (2023)'s length-generalisation study and its score.

"The Impact of Positional Encoding on Length Generalization in Transformers"
(Kazemnejad et al., NeurIPS 2023; code: McGill-NLP/length-generalization)
trains decoder-only transformers with five encodings (NoPE, T5's relative
bias, ALiBi, rotary, absolute sinusoidal) on synthetic tasks, each trained up
to one length and tested on the longer ones, and summarises the study by each
encoding's mean reciprocal rank (MRR): in every (task, split, seed) column the
encodings are ranked by their test accuracy, and an encoding's MRR is the mean
of ``1 / rank`` over the columns.

:func:`run_suite` trains every task of the suite through :func:`posenc.lab.training.run`
(one output directory per task, so its caching and resuming are the lab's: a
rerun trains nothing new), computes :func:`mean_reciprocal_rank` and writes
``suite.json`` and ``index.html`` (accuracy against length per task, the MRR
beside the paper's); :func:`quick_config` is ``--quick``'s. The column's accuracy
is the exact match over the test split, the lengths ``train_len + 1 .. test_len``
with as many examples at each (the reference's test set: ``make_*_dataset.py``'s
default ``test_min`` is ``train_max + 1``), i.e. the mean of the per-length
accuracies.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.faces.lab import names

#: The study's five encodings, in the order of the paper's reported MRR (best first).
STUDY = ("nope", "t5", "alibi", "rope", "sinusoidal")

#: The mean reciprocal ranks the paper reports over its whole suite (three seeds).
PAPER_MRR: Mapping[str, float] = {
    "nope": 0.687, "t5": 0.549, "alibi": 0.502, "rope": 0.330, "sinusoidal": 0.215,
}  # fmt: skip

Ties = Literal["first", "average"]
_TIES: tuple[Ties, ...] = ("first", "average")


@dataclass(frozen=True)
class SuiteSplit:
    """One (task, split) of the suite: trained on lengths ``1 .. train_len``, tested beyond.

    ``key`` names it after the task and its lengths, as the reference names its
    splits (``len_tr20_ts40``): ``copy_tr20_ts40``.
    """

    task: str
    train_len: int
    test_len: int

    def __post_init__(self) -> None:
        checks.check_choice(self.task, "task", tuple(t for t in names.TASKS if t != "text"))
        checks.check_int(self.train_len, "train_len", minimum=1)
        checks.check_int(self.test_len, "test_len", minimum=1)
        if self.test_len <= self.train_len:
            raise ValueError(
                f"{self.task}: test_len ({self.test_len}) must exceed train_len ({self.train_len})"
            )

    @property
    def key(self) -> str:
        """The split's name in results: ``task_trN_tsM``."""
        return f"{self.task}_tr{self.train_len}_ts{self.test_len}"


def as_split(entry: Any) -> SuiteSplit:
    """A :class:`SuiteSplit` from one, a ``(task, train_len, test_len)`` tuple, or any
    entry with those attributes (:data:`posenc.lab.names.SUITE`'s).

    Raises:
        TypeError: anything else.
    """
    if isinstance(entry, SuiteSplit):
        return entry
    if isinstance(entry, (tuple, list)) and len(entry) == 3:
        return SuiteSplit(*entry)
    if all(hasattr(entry, a) for a in ("task", "train_len", "test_len")):
        return SuiteSplit(entry.task, entry.train_len, entry.test_len)
    raise TypeError(
        f"a task of the suite must be a SuiteSplit or (task, train_len, test_len); got {entry!r}"
    )


def suite_tasks() -> tuple[SuiteSplit, ...]:
    """The suite's (task, train length, test length) entries: :data:`posenc.lab.names.SUITE`'s."""
    return tuple(as_split(entry) for entry in names.SUITE)


def select_tasks(chosen: Sequence[str]) -> tuple[SuiteSplit, ...]:
    """The suite's entries for the named tasks (``"copy"``, ``"scan"`` ...), in the suite's order.

    Raises:
        TypeError: a single string instead of a sequence of names.
        ValueError: no name, or a name that is not a task of the suite (the accepted ones listed).
    """
    if isinstance(chosen, (str, bytes)):
        raise TypeError(f"tasks must be a sequence of task names; got {chosen!r}")
    wanted = list(dict.fromkeys(chosen))
    if not wanted:
        raise ValueError("tasks must name at least one task of the suite")
    every = suite_tasks()
    for name in wanted:
        checks.check_choice(name, "tasks", tuple(t.task for t in every))
    return tuple(t for t in every if t.task in wanted)


# ------------------------------------------------------------------ the score


def reciprocal_ranks(
    column: Mapping[str, float], encodings: Sequence[str] | None = None, *, ties: Ties = "first"
) -> dict[str, float]:
    """``1 / rank`` of each encoding in one column, ranked by accuracy (best is rank 1).

    ``ties="first"`` is the reference notebook's rule (``plot_aggregate_final.ipynb``:
    pandas ``rank(method="first", ascending=False)``): tied encodings take
    consecutive ranks in the order they are listed, the first listed the best
    rank; ``"average"`` gives each the mean of the ranks they span (pandas'
    default, ``method="average"``), which does not depend on the order.

    Args:
        column: encoding -> accuracy (finite).
        encodings: the order of the encodings (the tie-break); the column's own
            order when None. Every one must be in ``column``, and no other.
        ties: ``"first"`` or ``"average"``.

    Raises:
        ValueError: an unknown ``ties``, an empty column, a non-finite accuracy,
            or ``encodings`` that are not the column's.
    """
    checks.check_choice(ties, "ties", _TIES)
    order = list(column) if encodings is None else list(encodings)
    if not order:
        raise ValueError("column must hold at least one encoding")
    if len(set(order)) != len(order) or set(order) != set(column):
        raise ValueError(
            f"encodings {order} must list each encoding of the column once: {sorted(column)}"
        )
    values = {}
    for e in order:
        v = column[e]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"accuracy of {e!r} must be a real number; got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"accuracy of {e!r} must be finite; got {v!r}")
        values[e] = float(v)
    # sorted is stable: equal accuracies keep the listed order
    ranked = sorted(order, key=lambda e: -values[e])
    rank = {e: float(i + 1) for i, e in enumerate(ranked)}
    if ties == "average":
        rank = {
            e: float(np.mean([rank[f] for f in order if values[f] == values[e]])) for e in order
        }  # fmt: skip
    return {e: 1.0 / rank[e] for e in order}


def mean_reciprocal_rank(
    columns: Mapping[str, Mapping[str, float]],
    encodings: Sequence[str] | None = None,
    *,
    ties: Ties = "first",
) -> dict[str, float]:
    """Each encoding's mean of ``1 / rank`` over the columns (Kazemnejad et al. 2023).

    As the reference notebook computes it: per column (a task, split and seed)
    the encodings ranked by accuracy, ties by :func:`reciprocal_ranks`' rule,
    then the mean over columns. The notebook drops a column that lacks an
    encoding (``dropna(axis=1)``); here such a column is an error.

    Args:
        columns: column name -> (encoding -> accuracy).
        encodings: the encodings in tie-break order (the first column's order when None).
        ties: ``"first"`` (the notebook's) or ``"average"``.

    Returns:
        encoding -> MRR, in the order of ``encodings``.

    Raises:
        ValueError: no columns, or a column whose encodings differ from ``encodings``
            (named), or what :func:`reciprocal_ranks` refuses.
    """
    if not columns:
        raise ValueError("columns must hold at least one column")
    order = list(encodings) if encodings is not None else list(next(iter(columns.values())))
    sums = dict.fromkeys(order, 0.0)
    for name, column in columns.items():
        if set(column) != set(order):
            raise ValueError(
                f"column {name!r} holds {sorted(column)}; every column must hold {sorted(order)}"
            )
        for e, rr in reciprocal_ranks(column, order, ties=ties).items():
            sums[e] += rr
    return {e: s / len(columns) for e, s in sums.items()}


# ------------------------------------------------------------------ the suite


@dataclass(frozen=True)
class SuiteConfig:
    """The suite's settings: its tasks, the study's encodings plus ``extra``, and training.

    Every task trains one model per encoding and seed with these settings
    (:class:`~posenc.lab.training.LabConfig`), at the task's own lengths.

    Attributes:
        tasks: the (task, split) entries; :func:`suite_tasks` by default.
        extra: encodings run beside the study's five (:data:`STUDY`), from
            :data:`posenc.lab.encodings.ENCODINGS`.
        seeds, steps, batch_size, lr, d_model, layers, heads, eval_examples: as
            in :class:`~posenc.lab.training.LabConfig`. The defaults are the scale the
            suite was measured at on a 2-core CPU (a 2-layer, 4-head model of width
            64, 2000 steps of batch 64, 64 examples per length); the paper trained
            larger models for longer.
    """

    tasks: tuple[SuiteSplit, ...] = field(default_factory=suite_tasks)
    extra: tuple[str, ...] = ()
    seeds: int = 3
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    eval_examples: int = 64

    def __post_init__(self) -> None:
        if isinstance(self.tasks, (str, bytes)) or not self.tasks:
            raise ValueError("tasks must hold at least one SuiteSplit")
        object.__setattr__(self, "tasks", tuple(as_split(t) for t in self.tasks))
        object.__setattr__(self, "extra", tuple(self.extra))
        keys = [t.key for t in self.tasks]
        if len(set(keys)) != len(keys):
            raise ValueError(f"tasks must not repeat a (task, split): {keys}")
        for e in self.extra:
            checks.check_choice(e, "encoding", names.ENCODINGS)
        for t in self.tasks:  # every LabConfig valid before anything trains
            self.lab_config(t)

    @property
    def encodings(self) -> tuple[str, ...]:
        """The study's five, then the extras not among them."""
        return tuple(dict.fromkeys((*STUDY, *self.extra)))

    def lab_config(self, task: SuiteSplit) -> Any:
        """The :class:`~posenc.lab.training.LabConfig` of one task of the suite."""
        from posenc.faces.lab.training import LabConfig

        # the training settings are the fields the two configs share
        lab = {f.name for f in fields(LabConfig)}
        shared = {f.name: getattr(self, f.name) for f in fields(self) if f.name in lab}
        return LabConfig(
            task=task.task, encodings=self.encodings, train_len=task.train_len,
            test_len=task.test_len, **shared,
        )  # fmt: skip


#: ``--quick``'s tasks: copy (trained to 20, tested 21-40) and sort (trained to 8,
#: tested 9-16).
QUICK_TASKS = ("copy", "sort")
#: ``--quick``'s seeds.
QUICK_SEEDS = 2


@functools.cache
def quick_config() -> SuiteConfig:
    """``--quick``'s settings: :data:`QUICK_TASKS` and :data:`QUICK_SEEDS` at the full
    suite's scale, so the full suite reuses its models. Built on first use (a
    :class:`SuiteConfig` checks its LabConfigs, which imports torch; the command line
    reads this module for its help)."""
    return SuiteConfig(tasks=select_tasks(QUICK_TASKS), seeds=QUICK_SEEDS)


@dataclass
class SuiteResult:
    """What :func:`run_suite` produced: ``suite.json``'s content and the files written."""

    doc: dict[str, Any]
    paths: dict[str, Path]
    trained: int  # models trained in this call (0 on a rerun)

    @property
    def mrr(self) -> dict[str, float]:
        """Each encoding's mean reciprocal rank over the suite's tasks."""
        return dict(self.doc["mrr"])


def _spread(by_seed: Mapping[str, Sequence[float]]) -> dict[str, Any] | None:
    if not by_seed or len(next(iter(by_seed.values()))) < 2:
        return None  # one seed: no spread to speak of
    return {
        e: {"min": min(v), "max": max(v), "std": float(np.std(v, ddof=1))}
        for e, v in by_seed.items()
    }  # fmt: skip


def score(config: SuiteConfig, records: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """``suite.json``'s document from every task's :class:`~posenc.lab.training.Record` list.

    ``records``: task key (:attr:`SuiteSplit.key`) -> its records.
    """
    encodings = config.encodings
    columns: list[dict[str, Any]] = []
    accuracy: list[dict[str, Any]] = []
    for task in config.tasks:
        tested: dict[tuple[int, str], list[float]] = {}
        trained: dict[tuple[int, str], list[float]] = {}
        for r in records[task.key]:
            accuracy.append({
                "task": task.task, "split": task.key, "encoding": r.encoding, "seed": r.seed,
                "length": r.length, "accuracy": r.value,
            })  # fmt: skip
            side = tested if r.length > task.train_len else trained
            side.setdefault((r.seed, r.encoding), []).append(r.value)
        for seed in range(config.seeds):
            column = {e: float(np.mean(tested[seed, e])) for e in encodings}
            columns.append({
                "task": task.task, "split": task.key, "seed": seed, "accuracy": column,
                "reciprocal_rank": reciprocal_ranks(column, encodings),
                "within": {e: float(np.mean(trained[seed, e])) for e in encodings},
            })  # fmt: skip

    def by_name(keep: Sequence[str], **options: Any) -> dict[str, float]:
        table = {
            f"{c['split']}/{c['seed']}": {e: c["accuracy"][e] for e in keep} for c in columns
        }  # fmt: skip
        return mean_reciprocal_rank(table, keep, **options)

    by_seed = {e: [] for e in encodings}  # type: dict[str, list[float]]
    for seed in range(config.seeds):
        mine = {
            f"{c['split']}/{seed}": c["accuracy"] for c in columns if c["seed"] == seed
        }  # fmt: skip
        for e, v in mean_reciprocal_rank(mine, encodings).items():
            by_seed[e].append(v)
    within = {
        task.key: {
            e: float(np.mean([c["within"][e] for c in columns if c["split"] == task.key]))
            for e in encodings
        }
        for task in config.tasks
    }  # fmt: skip
    settings = asdict(config)
    settings["tasks"] = [asdict(t) for t in config.tasks]
    settings["encodings"] = list(encodings)
    return {
        "settings": settings,
        "ties": "first",
        "mrr": by_name(encodings),
        "mrr_by_seed": by_seed,
        "mrr_spread": _spread(by_seed),
        "mrr_study": by_name(STUDY),
        "mrr_ties_averaged": by_name(encodings, ties="average"),
        "paper": dict(PAPER_MRR),
        "columns": columns,
        "within": within,
        "accuracy": accuracy,
    }


def run_suite(
    config: SuiteConfig | None = None,
    out: str | Path = "posenc-suite",
    *,
    quick: bool = False,
    workers: int | None = None,
    device: Any = None,
    progress: bool = True,
    on_task: Callable[[int, SuiteSplit], None] | None = None,
) -> SuiteResult:
    """Train and test every task of the suite, score it, write ``suite.json`` and the page.

    Each task runs through :func:`posenc.lab.training.run` in ``out/<split>/`` (for
    instance ``out/copy_tr20_ts40``), so finished trainings and evaluations are
    read back, and an interrupted suite resumes where it stopped.

    ``suite.json`` (written atomically) holds ``"settings"`` (the
    :class:`SuiteConfig`), ``"mrr"`` (encoding -> MRR over every column, the
    notebook's tie rule, encodings in :attr:`SuiteConfig.encodings` order),
    ``"mrr_by_seed"`` (encoding -> the MRR of each seed's columns, whose mean is
    ``"mrr"``), ``"mrr_spread"`` (encoding -> ``{"min", "max", "std"}`` of those;
    null with one seed), ``"mrr_study"`` (the five ranked among themselves, as
    the paper's numbers are), ``"mrr_ties_averaged"`` (ties sharing their mean
    rank), ``"paper"`` (:data:`PAPER_MRR`), ``"columns"`` (per task, split and
    seed: each encoding's test accuracy and reciprocal rank, and ``"within"``: its
    accuracy over the trained lengths), ``"within"`` (split -> encoding -> that
    accuracy's mean over seeds: whether the model learned the task at all, which
    the ranking does not tell), ``"accuracy"``
    (every task, split, encoding, seed and length), and ``"seconds"`` and
    ``"trained"``: this call's wall time and models trained (0 on a rerun).

    Args:
        config: the settings; :class:`SuiteConfig`'s defaults (the full suite) when None.
        out: the output directory.
        quick: use :func:`quick_config` (only with ``config`` None).
        workers, device: as :func:`posenc.lab.training.run` (``workers`` None: one per CPU).
        progress: the lab's progress bars.
        on_task: called with (index, task) before each task runs.

    Raises:
        ValueError: ``quick`` with a ``config``, a directory that cannot be
            written, or what :func:`posenc.lab.training.run` refuses.
    """
    from posenc.faces.lab.training import run

    if quick and config is not None:
        raise ValueError("quick: give either quick=True or a config, not both")
    if config is None:
        config = quick_config() if quick else SuiteConfig()
    if not isinstance(config, SuiteConfig):
        raise TypeError(f"config must be a SuiteConfig; got {type(config).__name__}")
    out = Path(out)
    started = time.perf_counter()
    records: dict[str, Any] = {}
    trained = 0
    for i, task in enumerate(config.tasks):
        if on_task is not None:
            on_task(i, task)
        # accuracies only: the lab's position probes would double a small model's time
        outcome = run(
            config.lab_config(task), out / task.key, progress=progress, workers=workers,
            device=device, probe=False,
        )  # fmt: skip
        records[task.key] = outcome.records
        trained += len(outcome.trained)
    doc = score(config, records)
    doc["seconds"] = time.perf_counter() - started
    doc["trained"] = trained
    with atomic_write(out / "suite.json", "w") as f:
        f.write(json.dumps(doc, indent=1))
    paths = {"json": out / "suite.json", **write_page(out, doc, records, config)}
    return SuiteResult(doc, paths, trained)


# ------------------------------------------------------------------ the page


def figure(records: Mapping[str, Sequence[Any]], config: SuiteConfig) -> Any:
    """Accuracy against length, one panel per task (:func:`posenc.lab.results.figure`'s)."""
    from posenc.faces.lab import results
    from posenc.faces.plot import new_figure

    labels = {entry.task: entry.label for entry in names.SUITE}
    count = len(config.tasks)
    columns = min(count, 4)
    rows = -(-count // columns)
    fig, axes = new_figure(4.2 * columns, 3.4 * rows, ncols=columns, nrows=rows)
    panels = list(np.atleast_1d(axes).ravel())
    for ax, task in zip(panels, config.tasks, strict=False):
        results.figure(
            records[task.key], task.train_len,
            f"{labels.get(task.task, task.task)}: trained 1-{task.train_len}", ax=ax,
        )  # fmt: skip
    for ax in panels[count:]:
        ax.set_visible(False)
    return fig


def _mrr_table(doc: Mapping[str, Any]) -> list[str]:
    spread = doc["mrr_spread"]
    extra = doc["mrr"] != doc["mrr_study"]
    head = "<th>MRR, all encodings ranked</th>" if extra else ""
    seeds = doc["settings"]["seeds"]
    lines = [
        "<table><tr><th>encoding</th><th>paper</th>"
        f"<th>MRR here ({seeds} seed{'s' if seeds > 1 else ''}; seed min-max)</th>{head}"
        "<th>ties sharing their mean rank</th></tr>"
    ]
    for e, value in doc["mrr"].items():
        paper = doc["paper"].get(e)
        here = doc["mrr_study"].get(e)
        cell = "-" if here is None else f"{here:.3f}"
        if here is not None and spread is not None and not extra:
            cell += f" ({spread[e]['min']:.3f}-{spread[e]['max']:.3f})"
        all_cell = f"<td>{value:.3f}</td>" if extra else ""
        lines.append(
            f"<tr><td>{html.escape(e)}</td><td>{'-' if paper is None else f'{paper:.3f}'}</td>"
            f"<td>{cell}</td>{all_cell}<td>{doc['mrr_ties_averaged'][e]:.3f}</td></tr>"
        )
    lines.append("</table>")
    return lines


#: Exact match within the trained lengths below which the page marks a model as not
#: having learned the task (the paper's models reach it on its tasks).
LEARNED = 0.9


def _within_table(doc: Mapping[str, Any]) -> list[str]:
    labels = {entry.task: entry.label for entry in names.SUITE}
    encodings = list(doc["mrr"])
    lines = [
        "<table><tr><th>task</th>"
        + "".join(f"<th>{html.escape(e)}</th>" for e in encodings)
        + "</tr>"
    ]
    for split in doc["settings"]["tasks"]:
        key = SuiteSplit(**split).key
        cells = []
        for e in encodings:
            value = doc["within"][key][e]
            text = f"{value:.2f}"
            cells.append(f"<td><b>{text}</b></td>" if value < LEARNED else f"<td>{text}</td>")
        label = html.escape(labels.get(split["task"], split["task"]))
        lines.append(f"<tr><td>{label} (1-{split['train_len']})</td>{''.join(cells)}</tr>")
    lines.append("</table>")
    return lines


def write_page(
    out: str | Path, doc: Mapping[str, Any], records: Mapping[str, Sequence[Any]],
    config: SuiteConfig,
) -> dict[str, Path]:  # fmt: skip
    """Write ``out/suite.svg`` and ``out/index.html`` (both atomically); return their paths."""
    from posenc.faces.plot import encode, pyplot

    out = Path(out)
    fig = figure(records, config)
    svg = encode(fig, "svg")
    pyplot().close(fig)
    with atomic_write(out / "suite.svg") as f:
        f.write(svg)
    s = doc["settings"]
    title = "posenc lab suite: length generalisation (Kazemnejad et al. 2023)"
    caption = (
        f"{len(config.tasks)} tasks, {s['seeds']} seeds per encoding; {s['steps']} steps of "
        f"batch {s['batch_size']}; a {s['layers']}-layer, {s['heads']}-head transformer of "
        f"width {s['d_model']}; {s['eval_examples']} examples per length. Lines: mean over "
        "seeds; bands: min-max; shaded: trained lengths."
    )
    rule = (
        "Mean reciprocal rank: in each (task, split, seed) column the encodings are ranked "
        "by exact-match accuracy over the tested lengths (those beyond training), and each "
        "encoding's 1/rank is averaged over the columns. Ties are broken as the paper's "
        'notebook breaks them (pandas rank(method="first")): the encoding listed first '
        f"({', '.join(STUDY)}) takes the better rank; the last column shares tied ranks "
        "instead. The paper's numbers come from its full suite (more tasks, larger models, "
        "three seeds)."
    )
    zero = sum(max(c["accuracy"].values()) == 0 for c in doc["columns"])
    if zero:
        rule += (
            f" In {zero} of the {len(doc['columns'])} columns every encoding scores 0, and "
            "there the listed order alone decides the ranks."
        )
    learned = (
        "Exact match over the trained lengths, mean over seeds. The ranking above scores "
        "only the longer lengths, so an encoding that never learned a task ranks as low as "
        f"one that learned it and failed to extrapolate; bold: below {LEARNED}."
    )
    page = "\n".join([
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title></head><body>",
        f"<h2>{html.escape(title)}</h2>",
        f"<p>{html.escape(caption)}</p>",
        f'<img src="data:image/svg+xml;base64,{base64.b64encode(svg).decode()}" '
        'alt="accuracy against length per task">',
        f"<p>{html.escape(rule)}</p>",
        *_mrr_table(doc),
        "<h3>Did each model learn its task?</h3>",
        f"<p>{html.escape(learned)}</p>",
        *_within_table(doc),
        "</body></html>",
    ])  # fmt: skip
    with atomic_write(out / "index.html", "w") as f:
        f.write(page)
    return {"svg": out / "suite.svg", "html": out / "index.html"}


def with_options(config: SuiteConfig, **options: Any) -> SuiteConfig:
    """``config`` with the options that are not None replaced (``extra``, ``seeds`` ...)."""
    given = {k: v for k, v in options.items() if v is not None}
    return replace(config, **given) if given else config
