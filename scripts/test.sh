#!/usr/bin/env bash
# Runs every kiln test: installs what is missing (scripts/setup.sh), builds with Bazel, runs the
# GoogleTest suites (`bazel test //...`) and the Python suites (pytest) against the built kilnd.
# Any failure fails the run. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
kiln_setup_all
cd "$KILN_ROOT"

start=$SECONDS
kiln_say "building and running the C++ tests (bazel test //...)"
nvrtc="$(kiln_nvrtc_library)"
[ -n "$nvrtc" ] || { kiln_say "NVRTC is missing from .venv (nvidia-cuda-nvrtc); CUDA tests need it"; exit 1; }
kiln_bazel test //... --test_output=errors \
  --test_env=KILN_NVRTC_PATH="$nvrtc" --test_env=KILN_REQUIRE_NVRTC=1
kiln_say "C++ tests passed ($((SECONDS - start)) s)"

start=$SECONDS
kiln_say "running the Python tests (pytest) against $KILN_ROOT/bazel-bin/server/kilnd"
export KILND="$KILN_ROOT/bazel-bin/server/kilnd"
# kilnd compiles CUDA targets with this NVRTC (no GPU needed); the corpus requires it.
export KILN_NVRTC_PATH="$nvrtc" KILN_REQUIRE_NVRTC=1
py_dirs=()
for d in client/python/tests tests/python; do
  [ -d "$d" ] && py_dirs+=("$d")
done
set +e
"$KILN_ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider "${py_dirs[@]}" "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  kiln_say "no Python tests were collected"; exit 1
fi
[ $rc -eq 0 ] || exit $rc
kiln_say "Python tests passed ($((SECONDS - start)) s)"

# The graph importer takes untrusted bytes: its fuzz, import and verifier tests also run under
# AddressSanitizer + UBSan; so does the lowering pipeline's fuse_test (lowering grows value tables
# while it reads them: a reference kept across a growth was a heap-use-after-free once).
# --symlink_prefix=/ leaves bazel-bin pointing at the normal build.
start=$SECONDS
kiln_say "running the graph importer's fuzz and verifier tests and the lowering pipeline's tests under ASan/UBSan (bazel test --config=asan)"
UBSAN_OPTIONS=halt_on_error=1 kiln_bazel test --config=asan --symlink_prefix=/ --test_output=errors \
  --test_env=UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  //server/graph:fuzz_test //server/graph:import_test //server/graph:verify_test \
  //server/graph:graph_path_test //server/lower:fuse_test
kiln_say "ASan tests passed ($((SECONDS - start)) s)"

# kilnd itself under AddressSanitizer + UBSan, serving the Python suites (every graph they send:
# the corpus on CPU and compiled for CUDA, models, backend, packages, admin): a memory error in the
# daemon aborts it and fails the run. The NVRTC worker stays the normal build (it caps its own
# address space, where ASan's shadow memory does not fit). Leak checking is off: tests assert
# kilnd's exit status, and process-lifetime globals (gRPC, Abseil) are not what this looks for.
start=$SECONDS
kiln_say "building kilnd under ASan/UBSan and running the Python tests against it"
kiln_bazel build --config=asan --symlink_prefix=/ //server:kilnd
asan_dir="$(mktemp -d)"
trap 'rm -rf "$asan_dir"' EXIT
cp "$(cd "$KILN_ROOT" && bazel info --config=asan bazel-bin)/server/kilnd" "$asan_dir/kilnd"
cp "$KILN_ROOT/bazel-bin/server/toolchain/kiln_nvrtc_worker" "$asan_dir/kiln_nvrtc_worker"
ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  KILND="$asan_dir/kilnd" "$KILN_ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider tests/python
kiln_say "Python tests against an ASan kilnd passed ($((SECONDS - start)) s)"
