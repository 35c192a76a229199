#!/usr/bin/env bash
# Cache-hit load benchmark: starts a kilnd (fresh cache dir, unix socket), runs
# //tests/bench:cache_load against it and prints the table. Extra arguments go to cache_load
# (e.g. --duration=5s --concurrency=1,16,64 --sizes=10240,1048576).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
kiln_setup_apt
cd "$KILN_ROOT"
kiln_say "building kilnd and cache_load"
kiln_bazel build //server:kilnd //tests/bench:cache_load >/dev/null 2>"$KILN_ROOT/bazel-build.log" || {
  cat "$KILN_ROOT/bazel-build.log" >&2; exit 1; }
dir=$(mktemp -d /tmp/kiln-bench.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
bazel-bin/server/kilnd --listen="unix:$dir/kilnd.sock" --cache_dir="$dir/cache" \
  --log_level=warn 2>"$dir/kilnd.log" &
pid=$!
for _ in $(seq 100); do [ -S "$dir/kilnd.sock" ] && break; sleep 0.05; done
kiln_say "kilnd $(bazel-bin/server/kilnd --version | cut -d' ' -f2) on $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
bazel-bin/tests/bench/cache_load --server="unix:$dir/kilnd.sock" "$@"
