#!/usr/bin/env bash
# Install the Debian packages BIE builds against. Idempotent; skips apt when all are present.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config python3 python3-pip python3-venv
      libpcre2-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libxxhash-dev
      libcpp-httplib-dev libboost-dev libssl-dev pybind11-dev libopenblas-dev libgtest-dev libbenchmark-dev
      libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
      clang libclang-rt-14-dev clang-format ccache
      libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools)  # Vulkan backend; tests run on lavapipe
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all Debian packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
