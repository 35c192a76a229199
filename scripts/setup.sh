#!/usr/bin/env bash
# Installs what kiln needs on a Debian 12 machine, idempotently, and is quick when nothing is missing:
#   - Debian packages (the C++ toolchain and libraries, Bazel, Redis);
#   - a Python venv at .venv/ with torch==2.13.0, grpcio, protobuf, pytest and the kiln client.
# Other scripts source this file; run it directly to install only.
set -euo pipefail
KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KILN_ROOT

kiln_say() { printf '[kiln] %s\n' "$*" >&2; }

KILN_APT_PACKAGES=(
  bazel-bootstrap clang-14 libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev libhiredis-dev redis-server libssl-dev libzstd-dev libxxhash-dev
  python3-venv patchelf libomp-14-dev
)

kiln_setup_apt() {
  local missing=()
  for p in "${KILN_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  kiln_say "installing Debian packages: ${missing[*]} (a few minutes on a fresh machine)"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  kiln_say "Debian packages installed"
}

# Pinned: the CPU wheel of torch 2.13.0 is on disk on the dev/CI machines; any other version
# downloads gigabytes of CUDA packages.
# expecttest: imported by torch.testing._internal (scripts/opinfo_check.py).
# nvidia-cuda-nvrtc: NVRTC for compiling CUDA kernels on machines without a CUDA toolkit or GPU
# (13.0, as on the GPU machine).
KILN_PY_REQUIREMENTS=(torch==2.13.0 "grpcio>=1.51" "protobuf>=3.20" pytest numpy expecttest
  nvidia-cuda-nvrtc==13.0.88)

kiln_setup_venv() {
  local venv="$KILN_ROOT/.venv"
  local py="$venv/bin/python"
  local stamp="$venv/.kiln-setup-stamp"
  local want
  want="$(printf "%s\n" "${KILN_PY_REQUIREMENTS[@]}"; cat "$KILN_ROOT/client/python/pyproject.toml" 2>/dev/null || true)"
  if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  if [ ! -x "$py" ]; then
    kiln_say "creating the Python venv at .venv/"
    python3 -m venv "$venv"
  fi
  kiln_say "installing Python packages into .venv/ (torch 2.13.0 CPU, grpcio, protobuf, pytest, NVRTC)"
  # (The filter drops pip's warnings about this machine's optional local index directories.)
  "$py" -m pip install -q --disable-pip-version-check "${KILN_PY_REQUIREMENTS[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  if [ -f "$KILN_ROOT/client/python/pyproject.toml" ]; then
    kiln_say "installing the kiln client package (editable) into .venv/"
    "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e "$KILN_ROOT/client/python"
  fi
  printf '%s' "$want" >"$stamp"
  kiln_say "Python venv ready"
}

# Builds every kiln binary with Bazel; a disk cache under ~/.cache keeps rebuilds in fresh clones fast.
kiln_bazel() {
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/kiln-bazel-disk"
  mkdir -p "$cache"
  (cd "$KILN_ROOT" && bazel "$1" --disk_cache="$cache" "${@:2}")
}

# The NVRTC library in the venv (from the nvidia-cuda-nvrtc wheel), or nothing.
kiln_nvrtc_library() {
  ls "$KILN_ROOT"/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 2>/dev/null | head -1
}

kiln_setup_all() {
  kiln_setup_apt
  kiln_setup_venv
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  kiln_setup_all
  kiln_say "setup complete"
fi
