// Runs the CUDA emitter's kernels on the host: the generated source, compiled by g++ with
// kernels/cuda/kiln_cuda_emulate.h in front (one std::thread per CUDA thread, barriers for
// __syncthreads and warp shuffles), against the CPU emitter's kernels for the same IR on the same
// random data. Checks what NVRTC cannot: indexing, grid-stride loops with small grids, vector
// lanes and their scalar fallbacks (misaligned pointers), register caches, and the warp, block
// and column all-reduces. The launch goes through the emitter's parameter convention.

#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kiln_half.h"
#include "kiln_runtime.h"
#include "server/codegen/cpu_emitter.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_test_kernels.h"
#include "server/kernel/test_kernels.h"
#include "server/toolchain/compiler.h"

namespace kiln::codegen {
namespace {

using namespace ::kiln::kernel;  // NOLINT: tests build IR
namespace kt = ::kiln::kernel::testing;
namespace ct = ::kiln::codegen::testing;

// out[b, i, j] = bf16(a[b, j, i] * 2 + c[i]) for a dynamic batch: a batched transpose (a tiled
// kernel with a decomposed batch dim, bf16 tiles widened to f32) plus a load broadcast along x.
absl::StatusOr<Kernel> BatchedTransposeBf16(int64_t rows, int64_t cols) {
  KernelBuilder kb("batched transpose");
  const Size n = kb.AddScalar(), r = Size::Const(rows), c = Size::Const(cols);
  const Buffer a = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * r * c);
  const Buffer col = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, r);
  const Buffer out = kb.AddBuffer(ScalarType::kBFloat16, Access::kWrite, n * r * c);
  const Var b = kb.AddOuter(n), i = kb.AddOuter(r), j = kb.AddOuter(c);
  const ExprOr x = Load(a, MakeIndex(Size(), {{b, r * c}, {j, r}, {i, Size::Const(1)}}));
  const ExprOr y = Load(col, MakeIndex(Size(), {{i, Size::Const(1)}}));
  kb.Add(Store(out, ContiguousIndex({b, i, j}, {n, r, c}),
               Cast(ScalarType::kBFloat16,
                    Add(Mul(Cast(ScalarType::kFloat32, x), ConstFloat(ScalarType::kFloat32, 2.0f)), y))));
  return kb.Finish();
}

// out[b, h, p, j] with p the phase of a stride-2 split read as a value (as max_pool2d's backward
// reads its [n, h / 2, h % 2, ...] dims): p == 1 && h + 1 < rows ? a[b, h + 1, j] (a masked load)
// : a[b, h, j] + p. The emitter unrolls p inside each thread (UnrolledPointDims) with p constant.
absl::StatusOr<Kernel> StrideSplitPhases(int64_t rows, int64_t cols) {
  KernelBuilder kb("stride split phases");
  const Size n = kb.AddScalar(), r = Size::Const(rows), c = Size::Const(cols), two = Size::Const(2);
  const Buffer a = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, n * r * c);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, n * r * two * c);
  const Var b = kb.AddOuter(n), h = kb.AddOuter(r), p = kb.AddOuter(two), j = kb.AddOuter(c);
  const ExprOr phase = LoopVar(p);
  const ExprOr mask = Binary(BinaryOp::kLogicalAnd, Binary(BinaryOp::kEq, phase, ConstInt(ScalarType::kInt64, 1)),
                             Binary(BinaryOp::kLt, Add(LoopVar(h), ConstInt(ScalarType::kInt64, 1)),
                                    ConstInt(ScalarType::kInt64, rows)));
  const ExprOr next = LoadMasked(a, MakeIndex(c, {{b, r * c}, {h, c}, {j, Size::Const(1)}}), mask);
  const ExprOr here = Load(a, MakeIndex(Size(), {{b, r * c}, {h, c}, {j, Size::Const(1)}}));
  kb.Add(Store(out, ContiguousIndex({b, h, p, j}, {n, r, two, c}),
               Select(mask, next, Add(here, Cast(ScalarType::kFloat32, phase)))));
  return kb.Finish();
}

// out[c] = sum over rows of x[r, c] * w[c] + running[c], with a bf16 weight: a column kernel whose
// body loads (w, running) are read into registers before the rows (EmitBodyPrefetch), one per
// lane of a vector column.
absl::StatusOr<Kernel> ColumnSumAffine(int64_t rows, int64_t cols) {
  KernelBuilder kb("column sum affine");
  const Size r = Size::Const(rows), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, r * c);
  const Buffer w = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, c);
  const Buffer running = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, c);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, c);
  const Var col = kb.AddOuter(c), row = kb.AddReduce(r);
  const Accumulator sum = kb.AddAccumulator(AccKind::kSum, ScalarType::kFloat32);
  const Index at = MakeIndex(Size(), {{col, Size::Const(1)}});
  kb.BeginPhase();
  kb.Add(Accumulate(sum, Load(x, MakeIndex(Size(), {{row, c}, {col, Size::Const(1)}}))));
  kb.BeginBody();
  kb.Add(Store(out, at, Add(Mul(AccRead(sum, AccField::kValue), Cast(ScalarType::kFloat32, Load(w, at))),
                            Load(running, at))));
  return kb.Finish();
}

// softmax(x) + x: phase 1 reads x outside exp(x - max) too, so the cache keeps x (no exp reuse).
absl::StatusOr<Kernel> SoftmaxPlusInput(int64_t cols) {
  KernelBuilder kb("softmax plus input");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer in = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, n * c);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator sm = kb.AddAccumulator(AccKind::kOnlineSoftmax, ScalarType::kFloat32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  kb.BeginPhase();
  kb.Add(Accumulate(sm, Load(in, idx)));
  kb.BeginPhase();
  const ExprOr e = Exp(Sub(Load(in, idx), AccRead(sm, AccField::kMax)));
  kb.Add(Store(out, idx, Add(Div(e, AccRead(sm, AccField::kSum)), Load(in, idx))));
  return kb.Finish();
}

// x / x.sum(0, keepdim=True): a column reduction with a phase epilogue (what fusion now gives
// a broadcast of a column sum), so the column layout runs a second phase of stores.
absl::StatusOr<Kernel> ColumnNormalize(int64_t rows, int64_t cols) {
  KernelBuilder kb("column normalize");
  const Size r = Size::Const(rows), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, r * c);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, r * c);
  const Var col = kb.AddOuter(c), row = kb.AddReduce(r);
  const Accumulator sum = kb.AddAccumulator(AccKind::kSum, ScalarType::kFloat32);
  const Index idx = MakeIndex(Size(), {{row, c}, {col, Size::Const(1)}});
  kb.BeginPhase();
  kb.Add(Accumulate(sum, Load(x, idx)));
  kb.BeginPhase();
  kb.Add(Store(out, idx, Div(Load(x, idx), AccRead(sum, AccField::kValue))));
  return kb.Finish();
}

struct Case {
  std::string name;
  absl::StatusOr<Kernel> kernel;
  std::vector<int64_t> scalars;
  bool misaligned = false;  // every buffer pointer one element past a 64-byte boundary
  int max_grid = 3;         // small grids exercise the grid-stride loops
  int64_t special_row = 0;  // > 0: f32 inputs get an all -inf row, a NaN and -infs (rows of this length)
  bool staggered = false;   // buffer j's pointer j elements past a 64-byte boundary (pointers
                            // that lie differently: shifted rows take their scalar path)
};

// One phase folding a Welford and an online softmax over values that are not loads (so the
// two-pass reductions keep them in registers of their own), and the statistics out per row.
absl::StatusOr<Kernel> RowStatistics(int64_t cols) {
  KernelBuilder kb("row statistics");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator wf = kb.AddAccumulator(AccKind::kWelford, ScalarType::kFloat32);
  const Accumulator sm = kb.AddAccumulator(AccKind::kOnlineSoftmax, ScalarType::kFloat32);
  const ExprOr v = Load(x, ContiguousIndex({row, col}, {n, c}));
  kb.BeginPhase();
  kb.Add(Accumulate(wf, Mul(v, ConstFloat(ScalarType::kFloat32, 2.0f))));
  kb.Add(Accumulate(sm, Sub(v, ConstFloat(ScalarType::kFloat32, 1.0f))));
  kb.BeginBody();
  const Index ridx = MakeIndex(Size(), {{row, Size::Const(1)}});
  for (const ExprOr& e : {AccRead(wf, AccField::kMean), AccRead(wf, AccField::kM2),
                          AccRead(wf, AccField::kCount), AccRead(sm, AccField::kMax),
                          AccRead(sm, AccField::kSum)}) {
    kb.Add(Store(kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, n), ridx, e));
  }
  return kb.Finish();
}

std::vector<Case> Cases() {
  std::vector<Case> c;
  c.push_back({"broadcast_add", kt::BroadcastAddTransposed(64, 128), {}});
  c.push_back({"broadcast_add_odd", kt::BroadcastAddTransposed(5, 37), {}});
  c.push_back({"broadcast_add_misaligned", kt::BroadcastAddTransposed(8, 64), {}, true});
  c.push_back({"transpose_tiled_tails", kt::BroadcastAddTransposed(40, 70), {}});
  c.push_back({"transpose_tiled_exact", kt::BroadcastAddTransposed(96, 64), {}, true});
  c.push_back({"transpose_tiled_batched_bf16", BatchedTransposeBf16(33, 64), {3}});
  c.push_back({"softmax_1024", kt::RowSoftmax(1024, false), {37}});
  c.push_back({"softmax_1000_misaligned", kt::RowSoftmax(1000, false), {5}, true});
  c.push_back({"softmax_100", kt::RowSoftmax(100, false), {19}, false, 1});
  c.push_back({"log_softmax_8192", kt::RowSoftmax(8192, true), {3}});
  c.push_back({"layer_norm_768", kt::LayerNorm(768, 1e-5f), {9}});
  c.push_back({"layer_norm_4096", kt::LayerNorm(4096, 1e-5f), {2}});
  c.push_back({"softmax_specials", kt::RowSoftmax(1000, false), {6}, false, 3, 1000});
  c.push_back({"log_softmax_specials", kt::RowSoftmax(8192, true), {5}, false, 3, 8192});
  c.push_back({"softmax_2048_block", kt::RowSoftmax(2048, false), {3}});
  c.push_back({"softmax_32768_specials", kt::RowSoftmax(32768, false), {3}, false, 3, 32768});
  c.push_back({"softmax_plus_input", SoftmaxPlusInput(512), {6}, false, 3, 512});
  c.push_back({"row_statistics_300", RowStatistics(300), {7}});
  c.push_back({"row_statistics_1024_misaligned", RowStatistics(1024), {4}, true});
  c.push_back({"row_statistics_3000", RowStatistics(3000), {3}});
  c.push_back({"column_sum", kt::ColumnSum(100, 70), {}});
  // Real-graph kernels: bf16 rows (the widened load serves the row cache, the two-pass statistic
  // and the exp reuse), rms norm's phase epilogue, a column-major output (loops permuted, tiled).
  c.push_back({"softmax_bf16_1024", kt::RowSoftmaxBf16(1024), {9}});
  c.push_back({"softmax_bf16_1000_misaligned", kt::RowSoftmaxBf16(1000), {5}, true});
  c.push_back({"softmax_bf16_4096_block", kt::RowSoftmaxBf16(4096), {3}});
  c.push_back({"layer_norm_bf16_1024", kt::LayerNormBf16(1024, 1e-5f), {7}});
  c.push_back({"rms_norm_1024", kt::RmsNorm(1024, 1e-6f, false), {7}});
  c.push_back({"rms_norm_bf16_1024", kt::RmsNorm(1024, 1e-6f, true), {7}});
  c.push_back({"rms_norm_bf16_3000_misaligned", kt::RmsNorm(3000, 1e-6f, true), {3}, true});
  c.push_back({"column_normalize", ColumnNormalize(100, 70), {}});
  c.push_back({"layer_norm_weight_grad", kt::LayerNormWeightGrad(3, 37, 70), {}});
  c.push_back({"softmax_then_backward_512", kt::SoftmaxThenBackward(512), {5}});
  c.push_back({"softmax_then_backward_777_misaligned", kt::SoftmaxThenBackward(777), {3}, true});
  c.push_back({"masked_softmax_512", kt::MaskedScaledSoftmax(512, false), {6}});
  c.push_back({"masked_softmax_1024", kt::MaskedScaledSoftmax(1024, false), {5}});
  c.push_back({"masked_softmax_3001_misaligned", kt::MaskedScaledSoftmax(3001, false), {3}, true});
  c.push_back({"masked_softmax_backward_512", kt::MaskedScaledSoftmax(512, true), {5}});
  c.push_back({"masked_softmax_backward_777_misaligned", kt::MaskedScaledSoftmax(777, true), {3}, true});
  c.push_back({"transpose_add_column_major", kt::TransposeAddColumnMajor(64, 96), {}});
  c.push_back({"transpose_add_column_major_tails", kt::TransposeAddColumnMajor(40, 70), {}});
  c.push_back({"bf16_chain", kt::Bf16Chain(1001), {}});
  c.push_back({"bf16_chain_misaligned", kt::Bf16Chain(4096), {}, true});
  c.push_back({"every_acc_f32", ct::EveryAccumulator(ScalarType::kFloat32, false, 4, 8), {}});
  c.push_back({"every_acc_f64_dyn", ct::EveryAccumulator(ScalarType::kFloat64, true, 30, 70), {6}});
  c.push_back({"every_acc_i32", ct::EveryAccumulator(ScalarType::kInt32, true, 2, 1000), {4}});
  c.push_back({"every_acc_i8", ct::EveryAccumulator(ScalarType::kInt8, false, 3, 3), {}});
  c.push_back({"full_sum", ct::FullSum(5000), {}});
  c.push_back({"dynamic_in_place", ct::DynamicInPlace(), {3, 5, 12}});
  c.push_back({"dynamic_in_place_misaligned", ct::DynamicInPlace(), {2, 3, 9}, true});
  for (ScalarType t : {ScalarType::kBool, ScalarType::kInt8, ScalarType::kUInt8, ScalarType::kInt32,
                       ScalarType::kInt64, ScalarType::kFloat32, ScalarType::kFloat64}) {
    c.push_back({absl::StrCat("every_op_", ScalarTypeName(t)), ct::EveryOp(t, 203), {}});
  }
  // Last, so that the cases above keep their random inputs.
  // Odd lengths: vectors shifted to each row's alignment, scalar first and last chunks.
  c.push_back({"softmax_bf16_1001", kt::RowSoftmaxBf16(1001), {9}});
  c.push_back({"softmax_bf16_1001_misaligned", kt::RowSoftmaxBf16(1001), {5}, true});
  c.push_back({"softmax_3001_specials", kt::RowSoftmax(3001, false), {4}, false, 2, 3001});
  c.push_back({"layer_norm_bf16_3001", kt::LayerNormBf16(3001, 1e-5f), {5}});
  c.push_back({"layer_norm_bf16_3001_misaligned", kt::LayerNormBf16(3001, 1e-5f), {3}, true});
  c.push_back({"row_sum_bf16_5x3001", kt::RowSum(5, 3001, true), {}});
  c.push_back({"softmax_bf16_3001_staggered", kt::RowSoftmaxBf16(3001), {4}, false, 3, 0, true});
  // Vector columns (4 points per thread; misaligned pointers: the same points, scalar loads).
  c.push_back({"column_sum_vec4", kt::ColumnSum(100, 512), {}});
  c.push_back({"column_sum_vec4_misaligned", kt::ColumnSum(64, 128), {}, true});
  c.push_back({"channels_last_partials_bf16", ct::ChannelsLastPartials(56, 64), {3}});
  c.push_back({"channels_last_partials_bf16_misaligned", ct::ChannelsLastPartials(49, 96), {2}, true});
  c.push_back({"layer_norm_bf16_3001_staggered", kt::LayerNormBf16(3001, 1e-5f), {3}, false, 3, 0, true});
  // Last: the cases share one random stream, and column_normalize's data divides by sums near zero.
  c.push_back({"stride_split_phases", StrideSplitPhases(7, 64), {3}});
  c.push_back({"stride_split_phases_odd_misaligned", StrideSplitPhases(5, 37), {2}, true});
  c.push_back({"column_sum_affine_vec4", ColumnSumAffine(100, 512), {}});
  c.push_back({"column_sum_affine_odd_misaligned", ColumnSumAffine(33, 70), {}, true});
  c.push_back({"masked_window_gather", ct::MaskedWindowGather(6, 64), {3}});
  c.push_back({"masked_window_gather_odd_misaligned", ct::MaskedWindowGather(5, 37), {2}, true});
  c.push_back({"cat_rows_bf16", ct::CatRowsBf16(3, 4, 64), {3}});
  c.push_back({"cat_rows_bf16_odd_misaligned", ct::CatRowsBf16(2, 3, 37), {2}, true});
  c.push_back({"one_access_two_masks", ct::OneAccessTwoMasks(8, 64), {}});
  c.push_back({"cat_transposed_tiled_bf16", ct::CatTransposedBf16(64, 64), {2}});
  c.push_back({"cat_transposed_tiled_bf16_tails", ct::CatTransposedBf16(40, 70), {3}});
  // Short columns: a thread per point, no all-reduce (vectors; odd points: scalar).
  c.push_back({"short_column_sum_vec4", kt::ColumnSum(3, 20000), {}});
  c.push_back({"short_column_sum_odd_misaligned", kt::ColumnSum(5, 17001), {}, true});
  return c;
}

std::string ReadRunfile(const std::string& path) {
  std::ifstream in(absl::StrCat(getenv("TEST_SRCDIR"), "/", getenv("TEST_WORKSPACE"), "/", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One buffer: 64-byte aligned storage, the kernel's pointer at `offset` bytes into it.
struct Storage {
  std::vector<unsigned char> bytes;
  size_t offset = 0;
  size_t size = 0;
  void* ptr() { return bytes.data() + offset; }
};

Storage Allocate(size_t size, int misaligned_elements, int elem) {
  Storage s;
  s.size = size;
  s.bytes.resize(size + 128);
  const uintptr_t base = reinterpret_cast<uintptr_t>(s.bytes.data());
  s.offset = ((64 - base % 64) % 64) + static_cast<size_t>(misaligned_elements * elem);
  return s;
}

void Fill(Storage& s, ScalarType t, bool input, std::mt19937& rng) {
  unsigned char* p = static_cast<unsigned char*>(s.ptr());
  if (!input) {
    std::memset(p, 0xAB, s.size);
    return;
  }
  std::uniform_real_distribution<double> real(-3.0, 3.0);
  std::uniform_int_distribution<int> small(-60, 60);
  const size_t n = s.size / ScalarTypeBytes(t);
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case ScalarType::kBool: p[i] = small(rng) > 0; break;
      case ScalarType::kInt8: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(small(rng)); break;
      case ScalarType::kUInt8: p[i] = static_cast<uint8_t>(small(rng) + 60); break;
      case ScalarType::kInt32: reinterpret_cast<int32_t*>(p)[i] = small(rng) * 1000; break;
      case ScalarType::kInt64: reinterpret_cast<int64_t*>(p)[i] = small(rng) * 100000; break;
      case ScalarType::kFloat16:
        reinterpret_cast<uint16_t*>(p)[i] = kiln_cpu::f32_to_f16(static_cast<float>(real(rng)));
        break;
      case ScalarType::kBFloat16:
        reinterpret_cast<uint16_t*>(p)[i] = kiln_cpu::f32_to_bf16(static_cast<float>(real(rng)));
        break;
      case ScalarType::kFloat32: reinterpret_cast<float*>(p)[i] = static_cast<float>(real(rng)); break;
      case ScalarType::kFloat64: reinterpret_cast<double*>(p)[i] = real(rng); break;
    }
  }
}

bool Close(double a, double b, double rel, double abs) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= abs + rel * std::fabs(b);
}

// The first mismatch between the emulated GPU result and the CPU one, or "".
std::string Compare(const Storage& gpu, const Storage& cpu, ScalarType t) {
  const unsigned char* g = gpu.bytes.data() + gpu.offset;
  const unsigned char* c = cpu.bytes.data() + cpu.offset;
  const size_t n = gpu.size / ScalarTypeBytes(t);
  for (size_t i = 0; i < n; ++i) {
    bool ok = true;
    double gv = 0, cv = 0;
    switch (t) {
      case ScalarType::kFloat32:
        gv = reinterpret_cast<const float*>(g)[i];
        cv = reinterpret_cast<const float*>(c)[i];
        ok = Close(gv, cv, 2e-5, 2e-5);
        break;
      case ScalarType::kFloat64:
        gv = reinterpret_cast<const double*>(g)[i];
        cv = reinterpret_cast<const double*>(c)[i];
        ok = Close(gv, cv, 1e-11, 1e-11);
        break;
      case ScalarType::kFloat16: case ScalarType::kBFloat16: {
        const uint16_t a = reinterpret_cast<const uint16_t*>(g)[i];
        const uint16_t b = reinterpret_cast<const uint16_t*>(c)[i];
        gv = t == ScalarType::kFloat16 ? kiln_cpu::f16_to_f32(a) : kiln_cpu::bf16_to_f32(a);
        cv = t == ScalarType::kFloat16 ? kiln_cpu::f16_to_f32(b) : kiln_cpu::bf16_to_f32(b);
        ok = (a == b) || Close(gv, cv, 1e-2, 1e-3);  // one rounding step apart
        break;
      }
      default: {
        const int size = ScalarTypeBytes(t);
        ok = std::memcmp(g + i * size, c + i * size, size) == 0;
        int64_t a = 0, b = 0;
        std::memcpy(&a, g + i * size, size);
        std::memcpy(&b, c + i * size, size);
        gv = static_cast<double>(a);
        cv = static_cast<double>(b);
        break;
      }
    }
    if (!ok) return absl::StrCat("element ", i, ": gpu ", gv, ", cpu ", cv);
  }
  return "";
}

// Rows spread over thread-block clusters (kClusterRow), with limits small enough that clusters of
// 128-thread blocks serve rows of a few thousand columns: cached rows too long for a block (odd
// lengths, bf16, misaligned pointers, NaN and -inf rows, Welford's non-commutative merge), every
// accumulator across the blocks of a cluster, and split sums of few rows.
CudaEmitOptions ClusterOptions() {
  CudaEmitOptions o;
  o.max_row_block = 128;
  o.row_values = 8;
  o.max_cached_values = 16;
  o.long_rows = CudaLongRows::kCluster;  // with these limits and a few rows, rows enough for L2
  return o;
}

std::vector<Case> ClusterCases() {
  std::vector<Case> c;
  c.push_back({"cluster_softmax_3001", kt::RowSoftmax(3001, false), {5}});
  c.push_back({"cluster_softmax_4096", kt::RowSoftmax(4096, false), {7}});
  c.push_back({"cluster_softmax_4096_misaligned", kt::RowSoftmax(4096, false), {3}, true});
  c.push_back({"cluster_softmax_specials", kt::RowSoftmax(3001, false), {4}, false, 2, 3001});
  c.push_back({"cluster_log_softmax_5000_specials", kt::RowSoftmax(5000, true), {3}, false, 3, 5000});
  c.push_back({"cluster_layer_norm_3000", kt::LayerNorm(3000, 1e-5f), {5}});
  c.push_back({"cluster_layer_norm_bf16_3001", kt::LayerNormBf16(3001, 1e-5f), {3}});
  c.push_back({"cluster_softmax_bf16_3001", kt::RowSoftmaxBf16(3001), {4}});
  c.push_back({"cluster_softmax_bf16_4096_misaligned", kt::RowSoftmaxBf16(4096), {3}, true});
  c.push_back({"cluster_rms_norm_bf16_3000", kt::RmsNorm(3000, 1e-6f, true), {3}});
  c.push_back({"cluster_every_acc_f32", ct::EveryAccumulator(ScalarType::kFloat32, false, 40, 100), {}});
  c.push_back({"cluster_every_acc_i32", ct::EveryAccumulator(ScalarType::kInt32, false, 20, 150), {}});
  c.push_back({"cluster_row_sum_5x5000", kt::RowSum(5, 5000, false), {}});
  c.push_back({"cluster_row_sum_bf16_3x6001", kt::RowSum(3, 6001, true), {}, false, 1});
  c.push_back({"cluster_full_sum", ct::FullSum(5000), {}});
  // Odd rows with shifted vectors (last, so that the cases above keep their random inputs).
  c.push_back({"cluster_softmax_bf16_3001_misaligned", kt::RowSoftmaxBf16(3001), {5}, true});
  c.push_back({"cluster_layer_norm_bf16_3001_misaligned", kt::LayerNormBf16(3001, 1e-5f), {4}, true});
  c.push_back({"cluster_log_softmax_3001", kt::RowSoftmax(3001, true), {3}});
  c.push_back({"cluster_softmax_bf16_3001_staggered", kt::RowSoftmaxBf16(3001), {4}, false, 3, 0, true});
  c.push_back({"cluster_softmax_3001_staggered_specials", kt::RowSoftmax(3001, false), {4}, false, 3, 3001, true});
  return c;
}

// softmax(x[:, 1:]) into a contiguous output (ct::SlicedRowSoftmax): the stores lie differently
// from the cached loads, so kSharedRow stores through windows of the cache at the output's own
// alignment. 9 rows: the two shifts differ by every residue modulo 8 (the input's row stride is
// 2 modulo 8, the output's 1); misaligned, staggered (b1 one element further than b0) and NaN
// and -inf rows (special rows of the input's stride).
std::vector<Case> SlicedCases() {
  std::vector<Case> c;
  c.push_back({"shared_sliced_softmax_bf16_3001", ct::SlicedRowSoftmax(ScalarType::kBFloat16, 3001), {9}});
  c.push_back({"shared_sliced_softmax_bf16_3001_misaligned", ct::SlicedRowSoftmax(ScalarType::kBFloat16, 3001), {9},
               true});
  c.push_back({"shared_sliced_softmax_bf16_3001_staggered", ct::SlicedRowSoftmax(ScalarType::kBFloat16, 3001), {9},
               false, 3, 0, true});
  c.push_back({"shared_sliced_softmax_f32_3001_specials", ct::SlicedRowSoftmax(ScalarType::kFloat32, 3001), {9},
               false, 3, 3002});
  c.push_back({"shared_sliced_softmax_f32_3001_staggered", ct::SlicedRowSoftmax(ScalarType::kFloat32, 3001), {5},
               false, 2, 0, true});
  c.push_back({"shared_sliced_softmax_bf16_50257_misaligned", ct::SlicedRowSoftmax(ScalarType::kBFloat16, 50257),
               {3}, true});
  return c;
}

// Rows cached in a block's dynamic shared memory (kSharedRow, forced), with the small limits of
// the cluster cases (128 threads a block): f32 slots (softmax's exps overwrite them), bf16 slots
// widened at each read (softmax, layer norm, rms norm), odd lengths with shifted vectors (50257),
// lengths that are not a multiple of the block's chunk (4100, 3000), misaligned and staggered
// pointers (scalar paths), NaN and -inf rows, and rows of a small grid reusing the slots.
std::vector<Case> SharedCases() {
  std::vector<Case> c;
  c.push_back({"shared_softmax_3001", kt::RowSoftmax(3001, false), {5}});
  c.push_back({"shared_softmax_4100", kt::RowSoftmax(4100, false), {4}});
  c.push_back({"shared_softmax_4100_misaligned", kt::RowSoftmax(4100, false), {3}, true});
  c.push_back({"shared_softmax_specials", kt::RowSoftmax(3001, false), {4}, false, 2, 3001});
  c.push_back({"shared_log_softmax_5000_specials", kt::RowSoftmax(5000, true), {3}, false, 3, 5000});
  c.push_back({"shared_log_softmax_50257", kt::RowSoftmax(50257, true), {2}});
  c.push_back({"shared_layer_norm_3000", kt::LayerNorm(3000, 1e-5f), {5}});
  c.push_back({"shared_layer_norm_bf16_3001", kt::LayerNormBf16(3001, 1e-5f), {3}});
  c.push_back({"shared_softmax_bf16_50257", kt::RowSoftmaxBf16(50257), {3}, false, 2});
  c.push_back({"shared_softmax_bf16_50257_misaligned", kt::RowSoftmaxBf16(50257), {2}, true});
  c.push_back({"shared_layer_norm_bf16_50257_misaligned", kt::LayerNormBf16(50257, 1e-5f), {2}, true});
  c.push_back({"shared_softmax_bf16_4096_misaligned", kt::RowSoftmaxBf16(4096), {3}, true});
  c.push_back({"shared_softmax_plus_input_3001", SoftmaxPlusInput(3001), {4}, false, 3, 3001});
  c.push_back({"shared_masked_softmax_3001", kt::MaskedScaledSoftmax(3001, false), {4}});
  c.push_back({"shared_rms_norm_bf16_3000", kt::RmsNorm(3000, 1e-6f, true), {3}});
  c.push_back({"shared_softmax_bf16_3001_staggered", kt::RowSoftmaxBf16(3001), {4}, false, 3, 0, true});
  for (Case& s : SlicedCases()) c.push_back(std::move(s));
  return c;
}

enum class Expect { kOneBlock, kCluster, kShared };

void RunCases(std::vector<Case> cases, const CudaEmitOptions& options, Expect expect) {
  std::vector<Kernel> kernels;
  for (Case& c : cases) {
    ASSERT_TRUE(c.kernel.ok()) << c.name << ": " << c.kernel.status();
    kernels.push_back(*c.kernel);
  }
  absl::StatusOr<CudaSource> cuda = EmitCudaSource(kernels, options);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  absl::StatusOr<CpuSource> cpu = EmitCpuSource(kernels);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const std::string emulate = ReadRunfile("kernels/cuda/kiln_cuda_emulate.h");
  ASSERT_FALSE(emulate.empty()) << "kiln_cuda_emulate.h not in the runfiles";
  std::string host = emulate + cuda->source;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const int ns = kernels[i].num_scalars;
    absl::StrAppend(&host, "extern \"C\" __attribute__((visibility(\"default\"))) void kiln_emulate_",
                    i, "(void* const* b, const int64_t* s) { kiln_emu::Launch(kiln_kernel_", i,
                    ", b, s, static_cast<int>(s[", ns, "]), static_cast<int>(s[", ns + 1,
                    "]), static_cast<int>(s[", ns + 2, "]), static_cast<int>(s[", ns + 3, "])); }\n");
  }
  toolchain::CompileOptions co;
  co.timeout = absl::Seconds(600);
  absl::StatusOr<toolchain::CompiledBinary> gpu_so = toolchain::CompileSharedObject(host, co);
  ASSERT_TRUE(gpu_so.ok()) << gpu_so.status();
  absl::StatusOr<toolchain::CompiledBinary> cpu_so = toolchain::CompileSharedObject(cpu->source, co);
  ASSERT_TRUE(cpu_so.ok()) << cpu_so.status();
  kiln_module* gm = nullptr;
  kiln_module* cm = nullptr;
  ASSERT_EQ(kiln_module_load(gpu_so->bytes.data(), gpu_so->bytes.size(), &gm), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_module_load(cpu_so->bytes.data(), cpu_so->bytes.size(), &cm), KILN_OK) << kiln_last_error();

  std::mt19937 rng(42);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Kernel& k = kernels[i];
    SCOPED_TRACE(c.name);
    int32_t gk = -1, ck = -1;
    ASSERT_EQ(kiln_module_add_kernel(gm, absl::StrCat("kiln_emulate_", i).c_str(), &gk), KILN_OK);
    ASSERT_EQ(kiln_module_add_kernel(cm, cpu->symbols[i].c_str(), &ck), KILN_OK);
    std::vector<Storage> gpu_bufs, cpu_bufs;
    for (const Buffer& b : k.buffers) {
      const absl::optional<int64_t> n = b.num_elements.Evaluate(c.scalars);
      ASSERT_TRUE(n.has_value());
      const int elem = ScalarTypeBytes(b.dtype);
      const int past = c.staggered ? static_cast<int>(b.index % 8) : c.misaligned ? 1 : 0;
      Storage s = Allocate(static_cast<size_t>(*n) * elem, past, elem);
      Fill(s, b.dtype, b.access != Access::kWrite, rng);
      if (c.special_row > 0 && b.access != Access::kWrite && b.dtype == ScalarType::kFloat32) {
        // Row 0 all -inf (softmax: 0 / 0), a NaN in row 1, a few -inf in row 2; row 3 (where
        // there is one) all -inf but its first element, so that a cluster's other blocks hold
        // only -inf (their exps scale by 0, not by exp(inf)).
        float* p = static_cast<float*>(s.ptr());
        const int64_t r = c.special_row;
        for (int64_t j = 0; j < r; ++j) p[j] = -INFINITY;
        p[r + r / 3] = NAN;
        p[2 * r + 1] = -INFINITY;
        p[2 * r + r - 1] = -INFINITY;
        if (*n >= 4 * r) {
          for (int64_t j = 1; j < r; ++j) p[3 * r + j] = -INFINITY;
          p[3 * r] = 1.5f;
        }
      }
      Storage t = Allocate(s.size, past, elem);
      std::memcpy(t.ptr(), s.ptr(), s.size);
      gpu_bufs.push_back(std::move(s));
      cpu_bufs.push_back(std::move(t));
    }
    std::vector<void*> gp, cp;
    for (Storage& s : gpu_bufs) gp.push_back(s.ptr());
    for (Storage& s : cpu_bufs) cp.push_back(s.ptr());
    const CudaLaunch& launch = cuda->launches[i];
    EXPECT_EQ(launch.layout == CudaLayout::kClusterRow, expect == Expect::kCluster) << c.name << ": " << CudaLayoutName(launch.layout);
    EXPECT_EQ(launch.layout == CudaLayout::kSharedRow, expect == Expect::kShared) << c.name;
    EXPECT_EQ(launch.shared_bytes > 0, expect == Expect::kShared) << c.name;
    absl::StatusOr<int64_t> grid = CudaGridSize(launch, c.scalars);
    ASSERT_TRUE(grid.ok()) << grid.status();
    ASSERT_EQ(*grid % launch.cluster, 0);
    std::vector<int64_t> gs = c.scalars;
    // A small grid (grid-stride loops), in whole clusters.
    gs.push_back(launch.cluster * std::min<int64_t>(*grid / launch.cluster, c.max_grid));
    gs.push_back(launch.block);
    gs.push_back(launch.cluster);
    gs.push_back(launch.shared_bytes);
    ASSERT_EQ(kiln_run_kernel(cm, ck, cp.data(), c.scalars.data()), KILN_OK);
    ASSERT_EQ(kiln_run_kernel(gm, gk, gp.data(), gs.data()), KILN_OK);
    for (size_t b = 0; b < k.buffers.size(); ++b) {
      const std::string diff = Compare(gpu_bufs[b], cpu_bufs[b], k.buffers[b].dtype);
      EXPECT_EQ(diff, "") << c.name << " (" << CudaLayoutName(launch.layout) << ", grid "
                          << gs[gs.size() - 4] << ", block " << launch.block << ", cluster "
                          << launch.cluster << ", vector width "
                          << launch.vector_width << "): buffer b" << b << ": " << diff;
    }
  }
  EXPECT_EQ(kiln_module_unload(gm), KILN_OK);
  EXPECT_EQ(kiln_module_unload(cm), KILN_OK);
}

TEST(CudaEmulation, GeneratedCudaKernelsMatchTheCpuKernels) {
  CudaEmitOptions options;
  options.max_cluster = 1;  // the one-block layouts (clusters below)
  RunCases(Cases(), options, Expect::kOneBlock);
}

TEST(CudaEmulation, ClusterRowKernelsMatchTheCpuKernels) {
  RunCases(ClusterCases(), ClusterOptions(), Expect::kCluster);
}

// The same rows, too long for one block's registers, as one uncached block per row (read twice,
// shifted vectors four chunks at a time, the grid capped to whole blocks per SM).
TEST(CudaEmulation, UncachedLongRowKernelsMatchTheCpuKernels) {
  CudaEmitOptions options = ClusterOptions();
  options.long_rows = CudaLongRows::kBlockPerRow;
  RunCases(ClusterCases(), options, Expect::kOneBlock);
}

TEST(CudaEmulation, SharedRowKernelsMatchTheCpuKernels) {
  CudaEmitOptions options = ClusterOptions();
  options.long_rows = CudaLongRows::kShared;
  RunCases(SharedCases(), options, Expect::kShared);
}

// The same with two caches a block (kSharedPrefetch: the block's next row filled during this
// one's phases), on the cases whose cache fits a block twice: the small grids give each block
// several rows, so every row but a block's first reads what the row before filled, in the other
// cache, with its own shift (odd lengths) and scalar ends.
TEST(CudaEmulation, SharedRowKernelsWithTheNextRowPrefetchedMatchTheCpuKernels) {
  CudaEmitOptions options = ClusterOptions();
  options.long_rows = CudaLongRows::kSharedPrefetch;
  std::vector<Case> cases;
  for (Case& c : SharedCases()) {
    if (c.name != "shared_log_softmax_50257") cases.push_back(std::move(c));  // 2 x 201 KB: no
  }
  std::vector<Kernel> kernels;
  for (const Case& c : cases) kernels.push_back(*c.kernel);
  absl::StatusOr<CudaSource> cuda = EmitCudaSource(kernels, options);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  // sm_90: the vector rows of 16-byte vectors fill by bulk copies (kiln_emu's mbarriers).
  int bulk = 0;
  for (size_t at = cuda->source.find("kiln_cuda::bulk_copy(&"); at != std::string::npos;
       at = cuda->source.find("kiln_cuda::bulk_copy(&", at + 1)) {
    ++bulk;
  }
  EXPECT_GE(bulk, 10);
  RunCases(std::move(cases), options, Expect::kShared);
}

// The sliced rows (also among SharedCases, above) store through windows of the cache: on sm_80
// too, where two caches fill by cp.async (the next row's fill into the cache whose windows the
// row before read: the barrier after the stores).
TEST(CudaEmulation, SlicedSharedRowsStoreVectorsAtTheOutputsAlignmentOnSm80AndSm90) {
  for (const std::string arch : {"sm_80", "sm_90"}) {
    SCOPED_TRACE(arch);
    CudaEmitOptions options = ClusterOptions();
    options.arch = arch;
    options.long_rows = CudaLongRows::kSharedPrefetch;
    std::vector<Case> cases;
    for (Case& c : SlicedCases()) {
      if (arch == "sm_90" || c.name.find("50257") == std::string::npos) cases.push_back(std::move(c));  // 2 x 100 KB
    }
    std::vector<Kernel> kernels;
    for (const Case& c : cases) kernels.push_back(*c.kernel);
    absl::StatusOr<CudaSource> cuda = EmitCudaSource(kernels, options);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    int windows = 0;
    for (const std::string& k : cuda->kernel_sources) windows += absl::StrContains(k, "kiln_cuda::window(kiln_c0[");
    EXPECT_EQ(windows, static_cast<int>(kernels.size()));
    EXPECT_EQ(absl::StrContains(cuda->source, "kiln_cuda::cp_async_commit();"), arch == "sm_80");
    EXPECT_EQ(absl::StrContains(cuda->source, "kiln_cuda::bulk_copy(&"), arch == "sm_90");
    if (arch == "sm_80") RunCases(std::move(cases), options, Expect::kShared);  // sm_90: above
  }
}

}  // namespace
}  // namespace kiln::codegen
