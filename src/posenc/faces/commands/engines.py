"""``posenc engines``: the engines ``posenc rope --engines`` runs, built in the user cache."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _list(args: argparse.Namespace) -> int:
    from posenc.integration.analysis import engine_cache
    from posenc.integration.analysis.engines import ENGINES

    root = engine_cache.cache_root()
    print(f"cache: {root}")
    width = max(map(len, ENGINES))
    for engine in ENGINES.values():
        done = engine_cache.record(engine)
        path = engine_cache.directory(engine)
        state = "built" if done else "not built"
        print(f"  {engine.name:<{width}}  {state:<9}  {path}")
    old = engine_cache.stale(list(ENGINES.values()))
    if old:
        print(f"{len(old)} older builds, logs or locks (`posenc engines clean` removes them)")
    return 0


def _build(args: argparse.Namespace) -> int:
    from posenc.integration.analysis import engine_cache
    from posenc.integration.analysis.engines import ENGINES, parse_engines

    names = parse_engines(args.names, option="NAMES")
    print(f"cache: {engine_cache.cache_root()}", flush=True)

    def one(name: str) -> tuple[str, str | None]:
        try:
            built = engine_cache.build(ENGINES[name], force=args.force)
        except engine_cache.BuildError as exc:
            return name, str(exc)
        how = f"built in {built.seconds:.0f} s" if built.built_now else "already built"
        print(f"  {name}: {how}, {_size(built.size)}: {built.path}", flush=True)
        return name, None

    # side by side: mostly downloads and pip, and llama.cpp's one C++ build
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        failed = [err for _, err in pool.map(one, names) if err]
    for err in failed:
        print(f"posenc engines build: {err}", file=sys.stderr)
    return 1 if failed else 0


def _logits(args: argparse.Namespace) -> int:
    import json

    from posenc.integration.analysis import engine_logits
    from posenc.integration.analysis.engines import ENGINES, parse_engines

    names = parse_engines(args.names, option="NAMES")
    without = [n for n in names if not ENGINES[n].logits]
    if without and args.names.strip() != "all":
        raise ValueError(f"NAMES: {', '.join(without)} cannot load a checkpoint here "
                         f"(the engines that can: "
                         f"{', '.join(n for n, e in ENGINES.items() if e.logits)})")  # fmt: skip
    cases = None
    if args.cases:
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    results = []
    for name in (n for n in names if ENGINES[n].logits):
        results.extend(engine_logits.run_logits(name, cases))
    if args.json:
        print(json.dumps([r.as_json() for r in results], indent=1))
    else:
        print("\n".join(engine_logits.table(results)))
    bad = {"error", "not installed"}
    return 1 if any(r.verdict in bad for r in results) else 0


def _clean(args: argparse.Namespace) -> int:
    from posenc.integration.analysis import engine_cache
    from posenc.integration.analysis.engines import ENGINES

    keep = [] if args.all else list(ENGINES.values())
    paths = engine_cache.stale(keep)
    freed = engine_cache.remove(paths)
    for path in paths:
        print(f"  removed {path}")
    print(f"freed {_size(freed)} in {engine_cache.cache_root()}")
    return 0


def add(sub: Any) -> None:
    """Add ``posenc engines`` (list, build, clean) to the command's subparsers."""
    from posenc.integration.analysis.engines import ENGINES

    where = ("the user cache: $POSENC_ENGINES if set, else $XDG_CACHE_HOME/posenc/engines "
             "(~/.cache/posenc/engines)")  # fmt: skip
    engines = sub.add_parser(
        "engines",
        help="list, build or clean the engines `posenc rope --engines` runs",
        description="The engines `posenc rope --engines` runs (vLLM, SGLang, MLX, llama.cpp, "
        "lmdeploy, KerasHub, EasyDeL, MaxText, ONNX Runtime GenAI, CTranslate2, all on the "
        "CPU), each in a virtual environment of its own, built from the recipe and "
        f"pins that ship with posenc into {where}; one directory per engine and pins, so a "
        "change of pins builds anew and an unchanged one is reused by every checkout and "
        "install. Without a subcommand: list them.",
    )
    engines.set_defaults(run=_list)
    engines_sub = engines.add_subparsers(dest="engines_command", metavar="COMMAND")
    listing = engines_sub.add_parser(
        "list",
        help="each engine, whether it is built, and where (the default)",
        description="Each engine, whether its current pins are built, and where; and how "
        "many older builds the cache holds.",
    )
    listing.set_defaults(run=_list)
    build = engines_sub.add_parser(
        "build",
        help="build engines in the user cache",
        description="Build each named engine's environment in the user cache, side by side, "
        "unless its current pins are built already (downloads from PyPI; llama.cpp also "
        "compiles ggml, which needs cmake and a C++ compiler). Each build's output goes to "
        "NAME-KEY.log beside it. Exit 1 if a build fails (the log's last lines are printed).",
    )
    build.add_argument(
        "names",
        metavar="NAMES",
        help=f"a comma list of {', '.join(ENGINES)}, or all",
    )
    build.add_argument(
        "--force", action="store_true", help="build again even where the cache holds the pins"
    )
    build.set_defaults(run=_build)
    from posenc.integration.analysis.engine_logits import LOGIT_CASES

    logits = engines_sub.add_parser(
        "logits",
        help="end to end: each engine's next-token logits on tiny models against transformers'",
        description="For each tiny random-weight model (one per rope type, an original "
        "context of 64 tokens), save it as transformers saves a checkpoint, convert it with "
        "the engine's own converter (llama.cpp's convert_hf_to_gguf.py, CTranslate2's "
        "TransformersConverter, ONNX Runtime GenAI's model builder; MLX reads it), run one "
        "prompt of 192 tokens and compare the logits at rows before and past the original "
        "context with transformers' in float64. 'same' is within float32's rounding "
        "through the model (a bound from the matrix products' lengths). Exit 1 when an "
        "engine is missing or its reader fails.",
    )
    logits.add_argument(
        "names",
        metavar="NAMES",
        help="a comma list of the engines that load checkpoints "
        f"({', '.join(n for n, e in ENGINES.items() if e.logits)}), or all",
    )
    logits.add_argument(
        "--cases", default=None, help=f"a comma list of {', '.join(LOGIT_CASES)} (default: all)"
    )
    logits.add_argument("--json", action="store_true", help="print the results as JSON")
    logits.set_defaults(run=_logits)
    clean = engines_sub.add_parser(
        "clean",
        help="remove older builds from the user cache",
        description="Remove the builds whose pins are no longer posenc's (and their logs), "
        "or with --all every build.",
    )
    clean.add_argument("--all", action="store_true", help="remove the current builds too")
    clean.set_defaults(run=_clean)
