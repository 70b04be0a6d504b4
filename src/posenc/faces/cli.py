"""The ``posenc`` command: write tables, check the properties, run the benchmarks.

Subcommands:

- ``posenc table``: write a sinusoidal table to ``.npy``, ``.pt``, ``.csv`` or ``.json``.
- ``posenc check``: measure the properties people ask about (shift, norm,
  offset-only dot products, one column vs the pair, float32 precision) and
  print PASS/FAIL against bounds derived from the arithmetic; exit 1 on a FAIL.
- ``posenc bench``: time posenc against the code users run, in one process.
- ``posenc presets``: list the named conventions and where each comes from.
- ``posenc report``: the explainer (figures and measured numbers) as one HTML file.
- ``posenc plot KIND``: any single figure of the report, as PNG or SVG.
- ``posenc rope CONFIG``: how posenc reads a model's RoPE configuration, exact
  golden tables (``--golden``), and another engine's tables checked (``--compare``).

Errors in the input (posenc's ``ValueError``/``TypeError``, sizes beyond
posenc's limits) and files that cannot be written (``OSError``) print one line,
``posenc: error: ...``, and exit with status 2, like argparse's own errors.
Every file is written atomically: the previous file or the whole new one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import numpy as np

from posenc.core import checks
from posenc.faces.files import atomic_write
from posenc.families.absolute.sinusoidal import PRESETS, resolve, sinusoidal

_FORMATS = (".npy", ".pt", ".csv", ".json")
_DTYPES = ("float16", "bfloat16", "float32", "float64")


class _UsageError(ValueError):
    """A problem with the command line found after parsing (reported like posenc's errors)."""


# --------------------------------------------------------------------------------------
# argument types


def _int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}; got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}; got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite; got {text!r}")
    return value


def _override_value(text: str) -> Any:
    """``true``/``false`` -> bool, then int, then float, else the string itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _overrides(pairs: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise _UsageError(f"--override must look like key=value; got {pair!r}")
        if key in out:
            raise _UsageError(f"--override {key} given twice")
        out[key] = _override_value(value)
    return out


def _spec_args(args: argparse.Namespace) -> dict[str, Any]:
    overrides = _overrides(args.override)
    if getattr(args, "offset", None) is not None:
        if "offset" in overrides or "start_index" in overrides:
            raise _UsageError("give the position offset once: --offset or --override offset=")
        overrides["offset"] = args.offset
    return overrides


# --------------------------------------------------------------------------------------
# posenc table


def _table(args: argparse.Namespace) -> int:
    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in _FORMATS:
        raise _UsageError(
            f"--out must end in {', '.join(_FORMATS)} (the format is chosen by the suffix); "
            f"got {str(out)!r}"
        )
    if args.dtype == "bfloat16" and suffix != ".pt":
        raise _UsageError("--dtype bfloat16 needs --out ending in .pt (numpy has no bfloat16)")
    overrides = _spec_args(args)
    spec = resolve(args.preset, **overrides)
    # refused before computing: an absurd size or a file that cannot be written
    checks.check_channels(args.dim, "--dim")
    checks.check_elements(args.length * args.dim, f"--length {args.length} x --dim {args.dim}")
    if out.is_dir():
        raise _UsageError(f"cannot write {args.out!r}: it is a directory")
    if not out.parent.is_dir():
        raise _UsageError(f"cannot write {args.out!r}: no directory {str(out.parent)!r}")
    if suffix == ".pt":
        import torch

        table: Any = sinusoidal(
            args.length, args.dim, preset=spec, dtype=getattr(torch, args.dtype)
        )
    else:
        table = sinusoidal(args.length, args.dim, preset=spec, dtype=args.dtype)
    try:
        _write_table(out, table, args, overrides)
    except OSError as exc:
        raise _UsageError(f"cannot write {args.out!r}: {exc.strerror or exc}") from None
    first = spec.offset
    print(
        f"wrote {out}: {args.length} x {args.dim} {args.dtype}, preset {args.preset}, "
        f"positions {first:g}..{first + args.length - 1:g}"
        + (f", overrides {overrides}" if overrides else "")
    )
    return 0


def _write_table(
    out: Path, table: Any, args: argparse.Namespace, overrides: dict[str, Any]
) -> None:
    """Write ``table`` in the format of ``out``'s suffix, atomically (old file or whole new one)."""
    suffix = out.suffix.lower()
    if suffix == ".pt":
        import torch

        with atomic_write(out) as f:
            try:
                torch.save(table, f)
            except RuntimeError as exc:  # torch's zip writer hides a failed write (disk full)
                if isinstance(exc.__context__, OSError):
                    raise exc.__context__ from None
                raise
    elif suffix == ".npy":
        with atomic_write(out) as f:  # a file object: np.save would add a suffix to a name
            np.save(f, table)
    elif suffix == ".csv":
        with atomic_write(out) as f:
            _write_csv(f, table)
    else:
        with atomic_write(out, "w") as f:
            f.write(_json_document(table, args, overrides))


def _round_trip_format(dtype: np.dtype[Any]) -> str:
    # enough significant digits to read back the identical value
    return {2: "%.5g", 4: "%.9g"}.get(dtype.itemsize, "%.17g")


def _write_csv(f: IO[bytes], table: np.ndarray) -> None:
    header = ",".join(f"ch{j}" for j in range(table.shape[1]))
    np.savetxt(
        f,
        table,
        fmt=_round_trip_format(table.dtype),
        delimiter=",",
        header=header,
        comments="",
    )


def _json_document(table: np.ndarray, args: argparse.Namespace, overrides: dict[str, Any]) -> str:
    doc = {
        "preset": args.preset,
        "overrides": overrides,
        "dim": args.dim,
        "length": args.length,
        "dtype": args.dtype,
        "shape": list(table.shape),
        # float64 of each stored value: JSON's shortest repr reads back exactly
        "values": table.astype(np.float64).tolist(),
    }
    return json.dumps(doc) + "\n"


# --------------------------------------------------------------------------------------
# posenc check


def _check(args: argparse.Namespace) -> int:
    from posenc.integration import analysis

    verdicts = analysis.check(args.dim, args.length, preset=args.preset, **_spec_args(args))
    result = {True: "PASS", False: "FAIL", None: "SKIP"}
    rows = [(v.claim, v.measured, v.bound, result[v.passed]) for v in verdicts]
    title = f"posenc check: preset {args.preset}, dim {args.dim}, positions 0..{args.length - 1}"
    header = ("property", "measured", "bound", "result")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(4)]
        print(title)
        for r in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    else:
        table = Table(title=title, title_justify="left")
        for head in header:
            table.add_column(head)
        colour = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
        for r in rows:
            table.add_row(*r[:3], f"[{colour[r[3]]}]{r[3]}[/]")
        Console(file=sys.stdout, width=max(120, _width())).print(table)
    counts = {status: sum(r[3] == status for r in rows) for status in ("PASS", "FAIL", "SKIP")}
    print(", ".join(f"{n} {status}" for status, n in counts.items() if n))
    return 1 if counts["FAIL"] else 0


def _width() -> int:
    import shutil

    return shutil.get_terminal_size((0, 0)).columns


# --------------------------------------------------------------------------------------
# posenc bench / presets


def _bench(args: argparse.Namespace) -> int:
    from posenc import bench

    device = args.device
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise _UsageError(
                "--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is "
                "False); use --device cpu"
            )
    for name in args.case or ():
        devices = bench.CASES[name].devices
        if device not in devices:
            raise _UsageError(
                f"--case {name} runs on {' and '.join(devices)} only, not --device {device}"
            )
    timings = bench.run(
        args.case,
        device=device,
        quick=args.quick,
        repeat=args.repeat,
        budget_s=3.0 if args.quick else 10.0,
        progress=sys.stderr,
        strict=not args.keep_going,
    )
    print(bench.to_json(timings) if args.json else bench.format_table(timings))
    # with --keep-going, posenc's own failures are rows: the status still says so
    failed = [t for t in timings if t.status == "error" and t.role != "peer"]
    for t in failed:
        print(f"posenc bench: {t.case}: {t.impl} failed: {t.reason}", file=sys.stderr)
    return 1 if failed else 0


def _report(args: argparse.Namespace) -> int:
    from posenc.faces import report

    def say(message: str) -> None:
        print(f"posenc report: {message}", file=sys.stderr, flush=True)

    result = report.build(
        args.out,
        dim=args.dim,
        length=args.length,
        preset=args.preset,
        rope_config=args.rope_config,
        train_steps=args.train_steps,
        lab=args.lab,
        progress=say,
    )
    rows = [(s.title, k, v) for s in result.sections for k, v in s.numbers[:3]]
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="posenc report: a few of the measured numbers", title_justify="left")
        for head in ("section", "measured", "value"):
            table.add_column(head)
        last = None
        for title, k, v in rows:
            table.add_row(title if title != last else "", k, v)
            last = title
        Console(width=max(100, _width())).print(table)
    except ImportError:
        for title, k, v in rows:
            print(f"{title}: {k}: {v}")
    print(
        f"report: {result.index.resolve()} ({len(result.figures)} figures, {result.seconds:.1f} s)"
    )
    return 0


def _plot(args: argparse.Namespace) -> int:
    from posenc.faces import plot

    out = Path(args.o)
    if out.suffix not in (".png", ".svg"):
        raise _UsageError(f"-o must end in .png or .svg; got {args.o!r}")
    options = {"dim": args.dim, "length": args.length, "preset": args.preset}
    options = {k: v for k, v in options.items() if v is not None}
    fig = plot.figure(args.kind, **options)
    try:
        plot.save(fig, out)
    except OSError as exc:
        raise _UsageError(f"cannot write {args.o!r}: {exc.strerror}") from None
    print(out)
    return 0


def _lab_config(args: argparse.Namespace) -> Any:
    """The :class:`posenc.lab.LabConfig` of ``posenc lab run``'s or ``profile``'s options."""
    from posenc.faces.lab.training import config_from

    encodings = None
    if args.encodings is not None:
        encodings = tuple(e.strip() for e in args.encodings.split(",") if e.strip())
    return config_from(
        args.task, encodings=encodings, train_len=args.train_len, test_len=args.test_len,
        seeds=args.seeds, data=args.data, **_sizes(args),
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
    options = {**_sizes(args), "seeds": args.seeds, "train_len": args.train_len,
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
        **_sizes(args),
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


def _rope(args: argparse.Namespace) -> int:
    from posenc.faces import rope

    return rope.run(
        args.config,
        sets=args.set or (),
        as_json=args.json,
        golden=args.golden,
        positions=args.positions,
        compare_file=args.compare,
        layout=args.layout,
        layer_type=args.layer_type,
        engines=args.engines,
        engine_python=args.engine_python or (),
    )


def _info(args: argparse.Namespace) -> int:
    from posenc.faces import info

    print(info.report())
    return 0


def _presets(args: argparse.Namespace) -> int:
    for name, spec in PRESETS.items():
        fields = f"layout={spec.layout} order={spec.order} base={spec.base:g} shift={spec.shift:g}"
        print(f"{name}\n    {fields} odd={spec.odd}\n    {spec.anchor}")
    return 0


# --------------------------------------------------------------------------------------
# parser


def _add_spec_options(p: argparse.ArgumentParser, *, length: int, min_length: int) -> None:
    p.add_argument(
        "--preset",
        default="vaswani",
        choices=list(PRESETS),
        metavar="NAME",
        help="the convention (see 'posenc presets'); default: %(default)s",
    )
    p.add_argument(
        "--dim",
        type=_int_at_least(1),
        default=512,
        help="channels d of each row; default: %(default)s",
    )
    p.add_argument(
        "--length",
        type=_int_at_least(min_length),
        default=length,
        help="rows: positions 0 .. length-1 (plus the offset); default: %(default)s",
    )
    p.add_argument(
        "--override",
        action="append",
        metavar="KEY=VALUE",
        help="change one field of the preset, e.g. base=500 or order=cos_sin "
        "(fields: layout, order, base, min_timescale, shift, scale, amplitude, offset, "
        "odd; or their aliases max_period, theta, start_index; diffusers' "
        "flip_sin_to_cos and downscale_freq_shift with --preset ddpm or ldm); "
        "repeatable",
    )


class _Parser(argparse.ArgumentParser):
    """argparse, with errors on one line (``posenc report: error: ...``) and no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse's own drops an OSError; a closed stdout (--help | head -1) must reach
        # main, which ends as a Unix tool does (_stdout_closed)
        if message:
            (file or sys.stderr).write(message)


#: The model's and training's sizes that ``lab run``, ``lab profile`` and ``lab suite``
#: share: the config field each option sets, its type and its help.
_LAB_SIZES: dict[str, tuple[Any, str]] = {
    "steps": (_int_at_least(1), "training steps per model"),
    "batch_size": (_int_at_least(1), "global batch"),
    "d_model": (_int_at_least(2), "model width"),
    "layers": (_int_at_least(1), "transformer blocks"),
    "heads": (_int_at_least(1), "attention heads"),
    "eval_examples": (_int_at_least(1), "examples per length"),
    "lr": (_number, "peak learning rate"),
}


def _lab_sizes(
    parser: argparse.ArgumentParser, examples: str, default: Mapping[str, Any] | None = None
) -> None:
    """Add the ``_LAB_SIZES`` options; ``examples`` is ``--eval-examples``' help and
    ``default`` (name -> value) puts the defaults in the help."""
    for name, (kind, text) in _LAB_SIZES.items():
        text = examples if name == "eval_examples" else text
        if default is not None:
            text = f"{text}; default: {default[name]}"
        metavar = None if name == "lr" else "N"
        parser.add_argument(
            "--" + name.replace("_", "-"), type=kind, default=None, metavar=metavar, help=text
        )


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    """The ``_LAB_SIZES`` options given (None where not)."""
    return {name: getattr(args, name) for name in _LAB_SIZES}


def _study_options(parser: argparse.ArgumentParser, out: str) -> None:
    """Where a study of many lab runs trains and writes (``lab suite``, ``lab arithmetic``)."""
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default=None,
        help="where to train (default: cuda where a GPU exists, else cpu)",
    )  # fmt: skip
    parser.add_argument("--out", default=out, metavar="DIR", help="default: %(default)s")
    parser.add_argument(
        "--workers", type=_int_at_least(1), default=None, metavar="N",
        help="trainings at once on a CPU (default: one per usable CPU)",
    )  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _lab_options(parser: argparse.ArgumentParser) -> None:
    """The task, encodings and sizes that ``posenc lab run`` and ``posenc lab profile`` share."""
    from posenc.faces.lab.names import ENCODINGS, TASKS

    parser.add_argument("--task", choices=TASKS, default="copy", help="default: %(default)s")
    parser.add_argument(
        "--encodings", default=None, metavar="LIST",
        help=f"comma-separated, from: {', '.join(ENCODINGS)}; default: alibi,t5,rope,"
        "sinusoidal,learned (text: alibi,sinusoidal,rope)",
    )  # fmt: skip
    for flag, kind, text in (
        ("--train-len", _int_at_least(1), "trained lengths 1..N (text: window bytes)"),
        ("--test-len", _int_at_least(1), "evaluated lengths up to N"),
        ("--seeds", _int_at_least(1), "seeds per encoding"),
    ):
        parser.add_argument(flag, type=kind, default=None, metavar="N", help=text)
    _lab_sizes(parser, "examples (text: windows) per length")
    parser.add_argument(
        "--data", default=None, metavar="PATH",
        help="--task text on your own text: a file (the last tenth is the test split) or a "
        "directory read recursively (every 10th file is; hidden, empty and binary files "
        "are skipped); default: the standard library's .py files",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The ``posenc`` argument parser with its subcommands."""
    from posenc import __version__

    parser = _Parser(
        prog="posenc",
        description="Positional encodings: exact tables, their properties, and benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    table = sub.add_parser(
        "table",
        help="write a sinusoidal table to a file",
        description="Write a (length, dim) sinusoidal table; the format follows the suffix "
        "of --out: .npy (numpy), .pt (torch.save of a tensor), .csv (a header row "
        "ch0..ch{d-1}, values with enough digits to read back exactly), .json (values "
        "with the parameters).",
    )
    _add_spec_options(table, length=50, min_length=0)
    table.add_argument(
        "--offset",
        type=_number,
        default=None,
        help="added to every position (tensor2tensor's start_index), so rows are "
        "positions offset .. offset+length-1; default: the preset's (0)",
    )
    table.add_argument(
        "--dtype",
        choices=_DTYPES,
        default="float32",
        help="stored dtype; bfloat16 only for .pt; default: %(default)s",
    )
    table.add_argument(
        "--out", required=True, metavar="FILE", help="output file: .npy, .pt, .csv or .json"
    )
    table.set_defaults(run=_table)

    check = sub.add_parser(
        "check",
        help="verify the shift, norm, dot-product, regression and precision properties",
        description="Measure the properties of the encoding and print each against a bound "
        "derived from float64 rounding: the shift matrix reproduces PE(p+k) from PE(p); "
        "every row has norm sqrt(d/2) (amplitude times sqrt(pairs)); PE(p).PE(p+k) depends "
        "on k only; one column is not a linear function of itself shifted but its "
        "(sin, cos) pair is; posenc's float32 values stay within half an ulp at "
        "positions 1e4, 1e6, 1e7 where the usual float32 formula errs by up to 0.7. "
        "Exit status 1 if any line fails.",
    )
    _add_spec_options(check, length=50, min_length=1)
    check.set_defaults(run=_check, offset=None)

    bench = sub.add_parser(
        "bench",
        help="time posenc against the code users run (one process, interleaved)",
        description="Time every implementation of each case interleaved in this process "
        "(warm-up, then round-robin runs) and report the median and minimum, and the "
        "ratio to the case's baseline (allocating and filling an array of the output's "
        "size). Peers that are not installed are listed as skipped. Progress goes to "
        "stderr. With --device cuda, inputs live on the GPU and every timed call ends "
        "with torch.cuda.synchronize(); cases that do not run there are left out.",
    )
    from posenc.faces.bench import CASES

    bench.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes and fewer runs (seconds rather than a minute)",
    )
    bench.add_argument(
        "--json",
        action="store_true",
        help="print machine-readable JSON (case, impl, median_s, min_s, ratio ...) instead "
        "of a table",
    )
    bench.add_argument(
        "--case",
        action="append",
        choices=list(CASES),
        metavar="NAME",
        help=f"run only this case (repeatable; cases: {', '.join(CASES)}); default: all",
    )
    bench.add_argument(
        "--repeat",
        type=_int_at_least(1),
        default=None,
        metavar="N",
        help="timed runs per implementation; default: 15, or 5 with --quick",
    )
    bench.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the tensors live and the work runs; cuda needs a CUDA device "
        "(default: %(default)s)",
    )
    bench.add_argument(
        "--keep-going",
        action="store_true",
        help="report a failing posenc row or baseline as an error row and go on, as for a "
        "failing peer (exit status 1 if any did)",
    )
    bench.set_defaults(run=_bench)

    presets = sub.add_parser(
        "presets",
        help="list the named conventions and their sources",
        description="List every preset with its parameters and the code or paper it reproduces.",
    )
    presets.set_defaults(run=_presets)

    info = sub.add_parser(
        "info",
        help="versions, the backend of each loop, and the engines found",
        description="Print posenc's, Python's, numpy's, torch's, triton's and transformers' "
        "versions; which backend serves each loop (the compiled C kernels, numpy or torch, "
        "Triton on CUDA) and, where the compiled kernels are missing, why; and the engines "
        "`posenc rope --engines` runs, with where each was found or looked for.",
    )
    info.set_defaults(run=_info)

    rep = sub.add_parser(
        "report",
        help="write the explainer: one interactive HTML page that works offline",
        description="Explain positional encodings with figures, formulas, code and numbers "
        "measured now: why positions at all, the sinusoidal table and its clock hands (with "
        "a position slider and d and base controls), why exp and log, the shift rotation, "
        "adding versus concatenating, the norm sqrt(d/2), precision, learned versus "
        "sinusoidal beyond the trained length, RoPE (an explorer of q and k), context "
        "extension schedules (an explorer), ALiBi and T5, 2-D grids. Writes DIR/index.html "
        "(one file, no network needed) and every figure as PNG and SVG in DIR/figures/.",
    )
    rep.add_argument(
        "--out",
        default="posenc-report",
        metavar="DIR",
        help="output directory; default: %(default)s",
    )
    rep.add_argument(
        "--dim",
        type=_int_at_least(4),
        default=512,
        help="channels (even, at most 1024); default: %(default)s",
    )
    rep.add_argument(
        "--length",
        type=_int_at_least(3),
        default=50,
        help="positions: the table's rows and the slider's range (at most 128); "
        "default: %(default)s",
    )
    rep.add_argument(
        "--preset",
        default="vaswani",
        choices=sorted(PRESETS),
        metavar="NAME",
        help="sinusoidal preset (see `posenc presets`); default: %(default)s",
    )
    rep.add_argument(
        "--rope-config",
        default=None,
        metavar="FILE",
        help="a model's config.json: its RoPE schedule first in the context-extension explorer",
    )
    rep.add_argument(
        "--train-steps",
        type=_int_at_least(1),
        default=300,
        metavar="N",
        help="steps of the learned-table training run; default: %(default)s, whose run is "
        "bundled with posenc and read back (another N trains a table now, a few seconds)",
    )
    rep.add_argument("--lab", default=None, metavar="DIR",
                     help="show the results of `posenc lab run --out DIR` instead of the "
                     "bundled copy and text runs")  # fmt: skip
    rep.set_defaults(run=_report)

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
    _lab_options(lab_run)
    lab_run.add_argument("--out", default="posenc-lab", metavar="DIR", help="default: %(default)s")
    lab_run.add_argument("--no-progress", action="store_true", help="no progress bars")
    lab_run.add_argument(
        "--workers",
        type=_int_at_least(1),
        default=None,
        metavar="N",
        help="trainings at once, each in its own process (default: one per usable CPU; "
        "1 under torchrun or on a GPU)",
    )
    lab_run.add_argument(
        "--context-parallel",
        type=_int_at_least(1),
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
    _lab_options(lab_profile)
    lab_profile.add_argument("--sample", type=_int_at_least(1), default=100, metavar="N",
                             help="steps timed per encoding (twice: by phase, then under "
                             "the profiler); default: %(default)s")  # fmt: skip
    lab_profile.add_argument("--threads", type=_int_at_least(1), default=1, metavar="N",
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
    lab_suite.add_argument("--seeds", type=_int_at_least(1), default=None, metavar="N",
                           help="seeds per encoding (default: 3, --quick 2)")  # fmt: skip
    defaults = {f.name: f.default for f in dataclasses.fields(suite.SuiteConfig)}
    _lab_sizes(lab_suite, "examples per length", default=defaults)
    _study_options(lab_suite, "posenc-suite")
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
    lab_arith.add_argument("--seeds", type=_int_at_least(1), default=None, metavar="N",
                           help="seeds per line (default: 3, --quick 1)")  # fmt: skip
    lab_arith.add_argument("--train-len", type=_int_at_least(1), default=None, metavar="N",
                           help="digits of the longest training number; default: 10")  # fmt: skip
    lab_arith.add_argument("--test-len", type=_int_at_least(2), default=None, metavar="N",
                           help="digits of the longest test number; default: 40")  # fmt: skip
    arith_defaults = {f.name: f.default for f in dataclasses.fields(arithmetic.ArithmeticConfig)}
    _lab_sizes(lab_arith, "examples per length", default=arith_defaults)
    _study_options(lab_arith, "posenc-arithmetic")
    lab_arith.set_defaults(run=_lab_arithmetic)

    from posenc.faces.plot import KINDS

    pl = sub.add_parser(
        "plot",
        help="render one figure of the report to PNG or SVG",
        description=f"Render one figure. Kinds: {', '.join(KINDS)}.",
    )
    pl.add_argument("kind", choices=list(KINDS), metavar="KIND", help=f"one of: {', '.join(KINDS)}")
    pl.add_argument("-o", required=True, metavar="FILE", help="output file, .png or .svg")
    pl.add_argument("--dim", type=_int_at_least(4), default=None, help="channels")
    pl.add_argument("--length", type=_int_at_least(3), default=None, help="positions")
    pl.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        metavar="NAME",
        help="sinusoidal preset (see `posenc presets`)",
    )
    pl.set_defaults(run=_plot)

    rp = sub.add_parser(
        "rope",
        help="how posenc reads a model's RoPE config; golden tables; compare another engine's",
        description="Print how posenc reads a model's RoPE configuration, per layer type: "
        "rope type, base, head and rotary dims, layout, every scaling parameter with the "
        "config key it came from, the attention scaling (and the softmax scale factor a "
        "config sets), the wavelengths against the trained window, NoPE layers and M-RoPE "
        "sections. A config transformers refuses (a key it requires left out) is refused "
        "with its reason. --golden writes posenc's exact "
        "float64 tables (inv_freq, cos, sin in the half and interleaved layouts) to check "
        "another engine against; --compare checks another engine's tables and names the "
        "likely misreading. Exit status 1 when --compare finds a divergence or an engine of "
        "--engines differs, refuses or gives no answer; 2 for a config refused.",
    )
    rp.add_argument(
        "config",
        metavar="CONFIG",
        help="a config.json, a directory holding one, or a transformers config class name "
        "(LlamaConfig, Gemma3TextConfig, Qwen2VLConfig ...: its defaults)",
    )
    rp.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="change one value before reading: VALUE is JSON when it parses, else a string; "
        "dotted keys set nested values (rope_parameters.factor=8, text_config.rope_theta=1e6); "
        "repeatable",
    )
    rp.add_argument("--json", action="store_true", help="print the reading as JSON")
    rp.add_argument(
        "--golden",
        default=None,
        metavar="FILE.npz",
        help="write posenc's exact tables: inv_freq, positions, cos, sin (half layout, times "
        "the attention scaling), cos_interleaved, sin_interleaved; per layer type prefixed "
        "<layer_type>/",
    )
    rp.add_argument(
        "--positions",
        default=None,
        metavar="SPEC",
        help="positions of --golden: start:stop, start:stop:step or a comma list "
        "(0:4096, 0:131072:1024, 0,1,100000)",
    )
    rp.add_argument(
        "--compare",
        default=None,
        metavar="FILE.npz",
        help="another engine's tables: inv_freq, and/or cos and sin (with positions, default "
        "0..n-1); exit 1 if they diverge, with the likely cause",
    )
    rp.add_argument(
        "--layout",
        default=None,
        choices=("half", "interleaved"),
        help="layout of the --compare file's cos and sin; default: detected",
    )
    rp.add_argument(
        "--layer-type",
        default=None,
        metavar="NAME",
        help="the layer type unprefixed --compare arrays belong to; default: each is tried",
    )
    from posenc.integration.analysis.engines import ENGINES

    rp.add_argument(
        "--engines",
        default=None,
        metavar="NAMES",
        help="run these engines' own RoPE code on the config, each in its own Python, and "
        f"compare with transformers' reading: a comma list of {', '.join(ENGINES)}, or all; "
        "exit 1 if one differs, refuses or gives no answer (not installed included)",
    )
    rp.add_argument(
        "--engine-python",
        action="append",
        metavar="NAME=PATH",
        help="the Python of engine NAME (default: $POSENC_ENGINES/NAME/bin/python, else "
        ".engines/NAME/bin/python in the repository, built by `make engines`); repeatable",
    )
    rp.set_defaults(run=_rope)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``posenc`` command and return its exit status.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` if None).

    Returns:
        0 on success, 1 when ``posenc check`` finds a failing property, 2 for
        invalid input or a file that cannot be written (the message is printed
        on one line as ``posenc: error: ...``), 141 when the reader of stdout
        closed it (``posenc presets | head -1``: see :func:`_stdout_closed`).
    """
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, in the handler, not at the exit
    except BrokenPipeError:
        return _stdout_closed()
    return status


def _stdout_closed() -> int:
    """End quietly after the reader of stdout closed it; the exit status, 141.

    A Unix tool writing into a pipe whose reader has gone (``seq 1 1000000 | head -1``)
    is killed by SIGPIPE, prints nothing, and the shell reports 128 + 13 = 141. posenc
    ends the same way: nothing on stderr and status 141, so that a pipeline run with
    ``set -o pipefail`` still sees that the output was cut (0 would claim it was all
    read). Python ignores SIGPIPE and raises ``BrokenPipeError`` instead; stdout is
    pointed at ``/dev/null`` so that the interpreter's last flush at the exit does not
    raise again (Python's documented recipe, ``signal`` module, "Note on SIGPIPE").
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no file (captured): nothing to do
        pass
    return 128 + 13  # 128 + SIGPIPE, as the shell reports a tool the signal ended


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main` without the closed-pipe handling (a ``BrokenPipeError`` goes through)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and argparse's own errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # stdout's reader went away: main ends quietly
        raise
    except (ValueError, TypeError) as exc:
        print(f"posenc: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system: a missing directory, a full disk, no permission
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"posenc: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:
        why = str(exc) or "try a smaller size"
        print(f"posenc: error: out of memory ({why})", file=sys.stderr)
        return 2
    except ImportError as exc:  # an extra not installed: the error names it
        from posenc.core import extras

        print(f"posenc: error: {extras.missing(f'posenc {args.command}', exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
