#!/usr/bin/env bash
# Build KerasHub's environment at $1 for `posenc rope --engines keras-hub`: keras-hub on
# Keras 3 with JAX's CPU build as the backend (the reader sets KERAS_BACKEND=jax).
# keras-hub is installed without its dependencies: they pull tensorflow-text (hence
# tensorflow) and kagglehub, which only its tokenizers, preprocessors and preset downloads
# use, all imported inside try/except. What `import keras_hub` and its HF converters
# (keras_hub/src/utils/transformers/) import is installed instead: absl-py, numpy,
# packaging, regex, rich, safetensors, sentencepiece, and tokenizers (without its
# huggingface_hub, which only its from_pretrained reads). Pins: keras-hub.txt.
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q -c "$here/keras-hub.txt" keras jax jaxlib absl-py numpy \
    packaging regex rich safetensors sentencepiece
"$dest/bin/python" -m pip install -q --no-deps -c "$here/keras-hub.txt" keras-hub tokenizers
KERAS_BACKEND=jax "$dest/bin/python" -c "import keras_hub"
