#!/usr/bin/env bash
# Build CTranslate2's environment at $1 for `posenc rope --engines ctranslate2`: the CPU torch
# first (torch==2.13.0; any other version pulls a CUDA build), then ctranslate2 (its CPU wheel
# from PyPI) and what its Transformers converter imports (transformers, sentencepiece,
# safetensors), every package constrained by ctranslate2.txt.
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q "$(grep '^torch==' "$here/ctranslate2.txt")"
"$dest/bin/python" -m pip install -q -c "$here/ctranslate2.txt" \
    ctranslate2 transformers sentencepiece safetensors numpy
"$dest/bin/python" -c "import ctranslate2.converters.transformers, transformers, torch"
