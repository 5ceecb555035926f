#!/usr/bin/env bash
# Create the reference-implementation venv: llama.cpp through llama-cpp-python (CPU build).
# Used only to regenerate tests/golden/* and to benchmark llama.cpp; CI never runs this
# (the goldens are committed).
#
#   scripts/setup_reference.sh                   # venv in ./.venv-ref
#   BIE_REF_VENV=/opt/bieref scripts/setup_reference.sh
#
# llama-cpp-python builds llama.cpp from source (~10-20 min on 2 cores). The version is pinned:
# changing it changes the goldens, so regenerate and commit them together.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"   # vendors ggml-org/llama.cpp@0c1e57098 (per its CHANGELOG)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BIE_REF_VENV:-$ROOT/.venv-ref}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_reference: creating venv $VENV"
  "$PY" -m venv "$VENV"
fi

if "$VENV/bin/python" - "$LLAMA_CPP_PYTHON_VERSION" <<'PYEOF' 2>/dev/null
import sys, llama_cpp, numpy
sys.exit(0 if llama_cpp.__version__ == sys.argv[1] else 1)
PYEOF
then
  echo "setup_reference: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION already in $VENV"
  exit 0
fi

# CPU-only build for a fixed ISA: AVX2 + FMA + F16C, no AVX-512, no AMX. Not GGML_NATIVE: on the
# project VMs the CPU advertises AMX but the hypervisor forbids it, and a native build dies with
# SIGILL (tilezero). A fixed ISA also keeps the goldens independent of the build machine.
# Override with CMAKE_ARGS=... if you know better. No tests/examples to keep the build short.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
echo "setup_reference: pip install llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (CMAKE_ARGS=$CMAKE_ARGS)"
"$VENV/bin/pip" install --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" numpy
"$VENV/bin/python" -c "import llama_cpp; print('setup_reference: ok, llama-cpp-python', llama_cpp.__version__)"
