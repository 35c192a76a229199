// kiln cuBLASLt runtime: runs the GEMMs of CUDA plans (LibrarySteps "cublasLt.matmul", encoded as
// server/lower/gemm_step.h documents) on a caller-given stream. A C ABI for ctypes, in the same
// library as kiln_runtime.h and kiln_cuda.h (runtime/build.sh: plain g++, no CUDA headers).
//
// Contract:
//   - cuBLASLt is opened with dlopen on the first call that needs it: $KILN_LIBCUBLASLT_PATH if
//     set; else the copy already in the process (libcublasLt.so.13, then .so.12, RTLD_NOLOAD:
//     torch has loaded one); else libcublasLt.so.13, .so.12, .so from the loader's search path.
//     Without it, kiln_cublas_init and kiln_cublas_matmul return KILN_ERROR_UNAVAILABLE with a
//     message naming every name tried. The few cuBLASLt types and enums used are declared by hand
//     in kiln_cublas.cc (their values are those of cublasLt.h, stable across CUDA 11.x-13.x).
//   - kiln_cublas_matmul(device, params, alpha, beta, buffers, stream): params are the step's
//     int_params (KILN_GEMM_NUM_PARAMS of them, in gemm_step.h's order), buffers = {D, A, B, C,
//     workspace} device pointers (C and workspace may be null as the params say). It makes a
//     context of `device` current (kiln_cuda_make_device_current), computes
//     D = alpha * A @ B (+ bias C over rows | + beta * C) with f32 accumulation for every dtype
//     (CUBLAS_COMPUTE_32F; CUBLAS_COMPUTE_32F_FAST_TF32 for f32 only when params' flags allow
//     TF32; f16/bf16 reductions as cuBLASLt's default, like torch's defaults), and enqueues it on
//     `stream` without synchronizing. The algorithm comes from cublasLtMatmulAlgoGetHeuristic,
//     cached per device, params and pointer alignments. One cuBLASLt handle per device; calls
//     from several threads are serialized per device (the enqueue only).
//   - Returns KILN_OK or an error code; kiln_cublas_last_error() gives the calling thread's
//     message. KILN_ERROR_UNSUPPORTED: cuBLASLt has no algorithm for this GEMM as laid out (or
//     refuses it as NOT_SUPPORTED): the caller runs the step another way. KILN_ERROR_CUBLAS: a
//     cuBLASLt call failed (the message names it and its status).
#ifndef KILN_RUNTIME_KILN_CUBLAS_H_
#define KILN_RUNTIME_KILN_CUBLAS_H_

#include <stddef.h>
#include <stdint.h>

#include "kiln_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ERROR_CUBLAS 7      /* a cuBLASLt call failed (the message names it) */
#define KILN_ERROR_UNSUPPORTED 8 /* cuBLASLt cannot run this GEMM: run it another way */
#define KILN_GEMM_NUM_PARAMS 18  /* server/lower/gemm_step.h kGemmParamCount */

const char* kiln_cublas_last_error(void);
/* Opens cuBLASLt (idempotent); out_version (may be null) gets cublasLtGetVersion(). */
int kiln_cublas_init(size_t* out_version);
int kiln_cublas_matmul(int device, const int64_t* params, int32_t num_params, double alpha, double beta,
                       void* const* buffers, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // KILN_RUNTIME_KILN_CUBLAS_H_
