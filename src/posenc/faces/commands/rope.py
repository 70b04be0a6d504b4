"""``posenc rope``: how posenc reads a RoPE config; golden tables; another engine checked."""

from __future__ import annotations

import argparse
from typing import Any


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


def add(sub: Any) -> None:
    """Add ``posenc rope`` to the command's subparsers."""
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
        help="the Python of engine NAME (default: its environment in the user cache, built by "
        "`posenc engines build NAME`); repeatable",
    )
    rp.set_defaults(run=_rope)
