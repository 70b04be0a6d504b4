#!/usr/bin/env bash
# Build ONNX Runtime GenAI's environment at $1 for `posenc rope --engines onnxruntime-genai`:
# the CPU torch first (torch==2.13.0; any other version pulls a CUDA build), then
# onnxruntime-genai (CPU), onnxruntime, onnx, and what its model builder
# (onnxruntime_genai/models/builder.py) imports to build from a local HF checkpoint:
# onnx-ir, transformers, sentencepiece, safetensors, numpy. Pins: onnxruntime-genai.txt.
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q "$(grep '^torch==' "$here/onnxruntime-genai.txt")"
"$dest/bin/python" -m pip install -q -c "$here/onnxruntime-genai.txt" onnxruntime-genai \
    onnxruntime onnx onnx-ir transformers sentencepiece safetensors numpy
