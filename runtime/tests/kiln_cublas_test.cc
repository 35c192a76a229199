// The cuBLASLt half of the runtime on a machine without a GPU: parameter and buffer checks come
// before the library is needed, and a missing cuBLASLt is a clear KILN_ERROR_UNAVAILABLE naming the
// path tried. KILN_LIBCUBLASLT_PATH points at a file that does not exist, so the test means the
// same on machines that have cuBLASLt. GEMMs on a GPU: tests/gpu/test_cuda_backend.py.

#include "kiln_cublas.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

class KilnCublasTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("KILN_LIBCUBLASLT_PATH", "/nonexistent/libcublasLt.so.13", 1);
    setenv("KILN_LIBCUDA_PATH", "/nonexistent/libcuda.so.1", 1);
  }

  // mm of a contiguous [4, 8] and [8, 2] into a contiguous [4, 2] f32, with 1 MiB of workspace.
  static std::vector<int64_t> Mm() {
    return {1, 4, 2, 8, /*f32*/ 1, 0, 8, 1, 0, 2, 1, 0, 2, /*no C*/ 0, 0, 0, /*flags*/ 0, 1 << 20};
  }
};

TEST_F(KilnCublasTest, BadParamsAndBuffersAreRefusedBeforeTheLibraryIsNeeded) {
  float d[8], a[32], b[16];
  char ws[16];
  void* buffers[5] = {d, a, b, nullptr, ws};
  std::vector<int64_t> p = Mm();
  EXPECT_EQ(kiln_cublas_matmul(0, p.data(), 17, 1.0, 0.0, buffers, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_cublas_last_error()).find("18"), std::string::npos) << kiln_cublas_last_error();
  EXPECT_EQ(kiln_cublas_matmul(0, nullptr, 18, 1.0, 0.0, buffers, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  p[6] = 7;  // A's leading dimension < k
  EXPECT_EQ(kiln_cublas_matmul(0, p.data(), 18, 1.0, 0.0, buffers, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_cublas_last_error()).find("layout of A"), std::string::npos);
  p = Mm();
  p[4] = 2;  // f64
  EXPECT_EQ(kiln_cublas_matmul(0, p.data(), 18, 1.0, 0.0, buffers, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  p = Mm();
  p[13] = 1;  // a bias, but no C buffer
  EXPECT_EQ(kiln_cublas_matmul(0, p.data(), 18, 1.0, 1.0, buffers, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_cublas_last_error()).find("buffers"), std::string::npos);
  p = Mm();
  p[0] = 2;  // batched, with batch strides of 0
  EXPECT_EQ(kiln_cublas_matmul(0, p.data(), 18, 1.0, 0.0, buffers, nullptr), KILN_ERROR_INVALID_ARGUMENT);
}

TEST_F(KilnCublasTest, WithoutCublasLtItSaysWhatWasTried) {
  size_t version = 0;
  EXPECT_EQ(kiln_cublas_init(&version), KILN_ERROR_UNAVAILABLE);
  const std::string message = kiln_cublas_last_error();
  EXPECT_NE(message.find("/nonexistent/libcublasLt.so.13"), std::string::npos) << message;
  EXPECT_NE(message.find("KILN_LIBCUBLASLT_PATH"), std::string::npos) << message;
  float d[8], a[32], b[16];
  char ws[16];
  void* buffers[5] = {d, a, b, nullptr, ws};
  const std::vector<int64_t> p = Mm();
  EXPECT_EQ(kiln_cublas_matmul(0, p.data(), 18, 1.0, 0.0, buffers, nullptr), KILN_ERROR_UNAVAILABLE);
  EXPECT_EQ(kiln_cublas_init(nullptr), KILN_ERROR_UNAVAILABLE);  // stays unavailable, no crash
}

}  // namespace
