#ifndef KILN_SERVER_COMPILER_TEST_UTIL_H_
#define KILN_SERVER_COMPILER_TEST_UTIL_H_

// Helpers shared by the end-to-end compiler tests: compile a graph for the CPU, random inputs,
// a C++ reference for the extern steps (mm, addmm), and comparisons at float32 tolerance.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/graph.pb.h"
#include "server/compiler/cpu_compiler.h"
#include "server/compiler/test_executor.h"

namespace kiln::compiler::testing {

// f32 metadata on the CPU; empty strides = contiguous.
::kiln::v1::ValueMeta C32(std::vector<int64_t> sizes, std::vector<int64_t> strides = {}, int64_t offset = 0);

struct Compiled {
  CompileResult result;
  int kernels = 0, aten = 0;  // kernel and aten steps in the plan
};

// PrepareGraph + CpuGraphCompiler::Compile for target cpu "x86-64".
absl::StatusOr<Compiled> CompileGraph(const ::kiln::v1::Graph& g, bool disable_fusion = false,
                                      CpuCompilerOptions options = CpuCompilerOptions());

HostTensor Random(std::vector<int64_t> sizes, std::vector<int64_t> strides = {}, unsigned seed = 1);

// mm / addmm in float64 over logical indices (an AtenFn for RunPlan).
absl::StatusOr<std::vector<HostTensor>> Aten(const ::kiln::v1::AtenStep& st, const std::vector<HostTensor>& values);

// |got - want| <= tol * (1 + |want|) elementwise (gtest assertions).
void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-5);

std::vector<double> MatMul(const std::vector<double>& a, const std::vector<double>& b, int m, int k, int n);
std::vector<double> Transpose(const std::vector<double>& a, int m, int n);
float RoundBf16(float f);

// Every captured request of server/graph/testdata (*.binpb, data "//server/graph:testdata_graphs"),
// sorted by file name, with that name; a file that does not parse is a test failure.
std::vector<std::pair<std::string, ::kiln::v1::CompileRequest>> CapturedRequests();

}  // namespace kiln::compiler::testing

#endif  // KILN_SERVER_COMPILER_TEST_UTIL_H_
