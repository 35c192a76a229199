#include "server/compiler/test_util.h"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <random>
#include <utility>

#include "gtest/gtest.h"
#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"

namespace kiln::compiler::testing {

namespace v1 = ::kiln::v1;


v1::ValueMeta C32(std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset) {
  return ::kiln::graph::testing::T(v1::DTYPE_FLOAT32, std::move(sizes), std::move(strides), v1::DEVICE_KIND_CPU, offset);
}

absl::StatusOr<Compiled> CompileGraph(const v1::Graph& g, bool disable_fusion, CpuCompilerOptions options) {
  v1::CompileRequest req = ::kiln::graph::testing::Request(g);
  req.mutable_target()->Clear();
  req.mutable_target()->set_device(v1::DEVICE_KIND_CPU);
  req.mutable_target()->set_cpu_isa("x86-64");
  req.mutable_options()->set_disable_fusion(disable_fusion);
  auto prepared = ::kiln::graph::PrepareGraph(req, ::kiln::graph::GraphLimits(), ::kiln::graph::CompilerIdentity());
  if (!prepared.ok()) return prepared.status();
  CpuGraphCompiler compiler(options);
  auto r = compiler.Compile(*prepared, req);
  if (!r.ok()) return r.status();
  Compiled c;
  c.result = std::move(*r);
  for (const auto& s : c.result.artifact.plan().steps()) {
    c.kernels += s.has_kernel();
    c.aten += s.has_aten();
  }
  return c;
}

HostTensor Random(std::vector<int64_t> sizes, std::vector<int64_t> strides, unsigned seed) {
  HostTensor t = Empty(v1::DTYPE_FLOAT32, std::move(sizes), std::move(strides));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  for (int64_t k = 0; k < t.numel(); ++k) t.Set(k, d(rng));
  return t;
}

// mm / addmm in float64 over logical indices.
absl::StatusOr<std::vector<HostTensor>> Aten(const v1::AtenStep& st, const std::vector<HostTensor>& values) {
  auto arg = [&](int i) { return values.at(ArgValue(st.args(i))); };
  if (st.target() == "aten.mm.default" || st.target() == "aten.addmm.default") {
    const bool add = st.target() == "aten.addmm.default";
    const HostTensor a = arg(add ? 1 : 0), b = arg(add ? 2 : 1);
    const int64_t m = a.sizes[0], kk = a.sizes[1], n = b.sizes[1];
    HostTensor out = Empty(v1::DTYPE_FLOAT32, {m, n});
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < kk; ++p) s += a.Get(i * kk + p) * b.Get(p * n + j);
        if (add) {
          const HostTensor bias = arg(0);
          s += bias.Get(bias.numel() == n ? j : i * n + j);
        }
        out.Set(i * n + j, s);
      }
    }
    return std::vector<HostTensor>{out};
  }
  return absl::UnimplementedError(st.target());
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
  }
}


std::vector<double> MatMul(const std::vector<double>& a, const std::vector<double>& b, int m, int k, int n) {
  std::vector<double> c(m * n, 0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      for (int p = 0; p < k; ++p) c[i * n + j] += a[i * k + p] * b[p * n + j];
    }
  }
  return c;
}

std::vector<double> Transpose(const std::vector<double>& a, int m, int n) {
  std::vector<double> t(m * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) t[j * m + i] = a[i * n + j];
  }
  return t;
}


float RoundBf16(float f) {
  HostTensor t = Empty(v1::DTYPE_BFLOAT16, {1});
  t.Set(0, f);
  return static_cast<float>(t.Get(0));
}


std::vector<std::pair<std::string, ::kiln::v1::CompileRequest>> CapturedRequests() {
  const std::string dir = "server/graph/testdata/";
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 6 && name.compare(name.size() - 6, 6, ".binpb") == 0) files.push_back(name);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  std::vector<std::pair<std::string, ::kiln::v1::CompileRequest>> out;
  for (const std::string& f : files) {
    std::ifstream in(dir + f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    ::kiln::v1::CompileRequest req;
    EXPECT_TRUE(req.ParseFromString(ss.str())) << f;
    out.emplace_back(f, std::move(req));
  }
  return out;
}

}  // namespace kiln::compiler::testing
