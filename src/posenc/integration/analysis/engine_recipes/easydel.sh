#!/usr/bin/env bash
# Build EasyDeL's environment at $1 for `posenc rope --engines easydel`: the CPU torch first
# (torch==2.13.0; any other version pulls a CUDA build), then easydel with all of its own
# requirements (JAX on CPU, flax, eformer, ejkernel, transformers, ray, ...) and pillow,
# every version held by easydel.txt. A full install: importing easydel.modules (the config
# classes and the models the reader builds) pulls in its inference and training stacks,
# transformers' torch-only modules (glm4v_moe's config) and pillow (esurge's multimodal
# manager), which easydel 0.3.0 does not declare.
set -euo pipefail
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q "$(grep '^torch==' "$here/easydel.txt")"
"$dest/bin/python" -m pip install -q -c "$here/easydel.txt" easydel pillow
