"""``posenc lab arithmetic``: addition far beyond the trained length, by encoding.

Addition trained on numbers of up to ``train_len`` digits and tested on numbers
of up to ``test_len``: exact match per operand length (every operand that many
digits). :data:`STUDY` is what runs: the encodings made for arithmetic, each
on its task format (:mod:`posenc.lab.arithmetic_tasks`), beside the baselines
they were made to fix:

- ``coupled``: position coupling (Cho et al. 2024), on their format (operands
  most significant digit first, zero-padded; the answer reversed);
- ``abacus`` and ``abacus-fire``: Abacus embeddings (McLeish et al. 2024), alone
  and with FIRE's bias, on reversed, zero-padded numbers;
- ``randomized-rope`` and ``randomized-learned``: randomized positions (Ruoss
  et al. 2023) under RoPE and under a learned table;
- ``fire-index-hints``: FIRE with index hints (Zhou et al. 2024);
- ``nope``, ``rope``, ``alibi``, ``fire``, ``learned``: the baselines.

Randomized NoPE is not a line: NoPE reads no position, so randomizing its
positions leaves the same model (the lab refuses ``random_positions`` without a
rotation or a table to read them).

:func:`run_arithmetic` trains each task's encodings through
:func:`posenc.lab.training.run` (one directory per task, cached and resumable) and
writes ``arithmetic.json``, ``arithmetic.svg`` and ``index.html``;
:func:`section` is the page's section (the explainer, the position-id tables of
one example, the curves and the table), which ``posenc report`` shows from the
bundled run; :func:`markdown` is the guide's table.
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.faces import bundle


@dataclass(frozen=True)
class Entry:
    """One line of the study: a lab encoding trained on one arithmetic task format."""

    name: str
    encoding: str
    task: str
    description: str


#: Every line of the study, in the order of the table.
STUDY = (
    Entry("coupled", "coupled", "add-answer-reversed",
          "position coupling (Cho et al. 2024), on their format"),
    Entry("abacus", "abacus", "add-reversed", "Abacus embeddings (McLeish et al. 2024)"),
    Entry("abacus-fire", "abacus-fire", "add-reversed", "Abacus embeddings with FIRE"),
    Entry("randomized-rope", "randomized", "add-reversed",
          "RoPE at randomized positions (Ruoss et al. 2023)"),
    Entry("randomized-learned", "randomized-learned", "add-reversed",
          "a learned table at randomized positions (Ruoss et al. 2023)"),
    Entry("fire-index-hints", "fire", "add-reversed-hints",
          "FIRE with index hints (Zhou et al. 2024)"),
    Entry("nope", "nope", "add-reversed", "no positional encoding"),
    Entry("rope", "rope", "add-reversed", "RoPE"),
    Entry("alibi", "alibi", "add-reversed", "ALiBi"),
    Entry("fire", "fire", "add-reversed", "FIRE"),
    Entry("learned", "learned", "add-reversed", "a learned absolute table"),
)  # fmt: skip
_BY_NAME = {e.name: e for e in STUDY}

#: The issue's goal: exact match at least this at ``GOAL_RATIO`` times the trained length.
GOAL = 0.9
GOAL_RATIO = 2.5


@dataclass(frozen=True)
class ArithmeticConfig:
    """The study's settings (the lab's :class:`~posenc.lab.training.LabConfig` fields it sets).

    Attributes:
        entries: names from :data:`STUDY`.
        train_len: training numbers have 1 to this many digits.
        test_len: testing reaches numbers of this many digits.
        seeds, steps, batch_size, lr, d_model, layers, heads, eval_examples: as the lab's.
    """

    entries: tuple[str, ...] = tuple(e.name for e in STUDY)
    train_len: int = 10
    test_len: int = 40
    seeds: int = 3
    steps: int = 4000
    batch_size: int = 64
    lr: float = 1e-3
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    eval_examples: int = 64

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("entries must name at least one line of the study")
        for name in self.entries:
            checks.check_choice(name, "entry", tuple(_BY_NAME))
        for name in ("train_len", "test_len", "seeds", "steps", "batch_size", "eval_examples"):
            checks.check_int(getattr(self, name), name, minimum=1)
        if self.test_len <= self.train_len:
            raise ValueError(f"test_len ({self.test_len}) must exceed train_len ({self.train_len})")

    def lab_configs(self) -> dict[str, Any]:
        """One :class:`~posenc.lab.training.LabConfig` per task, with its entries' encodings."""
        from posenc.faces.lab.training import LabConfig

        by_task: dict[str, list[str]] = {}
        for name in self.entries:
            entry = _BY_NAME[name]
            by_task.setdefault(entry.task, []).append(entry.encoding)
        sizes = {k: v for k, v in asdict(self).items() if k != "entries"}
        return {task: LabConfig(task=task, encodings=tuple(encs), **sizes)
                for task, encs in by_task.items()}  # fmt: skip


def quick_config() -> ArithmeticConfig:
    """``--quick``: one seed of every line, half the steps (about 10 minutes on 2 CPU cores)."""
    return ArithmeticConfig(seeds=1, steps=2000)


def _by_name(records_by_task: Mapping[str, Sequence[Any]], config: ArithmeticConfig) -> dict:
    """entry name -> length -> accuracies per seed."""
    out: dict[str, dict[int, list[float]]] = {}
    for name in config.entries:
        entry = _BY_NAME[name]
        for r in records_by_task[entry.task]:
            if r.encoding == entry.encoding and r.metric == "accuracy":
                out.setdefault(name, {}).setdefault(r.length, []).append(r.value)
    return out


def summarize(
    records_by_task: Mapping[str, Sequence[Any]], config: ArithmeticConfig
) -> dict[str, Any]:
    """The ``arithmetic.json`` document of a run's records (module docstring).

    ``accuracy[name][length]`` is ``{"mean", "min", "max"}`` over seeds;
    ``reach[name]``: the longest length whose mean is at least :data:`GOAL` with
    every shorter one too (0: none).
    """
    by_name = _by_name(records_by_task, config)
    accuracy: dict[str, dict[str, dict[str, float]]] = {}
    reach: dict[str, int] = {}
    for name, by_len in by_name.items():
        accuracy[name] = {
            str(n): {"mean": float(np.mean(v)), "min": float(min(v)), "max": float(max(v))}
            for n, v in sorted(by_len.items())
        }
        longest = 0
        for n in sorted(by_len):
            if np.mean(by_len[n]) < GOAL:
                break
            longest = n
        reach[name] = longest
    goal_len = int(np.ceil(GOAL_RATIO * config.train_len))
    reached = [
        name for name in accuracy
        if accuracy[name].get(str(goal_len), {"mean": 0.0})["mean"] >= GOAL
    ]  # fmt: skip
    return {
        "settings": asdict(config),
        "trained_max": config.train_len,
        "tested_max": config.test_len,
        "seeds": config.seeds,
        "entries": [asdict(_BY_NAME[name]) for name in config.entries],
        "accuracy": accuracy,
        "reach": reach,
        "goal": {"accuracy": GOAL, "length": goal_len, "reached_by": reached},
    }


def run_arithmetic(
    config: ArithmeticConfig | None = None,
    out: str | Path = "posenc-arithmetic",
    *,
    workers: int | None = None,
    device: Any = None,
    progress: bool = True,
    on_task: Callable[[int, str], None] | None = None,
) -> dict[str, Any]:
    """Train and test every line of the study; write ``arithmetic.json`` and the page.

    Each task format runs through :func:`posenc.lab.training.run` in ``out/<task>/``,
    so finished trainings are read back and an interrupted run resumes. The
    document (:func:`summarize`) gains ``"seconds"`` (this call's wall time) and
    ``"trained"`` (models trained by it).

    Raises:
        TypeError: a config that is no :class:`ArithmeticConfig`.
        ValueError: what :func:`posenc.lab.training.run` refuses.
    """
    from posenc.faces.lab.training import run

    config = ArithmeticConfig() if config is None else config
    if not isinstance(config, ArithmeticConfig):
        raise TypeError(f"config must be an ArithmeticConfig; got {type(config).__name__}")
    out = Path(out)
    started = time.perf_counter()
    records: dict[str, Any] = {}
    trained = 0
    for i, (task, lab) in enumerate(config.lab_configs().items()):
        if on_task is not None:
            on_task(i, task)
        outcome = run(lab, out / task, progress=progress, workers=workers, device=device,
                      probe=False)  # fmt: skip
        records[task] = outcome.records
        trained += len(outcome.trained)
    doc = summarize(records, config)
    doc["seconds"] = time.perf_counter() - started
    doc["trained"] = trained
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "arithmetic.json", "w") as f:
        f.write(json.dumps(doc, indent=1))
    svg = _svg(doc)
    with atomic_write(out / "arithmetic.svg") as f:
        f.write(svg)
    page = "\n".join([
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        "<title>posenc lab arithmetic</title></head><body>",
        section(doc, svg),
        "</body></html>",
    ])  # fmt: skip
    with atomic_write(out / "index.html", "w") as f:
        f.write(page)
    return doc


# ------------------------------------------------------------------ the figure


def figure(doc: Mapping[str, Any], ax: Any = None) -> Any:
    """Exact match against operand length, one line per entry (mean; band: seed min-max)."""
    from posenc.faces.plot import new_figure

    if ax is None:
        fig, ax = new_figure(8.5, 4.8)
    else:
        fig = ax.figure
    for i, (name, by_len) in enumerate(doc["accuracy"].items()):
        lengths = [int(n) for n in by_len]
        colour = f"C{i % 10}"
        style = "-" if i < 10 else "--"
        ax.plot(lengths, [v["mean"] for v in by_len.values()], style, color=colour, lw=1.6,
                label=name)  # fmt: skip
        low = [v["min"] for v in by_len.values()]
        high = [v["max"] for v in by_len.values()]
        ax.fill_between(lengths, low, high, color=colour, alpha=0.12, lw=0)
    ax.axvspan(0.5, doc["trained_max"] + 0.5, color="0.9", zorder=-1, label="trained lengths")
    goal = doc["goal"]
    ax.axvline(goal["length"], color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("digits per operand")
    ax.set_ylabel("exact match")
    ax.set_ylim(-0.02, 1.02)
    seeds = f"{doc['seeds']} seed{'s' if doc['seeds'] > 1 else ''}"
    ax.set_title(
        f"addition: trained on 1-{doc['trained_max']} digits, tested to "
        f"{doc['tested_max']} ({seeds})"
    )
    ax.legend(fontsize=7.5, ncol=2, loc="upper right")
    return fig


def _svg(doc: Mapping[str, Any]) -> bytes:
    from posenc.faces.plot import encode, pyplot

    fig = figure(doc)
    svg = encode(fig, "svg")
    pyplot().close(fig)
    return svg


# ------------------------------------------------------------------ the explainer


def id_table(
    numbers: tuple[int, ...] = (653, 49), task: str = "add-answer-reversed", seed: int = 0
) -> dict[str, list[Any]]:
    """The position ids of one example under every scheme, as the page draws them.

    Rows: ``"token"`` (the example written in ``task``'s format), ``"position"``
    (``0 .. seq - 1``: what RoPE, ALiBi, FIRE and a learned table read),
    ``"randomized"`` (one draw of Ruoss et al.'s positions below ``4 * seq``,
    seeded by ``seed``), ``"abacus"`` and ``"coupled"`` (at evaluation's offsets)
    and ``"hint"`` (the index hint each digit would get). Each row has one entry
    per token.

    Raises:
        ValueError: a task that is not an arithmetic format, or numbers it cannot
            write (a product of other than two).
    """
    import torch

    from posenc.faces.lab.arithmetic_tasks import FORMATS, example_tokens
    from posenc.families.arithmetic import (
        abacus_positions,
        coupled_positions,
        index_hints,
        randomized_positions,
    )

    checks.check_choice(task, "task", tuple(FORMATS))
    fmt = replace(FORMATS[task], hints=False)
    if fmt.operation == "multiply" and len(numbers) != 2:
        raise ValueError(f"numbers: a product takes 2; got {len(numbers)}")
    if len(numbers) < 2 or any(not isinstance(v, int) or v < 0 for v in numbers):
        raise ValueError(f"numbers must be 2 or more ints >= 0; got {numbers!r}")
    tokens, places, _ = example_tokens(fmt, tuple(numbers))
    names = {1: "BOS", 2: "=", 3: "EOS", 14: "+", 15: "x"}
    shown = [names.get(t, str(t - 4)) for t in tokens]
    sig = torch.tensor(places)
    generator = torch.Generator().manual_seed(seed)
    hints = index_hints(sig).tolist()
    return {
        "token": shown,
        "position": list(range(len(tokens))),
        "randomized": randomized_positions(len(tokens), 4 * len(tokens), generator).tolist(),
        "abacus": abacus_positions(sig).tolist(),
        "coupled": coupled_positions(sig).tolist(),
        "hint": ["" if h < 0 else f"h{h}" for h in hints],
    }


#: The explainer's paragraphs (plain text): why digits far out are lost, what each scheme changes.
EXPLAINER = (
    "Adding two long numbers needs one alignment: the answer's k-th digit reads the k-th "
    "digit of each operand, and a carry from the digit before. A model finds those digits by "
    "their positions. With absolute positions (a learned table, the sinusoidal one) the "
    "digits of a 30-digit number sit at positions no training example reached, so their "
    "vectors were never trained. Relative encodings (RoPE, ALiBi, FIRE) meet no new "
    "position, but they meet new distances: the operand digit an answer digit needs is "
    "about twice the number's length away, a distance that grows with every digit, so the "
    "attention pattern that found it at 10 digits points at the wrong digit at 30.",
    "The encodings made for arithmetic give the model the alignment instead. Randomized "
    "positions (Ruoss et al. 2023) train every position and distance up to a bound by "
    "drawing the positions at random below it. Abacus (McLeish et al. 2024) gives each "
    "digit the id of its place within its own number, so the units, tens and hundreds of "
    "every number share an id, and a random offset in training trains the ids of long "
    "numbers. Position coupling (Cho et al. 2024) gives the digits of one significance one "
    "id across operands and answer, whichever way each number is written. Index hints "
    "(Zhou et al. 2024) write the same alignment as tokens: a hint before every digit.",
    "Type two numbers below and pick a format: the table gives each token's position and "
    "the ids each scheme reads. Raise the training offset to see what a training example's "
    "ids look like; at test time it is 0.",
)

#: The schemes' rules, as the page's formulas (LaTeX).
FORMULAS = (
    r"\mathrm{abacus}(t) = 1 + (\text{index of digit } t \text{ in its number}) + k,"
    r"\quad k \sim U\{0..K\}\ \text{(training)},\ k = 0\ \text{(test)}",
    r"\mathrm{coupled}(t) = s + w - 1 - j(t),\quad j(t) = \text{significance of } t,"
    r"\ w = \text{columns},\ s \sim U\{1..S\}\ \text{(training)},\ s = 1\ \text{(test)}",
    r"\mathrm{hint}(t) = h_0 + j(t),\quad h_0\ \text{random (training)},\ 0\ \text{(test)}",
)

#: A few lines of posenc code computing the ids of the page's first table.
CODE = (
    "import torch\n"
    "from posenc.families.arithmetic import abacus_positions, coupled_positions\n"
    "# 653 + 049 = 2070: each digit's significance, -1 for '+' and '='\n"
    "significance = torch.tensor([2, 1, 0, -1, 2, 1, 0, -1, 0, 1, 2, 3])\n"
    "coupled_positions(significance)   # [2, 3, 4, 5, 2, 3, 4, 5, 4, 3, 2, 1]\n"
    "abacus_positions(significance)    # [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 4]"
)

# The id table recomputed in the page for the reader's numbers: the rules of
# posenc.families.arithmetic and of arithmetic_tasks.example_tokens, in JavaScript.
_SCRIPT = """
<script>
(function () {
  var box = document.getElementById("arith-explorer");
  if (!box) return;
  var input = document.getElementById("arith-numbers");
  var format = document.getElementById("arith-format");
  var offset = document.getElementById("arith-offset");
  var table = document.getElementById("arith-table");
  var note = document.getElementById("arith-note");
  function pad(text, width) { while (text.length < width) text = "0" + text; return text; }
  function draw() {
    var parts = input.value.split("+").map(function (s) { return s.trim(); });
    if (parts.length < 2 || parts.some(function (s) { return !/^[0-9]{1,40}$/.test(s); })) {
      note.textContent = "two to four numbers of 1 to 40 digits, joined by +";
      return;
    }
    parts = parts.slice(0, 4).map(function (s) { return BigInt(s).toString(); });
    note.textContent = "";
    var reverseOperands = format.value === "reversed";
    var k = Math.max(0, Math.min(60, parseInt(offset.value, 10) || 0));
    var width = Math.max.apply(null, parts.map(function (s) { return s.length; }));
    var widest = BigInt(0), total = BigInt(0);
    parts.forEach(function (s) {
      total += BigInt(s); widest += BigInt(10) ** BigInt(width) - BigInt(1);
    });
    var answerWidth = widest.toString().length;
    var tokens = ["BOS"], sig = [-2];
    function write(text, reverse) {
      var digits = text.split("");
      if (reverse) digits.reverse();
      digits.forEach(function (d, i) {
        tokens.push(d); sig.push(reverse ? i : digits.length - 1 - i);
      });
    }
    parts.forEach(function (s, i) {
      write(pad(s, width), reverseOperands);
      tokens.push(i < parts.length - 1 ? "+" : "="); sig.push(-1);
    });
    write(pad(total.toString(), answerWidth), true);
    tokens.push("EOS"); sig.push(-2);
    var columns = Math.max.apply(null, sig) + 1;
    var abacus = [], coupled = [], hints = [], run = 0;
    sig.forEach(function (j) {
      run = j >= 0 ? run + 1 : 0;
      abacus.push(j >= 0 ? run + k : 0);
      coupled.push(j >= -1 ? 1 + k + columns - 1 - j : 0);
      hints.push(j >= 0 ? "h" + (k + j) : "");
    });
    var rows = [["token", tokens], ["position", tokens.map(function (_, i) { return i; })],
                ["abacus", abacus], ["coupled", coupled], ["hint", hints]];
    table.innerHTML = rows.map(function (row) {
      return "<tr><th>" + row[0] + "</th>" + row[1].map(function (v) {
        return "<td>" + v + "</td>"; }).join("") + "</tr>";
    }).join("");
  }
  [input, format, offset].forEach(function (e) { e.addEventListener("input", draw); });
  draw();
})();
</script>
"""

_EXPLORER = """
<div id="arith-explorer">
<label>numbers <input id="arith-numbers" value="653+49" size="30"></label>
<label>operands <select id="arith-format">
<option value="msd">most significant digit first (Cho et al.)</option>
<option value="reversed">reversed, as the answer (McLeish et al.)</option>
</select></label>
<label>training offset <input id="arith-offset" type="number" value="0" min="0" max="60"></label>
<span id="arith-note"></span>
<div style="overflow-x:auto"><table class="numbers ids" id="arith-table"></table></div>
</div>
"""


def _id_table_html(rows: Mapping[str, Sequence[Any]], caption: str) -> str:
    body = []
    for label, values in rows.items():
        cells = "".join(f"<td>{html.escape(str(v))}</td>" for v in values)
        body.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    return (f'<table class="numbers ids"><caption>{html.escape(caption)}</caption>'
            + "".join(body) + "</table>")  # fmt: skip


def _cells(doc: Mapping[str, Any]) -> list[tuple[str, list[str], int]]:
    """Per line: its name, its cells at ``_shown_lengths`` (mean, and the seeds'
    min-max when there are several; "-" where not measured) and its reach."""
    lengths = _shown_lengths(doc)
    out = []
    for name, by_len in doc["accuracy"].items():
        cells = []
        for n in lengths:
            v = by_len.get(str(n))
            if v is None:
                cells.append("-")
            elif doc["seeds"] == 1:
                cells.append(f"{v['mean']:.2f}")
            else:
                cells.append(f"{v['mean']:.2f} ({v['min']:.2f}-{v['max']:.2f})")
        out.append((name, cells, doc["reach"][name]))
    return out


def _results_table(doc: Mapping[str, Any]) -> str:
    head = "".join(f"<th>{n}</th>" for n in _shown_lengths(doc))
    rows = [
        f"<tr><td>{html.escape(name)}</td>{''.join(f'<td>{c}</td>' for c in cells)}"
        f"<td>{reach}</td></tr>"
        for name, cells, reach in _cells(doc)
    ]
    return ('<table class="numbers"><tr><th>encoding</th>' + head
            + "<th>longest with every length up to it at 0.9 or more</th></tr>"
            + "".join(rows) + "</table>")  # fmt: skip


def _shown_lengths(doc: Mapping[str, Any]) -> list[int]:
    trained, tested = doc["trained_max"], doc["tested_max"]
    picks = {trained // 2 or 1, trained, doc["goal"]["length"], tested}
    picks |= {n for n in (int(1.5 * trained), 2 * trained, 3 * trained) if n <= tested}
    return sorted(n for n in picks if 1 <= n <= tested)


def section(doc: Mapping[str, Any], svg: bytes | None = None, *, explainer: bool = True) -> str:
    """The page's section: the explainer, one example's ids, the curves and the table.

    ``explainer=False`` leaves out the explainer's paragraphs, code and the figure (the
    report shows them as its section's text, code and figure) and keeps the rest, the
    reader's id table included.
    """
    image = ""
    if explainer:
        data = base64.b64encode(_svg(doc) if svg is None else svg).decode()
        image = (
            f'<img src="data:image/svg+xml;base64,{data}" alt="exact match against digits per '
            'operand, one line per encoding">'
        )
    s = doc["settings"]
    caption = (
        f"{doc['seeds']} seed{'s' if doc['seeds'] > 1 else ''} per line; {s['steps']} steps of "
        f"batch {s['batch_size']}; a {s['layers']}-layer, {s['heads']}-head transformer of "
        f"width {s['d_model']}; {s['eval_examples']} examples per length, exact match of the "
        "whole answer. Lines: mean over seeds; bands: min-max; shaded: trained lengths; "
        f"dotted: {GOAL_RATIO}x the trained length."
    )
    entries = "".join(
        f"<li><b>{html.escape(e['name'])}</b>: {html.escape(e['description'])} "
        f"(encoding <code>{html.escape(e['encoding'])}</code>, task "
        f"<code>{html.escape(e['task'])}</code>)</li>"
        for e in doc["entries"]
    )
    goal = doc["goal"]
    verdict = (
        f"At {goal['length']} digits ({GOAL_RATIO}x the trained {doc['trained_max']}), "
        + (f"{', '.join(goal['reached_by'])} reach {GOAL} exact match."
           if goal["reached_by"] else
           f"no line reaches {GOAL} exact match at this scale; the papers train larger "
           "models far longer (Cho et al.: 1-30 digits, tested to 200; McLeish et al.: "
           "20 digits, tested to 100, with 16-layer looped models).")
    )  # fmt: skip
    intro = []
    if explainer:
        intro = [f"<p>{html.escape(p)}</p>" for p in EXPLAINER]
        intro.append(f"<pre>{html.escape(CODE)}</pre>")
    return "\n".join([
        '<section id="lab-arithmetic" class="lab">',
        "<h3>Arithmetic beyond the trained length: Abacus, position coupling, randomized "
        "positions, index hints</h3>",
        *intro,
        _EXPLORER,
        _SCRIPT,
        _id_table_html(id_table(), "653 + 49 = 702 in Cho et al.'s format (operands zero-padded "
                       "and most significant digit first, the answer reversed): the ids each "
                       "scheme gives"),
        _id_table_html(id_table((123, 456), "add-reversed"),
                       "123 + 456 = 579, every number reversed: Abacus and coupling differ "
                       "in the operators' ids and in how the offset is drawn"),
        f"<ul>{entries}</ul>",
        image,
        f"<p>{html.escape(caption)}</p>",
        _results_table(doc),
        f"<p>{html.escape(verdict)}</p>",
        "</section>",
    ])  # fmt: skip


def id_markdown(rows: Mapping[str, Sequence[Any]]) -> str:
    """:func:`id_table`'s rows as a Markdown table (the guide's), tokens as the header."""
    tokens = list(rows["token"])
    lines = ["| | " + " | ".join(tokens) + " |", "|---|" + "---|" * len(tokens)]
    for name, values in rows.items():
        if name != "token":
            lines.append(f"| {name} | " + " | ".join(str(v) for v in values) + " |")
    return "\n".join(lines)


def markdown(doc: Mapping[str, Any]) -> str:
    """The guide's table: mean exact match (seed min-max) at the shown lengths."""
    lengths = _shown_lengths(doc)
    lines = [
        "| encoding | " + " | ".join(f"{n} digits" for n in lengths) + " | reach |",
        "|---|" + "---|" * (len(lengths) + 1),
    ]
    lines += [
        f"| {name} | " + " | ".join(cells) + f" | {reach} |" for name, cells, reach in _cells(doc)
    ]
    return "\n".join(lines)


#: The run bundled with posenc (``posenc/faces/data``): ``posenc lab arithmetic``'s document.
BUNDLED = "lab-arithmetic.json"
#: The lab guide's table sits between two of these lines.
README_MARKER = "<!-- arithmetic-table -->"
#: The page, relative to the repository, that shows the bundled table (the lab's guide).
GUIDE = "docs/guides/lab.md"


def readme(text: str, doc: Mapping[str, Any]) -> str:
    """``text`` (a guide's page) with :func:`markdown` of ``doc`` between the two markers.

    Raises:
        ValueError: the page has no pair of :data:`README_MARKER` lines.
    """
    return bundle.between(text, (README_MARKER, README_MARKER), markdown(doc), "arithmetic table")


def publish(run: str | Path, repository: str | Path | None = None) -> Path:
    """Bundle a finished run: its ``arithmetic.json`` as :data:`BUNDLED`, the guide's
    table, and ``docs/lab-arithmetic.png`` of the checkout (every file written atomically).

    Returns the bundled file's path.

    Raises:
        ValueError: ``run`` has no ``arithmetic.json``, or the guide no table markers.
    """
    root = Path(__file__).resolve().parents[4] if repository is None else Path(repository)
    return bundle.publish(Path(run) / "arithmetic.json", BUNDLED, root / GUIDE, readme, figure,
                          root / "docs" / "lab-arithmetic.png")  # fmt: skip


def bundled() -> dict[str, Any] | None:
    """The bundled ``arithmetic.json`` (None where the package has none)."""
    return bundle.read(BUNDLED)


if __name__ == "__main__":  # python -m posenc.faces.lab.arithmetic RUN_DIR: bundle a run
    import sys

    print(publish(sys.argv[1] if len(sys.argv) > 1 else "posenc-arithmetic"))
