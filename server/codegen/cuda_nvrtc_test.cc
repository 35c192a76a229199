// Every canonical kernel (server/kernel/test_kernels.h), every golden one and a set of kernels
// that use every operation, type and thread layout compile with NVRTC for sm_80 and sm_90 into
// real cubins (ELF, EM_CUDA = 190). NVRTC is found through KILN_NVRTC_PATH; with
// KILN_REQUIRE_NVRTC=1 (CI) a missing NVRTC fails the test, otherwise it is skipped LOUDLY.

#include <stdlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_test_kernels.h"
#include "server/kernel/test_kernels.h"
#include "server/toolchain/nvrtc.h"
#include "server/toolchain/nvrtc_testing.h"

namespace kiln::codegen {
namespace {

using namespace ::kiln::kernel;  // NOLINT: tests build IR
namespace kt = ::kiln::kernel::testing;
using namespace ::kiln::codegen::testing;  // NOLINT

using ::kiln::toolchain::testing::ElfMachine;
using ::kiln::toolchain::testing::HaveNvrtc;

toolchain::NvrtcOptions Options() { return toolchain::testing::TestNvrtcOptions(); }

std::vector<std::pair<std::string, absl::StatusOr<Kernel>>> AllKernels() {
  std::vector<std::pair<std::string, absl::StatusOr<Kernel>>> k;
  k.emplace_back("broadcast_add_transposed", kt::BroadcastAddTransposed(64, 1024));
  k.emplace_back("broadcast_add_odd", kt::BroadcastAddTransposed(3, 5));
  k.emplace_back("softmax_1024", kt::RowSoftmax(1024, false));
  k.emplace_back("softmax_1000", kt::RowSoftmax(1000, false));
  k.emplace_back("log_softmax_8192", kt::RowSoftmax(8192, true));
  k.emplace_back("softmax_100000", kt::RowSoftmax(100000, false));
  k.emplace_back("layer_norm_768", kt::LayerNorm(768, 1e-5f));
  k.emplace_back("layer_norm_4096", kt::LayerNorm(4096, 1e-5f));
  k.emplace_back("column_sum", kt::ColumnSum(4096, 512));
  k.emplace_back("channels_last_partials", ChannelsLastPartials(3136, 64));
  k.emplace_back("layer_norm_weight_grad", kt::LayerNormWeightGrad(8, 512, 768));
  k.emplace_back("bf16_chain", kt::Bf16Chain(1 << 20));
  k.emplace_back("bf16_chain_odd", kt::Bf16Chain(1001));
  for (ScalarType t : {ScalarType::kBool, ScalarType::kInt8, ScalarType::kUInt8, ScalarType::kInt32,
                       ScalarType::kInt64, ScalarType::kFloat32, ScalarType::kFloat64}) {
    k.emplace_back(absl::StrCat("every_op_", ScalarTypeName(t)), EveryOp(t, 1000));
  }
  k.emplace_back("every_acc_f32", EveryAccumulator(ScalarType::kFloat32, false, 4, 8));
  k.emplace_back("every_acc_f64_dyn", EveryAccumulator(ScalarType::kFloat64, true, 30, 70));
  k.emplace_back("every_acc_i32", EveryAccumulator(ScalarType::kInt32, true, 2, 1000));
  k.emplace_back("every_acc_i8", EveryAccumulator(ScalarType::kInt8, false, 3, 3));
  k.emplace_back("full_sum", FullSum(1 << 20));
  k.emplace_back("dynamic_in_place", DynamicInPlace());
  // Long rows: clusters on sm_90 (cached, odd and bf16, Welford, split sums), one block on sm_80.
  k.emplace_back("softmax_65536", kt::RowSoftmax(65536, false));
  k.emplace_back("log_softmax_262144", kt::RowSoftmax(262144, true));
  k.emplace_back("softmax_bf16_50257", kt::RowSoftmaxBf16(50257));
  k.emplace_back("layer_norm_65536", kt::LayerNorm(65536, 1e-5f));
  k.emplace_back("layer_norm_bf16_50257", kt::LayerNormBf16(50257, 1e-5f));
  k.emplace_back("rms_norm_bf16_131072", kt::RmsNorm(131072, 1e-6f, true));
  k.emplace_back("row_sum_64x262144", kt::RowSum(64, 262144, false));
  k.emplace_back("row_sum_bf16_1x1m", kt::RowSum(1, 1 << 20, true));
  k.emplace_back("every_acc_f32_few_long", EveryAccumulator(ScalarType::kFloat32, false, 64, 1024));
  return k;
}

TEST(CudaNvrtc, EveryKernelCompilesForSm80AndSm90) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  std::vector<Kernel> kernels;
  std::vector<std::string> names;
  for (auto& [name, k] : AllKernels()) {
    ASSERT_TRUE(k.ok()) << name << ": " << k.status();
    kernels.push_back(*k);
    names.push_back(name);
  }
  // One source with every kernel (a graph), for each arch (sm_90 has cluster kernels).
  for (const char* arch : {"sm_80", "sm_90"}) {
    CudaEmitOptions emit;
    emit.arch = arch;
    absl::StatusOr<CudaSource> all = EmitCudaSource(kernels, emit);
    ASSERT_TRUE(all.ok()) << all.status();
    absl::StatusOr<toolchain::CudaBinary> bin =
        toolchain::CompileCuda(all->source, arch, /*ptx=*/false, Options());
    ASSERT_TRUE(bin.ok()) << arch << ": " << bin.status();
    EXPECT_EQ(bin->bytes.substr(0, 4), "\x7f" "ELF") << arch;
    EXPECT_EQ(ElfMachine(bin->bytes), 190) << arch << " (EM_CUDA)";
    for (const std::string& symbol : all->symbols) {
      EXPECT_TRUE(absl::StrContains(bin->bytes, symbol)) << arch << " " << symbol;
    }
    fprintf(stderr, "%s: %zu kernels, %zu-byte cubin, %.0f ms\n", arch, kernels.size(),
            bin->bytes.size(), absl::ToDoubleMilliseconds(bin->elapsed));
  }
}

// `kernels` with the long-row layout `how` forced, emitted and compiled by NVRTC for sm_80 and
// sm_90: every kernel takes kSharedRow, `check` sees each arch's source, the cubins are CUDA ELF.
void CompileSharedRows(const std::vector<absl::StatusOr<Kernel>>& built, CudaLongRows how,
                       absl::FunctionRef<void(const std::string& arch, const CudaSource&)> check) {
  std::vector<Kernel> kernels;
  for (const absl::StatusOr<Kernel>& k : built) {
    ASSERT_TRUE(k.ok()) << k.status();
    kernels.push_back(*k);
  }
  for (const char* arch : {"sm_80", "sm_90"}) {
    CudaEmitOptions emit;
    emit.arch = arch;
    emit.long_rows = how;
    absl::StatusOr<CudaSource> all = EmitCudaSource(kernels, emit);
    ASSERT_TRUE(all.ok()) << all.status();
    for (size_t i = 0; i < kernels.size(); ++i) {
      EXPECT_EQ(all->launches[i].layout, CudaLayout::kSharedRow) << arch << " kernel " << i;
    }
    check(arch, *all);
    absl::StatusOr<toolchain::CudaBinary> bin =
        toolchain::CompileCuda(all->source, arch, /*ptx=*/false, Options());
    ASSERT_TRUE(bin.ok()) << arch << ": " << bin.status();
    EXPECT_EQ(ElfMachine(bin->bytes), 190) << arch << " (EM_CUDA)";
    fprintf(stderr, "%s: %zu shared-row kernels, %zu-byte cubin, %.0f ms\n", arch, kernels.size(),
            bin->bytes.size(), absl::ToDoubleMilliseconds(bin->elapsed));
  }
}

// Rows cached in dynamic shared memory (kSharedRow, forced on both archs; sm_90 picks it for the
// bf16 50257 rows by default): f32 and bf16 slots, shifted vectors, Welford, log_softmax, and
// sliced rows' stores through windows of the cache at the output's alignment.
TEST(CudaNvrtc, SharedRowKernelsCompileForSm80AndSm90) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  CompileSharedRows({kt::RowSoftmaxBf16(50257), kt::LayerNormBf16(50257, 1e-5f), kt::RowSoftmax(32768, true),
                     kt::RowSoftmax(40000, false), kt::RmsNorm(65536, 1e-6f, true), kt::LayerNorm(20000, 1e-5f),
                     SlicedRowSoftmax(ScalarType::kBFloat16, 50257), SlicedRowSoftmax(ScalarType::kFloat32, 20001)},
                    CudaLongRows::kShared, [](const std::string& arch, const CudaSource& all) {
                      for (size_t i = 0; i < all.launches.size(); ++i) {
                        EXPECT_GT(all.launches[i].shared_bytes, 48 * 1024) << arch << " kernel " << i;
                        EXPECT_LE(all.launches[i].shared_bytes, arch == "sm_80" ? 163 * 1024 : 227 * 1024);
                        EXPECT_EQ(absl::StrContains(all.kernel_sources[i], "kiln_cuda::window("), i >= 6)
                            << arch << " kernel " << i;
                      }
                    });
}

// Two row caches a block (kSharedPrefetch, forced): the next row's fill in flight (sm_80:
// cp.async commit groups; sm_90: bulk copies on mbarriers), shifted vectors (odd lengths),
// Welford and softmax, sliced rows.
TEST(CudaNvrtc, SharedRowKernelsWithTheNextRowPrefetchedCompileForSm80AndSm90) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  CompileSharedRows({kt::RowSoftmaxBf16(20001), kt::LayerNormBf16(30001, 1e-5f), kt::RowSoftmax(12000, true),
                     kt::RmsNorm(24576, 1e-6f, true), SlicedRowSoftmax(ScalarType::kBFloat16, 20001),
                     SlicedRowSoftmax(ScalarType::kFloat32, 12001)},
                    CudaLongRows::kSharedPrefetch, [](const std::string& arch, const CudaSource& all) {
                      const bool sm90 = arch == "sm_90";
                      EXPECT_EQ(absl::StrContains(all.source, "kiln_cuda::cp_async_commit();"), !sm90) << arch;
                      EXPECT_EQ(absl::StrContains(all.source, "kiln_cuda::bulk_copy(&"), sm90) << arch;
                      EXPECT_EQ(absl::StrContains(all.source, "kiln_cuda::mbar_wait(kiln_bars"), sm90) << arch;
                    });
}

TEST(CudaNvrtc, TheHelpersAloneCompile) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  absl::StatusOr<CudaSource> none = EmitCudaSource({});
  ASSERT_TRUE(none.ok());
  absl::StatusOr<toolchain::CudaBinary> bin =
      toolchain::CompileCuda(none->source, "sm_90", /*ptx=*/true, Options());
  ASSERT_TRUE(bin.ok()) << bin.status();
}

}  // namespace
}  // namespace kiln::codegen
