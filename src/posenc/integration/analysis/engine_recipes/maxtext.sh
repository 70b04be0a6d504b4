#!/usr/bin/env bash
# Build MaxText's environment at $1 for `posenc rope --engines maxtext`. Pins: maxtext.txt.
#
# maxtext 0.2.5 (a py3-none-any wheel) declares Requires-Python >=3.12 and puts every
# dependency in extras (tpu, cuda12: GCP clients, tensorflow, ...). posenc's Python is
# 3.11, so the wheel is installed with --no-deps --ignore-requires-python, beside exactly
# the packages that the modules the reader imports need on CPU: maxtext.layers.embeddings
# and .attentions / .attention_mla (jax, jaxlib, flax, aqtp, qwix, tokamax), their utils
# (orbax-checkpoint, etils, psutil, pathwaysutils, huggingface_hub) and
# maxtext.configs.pyconfig (omegaconf, pydantic, jinja2, pyyaml). jax 0.10.2 is the last
# jax with Python 3.11 wheels (maxtext's extras ask >=0.11.1): the reader supplies the one
# name of jax 0.11 those modules import and the RoPE never calls (see maxtext_reader.py).
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q -c "$here/maxtext.txt" jax jaxlib flax aqtp qwix tokamax \
  orbax-checkpoint etils psutil pathwaysutils huggingface_hub omegaconf pydantic jinja2 pyyaml
"$dest/bin/python" -m pip install -q --no-deps --ignore-requires-python -c "$here/maxtext.txt" maxtext
