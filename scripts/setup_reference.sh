#!/usr/bin/env bash
# The llama.cpp references, both from the llama-cpp-python sdist pinned below:
#
#   avx2    venv $BIE_REF_VENV (default ./.venv-ref): fixed ISA (AVX2/FMA/F16C, no AVX-512/AMX).
#           Used to regenerate tests/golden/*; the fixed ISA keeps the goldens independent of the
#           build machine. CI never runs this (the goldens are committed).
#   native  venv $BIE_REF_NATIVE_VENV (default ./build/.venv-ref-native): GGML_NATIVE=ON, i.e. the
#           best this machine has (AVX-512 F/BW/VL/VNNI/BF16, llamafile sgemm, repacking). Used for
#           speed comparisons only (scripts/compare_llamacpp.sh). The same build also makes
#           llama.cpp's C++ llama-server and llama-bench (from the sdist's vendor/llama.cpp), linked
#           into $BIE_REF_NATIVE_BIN (default ./build/ref-native/bin), for serving comparisons
#           (scripts/bench_serve.py) next to bie-serve.
#
#   scripts/setup_reference.sh            # both
#   scripts/setup_reference.sh avx2       # only the goldens reference
#   scripts/setup_reference.sh native     # only the speed reference + llama-server/llama-bench
#
# Each build compiles llama.cpp from source (~15-40 min on 2 cores; run it under nice in the
# background). The version is pinned: changing it changes the goldens, so regenerate and commit
# them together.
#
# AMX: a native build on a CPU that advertises AMX compiles the AMX kernels. Some hypervisors
# advertise AMX but do not enable its register state, and the build then dies with SIGILL
# (tilezero), or grant it and fault on ldtilecfg. The native build is smoke-tested after building
# (llama-bench on $BIE_REF_SMOKE_MODEL, default the fetched SmolLM2) and rebuilt with AMX off
# when it dies with AMX on; BIE_REF_NATIVE_NO_AMX=1 forces AMX off from the start.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"   # vendors ggml-org/llama.cpp@0c1e57098 (per its CHANGELOG)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WHAT="${1:-all}"
case "$WHAT" in
  all | avx2 | native) ;;
  *) echo "usage: $0 [all|avx2|native]" >&2; exit 2 ;;
esac

have_llama_cpp() { # venv -> 0 when the pinned llama-cpp-python imports there
  "$1/bin/python" - "$LLAMA_CPP_PYTHON_VERSION" <<'PYEOF' 2>/dev/null
import sys, llama_cpp, numpy
sys.exit(0 if llama_cpp.__version__ == sys.argv[1] else 1)
PYEOF
}

make_venv() {
  if [ ! -x "$1/bin/python" ]; then
    echo "setup_reference: creating venv $1"
    "$PY" -m venv "$1"
  fi
}

setup_avx2() {
  local venv="${BIE_REF_VENV:-$ROOT/.venv-ref}"
  make_venv "$venv"
  if have_llama_cpp "$venv"; then
    echo "setup_reference: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION already in $venv"
    return 0
  fi
  # Not GGML_NATIVE: a fixed ISA keeps the goldens independent of the build machine (and avoids
  # the AMX SIGILL above). Override with CMAKE_ARGS=... if you know better.
  local args="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
  echo "setup_reference: [avx2] pip install llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (CMAKE_ARGS=$args)"
  CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$venv/bin/pip" install --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" numpy
  "$venv/bin/python" -c "import llama_cpp; print('setup_reference: [avx2] ok, llama-cpp-python', llama_cpp.__version__)"
}

setup_native() {
  local venv="${BIE_REF_NATIVE_VENV:-$ROOT/build/.venv-ref-native}"
  local work="$ROOT/build/ref-native"
  local bin="${BIE_REF_NATIVE_BIN:-$work/bin}"
  local src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
  # A native build runs only on CPUs with the ISA it was compiled for (a build from an AVX-512
  # BF16 machine dies with SIGILL on one without): it is keyed by this CPU's flags and rebuilt
  # when the machine changed, since importing the module does not execute those instructions.
  local cpu_key stamp="$work/cpu-flags.sha256"
  cpu_key=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -d' ' -f1)
  local bdir="$work/cpp"
  local built=("$venv" "$work/build" "$bdir" "$bin")  # what a rebuild removes
  if [ -e "$venv" ] && [ "$(cat "$stamp" 2>/dev/null)" != "$cpu_key" ]; then
    echo "setup_reference: [native] the build in $venv is for another CPU's flags; rebuilding"
    rm -rf "${built[@]}"
  fi
  make_venv "$venv"
  if have_llama_cpp "$venv" && [ -x "$bin/llama-server" ] && [ -x "$bin/llama-bench" ]; then
    echo "setup_reference: native llama-cpp-python $LLAMA_CPP_PYTHON_VERSION already in $venv, binaries in $bin"
    return 0
  fi
  mkdir -p "$work"
  if [ ! -d "$src" ]; then
    # The sdist itself (not a wheel): its vendor/llama.cpp is the C++ source for llama-server.
    "$venv/bin/pip" download --no-binary :all: --no-deps -d "$work" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$work"
  fi
  local amx=""
  if [ "${BIE_REF_NATIVE_NO_AMX:-0}" = 1 ]; then
    # GGML_NATIVE=ON passes -march=native, which turns AMX on in the compiler; name the ISA instead.
    amx="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  fi
  # Two builds of the same source with the same flags: the Python package (libllama/libggml
  # only; LLAVA_BUILD=OFF, the benchmarks never load libmtmd), then llama.cpp's own CMake tree for
  # the two C++ binaries only (ggml's CMake uses ccache when it is installed, so the second build
  # reuses the first one's objects). Python first: compare_llamacpp.sh needs only that.
  local base="-DGGML_NATIVE=ON $amx -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
  local args="${CMAKE_ARGS:-$base -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF}"
  local par="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
  if ! have_llama_cpp "$venv"; then
    echo "setup_reference: [native] pip install $src (CMAKE_ARGS=$args)"
    CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="$par" \
      "$venv/bin/pip" install --no-cache-dir -C "build-dir=$work/build" "$src" numpy
  fi
  echo "setup_reference: [native] llama-server, llama-bench from $src/vendor/llama.cpp ($bdir)"
  # shellcheck disable=SC2086  # $base is a list of flags
  cmake -S "$src/vendor/llama.cpp" -B "$bdir" -DCMAKE_BUILD_TYPE=Release $base \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF > "$work/cpp-configure.log"
  cmake --build "$bdir" -j "$par" --target llama-server llama-bench
  mkdir -p "$bin"
  for exe in llama-server llama-bench; do
    if [ ! -x "$bdir/bin/$exe" ]; then
      echo "setup_reference: [native] $exe was not built (see $bdir)" >&2
      exit 1
    fi
    ln -sf "$bdir/bin/$exe" "$bin/$exe"
  done
  "$venv/bin/python" -c "import llama_cpp; print('setup_reference: [native] ok, llama-cpp-python', llama_cpp.__version__)"
  "$bin/llama-bench" --help > /dev/null
  # Smoke test: llama-bench on a small model (the default model when fetched). A hypervisor can
  # advertise AMX and grant its permission yet fault on ldtilecfg in ggml's AMX matmul (seen on
  # this project's Xeon VMs: SIGSEGV/SIGILL at the first prompt); then the build is redone with
  # AMX off, which is the speed peer such a machine can run.
  local smoke="${BIE_REF_SMOKE_MODEL:-${BIE_HOME:-$HOME/.cache/bie}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
  if [ -f "$smoke" ]; then
    if ! "$bin/llama-bench" -m "$smoke" -t 2 -p 16 -n 4 -r 1 > "$work/smoke.log" 2>&1; then
      if [ "${BIE_REF_NATIVE_NO_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo; then
        echo "setup_reference: [native] llama-bench died on $smoke with AMX on (this VM faults in" \
          "ggml's AMX kernels); rebuilding with AMX off (BIE_REF_NATIVE_NO_AMX=1)" >&2
        rm -rf "${built[@]}"
        BIE_REF_NATIVE_NO_AMX=1 setup_native
        return
      fi
      echo "setup_reference: [native] llama-bench failed on $smoke (see $work/smoke.log)" >&2
      exit 1
    fi
    echo "setup_reference: [native] smoke test passed (llama-bench on $smoke)"
  else
    echo "setup_reference: [native] no smoke test: $smoke not found (make models)"
  fi
  echo "$cpu_key" > "$stamp"
  echo "setup_reference: [native] llama-server, llama-bench in $bin"
}

case "$WHAT" in
  avx2) setup_avx2 ;;
  native) setup_native ;;
  all) setup_avx2 && setup_native ;;
esac
