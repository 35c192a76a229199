#ifndef KILN_SERVER_COMPILER_TEST_EXECUTOR_H_
#define KILN_SERVER_COMPILER_TEST_EXECUTOR_H_

// Test helper: a C++ executor of kiln.v1.Plan with exactly the semantics documented in
// server/lower/plan_builder.h (what the Python client implements), over host tensors. Kernel
// steps run through the runtime (runtime/kiln_runtime.h); aten steps through a callback; library
// GEMM steps (server/lower/gemm_step.h) naively here, with f64 accumulation.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/compiler.pb.h"

namespace kiln::compiler::testing {

struct HostTensor {
  ::kiln::v1::DType dtype = ::kiln::v1::DTYPE_FLOAT32;
  std::vector<int64_t> sizes, strides;
  std::shared_ptr<std::vector<uint8_t>> storage;
  int64_t offset = 0;  // elements

  int64_t numel() const;
  int64_t itemsize() const;
  uint8_t* data() const { return storage->data() + offset * itemsize(); }
  // Logical (row-major) element k as double (f32, f64, bf16, i64, i32, b8/u8).
  double Get(int64_t k) const;
  void Set(int64_t k, double v);
};

HostTensor Empty(::kiln::v1::DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides = {});
HostTensor FromMeta(const ::kiln::v1::TensorMeta& meta);
std::vector<double> Values(const HostTensor& t);

using AtenFn = std::function<absl::StatusOr<std::vector<HostTensor>>(const ::kiln::v1::AtenStep& step,
                                                                     const std::vector<HostTensor>& values)>;

// Runs the plan; returns the graph outputs (an empty HostTensor for None).
absl::StatusOr<std::vector<HostTensor>> RunPlan(const ::kiln::v1::Artifact& artifact,
                                                const std::vector<HostTensor>& inputs, const AtenFn& aten);

// The value an AtenStep argument names ("v<i>"), or -1.
int32_t ArgValue(const ::kiln::v1::Argument& a);

}  // namespace kiln::compiler::testing

#endif  // KILN_SERVER_COMPILER_TEST_EXECUTOR_H_
