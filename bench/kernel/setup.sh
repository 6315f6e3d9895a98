#!/usr/bin/env bash
# Build the llama-cpp-python server the kernel and DocETL benchmarks run
# the model behind, from PyPI's source distribution (PyPI has no binary
# wheel of it; the build compiles llama.cpp, several minutes on 2 cores).
#
#   bash bench/kernel/setup.sh
#
# Env:
#   LCP_VENV   venv to create or reuse   (default /tmp/lcp-venv)
#   PYTHON     interpreter for the venv  (default python3)
#
# Idempotent: a venv whose server already imports is kept as it is.
set -euo pipefail

LCP_VENV="${LCP_VENV:-/tmp/lcp-venv}"
PYTHON="${PYTHON:-python3}"
LCP_VERSION="0.3.36"

if [ -x "$LCP_VENV/bin/python" ] && "$LCP_VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
  echo "llama-cpp-python $("$LCP_VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)') already in $LCP_VENV"
  exit 0
fi
command -v cmake >/dev/null || { echo "cmake is needed: apt-get install cmake" >&2; exit 1; }
"$PYTHON" -m venv "$LCP_VENV"
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$LCP_VENV/bin/python" -m pip install -q --disable-pip-version-check \
  "llama-cpp-python[server]==$LCP_VERSION"
"$LCP_VENV/bin/python" -c 'import llama_cpp, llama_cpp.server; print("llama-cpp-python", llama_cpp.__version__)'
echo "venv: $LCP_VENV"
