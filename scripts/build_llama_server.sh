#!/usr/bin/env bash
# llama.cpp's own OpenAI server (`llama-server`), built from the llama.cpp source vendored in the
# llama-cpp-python sdist the project already compiles (same version, same CPU options), for
# `hyfunc bench serve --llama-server`. Usage: build_llama_server.sh VENV_PYTHON PACKAGE_SPEC OUT_BINARY
set -euo pipefail
python=$1 spec=$2 out=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --no-deps --no-binary :all: -d "$work" "$spec"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
here=$(cd "$(dirname "$0")" && pwd)
log="$work/build.log"
# Static: one file to copy, independent of the venv's shared libraries. No curl: models are local files.
# The compiler's output goes to a log, shown only when the build fails.
if ! { cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
         -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON $("$python" "$here/ggml_cpu_flags.py") \
       && cmake --build "$work/build" --target llama-server -j "$(nproc)"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  exit 1
fi
install -m 755 "$work/build/bin/llama-server" "$out"
"$out" --version 2>&1 | head -n 2
