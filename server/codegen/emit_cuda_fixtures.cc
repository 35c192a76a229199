// emit_cuda_fixtures: writes the inputs of the GPU check (tests/gpu/cuda_kernels_check.py):
// canonical kernels (server/kernel/test_kernels.h, plus two plain pointwise ones; among them the
// kernels of scripts/bench_gpu.py's real graphs) at sizes big enough to measure bandwidth, emitted by the CUDA emitter as one source, compiled by NVRTC into
// one cubin, and a JSON manifest saying for each kernel its symbol, launch (grid, block, shared
// bytes), scalars, buffers (dtype, shape, role) and what it computes.
//
//   KILN_NVRTC_PATH=.../libnvrtc.so.13 bazel run //server/codegen:emit_cuda_fixtures -- OUT_DIR
//       [--arch=sm_90] [--small] [--portable_clusters]
// OUT_DIR gets kernels_<arch>.cubin, kernels.cu and manifest.json. --small uses tiny sizes (tests).
// --portable_clusters keeps clusters within 8 blocks (CudaEmitOptions::max_small_cluster = 0), to
// compare against the default's 16-block clusters of 512-thread blocks.

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_test_kernels.h"
#include "server/kernel/test_kernels.h"
#include "server/toolchain/nvrtc.h"

namespace kiln::codegen {
namespace {

using namespace ::kiln::kernel;  // NOLINT
namespace kt = ::kiln::kernel::testing;
namespace ct = ::kiln::codegen::testing;

struct BufferSpec {
  std::string dtype;  // torch dtype name: "float32", "bfloat16"
  std::vector<int64_t> shape;
  std::string role;   // "in" or "out"
};

struct Fixture {
  std::string name;
  std::string op;      // what the check script computes with torch
  std::string params;  // extra JSON fields for the op, e.g. "\"eps\": 1e-05"
  absl::StatusOr<Kernel> kernel;
  std::vector<int64_t> scalars;
  std::vector<BufferSpec> buffers;
  CudaLongRows long_rows = CudaLongRows::kAuto;  // the layout of rows too long for a block
  int64_t grid = 0;                               // > 0: this grid instead of the launch's
};

// out = a + b, f32, n elements (the plainest pointwise kernel: 12 bytes per element).
absl::StatusOr<Kernel> AddF32(int64_t n) {
  KernelBuilder kb("add");
  const Size size = Size::Const(n);
  const Buffer a = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, size);
  const Buffer b = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, size);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, size);
  const Var i = kb.AddOuter(size);
  const Index idx = MakeIndex(Size(), {{i, Size::Const(1)}});
  kb.Add(Store(out, idx, Add(Load(a, idx), Load(b, idx))));
  return kb.Finish();
}

// Whether the fixture's kernel, forced to kSharedRow on `arch` (kShared, or kSharedPrefetch: two
// caches), gets it (its caches fit a block).
bool FitsSharedRows(const Fixture& f, const std::string& arch,
                    CudaLongRows how = CudaLongRows::kShared) {
  if (!f.kernel.ok()) return false;
  CudaEmitOptions options;
  options.arch = arch;
  options.include_prelude = false;
  options.long_rows = how;
  absl::StatusOr<CudaSource> src = EmitCudaSource({*f.kernel}, options);
  return src.ok() && src->launches[0].layout == CudaLayout::kSharedRow;
}

std::vector<Fixture> Fixtures(bool small, const std::string& arch) {
  const int64_t n = small ? 4099 : int64_t{64} << 20;
  const int64_t rows = small ? 37 : 65536;
  const int64_t big_rows = small ? 5 : 8192;
  const int64_t side = small ? 96 : 8192;
  std::vector<Fixture> f;
  f.push_back({"add_f32", "add", "", AddF32(n), {},
               {{"float32", {n}, "in"}, {"float32", {n}, "in"}, {"float32", {n}, "out"}}});
  f.push_back({"bf16_chain", "bf16_chain", "", kt::Bf16Chain(n), {},
               {{"bfloat16", {n}, "in"}, {"bfloat16", {n}, "in"}, {"bfloat16", {n}, "out"}}});
  f.push_back({"broadcast_add_transposed", "broadcast_add_transposed", "",
               kt::BroadcastAddTransposed(side, side), {},
               {{"float32", {side, side}, "in"}, {"float32", {side}, "in"},
                {"float32", {side, side}, "out"}}});
  f.push_back({"softmax_1024", "softmax", "", kt::RowSoftmax(1024, false), {rows},
               {{"float32", {rows, 1024}, "in"}, {"float32", {rows, 1024}, "out"}}});
  f.push_back({"log_softmax_8192", "log_softmax", "", kt::RowSoftmax(8192, true), {big_rows},
               {{"float32", {big_rows, 8192}, "in"}, {"float32", {big_rows, 8192}, "out"}}});
  // Long rows, one block per row kept in registers (Inductor reads such rows twice).
  const int64_t rows_16k = small ? 3 : 4096, rows_32k = small ? 2 : 2048;
  f.push_back({"softmax_16384", "softmax", "", kt::RowSoftmax(16384, false), {rows_16k},
               {{"float32", {rows_16k, 16384}, "in"}, {"float32", {rows_16k, 16384}, "out"}}});
  f.push_back({"softmax_32768", "softmax", "", kt::RowSoftmax(32768, false), {rows_32k},
               {{"float32", {rows_32k, 32768}, "in"}, {"float32", {rows_32k, 32768}, "out"}}});
  f.push_back({"layer_norm_1024", "layer_norm", "\"eps\": 1e-05", kt::LayerNorm(1024, 1e-5f),
               {rows},
               {{"float32", {rows, 1024}, "in"}, {"float32", {1024}, "in"}, {"float32", {1024}, "in"},
                {"float32", {rows, 1024}, "out"}, {"float32", {rows}, "out"},
                {"float32", {rows}, "out"}}});
  f.push_back({"column_sum", "column_sum", "", kt::ColumnSum(side, side), {},
               {{"float32", {side, side}, "in"}, {"float32", {side}, "out"}}});
  // A short column (grouped-query attention's backward sums 3 query heads a key head): a thread
  // per point.
  f.push_back({"column_sum_3_rows", "column_sum", "", kt::ColumnSum(3, int64_t{1} << 22), {},
               {{"float32", {3, int64_t{1} << 22}, "in"}, {"float32", {int64_t{1} << 22}, "out"}}});
  // The kernels of scripts/bench_gpu.py's real graphs (compile_graph --dump), at its sizes.
  f.push_back({"softmax_bf16_1024", "softmax", "", kt::RowSoftmaxBf16(1024), {rows},
               {{"bfloat16", {rows, 1024}, "in"}, {"bfloat16", {rows, 1024}, "out"}}});
  f.push_back({"layer_norm_bf16_1024", "layer_norm_out", "\"eps\": 1e-05", kt::LayerNormBf16(1024, 1e-5f),
               {rows},
               {{"bfloat16", {rows, 1024}, "in"}, {"bfloat16", {1024}, "in"}, {"bfloat16", {1024}, "in"},
                {"bfloat16", {rows, 1024}, "out"}}});
  f.push_back({"rms_norm_1024", "rms_norm", "\"eps\": 1e-06", kt::RmsNorm(1024, 1e-6f, false), {rows},
               {{"float32", {rows, 1024}, "in"}, {"float32", {1024}, "in"}, {"float32", {rows, 1024}, "out"}}});
  f.push_back({"rms_norm_bf16_1024", "rms_norm", "\"eps\": 1e-06", kt::RmsNorm(1024, 1e-6f, true), {rows},
               {{"bfloat16", {rows, 1024}, "in"}, {"bfloat16", {1024}, "in"},
                {"bfloat16", {rows, 1024}, "out"}}});
  f.push_back({"transpose_add_column_major", "add_transposed_rhs", "", kt::TransposeAddColumnMajor(side, side), {},
               {{"float32", {side, side}, "in"}, {"float32", {side, side}, "in"},
                {"float32", {side, side}, "out"}}});
  // Rows too long for one block's registers (sm_90: the registers of a thread-block cluster,
  // read once; sm_80: one block a row, read twice) and few long rows (split over a cluster). The
  // lengths of issue #7: a 50257 vocabulary (odd: scalar accesses), 65536, 131072, 262144.
  const int64_t vocab_rows = small ? 3 : 4096, few = small ? 2 : 64;
  const int64_t rows_64k = small ? 2 : 1024, rows_128k = small ? 2 : 512;
  auto rows_of = [](const char* name, const char* op, absl::StatusOr<Kernel> k, const char* dtype,
                    int64_t rows, int64_t cols) {
    return Fixture{name, op, "", std::move(k), {rows},
                   {{dtype, {rows, cols}, "in"}, {dtype, {rows, cols}, "out"}}};
  };
  f.push_back(rows_of("softmax_bf16_50257", "softmax", kt::RowSoftmaxBf16(50257), "bfloat16",
                      vocab_rows, 50257));
  f.push_back(rows_of("softmax_50257", "softmax", kt::RowSoftmax(50257, false), "float32",
                      vocab_rows, 50257));
  f.push_back(rows_of("softmax_65536", "softmax", kt::RowSoftmax(65536, false), "float32", rows_64k,
                      65536));
  f.push_back(rows_of("softmax_bf16_65536", "softmax", kt::RowSoftmaxBf16(65536), "bfloat16",
                      rows_64k, 65536));
  f.push_back(rows_of("log_softmax_131072", "log_softmax", kt::RowSoftmax(131072, true), "float32",
                      rows_128k, 131072));
  f.push_back(rows_of("softmax_262144", "softmax", kt::RowSoftmax(262144, false), "float32", few,
                      262144));
  f.push_back(rows_of("log_softmax_262144", "log_softmax", kt::RowSoftmax(262144, true), "float32",
                      few, 262144));
  f.push_back(rows_of("softmax_bf16_262144", "softmax", kt::RowSoftmaxBf16(262144), "bfloat16", few,
                      262144));
  f.push_back({"layer_norm_bf16_50257", "layer_norm_out", "\"eps\": 1e-05",
               kt::LayerNormBf16(50257, 1e-5f), {rows_64k},
               {{"bfloat16", {rows_64k, 50257}, "in"}, {"bfloat16", {50257}, "in"},
                {"bfloat16", {50257}, "in"}, {"bfloat16", {rows_64k, 50257}, "out"}}});
  // Each long-row shape with both layouts forced, side by side with what the emitter picks:
  // <name>_l2 one uncached block per row (pass 2 from L2, grid capped to whole blocks per SM
  // whose rows fit kL2RowBytes), <name>_cl a cluster caching the row. For the shapes where one
  // row per SM fits the L2, the _l2 kernel with the other grid too: <name>_l2g2 two blocks per
  // SM where the cap gives one, <name>_l2g1 one per SM where it gives two (bf16 50257).
  // <name>_sm: one block per row caching it in dynamic shared memory (kSharedRow), for the shapes
  // whose cache fits a block (bf16 50257 and layer norm: 104 KiB, two blocks per SM; f32 50257
  // and bf16 65536: one per SM); softmax_bf16_50257_sm1 the same with one block per SM.
  // <name>_smp: kSharedPrefetch, two caches in one block per SM, the block's next row filled by
  // bulk copies while this one reduces and stores (where both fit: bf16 50257 softmax and layer
  // norm; softmax_bf16_50257 itself takes it by default, layer norm keeps one cache).
  const std::set<std::string> long_rows = {
      "softmax_bf16_50257", "softmax_50257",      "softmax_65536",       "softmax_bf16_65536",
      "log_softmax_131072", "softmax_262144",     "log_softmax_262144",  "softmax_bf16_262144",
      "layer_norm_bf16_50257"};
  const std::map<std::string, int64_t> other_grid = {
      {"softmax_50257", 264}, {"softmax_65536", 264}, {"softmax_bf16_50257", 132},
      {"softmax_bf16_65536", 264}};  // H200: 132 SMs
  for (size_t i = 0, end = f.size(); i < end; ++i) {
    if (!long_rows.count(f[i].name)) continue;
    const Fixture base = f[i];
    Fixture l2 = base, cl = base;
    l2.name += "_l2";
    l2.long_rows = CudaLongRows::kBlockPerRow;
    cl.name += "_cl";
    cl.long_rows = CudaLongRows::kCluster;
    f.push_back(l2);
    f.push_back(cl);
    if (FitsSharedRows(base, arch)) {
      Fixture sm = base;
      sm.name += "_sm";
      sm.long_rows = CudaLongRows::kShared;
      f.push_back(sm);
      if (base.name == "softmax_bf16_50257" && !small) {
        sm.name += "1";
        sm.grid = 132;  // H200: 132 SMs
        f.push_back(sm);
      }
    }
    if (FitsSharedRows(base, arch, CudaLongRows::kSharedPrefetch)) {
      Fixture smp = base;  // two caches, one block per SM: the next row's loads in flight
      smp.name += "_smp";
      smp.long_rows = CudaLongRows::kSharedPrefetch;
      f.push_back(smp);
    }
    if (auto g = other_grid.find(base.name); g != other_grid.end() && !small) {
      Fixture regrid = l2;
      regrid.name = absl::StrCat(base.name, "_l2g", g->second / 132);
      regrid.grid = g->second;
      f.push_back(regrid);
    }
  }
  f.push_back({"row_sum_64x262144", "row_sum", "", kt::RowSum(few, 262144, false), {},
               {{"float32", {few, 262144}, "in"}, {"float32", {few}, "out"}}});
  f.push_back({"row_sum_bf16_64x262144", "row_sum", "", kt::RowSum(few, 262144, true), {},
               {{"bfloat16", {few, 262144}, "in"}, {"bfloat16", {few}, "out"}}});
  const int64_t full = small ? 70000 : int64_t{1} << 26;
  f.push_back({"full_sum_64m", "row_sum", "", kt::RowSum(1, full, false), {},
               {{"float32", {1, full}, "in"}, {"float32", {1}, "out"}}});
  // What lowering now makes of x.sum() over 64M f32 (server/lower/lower_split.cc): 8192 partial
  // sums of 8192 elements (the whole GPU), then the sum of the partials; their times add up.
  const int64_t parts = small ? 7 : 8192, part = small ? 1000 : 8192;
  f.push_back({"full_sum_64m_partials", "row_sum", "", kt::RowSum(parts, part, false), {},
               {{"float32", {parts, part}, "in"}, {"float32", {parts}, "out"}}});
  f.push_back({"full_sum_64m_combine", "row_sum", "", kt::RowSum(1, parts, false), {},
               {{"float32", {1, parts}, "in"}, {"float32", {1}, "out"}}});
  // A GPT attention backward's q, k, v gradients into its fused projection's (B8 T512 d768): the
  // transposed k staged through a shared tile under its cat mask.
  const int64_t cat_n = small ? 2 : 8, cat_t = small ? 40 : 512, cat_c = small ? 70 : 768;
  f.push_back({"cat_transposed_bf16", "cat_transposed", "", ct::CatTransposedBf16(cat_t, cat_c),
               {cat_n},
               {{"bfloat16", {cat_n, cat_t, cat_c}, "in"},
                {"bfloat16", {cat_n, cat_c, cat_t}, "in"},
                {"bfloat16", {cat_n, cat_t, cat_c}, "in"},
                {"bfloat16", {cat_n, cat_t, 3 * cat_c}, "out"}}});
  return f;
}

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

bool WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return static_cast<bool>(out);
}

int Main(int argc, char** argv) {
  std::string out_dir, arch = "sm_90";
  bool small = false, portable_clusters = false;
  const char* usage = "usage: emit_cuda_fixtures OUT_DIR [--arch=sm_90] [--small] [--portable_clusters]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--arch=", 0) == 0) {
      arch = a.substr(7);
    } else if (a == "--small") {
      small = true;
    } else if (a == "--portable_clusters") {
      portable_clusters = true;
    } else if (!a.empty() && a[0] != '-' && out_dir.empty()) {
      out_dir = a;
    } else {
      fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  if (out_dir.empty()) {
    fprintf(stderr, "%s", usage);
    return 2;
  }
  // Under `bazel run`, relative paths are the caller's.
  const char* cwd = getenv("BUILD_WORKING_DIRECTORY");
  if (out_dir[0] != '/' && cwd != nullptr) out_dir = absl::StrCat(cwd, "/", out_dir);
  if (system(absl::StrCat("mkdir -p '", out_dir, "'").c_str()) != 0) {
    fprintf(stderr, "cannot create %s\n", out_dir.c_str());
    return 1;
  }
  std::vector<Fixture> fixtures = Fixtures(small, arch);
  std::vector<Kernel> kernels;
  for (const Fixture& f : fixtures) {
    if (!f.kernel.ok()) {
      fprintf(stderr, "%s: %s\n", f.name.c_str(), std::string(f.kernel.status().message()).c_str());
      return 1;
    }
    kernels.push_back(*f.kernel);
  }
  CudaEmitOptions options;
  options.arch = arch;
  if (portable_clusters) options.max_small_cluster = 0;
  for (const Fixture& f : fixtures) options.kernel_long_rows.push_back(f.long_rows);
  absl::StatusOr<CudaSource> src = EmitCudaSource(kernels, options);
  if (!src.ok()) {
    fprintf(stderr, "emit: %s\n", std::string(src.status().message()).c_str());
    return 1;
  }
  toolchain::NvrtcOptions nvrtc;
  // All fixtures are one translation unit: ~60-75 s of NVRTC on the 2-core CI machine, more when
  // other tests run beside it (it once passed kilnd's 2-minute default for one graph's compile).
  nvrtc.timeout = absl::Minutes(10);
  // The worker: next to this binary in its runfiles (bazel run), else next to the binary.
  for (const std::string& candidate :
       {std::string("server/toolchain/kiln_nvrtc_worker"),
        absl::StrCat(argv[0], ".runfiles/kiln/server/toolchain/kiln_nvrtc_worker")}) {
    char resolved[4096];
    if (access(candidate.c_str(), X_OK) == 0 && realpath(candidate.c_str(), resolved) != nullptr) {
      nvrtc.worker = resolved;  // absolute: the worker runs in a temp directory
      break;
    }
  }
  absl::StatusOr<toolchain::CudaBinary> bin = toolchain::CompileCuda(src->source, arch, false, nvrtc);
  if (!bin.ok()) {
    fprintf(stderr, "nvrtc: %s\n", std::string(bin.status().message()).c_str());
    return 1;
  }
  const std::string cubin = absl::StrCat("kernels_", arch, ".cubin");
  std::string json = absl::StrCat("{\n  \"format\": 1,\n  \"arch\": \"", arch, "\",\n  \"cubin\": \"",
                                   cubin, "\",\n  \"source\": \"kernels.cu\",\n  \"kernels\": [\n");
  for (size_t i = 0; i < fixtures.size(); ++i) {
    const Fixture& f = fixtures[i];
    const CudaLaunch& l = src->launches[i];
    absl::StatusOr<int64_t> grid = f.grid > 0 ? absl::StatusOr<int64_t>(f.grid) : CudaGridSize(l, f.scalars);
    if (!grid.ok()) {
      fprintf(stderr, "%s: %s\n", f.name.c_str(), std::string(grid.status().message()).c_str());
      return 1;
    }
    std::vector<std::string> buffers;
    for (const BufferSpec& b : f.buffers) {
      buffers.push_back(absl::StrCat("{\"dtype\": \"", b.dtype, "\", \"shape\": ", Shape(b.shape),
                                     ", \"role\": \"", b.role, "\"}"));
    }
    absl::StrAppend(&json, "    {\"name\": \"", f.name, "\", \"symbol\": \"", src->symbols[i],
                    "\", \"op\": \"", f.op, "\"", f.params.empty() ? "" : ", ", f.params,
                    ",\n     \"layout\": \"", CudaLayoutName(l.layout), "\", \"grid\": ", *grid,
                    ", \"block\": ", l.block, ", \"shared_bytes\": ", l.shared_bytes,
                    ", \"vector_width\": ", l.vector_width, ", \"cached_values\": ", l.cached_values, ", \"cluster\": ", l.cluster,
                    ",\n     \"scalars\": ", Shape(f.scalars), ",\n     \"buffers\": [",
                    absl::StrJoin(buffers, ", "), "]}", i + 1 < fixtures.size() ? "," : "", "\n");
  }
  absl::StrAppend(&json, "  ]\n}\n");
  if (!WriteFile(absl::StrCat(out_dir, "/", cubin), bin->bytes) ||
      !WriteFile(absl::StrCat(out_dir, "/kernels.cu"), src->source) ||
      !WriteFile(absl::StrCat(out_dir, "/manifest.json"), json)) {
    fprintf(stderr, "cannot write to %s\n", out_dir.c_str());
    return 1;
  }
  printf("wrote %zu kernels to %s (%s, %zu-byte cubin, NVRTC %.0f ms)\n", fixtures.size(),
         out_dir.c_str(), cubin.c_str(), bin->bytes.size(), absl::ToDoubleMilliseconds(bin->elapsed));
  return 0;
}

}  // namespace
}  // namespace kiln::codegen

int main(int argc, char** argv) { return kiln::codegen::Main(argc, argv); }
