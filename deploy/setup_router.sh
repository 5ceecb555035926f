#!/usr/bin/env bash
# Installs vllm-router (PyPI; a Rust binary in a wheel) into its own virtual environment, for
# deploy/local_cluster.py and tests/server/test_router_e2e.py. Idempotent.
# Usage: deploy/setup_router.sh [VENV_DIR]   (default: build/.venv-router)
set -euo pipefail
VENV="${1:-build/.venv-router}"
VERSION="${VLLM_ROUTER_VERSION:-0.1.17}"
if [ -x "$VENV/bin/vllm-router" ] && "$VENV/bin/python" -m pip show vllm-router 2>/dev/null \
    | grep -qx "Version: $VERSION"; then
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "vllm-router==$VERSION"
echo "setup_router: vllm-router $VERSION in $VENV"
