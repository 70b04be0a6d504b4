#!/usr/bin/env bash
# Build llama.cpp's environment at $1 for `posenc rope --engines llama.cpp`, from PyPI and
# the local wheels only: a venv with what llama.cpp's converter imports (torch CPU, numpy,
# transformers; pins: llama.cpp.txt), and from the llama-cpp-python sdist's
# vendored llama.cpp: the converter (convert_hf_to_gguf.py, conversion/, gguf-py/) under
# $1/llama.cpp, and built CPU only under $1/ggml: ggml's libraries, libllama and
# llama-rope-args (the reader's driver: engine_readers/llamacpp_graph.py holds its C source),
# which prints the rope arguments of libllama's graph. Offline once built.
set -euo pipefail
dest=$(mkdir -p "$1" && cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
pins="$here/llama.cpp.txt"
jobs=${JOBS:-$(nproc)}
rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
py="$dest/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version=$(grep '^llama-cpp-python==' "$pins" | cut -d= -f3)
# the sdist only (no build): its vendor/ holds llama.cpp's source
"$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
sdist="$work/llama_cpp_python-$version"
src="$sdist/vendor/llama.cpp"
"$py" -m pip install -q -c "$pins" torch numpy transformers PyYAML requests tqdm &
pip_pid=$!
trap 'kill "$pip_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
# configured from llama.cpp's top level (ggml's own CMakeLists wants files the sdist
# leaves out); only the llama target (libllama and the ggml libraries it links) is built
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BACKEND_DL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON > "$work/cmake.log"
cmake --build "$work/build" --target llama -j "$jobs" > "$work/build.log"
wait "$pip_pid" || { echo "pip install failed" >&2; exit 1; }
mkdir -p "$dest/ggml" "$dest/llama.cpp"
cp -a "$work"/build/bin/libggml*.so* "$work"/build/bin/libllama.so* "$dest/ggml/"
"$py" "$here/../engine_readers/llamacpp_graph.py" \
    > "$work/llama-rope-args.c"
"${CC:-cc}" -O2 -o "$dest/ggml/llama-rope-args" "$work/llama-rope-args.c" \
    -I"$src/include" -I"$src/ggml/include" -L"$dest/ggml" \
    -Wl,--no-as-needed -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,'$ORIGIN'
"$py" "$here/../engine_readers/llamacpp_graph.py" logits \
    > "$work/llama-logits.c"
"${CC:-cc}" -O2 -o "$dest/ggml/llama-logits" "$work/llama-logits.c" \
    -I"$src/include" -I"$src/ggml/include" -L"$dest/ggml" \
    -Wl,--no-as-needed -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,'$ORIGIN'
cp -a "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$dest/llama.cpp/"
commit=$(cat "$sdist/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null | cut -c1-9 || true)
# the sdist's submodule is a shallow clone: it holds the commit, not llama.cpp's build
# number (its commit count); 0c1e57098 is release b11312
build=null
[ "$commit" = 0c1e57098 ] && build=11312
gguf_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$src/gguf-py/pyproject.toml")
cat > "$dest/llama.cpp/BUILD_INFO.json" <<JSON
{"commit": "${commit:-unknown}", "build": $build, "llama_cpp_python": "$version", "gguf": "$gguf_version"}
JSON
"$py" - <<PY
import ctypes
ctypes.CDLL("$dest/ggml/libggml-base.so", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL("$dest/ggml/libggml-cpu.so")
PY
"$dest/ggml/llama-rope-args" 2> /dev/null || [ $? -eq 2 ]  # its usage: it links and runs
