// kiln runtime: loads compiled kiln artifacts (CPU shared objects) and runs consecutive kernel
// steps of a plan in one call. A C ABI, so that the Python client can use it through ctypes.
//
// Build without Bazel (what the client does on install):
//     g++ -std=c++17 -O2 -shared -fPIC runtime/*.cc -ldl -o libkiln_runtime.so   (runtime/build.sh)
//
// Contract:
//   - Every function returns KILN_OK (0) or an error code, never aborts the process on bad input
//     (null pointers, unknown symbols, truncated or non-ELF bytes, indices out of range); on error
//     kiln_last_error() returns a message for the calling thread (valid until its next call).
//   - kiln_module_load copies nothing it does not need: the bytes go into an anonymous memory file
//     (memfd_create) that is dlopen'ed through /proc/self/fd/N, or, where memfd is unavailable,
//     into a private temp file that is unlinked right after dlopen. Modules are independent: two
//     loads of the same bytes give two modules.
//   - Kernels of a module are registered by symbol (kiln_module_add_kernel) and then named by the
//     returned dense index. Generated kernels have the signature kiln_kernel_fn (see
//     server/codegen/cpu_emitter.h): buffers[j] is the element pointer of buffer j (already at the
//     tensor's storage offset), scalars[j] the j-th int64 scalar (run-time sizes).
//   - kiln_run_steps runs steps[0..n) in order on the calling thread (kernels may use OpenMP
//     threads inside). The runtime cannot check that a step passes as many buffers and scalars as
//     its kernel expects: the plan (KernelStep.args / scalar_args) is the authority.
//   - A module may be used from several threads at once; unloading it while in use is the
//     caller's error.
#ifndef KILN_RUNTIME_KILN_RUNTIME_H_
#define KILN_RUNTIME_KILN_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_RUNTIME_ABI_VERSION 1

enum {
  KILN_OK = 0,
  KILN_ERROR_INVALID_ARGUMENT = 1, /* null pointer, bad index, bad size */
  KILN_ERROR_LOAD = 2,             /* the bytes are not a loadable shared object */
  KILN_ERROR_NOT_FOUND = 3,        /* no such symbol in the module */
  KILN_ERROR_INTERNAL = 4          /* out of memory, I/O failure */
};

typedef struct kiln_module kiln_module;
typedef void (*kiln_kernel_fn)(void* const* buffers, const int64_t* scalars);

/* One kernel launch: kernel = an index from kiln_module_add_kernel. */
typedef struct kiln_step {
  int32_t kernel;
  int32_t reserved; /* 0 */
  void* const* buffers;
  const int64_t* scalars;
} kiln_step;

int kiln_runtime_abi_version(void);
const char* kiln_last_error(void);

int kiln_module_load(const void* data, size_t size, kiln_module** out);
/* Resolves `symbol` and returns its kernel index (the same index for the same symbol). */
int kiln_module_add_kernel(kiln_module* module, const char* symbol, int32_t* out_index);
int kiln_module_num_kernels(const kiln_module* module, int32_t* out_count);
int kiln_run_steps(const kiln_module* module, const kiln_step* steps, int32_t num_steps);
/* Runs one kernel directly. */
int kiln_run_kernel(const kiln_module* module, int32_t kernel, void* const* buffers,
                    const int64_t* scalars);
/* dlclose and free; null is accepted and ignored. */
int kiln_module_unload(kiln_module* module);

#ifdef __cplusplus
}
#endif

#endif  // KILN_RUNTIME_KILN_RUNTIME_H_
