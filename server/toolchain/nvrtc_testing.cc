#include "server/toolchain/nvrtc_testing.h"

#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kiln::toolchain::testing {

NvrtcOptions TestNvrtcOptions() {
  NvrtcOptions o;
  o.worker = absl::StrCat(getenv("TEST_SRCDIR"), "/", getenv("TEST_WORKSPACE"), "/server/toolchain/kiln_nvrtc_worker");
#if defined(__SANITIZE_ADDRESS__)
  o.memory_limit_bytes = 0;  // the ASan-built worker reserves terabytes of shadow: no RLIMIT_AS
#endif
  return o;
}

bool HaveNvrtc() {
  absl::StatusOr<std::string> v = NvrtcVersion(TestNvrtcOptions());
  if (v.ok()) return true;
  const char* required = getenv("KILN_REQUIRE_NVRTC");
  if (required != nullptr && std::string(required) == "1") {
    ADD_FAILURE() << "NVRTC is required here but not usable: " << v.status();
  } else {
    fprintf(stderr, "\n*** NVRTC NOT FOUND: CUDA compile tests are SKIPPED: %s ***\n\n",
            std::string(v.status().message()).c_str());
  }
  return false;
}

uint16_t ElfMachine(const std::string& elf) {
  if (elf.size() < 20) return 0;
  uint16_t m = 0;
  memcpy(&m, elf.data() + 18, 2);
  return m;
}

}  // namespace kiln::toolchain::testing
