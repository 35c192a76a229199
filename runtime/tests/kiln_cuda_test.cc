// The CUDA half of the runtime on a machine without a GPU: every argument and image check, and a
// clear KILN_ERROR_UNAVAILABLE where the NVIDIA driver is missing. KILN_LIBCUDA_PATH points at a
// file that does not exist, so the test means the same on machines that do have a driver. Real
// cubins come from NVRTC (KILN_NVRTC_PATH; required when KILN_REQUIRE_NVRTC=1, else the tests
// that need one are skipped loudly). Launches on a GPU: tests/gpu/cuda_kernels_check.py.

#include "kiln_cuda.h"

#include <stdlib.h>

#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/toolchain/nvrtc.h"

namespace {

class KilnCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setenv("KILN_LIBCUDA_PATH", "/nonexistent/libcuda.so.1", 1); }

  // A real sm_90 cubin with one kernel, or "" where NVRTC is missing.
  static std::string Cubin() {
    kiln::toolchain::NvrtcOptions o;
    o.worker = absl::StrCat(getenv("TEST_SRCDIR"), "/", getenv("TEST_WORKSPACE"),
                            "/server/toolchain/kiln_nvrtc_worker");
#if defined(__SANITIZE_ADDRESS__)
    o.memory_limit_bytes = 0;  // the ASan-built worker reserves terabytes of shadow: no RLIMIT_AS
#endif
    absl::StatusOr<kiln::toolchain::CudaBinary> bin = kiln::toolchain::CompileCuda(
        "extern \"C\" __global__ void kiln_kernel_0(float* b0, long long n0) { b0[0] = n0; }",
        "sm_90", false, o);
    if (bin.ok()) return bin->bytes;
    const char* required = getenv("KILN_REQUIRE_NVRTC");
    if (required != nullptr && std::string(required) == "1") {
      ADD_FAILURE() << "NVRTC is required here but not usable: " << bin.status();
    } else {
      fprintf(stderr, "\n*** NVRTC NOT FOUND: cubin tests are SKIPPED: %s ***\n\n",
              std::string(bin.status().message()).c_str());
    }
    return "";
  }
};

TEST_F(KilnCudaTest, NullsAndBadBytesAreRefusedBeforeTheDriverIsNeeded) {
  kiln_cuda_module* m = reinterpret_cast<kiln_cuda_module*>(0x1);
  EXPECT_EQ(kiln_cuda_module_load(nullptr, 10, 0, &m), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_EQ(kiln_cuda_module_load("x", 1, 0, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  const char junk[] = "definitely not a cubin";
  EXPECT_EQ(kiln_cuda_module_load(junk, sizeof(junk), 0, &m), KILN_ERROR_LOAD);
  EXPECT_NE(std::string(kiln_cuda_last_error()).find("neither a cubin nor PTX"), std::string::npos)
      << kiln_cuda_last_error();
  unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  elf[18] = 62;  // EM_X86_64: an ELF file, not a cubin
  EXPECT_EQ(kiln_cuda_module_load(elf, sizeof(elf), 0, &m), KILN_ERROR_LOAD);
  EXPECT_NE(std::string(kiln_cuda_last_error()).find("EM_CUDA"), std::string::npos);
  EXPECT_EQ(kiln_cuda_module_load(elf, 10, 0, &m), KILN_ERROR_LOAD);  // too short
  int32_t index = 0, count = 0;
  EXPECT_EQ(kiln_cuda_module_add_kernel(nullptr, "kiln_kernel_0", &index), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cuda_module_num_kernels(nullptr, &count), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cuda_run_launches(nullptr, nullptr, 0, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cuda_driver_version(nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_cuda_module_unload(nullptr), KILN_OK);
}

TEST_F(KilnCudaTest, WithoutTheDriverEveryCallThatNeedsItSaysSo) {
  EXPECT_EQ(kiln_cuda_init(), KILN_ERROR_UNAVAILABLE);
  const std::string message = kiln_cuda_last_error();
  EXPECT_NE(message.find("/nonexistent/libcuda.so.1"), std::string::npos) << message;
  EXPECT_NE(message.find("NVIDIA driver"), std::string::npos) << message;
  int version = 0;
  EXPECT_EQ(kiln_cuda_driver_version(&version), KILN_ERROR_UNAVAILABLE);
  EXPECT_EQ(kiln_cuda_stream_synchronize(nullptr), KILN_ERROR_UNAVAILABLE);
  EXPECT_EQ(kiln_cuda_init(), KILN_ERROR_UNAVAILABLE);  // stays unavailable, no crash
  // PTX text passes the image check and then needs the driver.
  const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n";
  kiln_cuda_module* m = nullptr;
  EXPECT_EQ(kiln_cuda_module_load(ptx, sizeof(ptx) - 1, 0, &m), KILN_ERROR_UNAVAILABLE);
  EXPECT_EQ(m, nullptr);
}

TEST_F(KilnCudaTest, ARealCubinPassesTheImageCheckAndATruncatedOneDoesNot) {
  const std::string cubin = Cubin();
  if (cubin.empty()) GTEST_SKIP() << "NVRTC not found";
  kiln_cuda_module* m = nullptr;
  EXPECT_EQ(kiln_cuda_module_load(cubin.data(), cubin.size(), 0, &m), KILN_ERROR_UNAVAILABLE)
      << kiln_cuda_last_error();
  EXPECT_EQ(m, nullptr);
  for (size_t cut : {cubin.size() / 2, cubin.size() - 1, size_t{100}}) {
    EXPECT_EQ(kiln_cuda_module_load(cubin.data(), cut, 0, &m), KILN_ERROR_LOAD) << cut;
    EXPECT_NE(std::string(kiln_cuda_last_error()).find("truncated"), std::string::npos)
        << cut << ": " << kiln_cuda_last_error();
  }
  std::string other_machine = cubin;
  other_machine[18] = 62;
  EXPECT_EQ(kiln_cuda_module_load(other_machine.data(), other_machine.size(), 0, &m), KILN_ERROR_LOAD);
}

TEST_F(KilnCudaTest, ErrorsAreThreadLocal) {
  EXPECT_EQ(kiln_cuda_init(), KILN_ERROR_UNAVAILABLE);
  std::string other;
  std::thread t([&other] { other = kiln_cuda_last_error(); });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(kiln_cuda_last_error()), "");
}

}  // namespace
