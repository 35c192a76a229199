#!/bin/bash
# runtime/build.sh builds the runtime with plain g++ (no Bazel), exports the C API, and a C
# program compiled against kiln_runtime.h links with it and gets error codes for bad input.
set -euo pipefail
src="${TEST_SRCDIR}/${TEST_WORKSPACE}/runtime"
work="${TEST_TMPDIR}/repo"
mkdir -p "${work}/runtime"
cp "${src}/build.sh" "${src}/kiln_runtime.cc" "${src}/kiln_runtime.h" "${src}/kiln_cuda.cc" \
   "${src}/kiln_cuda.h" "${src}/kiln_cublas.cc" "${src}/kiln_cublas.h" "${work}/runtime/"
"${work}/runtime/build.sh" "${work}/libkiln_runtime.so"
for sym in kiln_runtime_abi_version kiln_last_error kiln_module_load kiln_module_add_kernel \
           kiln_module_num_kernels kiln_run_steps kiln_run_kernel kiln_module_unload \
           kiln_cuda_last_error kiln_cuda_init kiln_cuda_driver_version kiln_cuda_module_load \
           kiln_cuda_module_add_kernel kiln_cuda_module_num_kernels kiln_cuda_run_launches \
           kiln_cuda_stream_synchronize kiln_cuda_module_unload kiln_cuda_make_device_current \
           kiln_cublas_last_error kiln_cublas_init kiln_cublas_matmul; do
  nm -D --defined-only "${work}/libkiln_runtime.so" | grep -qw "${sym}" || {
    echo "missing symbol ${sym}"; exit 1; }
done
gcc -std=c99 -Wall -Werror -I"${work}/runtime" "${src}/tests/abi_check.c" \
    -L"${work}" -lkiln_runtime -Wl,-rpath,"${work}" -o "${work}/abi_check"
KILN_LIBCUDA_PATH=/nonexistent/libcuda.so.1 "${work}/abi_check"
echo PASS
