#include "server/toolchain/nvrtc.h"

#include <stdlib.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/toolchain/nvrtc_testing.h"

namespace kiln::toolchain {
namespace {

constexpr char kSaxpy[] = R"(
extern "C" __global__ void kiln_saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

// The worker from runfiles, NVRTC from KILN_NVRTC_PATH; a missing NVRTC fails under
// KILN_REQUIRE_NVRTC=1 (CI) and is skipped loudly otherwise (nvrtc_testing.h).
NvrtcOptions Options() { return testing::TestNvrtcOptions(); }
using testing::ElfMachine;
using testing::HaveNvrtc;

TEST(NvrtcTest, ReportsItsVersion) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  absl::StatusOr<std::string> v = NvrtcVersion(Options());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(absl::StartsWith(*v, "1")) << *v;
  EXPECT_TRUE(absl::StrContains(*v, ".")) << *v;
}

TEST(NvrtcTest, CompilesCubinsForGpusThisMachineDoesNotHave) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  std::string previous;
  for (const char* arch : {"sm_80", "sm_90"}) {
    absl::StatusOr<CudaBinary> bin = CompileCuda(kSaxpy, arch, /*ptx=*/false, Options());
    ASSERT_TRUE(bin.ok()) << arch << ": " << bin.status();
    ASSERT_GT(bin->bytes.size(), 64u);
    EXPECT_EQ(bin->bytes.substr(0, 4), "\x7f" "ELF") << arch;
    EXPECT_EQ(ElfMachine(bin->bytes), 190) << arch << " (EM_CUDA)";
    EXPECT_TRUE(absl::StrContains(bin->bytes, "kiln_saxpy")) << arch;
    EXPECT_NE(bin->bytes, previous) << "sm_80 and sm_90 cubins must differ";
    previous = bin->bytes;
  }
}

TEST(NvrtcTest, EmitsPtxOnRequest) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  absl::StatusOr<CudaBinary> bin = CompileCuda(kSaxpy, "sm_90", /*ptx=*/true, Options());
  ASSERT_TRUE(bin.ok()) << bin.status();
  EXPECT_TRUE(bin->ptx);
  EXPECT_TRUE(absl::StrContains(bin->bytes, ".target sm_90")) << bin->bytes.substr(0, 400);
  EXPECT_TRUE(absl::StrContains(bin->bytes, ".entry kiln_saxpy"));
}

TEST(NvrtcTest, ASourceErrorIsInternalWithTheLog) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  absl::StatusOr<CudaBinary> bin =
      CompileCuda("__global__ void k() { undeclared_name = 1; }", "sm_90", false, Options());
  ASSERT_FALSE(bin.ok());
  EXPECT_EQ(bin.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(bin.status().message(), "undeclared_name")) << bin.status();
}

TEST(NvrtcTest, RefusesArchitecturesThatAreNotPlainTokens) {
  for (const char* bad : {"compute_90", "sm_9", "sm_90 --ptxas-options=-v", "sm_x0", "", "sm_1000"}) {
    absl::StatusOr<CudaBinary> bin = CompileCuda(kSaxpy, bad, false, Options());
    ASSERT_FALSE(bin.ok()) << bad;
    EXPECT_EQ(bin.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(ValidateCudaArch("sm_90a").ok());
  EXPECT_TRUE(ValidateCudaArch("sm_100").ok());
}

TEST(NvrtcTest, LimitsAndAMissingLibraryGiveClearErrors) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  NvrtcOptions fast = Options();
  fast.timeout = absl::Milliseconds(1);
  absl::StatusOr<CudaBinary> late = CompileCuda(kSaxpy, "sm_90", false, fast);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();

  NvrtcOptions missing = Options();
  missing.library = "/nonexistent/libnvrtc.so.13";
  absl::StatusOr<CudaBinary> none = CompileCuda(kSaxpy, "sm_90", false, missing);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "nvidia-cuda-nvrtc")) << none.status();
}

TEST(NvrtcTest, CompilesInParallelProcesses) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([i, &results] {
      std::string src = absl::StrCat(kSaxpy, "\n// variant ", i, "\n");
      results[i] = CompileCuda(src, i % 2 ? "sm_80" : "sm_90", false, Options()).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace kiln::toolchain
