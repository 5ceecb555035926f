#!/usr/bin/env bash
# Creates the Python virtual environment the end-to-end server tests use (official `openai`
# client, pytest, requests; pyzmq and msgpack for the KV-event subscriber test). Idempotent: does nothing when the venv already has them.
# Usage: scripts/setup_pyenv.sh [VENV_DIR]   (default: build/.venv-test)
set -euo pipefail
VENV="${1:-build/.venv-test}"
PKGS=(openai pytest requests prometheus_client pyzmq msgpack pyyaml jsonschema)
STAMP="$VENV/.bie-pyenv-ok"
if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import openai, pytest, requests, prometheus_client, zmq, msgpack, yaml, jsonschema" 2>/dev/null; then
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}"
"$VENV/bin/python" -c "import openai, pytest, requests; print('setup_pyenv: openai', openai.__version__, 'in $VENV')"
touch "$STAMP"
