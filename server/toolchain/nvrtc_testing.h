#ifndef KILN_SERVER_TOOLCHAIN_NVRTC_TESTING_H_
#define KILN_SERVER_TOOLCHAIN_NVRTC_TESTING_H_

// For GoogleTest suites that compile with real NVRTC: the worker from the test's runfiles
// (data = ["//server/toolchain:kiln_nvrtc_worker"]) and NVRTC from KILN_NVRTC_PATH. With
// KILN_REQUIRE_NVRTC=1 (CI) a missing NVRTC fails the test; otherwise it is skipped LOUDLY.

#include <cstdint>
#include <string>

#include "server/toolchain/nvrtc.h"

namespace kiln::toolchain::testing {

NvrtcOptions TestNvrtcOptions();

// True when NVRTC works; otherwise records a failure (KILN_REQUIRE_NVRTC=1) or prints a banner.
bool HaveNvrtc();

// The ELF e_machine of a cubin (EM_CUDA = 190); 0 for anything too short.
uint16_t ElfMachine(const std::string& elf);

}  // namespace kiln::toolchain::testing

#endif  // KILN_SERVER_TOOLCHAIN_NVRTC_TESTING_H_
