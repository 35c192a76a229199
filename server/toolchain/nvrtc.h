#ifndef KILN_SERVER_TOOLCHAIN_NVRTC_H_
#define KILN_SERVER_TOOLCHAIN_NVRTC_H_

// CUDA compiles with NVRTC, each in a separate worker process (kiln_nvrtc_worker) with a time and
// a memory limit: NVRTC scales across processes (threads inside one plateau near 3.6x), and a
// crash or hang in it never reaches kilnd. NVRTC is opened with dlopen by the worker, so kilnd
// runs, and compiles for GPUs it does not have, on machines without a GPU or a CUDA toolkit as
// long as the NVRTC library is present (e.g. from the nvidia-cuda-nvrtc wheel).
//
// Errors: FAILED_PRECONDITION when NVRTC or the worker cannot be found or loaded (the message says
// what to install or which flag to set), INVALID_ARGUMENT for a bad architecture, INTERNAL with
// the compile log for a source NVRTC rejects, DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED for limits.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln::toolchain {

struct NvrtcOptions {
  std::string library;  // path or soname of libnvrtc; empty: FindNvrtcLibrary("")
  std::string worker;   // path of kiln_nvrtc_worker; empty: next to this executable
  absl::Duration timeout = absl::Seconds(120);
  int64_t memory_limit_bytes = int64_t{8} << 30;
  size_t max_log_bytes = 64 * 1024;
  std::string temp_root;  // default $TMPDIR or /tmp
};

// The NVRTC library to use: `hint` if set, else $KILN_NVRTC_PATH, else the first of
// /usr/local/cuda/lib64/libnvrtc.so{,.13,.12} that exists, else the soname "libnvrtc.so.13"
// (found through the loader's search path). The worker's dlopen is the final check.
std::string FindNvrtcLibrary(const std::string& hint);

// "sm_80", "sm_90", "sm_90a", "sm_100" ... ; INVALID_ARGUMENT otherwise.
absl::Status ValidateCudaArch(absl::string_view arch);

// NVRTC's version ("13.0"), from the worker; computed once per (worker, library).
absl::StatusOr<std::string> NvrtcVersion(const NvrtcOptions& options);

struct CudaBinary {
  std::string bytes;  // a cubin (ELF), or PTX text
  bool ptx = false;
  std::string log;
  absl::Duration elapsed;
};

// Compiles `source` for `arch` (a real architecture: SASS; with `ptx`, PTX for compute_NN).
absl::StatusOr<CudaBinary> CompileCuda(absl::string_view source, absl::string_view arch, bool ptx,
                                       const NvrtcOptions& options);

}  // namespace kiln::toolchain

#endif  // KILN_SERVER_TOOLCHAIN_NVRTC_H_
