#!/usr/bin/env bash
# Build SGLang's environment at $1 for `posenc rope --engines sglang`: SGLang 0.5 on the
# CPU torch, every package pinned in sglang.txt and installed without its
# dependencies (SGLang's own requirements pull CUDA builds). The reader sets
# SGLANG_USE_CPU_ENGINE=1 before importing SGLang.
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q --no-deps -r "$here/sglang.txt"
SGLANG_USE_CPU_ENGINE=1 "$dest/bin/python" -c "import sglang.srt.layers.rotary_embedding" 2> /dev/null
