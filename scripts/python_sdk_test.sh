#!/usr/bin/env bash
# Runs the Python SDK tests (ctest calls this; see CMakeLists.txt). Idempotent.
#   python_sdk_test.sh staged BUILD_DIR PYTHON  pytest tests/python_sdk against the module built in
#                                               BUILD_DIR (staged in BUILD_DIR/python), no install
#   python_sdk_test.sh pip BUILD_DIR PYTHON     `pip install .` into a venv (the first time as a
#                                               user would, later incrementally), then the example
#                                               and the install checks against the installed package
# Both use one venv, BUILD_DIR/.venv-sdk (pytest from PyPI once); in staged mode PYTHONPATH puts
# the build tree's package ahead of the installed one.
set -euo pipefail
mode=$1
build=$(cd "$2" && pwd)
py=${3:-python3}
src=$(cd "$(dirname "$0")/.." && pwd)

venv=$build/.venv-sdk
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import pytest" 2>/dev/null; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "pytest>=7"
fi

export BIE_SDK_SOURCE_DIR=$src
case "$mode" in
  staged)
    export PYTHONPATH=$build/python
    cd "$src"
    "$venv/bin/python" -c "import benni_inference, sys; f = benni_inference.__file__; \
      sys.exit(0 if f.startswith('$build/python/') else 'staged tests would import ' + f)"
    exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python_sdk -m "not installed"
    ;;
  pip)
    start=$(date +%s)
    # The build tree's compiler and warnings as errors: the same compiler command lines let ccache
    # hand this build the build tree's objects of bie_core (CMakeLists.txt, BIE_CCACHE).
    pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check
         --config-settings=cmake.define.BIE_WERROR=ON)
    for lang in C CXX; do
      compiler=$(sed -n "s/^CMAKE_${lang}_COMPILER:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null)
      if [ -n "$compiler" ]; then pip+=("--config-settings=cmake.define.CMAKE_${lang}_COMPILER=$compiler"); fi
    done
    if [ ! -f "$venv/.isolated-install-ok" ]; then
      # First run: exactly what a user does (build dependencies from PyPI, isolated build).
      "${pip[@]}" "$src"
      touch "$venv/.isolated-install-ok"
      echo "python_sdk_test: pip install . (isolated, full build) took $(( $(date +%s) - start )) s"
    else
      # Later runs: an isolated build reconfigures from scratch every time (its environment moves),
      # so reuse build/pip/ incrementally with the build dependencies installed in the venv.
      "${pip[@]}" "scikit-build-core>=0.8" "pybind11>=2.10"
      "${pip[@]}" --no-build-isolation "$src"
      echo "python_sdk_test: pip install --no-build-isolation . took $(( $(date +%s) - start )) s"
    fi
    unset PYTHONPATH
    # Run from outside the source tree so `import benni_inference` finds the installed package.
    cd "$build"
    exec "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$src/tests/python_sdk" \
      "$src/tests/python_sdk" -m installed
    ;;
  *)
    echo "usage: $0 staged|pip BUILD_DIR [PYTHON]" >&2
    exit 2
    ;;
esac
