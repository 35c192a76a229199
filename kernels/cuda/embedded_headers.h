#ifndef KILN_KERNELS_CUDA_EMBEDDED_HEADERS_H_
#define KILN_KERNELS_CUDA_EMBEDDED_HEADERS_H_

// The helper headers of kernels/cuda, concatenated at build time (their own `#include "..."` lines
// removed) into one string that the CUDA emitter places at the top of each generated source, so
// NVRTC needs no include path. Part of what the cache key must cover (hash the source).

namespace kiln::kernels {

const char* CudaPrelude();

}  // namespace kiln::kernels

#endif  // KILN_KERNELS_CUDA_EMBEDDED_HEADERS_H_
