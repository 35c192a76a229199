#!/usr/bin/env bash
# Packs kilnd and kilnctl with the shared libraries they need (all but glibc's own) into a folder
# that runs on a machine without Bazel or gRPC (e.g. Ubuntu 24.04): binaries and libraries get an
# rpath of $ORIGIN. Usage: deploy/bundle.sh [OUT_DIR]   (default: .bundle/kiln)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/setup.sh"
kiln_setup_apt
command -v patchelf >/dev/null || {
  kiln_say "installing patchelf"; apt-get install -y -q patchelf >/dev/null; }
out="${1:-$KILN_ROOT/.bundle/kiln}"
cd "$KILN_ROOT"
kiln_say "building kilnd and kilnctl"
kiln_bazel build //server:kilnd //client/kilnctl:kilnctl //server/toolchain:kiln_nvrtc_worker >/dev/null 2>"$KILN_ROOT/bazel-build.log" || {
  cat "$KILN_ROOT/bazel-build.log" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
cp bazel-bin/server/kilnd bazel-bin/client/kilnctl/kilnctl \
  bazel-bin/server/toolchain/kiln_nvrtc_worker "$out/"
chmod u+w "$out"/*
# glibc's libraries come from the target machine; everything else travels.
skip='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so'
for bin in "$out/kilnd" "$out/kilnctl" "$out/kiln_nvrtc_worker"; do
  ldd "$bin" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -f "$out/$name" ] || cp -L "$path" "$out/$name"
  done
done
for f in "$out"/*; do
  chmod u+w "$f"
  patchelf --set-rpath '$ORIGIN' "$f"
  strip --strip-unneeded "$f" 2>/dev/null || true
done
cp README.md "$out/"
size=$(du -sm "$out" | cut -f1)
kiln_say "bundle at $out: $(ls "$out" | wc -l) files, ${size} MiB"
