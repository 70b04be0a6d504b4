"""``posenc table``: write a sinusoidal table to .npy, .pt, .csv or .json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import IO, Any

import numpy as np

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.faces.commands.options import (
    DTYPES,
    FORMATS,
    UsageError,
    add_spec_options,
    number,
    spec_args,
)
from posenc.families.absolute.sinusoidal import resolve, sinusoidal


def _table(args: argparse.Namespace) -> int:
    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(
            f"--out must end in {', '.join(FORMATS)} (the format is chosen by the suffix); "
            f"got {str(out)!r}"
        )
    if args.dtype == "bfloat16" and suffix != ".pt":
        raise UsageError("--dtype bfloat16 needs --out ending in .pt (numpy has no bfloat16)")
    overrides = spec_args(args)
    spec = resolve(args.preset, **overrides)
    # refused before computing: an absurd size or a file that cannot be written
    checks.check_channels(args.dim, "--dim")
    checks.check_elements(args.length * args.dim, f"--length {args.length} x --dim {args.dim}")
    if out.is_dir():
        raise UsageError(f"cannot write {args.out!r}: it is a directory")
    if not out.parent.is_dir():
        raise UsageError(f"cannot write {args.out!r}: no directory {str(out.parent)!r}")
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
        raise UsageError(f"cannot write {args.out!r}: {exc.strerror or exc}") from None
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


def add(sub: Any) -> None:
    """Add ``posenc table`` to the command's subparsers."""
    table = sub.add_parser(
        "table",
        help="write a sinusoidal table to a file",
        description="Write a (length, dim) sinusoidal table; the format follows the suffix "
        "of --out: .npy (numpy), .pt (torch.save of a tensor), .csv (a header row "
        "ch0..ch{d-1}, values with enough digits to read back exactly), .json (values "
        "with the parameters).",
    )
    add_spec_options(table, length=50, min_length=0)
    table.add_argument(
        "--offset",
        type=number,
        default=None,
        help="added to every position (tensor2tensor's start_index), so rows are "
        "positions offset .. offset+length-1; default: the preset's (0)",
    )
    table.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="stored dtype; bfloat16 only for .pt; default: %(default)s",
    )
    table.add_argument(
        "--out", required=True, metavar="FILE", help="output file: .npy, .pt, .csv or .json"
    )
    table.set_defaults(run=_table)
