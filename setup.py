"""The optional compiled kernel; everything else is declared in pyproject.toml.

``posenc.core._kernels`` fuses the sinusoidal table loop of ``posenc.core.angles``,
the float32 and bfloat16 rotation of ``posenc.families.rotary.apply`` and the
float32 attention loops of ``posenc.integration.attention`` (softmax with its score
terms, CoPE's, DAPE's, stick-breaking's and PaTH's chunk core). It is optional:
where no C compiler is found, the build goes on without it and posenc does the same
work in numpy and torch.

Its C sources are in ``src/posenc/core/csrc``: one file per kernel (``table.c``,
``rotate.c``, ``attend.c``, ``counted.c``, ``mixed.c``, ``breaking.c``, ``path.c``),
``tiles.h`` for the AVX-512 pieces the attention loops share, ``team.c`` for the
threads they share, ``module.c`` for the module itself, and ``common.h``.
"""

import sys

from setuptools import Extension, setup

unix = sys.platform != "win32"
setup(
    ext_modules=[
        Extension(
            "posenc.core._kernels",
            [
                f"src/posenc/core/csrc/{name}.c"
                for name in (
                    "module",
                    "team",
                    "table",
                    "rotate",
                    "attend",
                    "counted",
                    "mixed",
                    "breaking",
                    "path",
                )
            ],
            depends=[
                "src/posenc/core/csrc/common.h",
                "src/posenc/core/csrc/tiles.h",
            ],  # rebuilt when it changes, and in the sdist
            # no fused multiply-add: each product and sum is rounded, so float32 tables
            # match the numpy path bit for bit
            extra_compile_args=["-O3", "-ffp-contract=off", "-pthread"] if unix else [],
            extra_link_args=["-pthread", "-ldl", "-lm"] if unix else [],
            optional=True,
        )
    ]
)
