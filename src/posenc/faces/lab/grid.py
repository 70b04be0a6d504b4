"""``posenc lab grid``: 2-D rotary encodings of image patches on larger grids than trained.

A tiny bidirectional encoder (:class:`posenc.lab.grid_model.GridEncoder`) learns the
grid task of :mod:`posenc.lab.grid_tasks` (where the second of two marked cells lies
from the first: right, left, below or above) on 8 x 8 grids, and is tested on 8 x 8,
12 x 12 and 16 x 16 grids: accuracy per grid size, one model per encoding and seed.
Every model has the same sizes, steps and batches (the batches and the test sets are
drawn from seeded generators: one seed gives the same examples to every encoding); only
the rotation of its queries and keys differs, one module of the encoding per layer
(:data:`posenc.lab.grid_model.ENCODINGS`).

:func:`run_grid` trains every model (in worker processes, one thread each), caches each
model's accuracies under ``out/runs`` (a rerun reads them back; an interrupted run
resumes) and writes ``grid.json`` and ``grid.svg``; :func:`publish` bundles a run
(``python -m posenc.faces.lab.grid DIR``, ``make grid-table``).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.faces import bundle
from posenc.faces.lab.grid_tasks import DIRECTIONS, distances, make_grids

if TYPE_CHECKING:  # torch is imported on first use: the command line lists the study without it
    import torch
    from torch import nn

    from posenc.faces.lab.grid_model import GridEncoder

#: Bump when training or measuring changes (part of every cached result's key).
VERSION = 1
#: Accuracy of a model that reads no position (one class in four).
CHANCE = 1 / len(DIRECTIONS)
# test examples per forward pass: a 16 x 16 grid's scores stay a few MiB per chunk
_CHUNK = 64


# ------------------------------------------------------------------ the encodings


def _none(head_dim: int, heads: int) -> nn.Module:
    from posenc.faces.lab.grid_model import NoRotation

    return NoRotation(head_dim, heads)


def _axial(head_dim: int, heads: int) -> nn.Module:
    from posenc.faces.lab.grid_model import AxialCells

    return AxialCells(head_dim, heads)


def _axial_pixel(head_dim: int, heads: int) -> nn.Module:
    from posenc.faces.lab.grid_model import AxialPixels

    return AxialPixels(head_dim, heads)


def _rope_mixed(head_dim: int, heads: int) -> nn.Module:
    from posenc.families.rotary.multiaxis import RoPEMixed

    return RoPEMixed(head_dim, heads)


def _dinov3(head_dim: int, heads: int) -> nn.Module:
    from posenc.families.rotary.multiaxis import DINOv3Rope

    # transformers' DINOv3ViTConfig: rope_theta 100, pos_embed_rescale 2.0, no shift or jitter
    return DINOv3Rope(head_dim, heads, base=100.0, rescale=2.0)


def _liere(head_dim: int, heads: int) -> nn.Module:
    from posenc.families.rotary.multiaxis import LieRotary

    return LieRotary(head_dim, heads, kind="liere")


def _comrope(head_dim: int, heads: int) -> nn.Module:
    from posenc.families.rotary.multiaxis import LieRotary

    return LieRotary(head_dim, heads, kind="comrope-ld")


@dataclass(frozen=True)
class GridEncoding:
    """One 2-D encoding of the study.

    Attributes:
        name: its name in the study.
        description: one line for people (the method and its source).
        formula: the angle (or rotation) of a cell, in one line; ``(y, x)`` is its
            (row, column) in the module's own coordinates.
        coordinates: those coordinates on an ``n x n`` grid, in words.
        build: ``(head_dim, heads) ->`` one layer's rotation module
            (:mod:`posenc.lab.grid_model`).
    """

    name: str
    description: str
    formula: str
    coordinates: str
    build: Callable[[int, int], nn.Module]


#: The study's encodings, in the table's order: name -> :class:`GridEncoding`.
ENCODINGS: dict[str, GridEncoding] = {
    e.name: e
    for e in (
        GridEncoding(
            "none",
            "no position: the encoder is permutation-invariant",
            "R = I",
            "none",
            _none,
        ),
        GridEncoding(
            "axial",
            "axial RoPE, posenc.rotary.multiaxis.AxialRotary (rotary-embedding-torch "
            "get_axial_freqs, freqs_for='lang')",
            "theta_j = y w_j (channels 0-7), x w_j (channels 8-15); w_j = 10000^(-j/4), j = 0..3",
            "integers 0 .. n - 1",
            _axial,
        ),
        GridEncoding(
            "axial-pixel",
            "axial RoPE on normalised coordinates (rotary-embedding-torch freqs_for='pixel'): "
            "axial's rotation, the other coordinate convention",
            "theta_j = y w_j (channels 0-7), x w_j (channels 8-15); w_j = pi (1 + 4j/3), j = 0..3",
            "linspace(-1, 1, n)",
            _axial_pixel,
        ),
        GridEncoding(
            "rope-mixed",
            "RoPE-Mixed (Heo et al. 2024), posenc.rotary.multiaxis.RoPEMixed "
            "(timm RotaryEmbeddingMixed)",
            "theta_hj = x fx_hj + y fy_hj; fx, fy learned per layer, head and pair "
            "(rope-vit init_random_2d_freqs, theta 10)",
            "integers 0 .. n - 1",
            _rope_mixed,
        ),
        GridEncoding(
            "dinov3",
            "DINOv3's RoPE, posenc.rotary.multiaxis.DINOv3Rope (transformers "
            "DINOv3ViTRopePositionEmbedding)",
            "theta_j = 2 pi y / P_j (pairs 0-3), 2 pi x / P_j (pairs 4-7); P_j = 100^(j/4); "
            "training: (y, x) times s, log s ~ U(-log 2, log 2)",
            "patch centres in [-1, 1]: (2 i + 1) / n - 1",
            _dinov3,
        ),
        GridEncoding(
            "liere",
            "LieRE (Ostmeier et al. 2024), posenc.rotary.multiaxis.LieRotary kind='liere'",
            "R = exp(y G_1 + x G_2); G_a learned skew-symmetric 16 x 16 per layer and head",
            "linspace(0, 1, n)",
            _liere,
        ),
        GridEncoding(
            "comrope",
            "ComRoPE-LD (Yu et al. 2025), posenc.rotary.multiaxis.LieRotary kind='comrope-ld'",
            "R_j = exp((y m_1j + x m_2j)(P_j - P_j^T)) per block of 2 channels; P, m learned "
            "per layer and head",
            "(i + 0.5) / n",
            _comrope,
        ),
    )
}


def model(encoding: str, config: GridConfig) -> GridEncoder:
    """A fresh :class:`~posenc.lab.grid_model.GridEncoder` of ``encoding`` at ``config``'s sizes.

    Raises:
        ValueError: an encoding not in :data:`ENCODINGS`.
    """
    from posenc.faces.lab.grid_model import GridEncoder

    checks.check_choice(encoding, "encoding", tuple(ENCODINGS))
    return GridEncoder(ENCODINGS[encoding].build, d_model=config.d_model,
                       layers=config.layers, heads=config.heads)  # fmt: skip


@dataclass(frozen=True)
class GridConfig:
    """The study's settings.

    Attributes:
        encodings: names from :data:`posenc.lab.grid_model.ENCODINGS`.
        train_grid: the side of the trained (square) grids.
        test_grids: the sides of the tested grids.
        seeds: seeds ``0 .. seeds - 1`` of every encoding.
        steps: optimiser steps per model.
        batch_size: grids per step.
        lr: AdamW's peak learning rate (warm-up, then a cosine to a tenth).
        d_model, layers, heads: the encoder's sizes.
        eval_examples: test grids per size (the same for every model).
    """

    encodings: tuple[str, ...] = tuple(ENCODINGS)
    train_grid: int = 8
    test_grids: tuple[int, ...] = (8, 12, 16)
    seeds: int = 3
    steps: int = 400
    batch_size: int = 64
    lr: float = 3e-3
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    eval_examples: int = 512

    def __post_init__(self) -> None:
        if not self.encodings:
            raise ValueError("encodings must name at least one encoding")
        for name in self.encodings:
            checks.check_choice(name, "encoding", tuple(ENCODINGS))
        if len(set(self.encodings)) != len(self.encodings):
            raise ValueError(f"encodings must not repeat a name; got {self.encodings!r}")
        checks.check_int(self.train_grid, "train_grid", minimum=2)
        if not self.test_grids or any(
            not isinstance(n, int) or isinstance(n, bool) or n < 2 for n in self.test_grids
        ):
            raise ValueError(f"test_grids must be ints >= 2; got {self.test_grids!r}")
        for name in ("seeds", "steps", "batch_size", "d_model", "layers", "heads",
                     "eval_examples"):  # fmt: skip
            checks.check_int(getattr(self, name), name, minimum=1)
        checks.check_number(self.lr, "lr", positive=True)
        if self.d_model % self.heads or (self.d_model // self.heads) % 2:
            raise ValueError(
                f"d_model ({self.d_model}) must split into heads ({self.heads}) of an even size"
            )


#: ``posenc lab grid --quick``: one seed of every encoding.
QUICK = GridConfig(seeds=1)


# ------------------------------------------------------------------ one model


def train(encoding: str, seed: int, config: GridConfig) -> tuple[GridEncoder, list[float]]:
    """Train one model: ``encoding`` at ``seed`` (its initialisation and its batches).

    The global random state is left as it was (the initialisation, and any draw a module
    makes in training, runs in a fork of it seeded by ``seed``).

    Returns:
        ``(model, losses)``: the trained model (in eval mode) and its loss at every step.
    """
    import torch
    from torch import nn

    from posenc.faces.lab.training import update, warmup_cosine

    side = config.train_grid
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = model(encoding, config)
        opt = torch.optim.AdamW(net.parameters(), lr=config.lr, betas=(0.9, 0.98),
                                weight_decay=0.01)  # fmt: skip
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, config.steps))
        data = torch.Generator().manual_seed(1_000_003 * (seed + 1))
        losses = []
        net.train()
        for _ in range(config.steps):
            tokens, labels = make_grids(side, side, config.batch_size, data)
            loss = nn.functional.cross_entropy(net(tokens, side, side), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            update(net, opt, sched)
            losses.append(float(loss.detach()))
    return net.eval(), losses


def held_out(side: int, examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The test grids of one size: the same for every encoding and seed."""
    import torch

    return make_grids(side, side, examples, torch.Generator().manual_seed(7919 * side + 1))


def accuracy(net: GridEncoder, side: int, examples: int, trained: int) -> dict[str, Any]:
    """The share of :func:`held_out`'s ``side x side`` grids whose class ``net`` gets.

    Returns:
        ``{"all", "near", "far"}``: over every grid, over those whose marked cells are
        fewer than ``trained`` cells apart (distances a ``trained``-side grid holds),
        and over the others (None where there are none).
    """
    import torch

    tokens, labels = held_out(side, examples)
    net.eval()
    right = []
    with torch.no_grad():
        for start in range(0, examples, _CHUNK):
            logits = net(tokens[start : start + _CHUNK], side, side)
            right.append(logits.argmax(-1) == labels[start : start + _CHUNK])
    hit = torch.cat(right).float()
    near = distances(tokens, side) < trained
    return {
        "all": float(hit.mean()),
        "near": float(hit[near].mean()) if bool(near.any()) else None,
        "far": float(hit[~near].mean()) if bool((~near).any()) else None,
    }


def _key(encoding: str, seed: int, config: GridConfig) -> str:
    """The cache key of one model's accuracies: everything they depend on."""
    settings = {k: v for k, v in asdict(config).items() if k not in ("encodings", "seeds")}
    text = json.dumps([VERSION, encoding, seed, settings], sort_keys=True)
    return f"{encoding}-{seed}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _job(job: tuple[str, int, GridConfig, Path]) -> tuple[dict[str, Any], bool]:
    """One model's record (read back where cached) and whether it trained.

    The record: ``accuracy`` and ``by_distance`` (:func:`accuracy`'s near and far) by
    grid side, ``final_loss`` and ``cpu_seconds`` (the process's CPU time to train and
    test the model).
    """
    encoding, seed, config, runs = job
    path = runs / f"{_key(encoding, seed, config)}.json"
    if path.exists():
        record: dict[str, Any] = json.loads(path.read_text())
        return record, False
    start = time.process_time()
    net, losses = train(encoding, seed, config)
    measured = {str(n): accuracy(net, n, config.eval_examples, config.train_grid)
                for n in config.test_grids}  # fmt: skip
    record = {"accuracy": {n: m["all"] for n, m in measured.items()},
              "by_distance": {n: {k: m[k] for k in ("near", "far")} for n, m in measured.items()},
              "final_loss": losses[-1],
              "cpu_seconds": round(time.process_time() - start, 2)}  # fmt: skip
    with atomic_write(path, "w") as f:
        json.dump(record, f)
    return record, True


def _worker_job(job: tuple[str, int, GridConfig, Path]) -> tuple[dict[str, Any], bool]:
    import torch

    # one thread per worker, as posenc lab run's: the matrices are too small to share a core
    torch.set_num_threads(1)
    return _job(job)


# ------------------------------------------------------------------ the study


def _spread(values: Sequence[float]) -> dict[str, Any]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values),
            "values": list(values)}  # fmt: skip


def summarize(records: Mapping[str, Sequence[Mapping[str, Any]]], config: GridConfig) -> dict:
    """The ``grid.json`` document of every model's record.

    Args:
        records: encoding -> one record per seed, in seed order: ``{"accuracy": {side:
            value}}`` and, optionally, ``"by_distance": {side: {"near", "far"}}``
            (:func:`accuracy`).
        config: the study.

    Returns:
        ``settings``, ``train_grid``, ``test_grids``, ``seeds``, ``chance``,
        ``encodings`` (name -> ``{"description", "formula", "coordinates"}``),
        ``accuracy[encoding][side]``: ``{"mean", "min", "max", "values"}`` over seeds
        (``values``: one per seed, in seed order), and ``by_distance[encoding][side]``:
        ``{"near", "far"}``, each such a spread (or None where no pair was that far).
    """
    accuracy_doc: dict[str, dict[str, Any]] = {}
    distance_doc: dict[str, dict[str, Any]] = {}
    for name in config.encodings:
        runs = records[name]
        accuracy_doc[name], distance_doc[name] = {}, {}
        for n in map(str, config.test_grids):
            accuracy_doc[name][n] = _spread([float(r["accuracy"][n]) for r in runs])
            if all("by_distance" in r for r in runs):
                distance_doc[name][n] = {
                    part: None if runs[0]["by_distance"][n][part] is None
                    else _spread([float(r["by_distance"][n][part]) for r in runs])
                    for part in ("near", "far")
                }  # fmt: skip
    return {
        "settings": asdict(config),
        "train_grid": config.train_grid,
        "test_grids": list(config.test_grids),
        "seeds": config.seeds,
        "chance": CHANCE,
        "encodings": {
            name: {
                "description": ENCODINGS[name].description,
                "formula": ENCODINGS[name].formula,
                "coordinates": ENCODINGS[name].coordinates,
            }
            for name in config.encodings
        },
        "accuracy": accuracy_doc,
        "by_distance": distance_doc,
    }


def run_grid(
    config: GridConfig | None = None,
    out: str | Path = "posenc-grid",
    *,
    workers: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train and test every encoding and seed; write ``grid.json`` and ``grid.svg``.

    The document (:func:`summarize`) gains ``"seconds"`` (this call's wall time),
    ``"trained"`` (models trained by it, not read back from ``out/runs``), and per
    encoding each seed's ``"final_loss"`` (the last step's) and ``"cpu_seconds"`` (its
    worker's CPU time to train and test it, wherever it ran).

    Args:
        config: the study (:class:`GridConfig`'s defaults by default).
        out: the run's directory.
        workers: trainings at once, each in its own process (default: one per usable CPU).
        progress: a line on stderr per finished model.

    Raises:
        TypeError: a config that is no :class:`GridConfig`.
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from posenc.faces.lab.training import usable_cpus

    config = GridConfig() if config is None else config
    if not isinstance(config, GridConfig):
        raise TypeError(f"config must be a GridConfig; got {type(config).__name__}")
    if workers is not None:
        workers = checks.check_int(workers, "workers", minimum=1)
    out = Path(out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = [(e, s, config, runs) for e in config.encodings for s in range(config.seeds)]
    count = max(1, min(len(jobs), workers if workers is not None else usable_cpus()))
    results: list[tuple[dict[str, Any], bool]] = []

    def say(job: tuple[str, int, GridConfig, Path], record: dict[str, Any]) -> None:
        if progress:
            result = record["accuracy"]
            cells = " ".join(f"{n}x{n} {result[str(n)]:.3f}" for n in config.test_grids)
            print(f"grid: {job[0]} seed {job[1]}: {cells}", file=sys.stderr, flush=True)

    if count == 1:
        for job in jobs:
            results.append(_job(job))
            say(job, results[-1][0])
    else:
        with ProcessPoolExecutor(count, mp_context=get_context("spawn")) as pool:
            for job, done in zip(jobs, pool.map(_worker_job, jobs), strict=True):
                results.append(done)
                say(job, done[0])
    per_seed: dict[str, list[dict[str, Any]]] = {}
    for (encoding, _, _, _), (record, _) in zip(jobs, results, strict=True):
        per_seed.setdefault(encoding, []).append(record)
    doc = summarize(per_seed, config)
    by_encoding = [(job[0], record) for job, (record, _) in zip(jobs, results, strict=True)]
    for field in ("final_loss", "cpu_seconds"):
        doc[field] = {name: [r.get(field) for e, r in by_encoding if e == name]
                      for name in config.encodings}  # fmt: skip
    doc["seconds"] = round(time.perf_counter() - started, 1)
    doc["trained"] = sum(fresh for _, fresh in results)
    with atomic_write(out / "grid.json", "w") as f:
        f.write(json.dumps(doc, indent=1))
    from posenc.faces.plot import encode, pyplot

    fig = figure(doc)
    svg = encode(fig, "svg")
    pyplot().close(fig)
    with atomic_write(out / "grid.svg") as f:
        f.write(svg)
    return doc


# ------------------------------------------------------------------ reading a study


def figure(doc: Mapping[str, Any], ax: Any = None) -> Any:
    """Accuracy against the grid's side, one line per encoding (mean; band and dots: seeds)."""
    from posenc.faces.plot import new_figure

    if ax is None:
        fig, ax = new_figure(7.2, 4.0)
    else:
        fig = ax.figure
    sides = [int(n) for n in doc["test_grids"]]
    for i, (name, by_side) in enumerate(doc["accuracy"].items()):
        colour = f"C{i % 10}"
        cells = [by_side[str(n)] for n in sides]
        ax.plot(sides, [c["mean"] for c in cells], "-o", color=colour, lw=1.6, ms=3.5,
                label=name)  # fmt: skip
        ax.fill_between(sides, [c["min"] for c in cells], [c["max"] for c in cells],
                        color=colour, alpha=0.12, lw=0)  # fmt: skip
        for n, c in zip(sides, cells, strict=True):
            ax.plot([n] * len(c["values"]), c["values"], ".", color=colour, ms=3, alpha=0.6)
    ax.axhline(doc["chance"], color="0.5", lw=0.8, ls=":", label="chance")
    ax.axvline(doc["train_grid"], color="0.8", lw=6, zorder=-1, label="trained grid")
    ax.set_xticks(sides, [f"{n}x{n}" for n in sides])
    ax.set_xlabel("grid (patches)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.02)
    seeds = f"{doc['seeds']} seed{'s' if doc['seeds'] > 1 else ''}"
    ax.set_title(f"where is the second marked cell: trained at {doc['train_grid']}x"
                 f"{doc['train_grid']} ({seeds})")  # fmt: skip
    ax.set_xlim(sides[0] - 1, sides[-1] + 1)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _cell(v: Mapping[str, Any]) -> str:
    if v["min"] == v["max"]:
        return f"{v['mean']:.3f}"
    return f"{v['mean']:.3f} ({v['min']:.3f}-{v['max']:.3f})"


def markdown(doc: Mapping[str, Any]) -> str:
    """The guide's tables: mean accuracy per grid (seed min-max), one row per encoding;
    then, on the grids larger than trained, the same over the pairs of marked cells at
    distances the trained grid holds (near) and over the farther ones (far)."""
    sides = [int(n) for n in doc["test_grids"]]
    lines = [
        "| encoding | " + " | ".join(f"{n}x{n}" for n in sides) + " |",
        "|---|" + "---|" * len(sides),
    ]
    for name, by_side in doc["accuracy"].items():
        lines.append(f"| {name} | " + " | ".join(_cell(by_side[str(n)]) for n in sides) + " |")
    larger = [n for n in sides if n > doc["train_grid"]]
    distance = doc.get("by_distance") or {}
    if larger and all(distance.get(name) for name in doc["accuracy"]):
        below = doc["train_grid"]
        lines += [
            "",
            "| encoding | "
            + " | ".join(f"{n}x{n}, < {below} apart | {n}x{n}, >= {below} apart" for n in larger)
            + " |",
            "|---|" + "---|" * (2 * len(larger)),
        ]
        for name in doc["accuracy"]:
            cells = [
                "-" if distance[name][str(n)][part] is None else _cell(distance[name][str(n)][part])
                for n in larger
                for part in ("near", "far")
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The run bundled with posenc (``posenc/faces/data``): ``posenc lab grid``'s document.
BUNDLED = "lab-grid.json"
#: The lab guide's table sits between two of these lines.
MARKER = "<!-- grid-table -->"
#: The page, relative to the repository, that shows the bundled table.
GUIDE = "docs/guides/lab.md"


def readme(text: str, doc: Mapping[str, Any]) -> str:
    """``text`` (the guide) with :func:`markdown` of ``doc`` between the two markers.

    Raises:
        ValueError: the page has no pair of :data:`MARKER` lines.
    """
    return bundle.between(text, (MARKER, MARKER), markdown(doc), "grid table")


def publish(run: str | Path, repository: str | Path | None = None) -> Path:
    """Bundle a finished run: its ``grid.json`` as :data:`BUNDLED`, the guide's table and
    ``docs/lab-grid.png`` of the checkout (each written atomically). The bundled file's path.

    Raises:
        ValueError: ``run`` has no ``grid.json``, or the guide no table markers.
    """
    root = Path(__file__).resolve().parents[4] if repository is None else Path(repository)
    return bundle.publish(Path(run) / "grid.json", BUNDLED, root / GUIDE, readme, figure,
                          root / "docs" / "lab-grid.png")  # fmt: skip


def bundled() -> dict[str, Any] | None:
    """The bundled ``grid.json`` (None where the package has none)."""
    return bundle.read(BUNDLED)


def report(doc: Mapping[str, Any], say: Callable[[str], None] = print) -> None:
    """The command's summary of a finished run: the table, its time and models trained."""
    sides = [str(n) for n in doc["test_grids"]]
    say(f"accuracy by grid (mean over {doc['seeds']} seeds, min-max); trained at "
        f"{doc['train_grid']}x{doc['train_grid']}, chance {doc['chance']:.2f}")  # fmt: skip
    say(f"{'encoding':>12}  " + "  ".join(f"{n + 'x' + n:>21}" for n in sides))
    for name, by_side in doc["accuracy"].items():
        say(f"{name:>12}  " + "  ".join(f"{_cell(by_side[n]):>21}" for n in sides))
    cpu = sum(sum(v for v in seeds if v is not None) for seeds in doc["cpu_seconds"].values())
    say(f"trained {doc['trained']} models in {doc['seconds']:.0f} s; {cpu:.0f} CPU seconds "
        "to train and test every model")  # fmt: skip


if __name__ == "__main__":  # python -m posenc.faces.lab.grid RUN_DIR: bundle a run
    print(publish(sys.argv[1] if len(sys.argv) > 1 else "posenc-grid"))
