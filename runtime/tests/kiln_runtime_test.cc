#include "kiln_runtime.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/toolchain/compiler.h"

namespace {

constexpr char kSource[] = R"(
#include <cstdint>
extern "C" __attribute__((visibility("default"))) void kiln_kernel_0(void* const* buffers, const int64_t* scalars) {
  int64_t* out = static_cast<int64_t*>(buffers[0]);
  for (int64_t i = 0; i < scalars[1]; ++i) out[i] = i * scalars[0];
}
extern "C" __attribute__((visibility("default"))) void kiln_kernel_1(void* const* buffers, const int64_t* scalars) {
  int64_t* out = static_cast<int64_t*>(buffers[0]);
  for (int64_t i = 0; i < scalars[0]; ++i) out[i] += 1;
}
)";

class RuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<kiln::toolchain::CompiledBinary> b =
        kiln::toolchain::CompileSharedObject(kSource, kiln::toolchain::CompileOptions());
    ASSERT_TRUE(b.ok()) << b.status();
    bytes_ = new std::string(b->bytes);
  }
  static std::string* bytes_;
};
std::string* RuntimeTest::bytes_ = nullptr;

TEST_F(RuntimeTest, LoadsFromBytesAndRunsStepsInOneCall) {
  kiln_module* m = nullptr;
  ASSERT_EQ(kiln_module_load(bytes_->data(), bytes_->size(), &m), KILN_OK) << kiln_last_error();
  int32_t k0 = -1, k1 = -1, again = -1;
  ASSERT_EQ(kiln_module_add_kernel(m, "kiln_kernel_0", &k0), KILN_OK);
  ASSERT_EQ(kiln_module_add_kernel(m, "kiln_kernel_1", &k1), KILN_OK);
  ASSERT_EQ(kiln_module_add_kernel(m, "kiln_kernel_0", &again), KILN_OK);
  EXPECT_EQ(k0, 0);
  EXPECT_EQ(k1, 1);
  EXPECT_EQ(again, 0);
  int32_t count = 0;
  ASSERT_EQ(kiln_module_num_kernels(m, &count), KILN_OK);
  EXPECT_EQ(count, 2);
  std::vector<int64_t> out(5, -7);
  void* buffers[] = {out.data()};
  const int64_t s0[] = {3, 5};
  const int64_t s1[] = {5};
  const kiln_step steps[] = {{k0, 0, buffers, s0}, {k1, 0, buffers, s1}, {k1, 0, buffers, s1}};
  ASSERT_EQ(kiln_run_steps(m, steps, 3), KILN_OK) << kiln_last_error();
  EXPECT_EQ(out, (std::vector<int64_t>{2, 5, 8, 11, 14}));
  EXPECT_EQ(kiln_module_unload(m), KILN_OK);
}

TEST_F(RuntimeTest, ModulesAreIndependent) {
  kiln_module* a = nullptr;
  kiln_module* b = nullptr;
  ASSERT_EQ(kiln_module_load(bytes_->data(), bytes_->size(), &a), KILN_OK);
  ASSERT_EQ(kiln_module_load(bytes_->data(), bytes_->size(), &b), KILN_OK);
  ASSERT_NE(a, b);
  int32_t ka = -1, kb = -1;
  ASSERT_EQ(kiln_module_add_kernel(a, "kiln_kernel_1", &ka), KILN_OK);
  ASSERT_EQ(kiln_module_unload(a), KILN_OK);
  ASSERT_EQ(kiln_module_add_kernel(b, "kiln_kernel_0", &kb), KILN_OK);
  std::vector<int64_t> out(2, 0);
  void* buffers[] = {out.data()};
  const int64_t s[] = {10, 2};
  ASSERT_EQ(kiln_run_kernel(b, kb, buffers, s), KILN_OK);
  EXPECT_EQ(out[1], 10);
  EXPECT_EQ(kiln_module_unload(b), KILN_OK);
}

TEST_F(RuntimeTest, BadInputIsAnErrorNotACrash) {
  kiln_module* m = nullptr;
  EXPECT_EQ(kiln_module_load(nullptr, 10, &m), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(kiln_last_error(), "null"));
  EXPECT_EQ(kiln_module_load(bytes_->data(), bytes_->size(), nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_module_load("garbage garbage", 15, &m), KILN_ERROR_LOAD);
  const std::string truncated = bytes_->substr(0, bytes_->size() / 3);
  EXPECT_EQ(kiln_module_load(truncated.data(), truncated.size(), &m), KILN_ERROR_LOAD);
  EXPECT_EQ(m, nullptr);
  EXPECT_TRUE(absl::StrContains(kiln_last_error(), "truncated")) << kiln_last_error();
  // Every truncation length is refused without a crash.
  for (size_t len = 0; len < bytes_->size(); len += 97) {
    ASSERT_EQ(kiln_module_load(bytes_->data(), len, &m), KILN_ERROR_LOAD) << len;
  }
  // A corrupt but complete file: dlopen's own error comes back.
  std::string corrupt = *bytes_;
  std::memset(&corrupt[64], 0xff, 512);
  const int rc = kiln_module_load(corrupt.data(), corrupt.size(), &m);
  EXPECT_NE(rc, KILN_OK);
  if (rc == KILN_OK) kiln_module_unload(m);
  m = nullptr;

  ASSERT_EQ(kiln_module_load(bytes_->data(), bytes_->size(), &m), KILN_OK);
  int32_t k = -1;
  EXPECT_EQ(kiln_module_add_kernel(m, "no_such_kernel", &k), KILN_ERROR_NOT_FOUND);
  EXPECT_EQ(kiln_module_add_kernel(m, nullptr, &k), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_module_add_kernel(nullptr, "kiln_kernel_0", &k), KILN_ERROR_INVALID_ARGUMENT);
  const kiln_step bad[] = {{0, 0, nullptr, nullptr}};  // no kernel registered yet
  EXPECT_EQ(kiln_run_steps(m, bad, 1), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_run_steps(m, nullptr, 1), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_run_steps(m, nullptr, 0), KILN_OK);
  EXPECT_EQ(kiln_run_steps(nullptr, bad, 1), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_module_unload(m), KILN_OK);
  EXPECT_EQ(kiln_module_unload(nullptr), KILN_OK);
}

}  // namespace
