#!/bin/sh
# Builds libkiln_runtime.so without Bazel (what the Python client does on install).
# Usage: runtime/build.sh [output path]   (default: ./libkiln_runtime.so, relative to the repo root)
set -eu
cd "$(dirname "$0")/.."
out="${1:-libkiln_runtime.so}"
exec g++ -std=c++17 -O2 -shared -fPIC runtime/*.cc -ldl -o "$out"
