"""The optional compiled kernel; everything else is declared in pyproject.toml.

``posenc._kernels`` fuses the table loop of ``posenc._angles``. It is optional:
where no C compiler is found, the build goes on without it and posenc uses the
same arithmetic in numpy.
"""

import sys

from setuptools import Extension, setup

unix = sys.platform != "win32"
setup(
    ext_modules=[
        Extension(
            "posenc._kernels",
            ["src/posenc/_kernels.c"],
            # no fused multiply-add: the kernel rounds exactly as numpy does
            extra_compile_args=["-O3", "-ffp-contract=off", "-pthread"] if unix else [],
            extra_link_args=["-pthread"] if unix else [],
            optional=True,
        )
    ]
)
