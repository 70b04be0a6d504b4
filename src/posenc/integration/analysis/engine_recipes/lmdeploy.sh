#!/usr/bin/env bash
# Build LMDeploy's environment at $1 for `posenc rope --engines lmdeploy`: the CPU torch
# first (torch==2.13.0; any other version pulls a CUDA build), then lmdeploy and every other
# pin of lmdeploy.txt with --no-deps. lmdeploy 0.18.0 declares torch<=2.12.1, triton and the
# CUDA libraries: it runs here outside its declared torch range, on a machine without CUDA,
# and the reader uses only its PyTorch engine's config reading and rotary modules (the
# default backend's, which its CUDA backend also builds), never its kernels.
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q "$(grep '^torch==' "$here/lmdeploy.txt")"
grep -v -e '^#' -e '^torch==' -e '^$' "$here/lmdeploy.txt" >"$dest/pins.txt"
"$dest/bin/python" -m pip install -q --no-deps -r "$dest/pins.txt"
