// kiln CUDA runtime: loads cubins produced by kiln's CUDA emitter (server/codegen/cuda_emitter.h)
// and launches their kernels on a caller-given stream, a whole list of launches per call. A C ABI
// for ctypes, in the same library as kiln_runtime.h (runtime/build.sh builds both with one plain
// g++ command: no CUDA headers or libraries at build time).
//
// Contract:
//   - The NVIDIA driver library is opened with dlopen (libcuda.so.1, or $KILN_LIBCUDA_PATH) on
//     the first call that needs it; the few driver API types and functions used are declared by
//     hand. On a machine without it, kiln_cuda_init and every call that needs the driver return
//     KILN_ERROR_UNAVAILABLE with a message that says so. Nothing here ever aborts the process.
//   - Every function returns KILN_OK (0) or an error code (kiln_runtime.h, plus the two below);
//     on error kiln_cuda_last_error() returns a message for the calling thread (valid until its
//     next kiln_cuda_* call). A failing driver call gives KILN_ERROR_CUDA and names the call and
//     the CUresult (e.g. "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (invalid argument)").
//   - Contexts: a module lives in the context that is current on the calling thread when it is
//     loaded (torch's primary context once torch has touched the device); if none is current,
//     the primary context of `device` is retained and made current (released at unload). Launch
//     calls make the module's context current if another one is.
//   - Bytes: a cubin (ELF, machine EM_CUDA = 190, every header and section inside `size`) or PTX
//     text (copied and NUL-terminated). Bytes are checked before the driver sees them: the driver
//     API takes no size, so a truncated image is refused here instead of being read past its end.
//   - Kernel parameters (the emitter's convention): kernel i of a cubin is "kiln_kernel_<i>" with
//     parameters (b0, ..., b{nb-1}, n0, ..., n{ns-1}): device pointers, then int64 scalars, each
//     8 bytes, passed by value. A launch gives buffers[nb] (device pointers as void*) and
//     scalars[ns]; the runtime passes kernelParams = {&buffers[0], ..., &scalars[0], ...}, so no
//     argument copies go to device memory. Where the driver can tell (cuFuncGetParamInfo, CUDA
//     12.4+), a launch whose nb + ns differs from the kernel's parameter count is refused.
//   - kiln_cuda_run_launches checks every launch first (kernel index, grid 1..2^31-1, block
//     1..the kernel's max threads per block, shared bytes, tables), so a bad table launches
//     nothing; then enqueues them in order on `stream` (a CUstream, e.g. torch's
//     torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream) and returns
//     without synchronizing. Errors of the kernels themselves appear later, on the stream.
//   - Add kernels (kiln_cuda_module_add_kernel) before launching from several threads; launches
//     may then run concurrently. Unloading a module in use is the caller's error.
#ifndef KILN_RUNTIME_KILN_CUDA_H_
#define KILN_RUNTIME_KILN_CUDA_H_

#include <stddef.h>
#include <stdint.h>

#include "kiln_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ERROR_UNAVAILABLE 5 /* no NVIDIA driver (libcuda) or no device */
#define KILN_ERROR_CUDA 6        /* a driver call failed (the message names it) */

typedef struct kiln_cuda_module kiln_cuda_module;

/* One kernel launch; kernel = an index from kiln_cuda_module_add_kernel. */
typedef struct kiln_cuda_launch {
  int32_t kernel;
  uint32_t grid_x;
  uint32_t block_x;
  uint32_t shared_bytes; /* dynamic shared memory (the emitter's kernels use 0) */
  int32_t num_buffers;
  int32_t num_scalars;
  void* const* buffers;  /* num_buffers device pointers */
  const int64_t* scalars;
} kiln_cuda_launch;

const char* kiln_cuda_last_error(void);
/* Opens the driver and runs cuInit(0); idempotent. */
int kiln_cuda_init(void);
/* The driver's CUDA version, e.g. 13000. */
int kiln_cuda_driver_version(int* out_version);

int kiln_cuda_module_load(const void* data, size_t size, int device, kiln_cuda_module** out);
/* Resolves `symbol` (the same index for the same symbol). A kernel whose __cluster_dims__ exceed
   the portable 8 blocks gets CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED here (an error
   where the driver refuses it). */
int kiln_cuda_module_add_kernel(kiln_cuda_module* module, const char* symbol, int32_t* out_index);
int kiln_cuda_module_num_kernels(const kiln_cuda_module* module, int32_t* out_count);
int kiln_cuda_run_launches(const kiln_cuda_module* module, const kiln_cuda_launch* launches,
                           int32_t num_launches, void* stream);
/* Makes a context of `device` current on the calling thread: the current one if it is on that
   device, else the device's primary context (retained once, never released). */
int kiln_cuda_make_device_current(int device);
/* cuStreamSynchronize: kernel faults surface here as KILN_ERROR_CUDA. */
int kiln_cuda_stream_synchronize(void* stream);
/* cuModuleUnload (and release of a primary context the load retained); null is accepted. */
int kiln_cuda_module_unload(kiln_cuda_module* module);

#ifdef __cplusplus
}
#endif

#endif  // KILN_RUNTIME_KILN_CUDA_H_
