"""What the commands share: option types, the spec options, the lab's sizes, the usage error."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import Any

from posenc.families.absolute.sinusoidal import PRESETS

FORMATS = (".npy", ".pt", ".csv", ".json")


DTYPES = ("float16", "bfloat16", "float32", "float64")


class UsageError(ValueError):
    """A problem with the command line found after parsing (reported like posenc's errors)."""


def int_at_least(minimum: int) -> Any:
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


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite; got {text!r}")
    return value


def override_value(text: str) -> Any:
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


def parse_overrides(pairs: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--override must look like key=value; got {pair!r}")
        if key in out:
            raise UsageError(f"--override {key} given twice")
        out[key] = override_value(value)
    return out


def spec_args(args: argparse.Namespace) -> dict[str, Any]:
    overrides = parse_overrides(args.override)
    if getattr(args, "offset", None) is not None:
        if "offset" in overrides or "start_index" in overrides:
            raise UsageError("give the position offset once: --offset or --override offset=")
        overrides["offset"] = args.offset
    return overrides


def width() -> int:
    import shutil

    return shutil.get_terminal_size((0, 0)).columns


def add_spec_options(p: argparse.ArgumentParser, *, length: int, min_length: int) -> None:
    p.add_argument(
        "--preset",
        default="vaswani",
        choices=list(PRESETS),
        metavar="NAME",
        help="the convention (see 'posenc presets'); default: %(default)s",
    )
    p.add_argument(
        "--dim",
        type=int_at_least(1),
        default=512,
        help="channels d of each row; default: %(default)s",
    )
    p.add_argument(
        "--length",
        type=int_at_least(min_length),
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


#: The model's and training's sizes that ``lab run``, ``lab profile`` and ``lab suite``
#: share: the config field each option sets, its type and its help.
LAB_SIZES: dict[str, tuple[Any, str]] = {
    "steps": (int_at_least(1), "training steps per model"),
    "batch_size": (int_at_least(1), "global batch"),
    "d_model": (int_at_least(2), "model width"),
    "layers": (int_at_least(1), "transformer blocks"),
    "heads": (int_at_least(1), "attention heads"),
    "eval_examples": (int_at_least(1), "examples per length"),
    "lr": (number, "peak learning rate"),
}


def lab_sizes(
    parser: argparse.ArgumentParser, examples: str, default: Mapping[str, Any] | None = None
) -> None:
    """Add the ``LAB_SIZES`` options; ``examples`` is ``--eval-examples``' help and
    ``default`` (name -> value) puts the defaults in the help."""
    for name, (kind, text) in LAB_SIZES.items():
        text = examples if name == "eval_examples" else text
        if default is not None:
            text = f"{text}; default: {default[name]}"
        metavar = None if name == "lr" else "N"
        parser.add_argument(
            "--" + name.replace("_", "-"), type=kind, default=None, metavar=metavar, help=text
        )


def sizes(args: argparse.Namespace) -> dict[str, Any]:
    """The ``LAB_SIZES`` options given (None where not)."""
    return {name: getattr(args, name) for name in LAB_SIZES}


def study_options(parser: argparse.ArgumentParser, out: str, *, device: bool = True) -> None:
    """Where a study of many lab runs trains and writes (``lab suite``, ``lab arithmetic``,
    ``lab extend``; ``device=False`` for a study that runs on the CPU only)."""
    if device:
        parser.add_argument(
            "--device", choices=("cpu", "cuda"), default=None,
            help="where to train (default: cuda where a GPU exists, else cpu)",
        )  # fmt: skip
    parser.add_argument("--out", default=out, metavar="DIR", help="default: %(default)s")
    parser.add_argument(
        "--workers", type=int_at_least(1), default=None, metavar="N",
        help="trainings at once on a CPU (default: one per usable CPU)",
    )  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def lab_options(parser: argparse.ArgumentParser) -> None:
    """The task, encodings and sizes that ``posenc lab run`` and ``posenc lab profile`` share."""
    from posenc.faces.lab.names import ENCODINGS, TASKS

    parser.add_argument("--task", choices=TASKS, default="copy", help="default: %(default)s")
    parser.add_argument(
        "--encodings", default=None, metavar="LIST",
        help=f"comma-separated, from: {', '.join(ENCODINGS)}; default: alibi,t5,rope,"
        "sinusoidal,learned (text: alibi,sinusoidal,rope)",
    )  # fmt: skip
    for flag, kind, text in (
        ("--train-len", int_at_least(1), "trained lengths 1..N (text: window bytes)"),
        ("--test-len", int_at_least(1), "evaluated lengths up to N"),
        ("--seeds", int_at_least(1), "seeds per encoding"),
    ):
        parser.add_argument(flag, type=kind, default=None, metavar="N", help=text)
    lab_sizes(parser, "examples (text: windows) per length")
    parser.add_argument(
        "--data", default=None, metavar="PATH",
        help="--task text on your own text: a file (the last tenth is the test split) or a "
        "directory read recursively (every 10th file is; hidden, empty and binary files "
        "are skipped); default: the standard library's .py files",
    )  # fmt: skip
