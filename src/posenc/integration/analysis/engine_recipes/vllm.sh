#!/usr/bin/env bash
# Build vLLM's environment at $1 for `posenc rope --engines vllm`: the CPU torch first
# (torch==2.13.0; any other version pulls a CUDA build), then vllm and every other pin of
# vllm.txt with --no-deps (vllm's own requirements pull CUDA torch and kernels).
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q "$(grep '^torch==' "$here/vllm.txt")"
grep -v -e '^#' -e '^torch==' -e '^$' "$here/vllm.txt" >"$dest/pins.txt"
"$dest/bin/python" -m pip install -q --no-deps -r "$dest/pins.txt"
