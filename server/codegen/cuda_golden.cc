#include "server/codegen/cuda_golden.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "server/kernel/verifier.h"

namespace kiln::codegen::testing {

std::string EmitOne(const absl::StatusOr<kernel::Kernel>& k, bool vectorize, CudaLaunch* launch,
                    bool tile, CudaLongRows long_rows) {
  EXPECT_TRUE(k.ok()) << k.status();
  if (!k.ok()) return "";
  EXPECT_TRUE(kernel::VerifyKernel(*k).ok());
  CudaEmitOptions options;
  options.long_rows = long_rows;
  options.include_prelude = false;
  options.vectorize = vectorize;
  options.tile = tile;
  absl::StatusOr<CudaSource> src = EmitCudaSource({*k}, options);
  EXPECT_TRUE(src.ok()) << src.status();
  if (!src.ok()) return "";
  if (std::getenv("KILN_PRINT_GOLDEN") != nullptr) {
    std::cerr << "==== golden\n" << src->kernel_sources[0] << "==== end\n";
  }
  if (launch != nullptr) *launch = src->launches[0];
  return src->kernel_sources[0];
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace kiln::codegen::testing
