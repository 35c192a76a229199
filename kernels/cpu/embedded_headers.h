#ifndef KILN_KERNELS_CPU_EMBEDDED_HEADERS_H_
#define KILN_KERNELS_CPU_EMBEDDED_HEADERS_H_

// The helper headers of kernels/cpu, concatenated at build time (their own `#include "..."` lines
// removed) into one string that the CPU emitter places at the top of each generated translation
// unit. The string never changes at run time; it is part of what the cache key must cover (a
// change to a header changes generated source, so hash the source or this string).

namespace kiln::kernels {

const char* CpuPrelude();

}  // namespace kiln::kernels

#endif  // KILN_KERNELS_CPU_EMBEDDED_HEADERS_H_
