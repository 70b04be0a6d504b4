#!/usr/bin/env bash
# Build MLX's environment at $1 for `posenc rope --engines mlx`: mlx[cpu] (the CPU build,
# also on Linux), and mlx-lm without its dependencies (they pull transformers; the reader
# loads only mlx_lm.models by path). Pins: mlx.txt.
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q -c "$here/mlx.txt" "mlx[cpu]"
"$dest/bin/python" -m pip install -q --no-deps -c "$here/mlx.txt" mlx-lm
