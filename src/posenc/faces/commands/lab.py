"""``posenc lab``: train small models on every encoding: run, profile, suite, arithmetic,
extend, grid."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

from posenc.faces.commands.options import (
    int_at_least,
    lab_options,
    lab_sizes,
    sizes,
    study_options,
)


def _lab_config(args: argparse.Namespace) -> Any:
    """The :class:`posenc.lab.LabConfig` of ``posenc lab run``'s or ``profile``'s options."""
    from posenc.faces.lab.training import config_from

    encodings = None
    if args.encodings is not None:
        encodings = tuple(e.strip() for e in args.encodings.split(",") if e.strip())
    return config_from(
        args.task, encodings=encodings, train_len=args.train_len, test_len=args.test_len,
        seeds=args.seeds, data=args.data, **sizes(args),
    )  # fmt: skip


def _lab_profile(args: argparse.Namespace) -> int:
    from posenc.faces.lab.profile import format_profile, profile
    from posenc.faces.lab.training import usable_cpus

    result = profile(_lab_config(args), steps=args.sample, threads=args.threads)
    print(format_profile(result, workers=usable_cpus()))
    return 0


def _lab_run(args: argparse.Namespace) -> int:
    from posenc.faces.lab import results
    from posenc.faces.lab.training import run

    config = _lab_config(args)
    outcome = run(
        config, args.out, progress=not args.no_progress, workers=args.workers,
        context_parallel=args.context_parallel, device=args.device,
    )  # fmt: skip
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 reports
        return 0
    paths = results.write(args.out, outcome.records, config, outcome.probes)
    rows = results.summary(outcome.records, config.train_len)
    for row in rows:
        within = row.get("within", (math.nan,) * 3)
        beyond = row.get("beyond", (math.nan,) * 3)
        print(
            f"{row['encoding']:>12}  {row['metric']} within {within[0]:.3g} "
            f"({within[1]:.3g}-{within[2]:.3g})  beyond {beyond[0]:.3g} "
            f"({beyond[1]:.3g}-{beyond[2]:.3g})"
        )
    for row in results.probe_summary(outcome.probes):
        means = " ".join(f"{mean:.3g}" for mean, _, _ in row["layers"].values())
        chance = f" (chance {1 / row['positions']:.3g})" if row["metric"] == "accuracy" else ""
        print(f"{row['encoding']:>12}  position probe {row['metric']} by layer {means}{chance}")
    where = (Path(args.out) / "results.json").resolve()
    print(
        f"trained {len(outcome.trained)}, reused {len(outcome.reused)}, "
        f"probed {len(outcome.probed)}; results: {where}"
    )
    print(f"page: {paths['html'].resolve()}")
    return 0


def _lab_arithmetic(args: argparse.Namespace) -> int:
    from posenc.faces.lab.arithmetic import ArithmeticConfig, quick_config, run_arithmetic

    entries = None
    if args.entries is not None:
        entries = tuple(e.strip() for e in args.entries.split(",") if e.strip())
    options = {**sizes(args), "seeds": args.seeds, "train_len": args.train_len,
               "test_len": args.test_len, "entries": entries}  # fmt: skip
    # ArithmeticConfig checks every option, the entries' names included
    config = dataclasses.replace(
        quick_config() if args.quick else ArithmeticConfig(),
        **{k: v for k, v in options.items() if v is not None},
    )

    def say(i: int, task: str) -> None:
        print(f"arithmetic: task {i + 1}: {task}", file=sys.stderr, flush=True)

    doc = run_arithmetic(
        config, args.out, workers=args.workers, device=args.device,
        progress=not args.no_progress, on_task=say,
    )  # fmt: skip
    goal = doc["goal"]
    print(f"{'encoding':>20}  exact match at {goal['length']} digits (seed min-max)  reach")
    for name, by_len in doc["accuracy"].items():
        v = by_len.get(str(goal["length"]))
        cell = "-" if v is None else f"{v['mean']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
        print(f"{name:>20}  {cell:<38}  {doc['reach'][name]}")
    out = Path(args.out).resolve()
    print(f"trained {doc['trained']} in {doc['seconds']:.0f} s; results: {out / 'arithmetic.json'}")
    print(f"page: {out / 'index.html'}")
    return 0


def _lab_suite(args: argparse.Namespace) -> int:
    from posenc.faces.lab.suite import (
        SuiteConfig,
        quick_config,
        run_suite,
        select_tasks,
        with_options,
    )

    extra = None
    if args.encodings is not None:
        extra = tuple(e.strip() for e in args.encodings.split(",") if e.strip())
    tasks = None
    if args.tasks is not None:
        tasks = select_tasks([t.strip() for t in args.tasks.split(",") if t.strip()])
    config = with_options(
        quick_config() if args.quick else SuiteConfig(), extra=extra, seeds=args.seeds, tasks=tasks,
        **sizes(args),
    )  # fmt: skip

    def say(i: int, task: Any) -> None:
        print(f"suite: task {i + 1}/{len(config.tasks)}: {task.key}", file=sys.stderr, flush=True)

    result = run_suite(
        config, args.out, workers=args.workers, device=args.device,
        progress=not args.no_progress, on_task=say,
    )  # fmt: skip
    doc = result.doc
    print(f"{'encoding':>14}  {'MRR':>6}  {'paper':>6}  seed min-max")
    for encoding, value in doc["mrr"].items():
        paper = doc["paper"].get(encoding)
        spread = (doc["mrr_spread"] or {}).get(encoding)
        band = f"{spread['min']:.3f}-{spread['max']:.3f}" if spread else "-"
        paper_cell = f"{paper:.3f}" if paper is not None else "-"
        print(f"{encoding:>14}  {value:6.3f}  {paper_cell:>6}  {band}")
    print(f"trained {result.trained} models in {doc['seconds']:.0f} s; "
          f"results: {result.paths['json'].resolve()}")  # fmt: skip
    print(f"page: {result.paths['html'].resolve()}")
    return 0


def _lab_extend(args: argparse.Namespace) -> int:
    from posenc.faces.lab.extend import QUICK, TASKS, ExtendConfig, run_extend

    base = QUICK if args.quick else ExtendConfig()
    given = {"seeds": args.seeds, "train_len": args.train_len, "steps": args.steps,
             "data": args.data}  # fmt: skip
    config = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    tasks = TASKS if args.tasks is None else tuple(t.strip() for t in args.tasks.split(","))
    study = run_extend(config, args.out, workers=args.workers, progress=not args.no_progress,
                       tasks=tasks)  # fmt: skip
    factor = str(config.fine_tune_multiple)
    lengths = [str(n) for n in config.lengths]
    last = str(config.fine_tune_steps[-1])
    for task in tasks:
        metric = "bits per byte" if task == "text" else "keys retrieved"
        print(
            f"{task}: {metric} (mean over {config.seeds} seeds), schedules set for "
            f"{factor}x; zero-shot | after {last} fine-tuning steps at {factor}x"
        )
        print(f"{'line':>15}  " + "  ".join(f"{n:>6}" for n in lengths) + "  |  "
              + "  ".join(f"{n:>6}" for n in lengths))  # fmt: skip
        for name, by_factor in study.zero_shot[task].items():
            zero = by_factor.get(factor, by_factor.get("1", {}))
            cells = "  ".join(f"{zero[n]['mean']:6.3f}" for n in lengths)
            tuned = study.fine_tuned.get(task, {}).get(name)
            after = "  ".join(f"{tuned[last][n]['mean']:6.3f}" for n in lengths) if tuned else ""
            print(f"{name:>15}  {cells}  |  {after}")
    out = Path(args.out).resolve()
    print(f"in {study.seconds:.0f} s; results: {out / 'extend.json'}")
    return 0


def _lab_grid(args: argparse.Namespace) -> int:
    from posenc.faces.lab.grid import QUICK, GridConfig, report, run_grid

    encodings = None
    if args.encodings is not None:
        encodings = tuple(e.strip() for e in args.encodings.split(",") if e.strip())
    given = {**sizes(args), "seeds": args.seeds, "encodings": encodings}
    # GridConfig checks every option, the encodings' names included
    config = dataclasses.replace(
        QUICK if args.quick else GridConfig(), **{k: v for k, v in given.items() if v is not None}
    )
    doc = run_grid(config, args.out, workers=args.workers, progress=not args.no_progress)
    report(doc)
    out = Path(args.out).resolve()
    print(f"results: {out / 'grid.json'}; figure: {out / 'grid.svg'}")
    return 0


def add(sub: Any) -> None:
    """Add ``posenc lab`` to the command's subparsers."""
    lab = sub.add_parser(
        "lab",
        help="train small transformers with each encoding; measure length extrapolation",
        description="posenc lab: train one small transformer per encoding and seed on a "
        "task, and measure it at every length up to --test-len.",
    )
    lab_sub = lab.add_subparsers(dest="lab_command", metavar="COMMAND", required=True)
    lab_run = lab_sub.add_parser(
        "run",
        help="train and evaluate (cached: reruns compute only what is new)",
        description="Train and evaluate every encoding and seed; write DIR/results.json "
        "(task, encoding, seed, length, metric, value), DIR/results.png and .svg, and "
        "DIR/index.html. Runs unchanged under torchrun --nproc_per_node N (DDP); with "
        "--context-parallel, processes also share each sequence.",
    )
    lab_options(lab_run)
    lab_run.add_argument("--out", default="posenc-lab", metavar="DIR", help="default: %(default)s")
    lab_run.add_argument("--no-progress", action="store_true", help="no progress bars")
    lab_run.add_argument(
        "--workers",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="trainings at once, each in its own process (default: one per usable CPU; "
        "1 under torchrun or on a GPU)",
    )
    lab_run.add_argument(
        "--context-parallel",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="under torchrun, N processes share each sequence (ring attention, zigzag "
        "shards); N must divide the processes, which form (processes / N) data-parallel "
        "ranks; default: 1 (plain DDP)",
    )
    lab_run.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="where to train (default: cuda where a GPU exists, else cpu)",
    )
    lab_run.set_defaults(run=_lab_run)
    lab_profile = lab_sub.add_parser(
        "profile",
        help="where a training's time goes, by phase and by kind of operation",
        description="Train each encoding of the run for a sample of steps, as `posenc lab "
        "run` trains it (one thread, as each of its workers has), and print the time per "
        "step by phase (data, forward, backward, optimiser) and by kind of operation "
        "(matmul, attention kernels, GELU, ..., and the Python, autograd and dispatch "
        "between operations, from torch.profiler), and the whole run's estimate.",
    )
    lab_options(lab_profile)
    lab_profile.add_argument("--sample", type=int_at_least(1), default=100, metavar="N",
                             help="steps timed per encoding (twice: by phase, then under "
                             "the profiler); default: %(default)s")  # fmt: skip
    lab_profile.add_argument("--threads", type=int_at_least(1), default=1, metavar="N",
                             help="torch threads; default: %(default)s")  # fmt: skip
    lab_profile.set_defaults(run=_lab_profile)
    from posenc.faces.lab import names

    lab_suite = lab_sub.add_parser(
        "suite",
        help="Kazemnejad et al. (2023)'s length-generalisation suite and its mean reciprocal rank",
        description="Train NoPE, T5 bias, ALiBi, rotary and sinusoidal (plus --encodings) on "
        "every task of the suite, each trained to one length and tested beyond it, through "
        "`posenc lab run` (cached: a rerun trains nothing new); write DIR/<task split>/, "
        "DIR/suite.json (every accuracy and the mean reciprocal rank) and DIR/index.html "
        "(accuracy against length per task, the MRR beside the paper's).",
    )
    from posenc.faces.lab import suite

    lab_suite.add_argument(
        "--quick", action="store_true",
        help=f"{' and '.join(suite.QUICK_TASKS)} only, {suite.QUICK_SEEDS} seeds (about 5 "
        "minutes on 2 CPU cores); the full suite reuses its models",
    )  # fmt: skip
    lab_suite.add_argument(
        "--tasks", default=None, metavar="LIST",
        help="comma-separated tasks of the suite to run (default: all), from: "
        f"{', '.join(t.task for t in names.SUITE)}",
    )  # fmt: skip
    lab_suite.add_argument(
        "--encodings", default=None, metavar="LIST",
        help="comma-separated encodings run beside the five, from: "
        f"{', '.join(names.ENCODINGS)}",
    )  # fmt: skip
    lab_suite.add_argument("--seeds", type=int_at_least(1), default=None, metavar="N",
                           help="seeds per encoding (default: 3, --quick 2)")  # fmt: skip
    defaults = {f.name: f.default for f in dataclasses.fields(suite.SuiteConfig)}
    lab_sizes(lab_suite, "examples per length", default=defaults)
    study_options(lab_suite, "posenc-suite")
    lab_suite.set_defaults(run=_lab_suite)

    from posenc.faces.lab import arithmetic

    lab_arith = lab_sub.add_parser(
        "arithmetic",
        help="addition beyond the trained length: position coupling, Abacus, randomized "
        "positions, index hints beside NoPE, RoPE, ALiBi, FIRE and a learned table",
        description="Train every line of the study on addition with numbers of 1 to "
        "--train-len digits and test exact match per operand length up to --test-len, "
        "through `posenc lab run` (cached: a rerun trains nothing new); write "
        "DIR/<task>/, DIR/arithmetic.json (accuracy[encoding][length]: mean, min, max over "
        "seeds), DIR/arithmetic.svg and DIR/index.html. Lines: "
        + ", ".join(e.name for e in arithmetic.STUDY)
        + ".",
    )
    lab_arith.add_argument(
        "--quick", action="store_true",
        help="one seed per line, 2000 steps (about 8 minutes on 2 CPU cores)",
    )  # fmt: skip
    lab_arith.add_argument("--entries", default=None, metavar="LIST",
                           help="comma-separated lines of the study (default: all)")  # fmt: skip
    lab_arith.add_argument("--seeds", type=int_at_least(1), default=None, metavar="N",
                           help="seeds per line (default: 3, --quick 1)")  # fmt: skip
    lab_arith.add_argument("--train-len", type=int_at_least(1), default=None, metavar="N",
                           help="digits of the longest training number; default: 10")  # fmt: skip
    lab_arith.add_argument("--test-len", type=int_at_least(2), default=None, metavar="N",
                           help="digits of the longest test number; default: 40")  # fmt: skip
    arith_defaults = {f.name: f.default for f in dataclasses.fields(arithmetic.ArithmeticConfig)}
    lab_sizes(lab_arith, "examples per length", default=arith_defaults)
    study_options(lab_arith, "posenc-arithmetic")
    lab_arith.set_defaults(run=_lab_arithmetic)

    lab_extend = lab_sub.add_parser(
        "extend",
        help="every context-extension schedule on the same trained RoPE models, zero-shot "
        "and fine-tuned, beside ALiBi, FIRE, NoPE and RoPE trained long",
        description="Train RoPE (and Resonance RoPE, ALiBi, FIRE, NoPE) at L tokens on a "
        "byte-level language model and on passkey retrieval, and RoPE at 4L; run each "
        "context-extension schedule set for 2x, 4x and 8x (posenc.rotary.schedules."
        "stretched) at L, 2L, 4L and 8L, zero-shot, and after fine-tuning at 4L for "
        "10 to 200 steps. Cached and resumable under DIR; writes DIR/extend.json "
        "(zero_shot[task][line][factor][length], depth[line][factor][length][depth], "
        "fine_tuned[task][line][steps][length]: mean, min, max over seeds).",
    )
    lab_extend.add_argument(
        "--quick", action="store_true", help="one seed, fine-tunes measured at 20 and 200 steps"
    )
    lab_extend.add_argument("--tasks", default=None, metavar="LIST",
                            help="text, passkey or both (default: both)")  # fmt: skip
    lab_extend.add_argument("--seeds", type=int_at_least(1), default=None, metavar="N",
                            help="seeds of every model (default: 3, --quick 1)")  # fmt: skip
    lab_extend.add_argument("--train-len", type=int_at_least(16), default=None, metavar="N",
                            help="L, the trained length in tokens; default: 64")  # fmt: skip
    lab_extend.add_argument("--steps", type=int_at_least(1), default=None, metavar="N",
                            help="training steps of each base model; default: 1500")  # fmt: skip
    lab_extend.add_argument("--data", default=None, metavar="PATH",
                            help="the text of the language model (as lab run --data)")  # fmt: skip
    study_options(lab_extend, "posenc-extend", device=False)
    lab_extend.set_defaults(run=_lab_extend)

    from posenc.faces.lab import grid

    lab_grid = lab_sub.add_parser(
        "grid",
        help="2-D rotary encodings of image patches on larger grids than trained: axial, "
        "RoPE-Mixed, DINOv3, LieRE, ComRoPE and no position",
        description="Train a tiny bidirectional ViT-like encoder per encoding and seed on "
        "8x8 grids (where is the second of two marked cells: right, left, below or above) "
        "and test it on 8x8, 12x12 and 16x16 grids; write DIR/grid.json "
        "(accuracy[encoding][grid]: mean, min, max over seeds and each seed's value) and "
        "DIR/grid.svg. Cached under DIR/runs: a rerun trains nothing new. Encodings: "
        + ", ".join(grid.ENCODINGS)
        + ".",
    )
    lab_grid.add_argument("--quick", action="store_true",
                          help="one seed per encoding (a third of the default's time)")  # fmt: skip
    lab_grid.add_argument("--encodings", default=None, metavar="LIST",
                          help="comma-separated encodings (default: all)")  # fmt: skip
    lab_grid.add_argument("--seeds", type=int_at_least(1), default=None, metavar="N",
                          help="seeds per encoding (default: 3, --quick 1)")  # fmt: skip
    grid_defaults = {f.name: f.default for f in dataclasses.fields(grid.GridConfig)}
    lab_sizes(lab_grid, "test grids per size", default=grid_defaults)
    study_options(lab_grid, "posenc-grid", device=False)
    lab_grid.set_defaults(run=_lab_grid)
