#!/usr/bin/env bash
# kiln's main job on the embedded default: a kilnd with its local disk cache, no other service.
# Installs what is missing, builds kilnd, starts it on a unix socket under the cache dir (or reuses
# one that is running there), checks its health and runs the example through it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
kiln_setup_all
cd "$KILN_ROOT"

kiln_say "building kilnd (bazel build //server:kilnd)"
kiln_bazel build //server:kilnd >/dev/null 2>"$KILN_ROOT/bazel-build.log" || {
  cat "$KILN_ROOT/bazel-build.log" >&2; exit 1; }
exec "$KILN_ROOT/.venv/bin/python" "$KILN_ROOT/scripts/demo.py" --kilnd "$KILN_ROOT/bazel-bin/server/kilnd"
