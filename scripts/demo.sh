#!/usr/bin/env bash
# kiln's main job on the embedded default: torch.compile(model, backend="kiln") with KILN_SERVER
# unset, so the client starts (or reuses) a local kilnd on a unix socket under ~/.cache/kiln, with
# its on-disk cache and no other service. Installs what is missing, builds kilnd, then runs
# examples/quickstart.py twice in two processes: the first compiles, the second is a cache hit.
# Each run checks the result against eager PyTorch. The kilnd it starts exits after 10 idle minutes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
kiln_setup_all
cd "$KILN_ROOT"

kiln_say "building kilnd and kilnctl (bazel build)"
kiln_bazel build //server:kilnd //client/kilnctl:kilnctl //server/toolchain:kiln_nvrtc_worker \
  >/dev/null 2>"$KILN_ROOT/bazel-build.log" || { cat "$KILN_ROOT/bazel-build.log" >&2; exit 1; }
# A stable copy: the embedded kilnd outlives this script, and bazel-bin may be rebuilt meanwhile.
bin="${XDG_CACHE_HOME:-$HOME/.cache}/kiln/bin"
mkdir -p "$bin"
for f in server/kilnd client/kilnctl/kilnctl server/toolchain/kiln_nvrtc_worker; do
  install -m 0755 "bazel-bin/$f" "$bin/$(basename "$f").new" && mv -f "$bin/$(basename "$f").new" "$bin/$(basename "$f")"
done
export KILN_KILND="$bin/kilnd"
unset KILN_SERVER
for run in 1 2; do
  kiln_say "run $run of examples/quickstart.py (a new Python process)"
  "$KILN_ROOT/.venv/bin/python" "$KILN_ROOT/examples/quickstart.py"
done
kiln_say "what kilnd has cached (kilnctl ls):"
"$bin/kilnctl" ls
