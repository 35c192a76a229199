// End-to-end: kernels built by hand -> CPU emitter -> g++ in a worker process -> runtime (load from
// bytes) -> run on random data -> compare with a straightforward double-precision reference.
// All kernels go into one translation unit (one compile for the whole suite).

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kiln_runtime.h"
#include "kernels/cpu/kiln_half.h"
#include "server/codegen/cpu_emitter.h"
#include "server/kernel/kernel_ir.h"
#include "server/kernel/printer.h"
#include "server/kernel/test_kernels.h"
#include "server/toolchain/compiler.h"
#include "server/toolchain/subprocess.h"

namespace kiln::codegen {
namespace {

using namespace ::kiln::kernel;  // NOLINT: the test builds a lot of IR
namespace kt = ::kiln::kernel::testing;

constexpr ScalarType kF32 = ScalarType::kFloat32;
constexpr ScalarType kF64 = ScalarType::kFloat64;
constexpr ScalarType kI64 = ScalarType::kInt64;
constexpr ScalarType kI32 = ScalarType::kInt32;

Size C(int64_t v) { return Size::Const(v); }
Index Idx(Size offset, std::vector<IndexTerm> terms) { return MakeIndex(offset, std::move(terms)); }
Index At(Var v) { return MakeIndex(Size(), {{v, C(1)}}); }

// ---- kernels that are not in test_kernels -------------------------------------------------

// out[i, j] = x[2 + i, 3 + 2j] * y[i, 0 (expanded)] + 1 with run-time n0 x n1; x is f32[10, 20].
absl::StatusOr<Kernel> SlicedExpanded() {
  KernelBuilder kb("sliced/expanded");
  const Size n0 = kb.AddScalar(), n1 = kb.AddScalar();
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, C(200));
  const Buffer y = kb.AddBuffer(kF32, Access::kRead, n0);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, n0 * n1);
  const Var i = kb.AddOuter(n0), j = kb.AddOuter(n1);
  const ExprOr xv = Load(x, Idx(C(43), {{i, C(20)}, {j, C(2)}}));
  const ExprOr yv = Load(y, Idx(Size(), {{i, C(1)}, {j, C(0)}}));
  kb.Add(Store(out, ContiguousIndex({i, j}, {n0, n1}), Add(Mul(xv, yv), ConstFloat(kF32, 1))));
  return kb.Finish();
}

// out = relu(a) over [n0, 1, n1] (size-1 and, at run time, zero-size dims).
absl::StatusOr<Kernel> ReluWithUnitDim() {
  KernelBuilder kb("relu [n0, 1, n1]");
  const Size n0 = kb.AddScalar(), n1 = kb.AddScalar();
  const Buffer a = kb.AddBuffer(kF32, Access::kRead, n0 * n1);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, n0 * n1);
  const Var i = kb.AddOuter(n0), u = kb.AddOuter(C(1)), j = kb.AddOuter(n1);
  const Index idx = ContiguousIndex({i, u, j}, {n0, C(1), n1});
  kb.Add(Store(out, idx, Unary(UnaryOp::kRelu, Load(a, idx))));
  return kb.Finish();
}

// 0-d: out[] = a[] * b[] (f64).
absl::StatusOr<Kernel> ZeroDim() {
  KernelBuilder kb("0-d mul");
  const Buffer a = kb.AddBuffer(kF64, Access::kRead, C(1));
  const Buffer b = kb.AddBuffer(kF64, Access::kRead, C(1));
  const Buffer out = kb.AddBuffer(kF64, Access::kWrite, C(1));
  kb.Add(Store(out, Idx(Size(), {}), Mul(Load(a, Idx(Size(), {})), Load(b, Idx(Size(), {})))));
  return kb.Finish();
}

// Integer division family on i64 (and remainder on i32) over n0 elements.
absl::StatusOr<Kernel> IntDivision() {
  KernelBuilder kb("int division");
  const Size n = kb.AddScalar();
  const Buffer a = kb.AddBuffer(kI64, Access::kRead, n);
  const Buffer b = kb.AddBuffer(kI64, Access::kRead, n);
  std::vector<Buffer> outs;
  for (int k = 0; k < 4; ++k) outs.push_back(kb.AddBuffer(kI64, Access::kWrite, n));
  const Buffer rem32 = kb.AddBuffer(kI32, Access::kWrite, n);
  const Var i = kb.AddOuter(n);
  const ExprOr x = Load(a, At(i)), y = Load(b, At(i));
  kb.Add(Store(outs[0], At(i), Binary(BinaryOp::kFloorDiv, x, y)));
  kb.Add(Store(outs[1], At(i), Binary(BinaryOp::kTruncDiv, x, y)));
  kb.Add(Store(outs[2], At(i), Binary(BinaryOp::kRemainder, x, y)));
  kb.Add(Store(outs[3], At(i), Binary(BinaryOp::kFmod, x, y)));
  kb.Add(Store(rem32, At(i), Binary(BinaryOp::kRemainder, Cast(kI32, x), Cast(kI32, y))));
  return kb.Finish();
}

// Per row of x f32[n0, 33]: amax, amin, argmax, argmin (NaN-propagating, torch's tie rules).
absl::StatusOr<Kernel> RowMaxMin() {
  KernelBuilder kb("row max/min");
  const Size n = kb.AddScalar();
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, n * C(33));
  const Buffer mx = kb.AddBuffer(kF32, Access::kWrite, n);
  const Buffer mn = kb.AddBuffer(kF32, Access::kWrite, n);
  const Buffer amx = kb.AddBuffer(kI64, Access::kWrite, n);
  const Buffer amn = kb.AddBuffer(kI64, Access::kWrite, n);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(C(33));
  const Accumulator a0 = kb.AddAccumulator(AccKind::kMax, kF32);
  const Accumulator a1 = kb.AddAccumulator(AccKind::kMin, kF32);
  const Accumulator a2 = kb.AddAccumulator(AccKind::kArgMax, kF32);
  const Accumulator a3 = kb.AddAccumulator(AccKind::kArgMin, kF32);
  kb.BeginPhase();
  const ExprOr v = Load(x, ContiguousIndex({row, col}, {n, C(33)}));
  for (const Accumulator& a : {a0, a1, a2, a3}) kb.Add(Accumulate(a, v));
  kb.BeginBody();
  kb.Add(Store(mx, At(row), AccRead(a0, AccField::kValue)));
  kb.Add(Store(mn, At(row), AccRead(a1, AccField::kValue)));
  kb.Add(Store(amx, At(row), AccRead(a2, AccField::kIndex)));
  kb.Add(Store(amn, At(row), AccRead(a3, AccField::kIndex)));
  return kb.Finish();
}

// var_mean(x, dim=-1, correction=1) of x f32[n0, 129] via Welford in f64.
absl::StatusOr<Kernel> VarMean() {
  KernelBuilder kb("var_mean");
  const Size n = kb.AddScalar();
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, n * C(129));
  const Buffer var = kb.AddBuffer(kF32, Access::kWrite, n);
  const Buffer mean = kb.AddBuffer(kF32, Access::kWrite, n);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(C(129));
  const Accumulator w = kb.AddAccumulator(AccKind::kWelford, kF64);
  kb.BeginPhase();
  kb.Add(Accumulate(w, Cast(kF64, Load(x, ContiguousIndex({row, col}, {n, C(129)})))));
  kb.BeginBody();
  const ExprOr denom = Sub(AccRead(w, AccField::kCount), ConstFloat(kF64, 1));
  kb.Add(Store(var, At(row), Cast(kF32, Div(AccRead(w, AccField::kM2), denom))));
  kb.Add(Store(mean, At(row), Cast(kF32, AccRead(w, AccField::kMean))));
  return kb.Finish();
}

// out[] = sum over [n0, n1] of x, accumulated in f64 (a full reduction: two reduction dims).
absl::StatusOr<Kernel> FullSum() {
  KernelBuilder kb("full sum");
  const Size n0 = kb.AddScalar(), n1 = kb.AddScalar();
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, n0 * n1);
  const Buffer out = kb.AddBuffer(kF64, Access::kWrite, C(1));
  const Var r0 = kb.AddReduce(n0), r1 = kb.AddReduce(n1);
  const Accumulator s = kb.AddAccumulator(AccKind::kSum, kF64);
  kb.BeginPhase();
  kb.Add(Accumulate(s, Cast(kF64, Load(x, ContiguousIndex({r0, r1}, {n0, n1})))));
  kb.BeginBody();
  kb.Add(Store(out, Idx(Size(), {}), AccRead(s, AccField::kValue)));
  return kb.Finish();
}

// out = f16(tanh(f32(a)) * 2 - f32(b)) for f16 a, b over n0 elements.
absl::StatusOr<Kernel> F16Chain() {
  KernelBuilder kb("f16 chain");
  const Size n = kb.AddScalar();
  const Buffer a = kb.AddBuffer(ScalarType::kFloat16, Access::kRead, n);
  const Buffer b = kb.AddBuffer(ScalarType::kFloat16, Access::kRead, n);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat16, Access::kWrite, n);
  const Var i = kb.AddOuter(n);
  const ExprOr t = Mul(Unary(UnaryOp::kTanh, Cast(kF32, Load(a, At(i)))), ConstFloat(kF32, 2));
  kb.Add(Store(out, At(i), Cast(ScalarType::kFloat16, Sub(t, Cast(kF32, Load(b, At(i)))))));
  return kb.Finish();
}

// The unary ops applied to x f32[n0]: out[k * n0 + i] = op_k(x[i]).
const std::vector<UnaryOp>& UnaryOps() {
  static const auto* ops = new std::vector<UnaryOp>{
      UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kExp, UnaryOp::kExp2, UnaryOp::kExpm1,
      UnaryOp::kSin, UnaryOp::kCos, UnaryOp::kTanh, UnaryOp::kSigmoid, UnaryOp::kErf,
      UnaryOp::kRelu, UnaryOp::kGelu, UnaryOp::kGeluTanh, UnaryOp::kSilu, UnaryOp::kFloor,
      UnaryOp::kCeil, UnaryOp::kRound, UnaryOp::kTrunc, UnaryOp::kSign};
  return *ops;
}

absl::StatusOr<Kernel> ManyUnary() {
  KernelBuilder kb("many unary");
  const Size n = kb.AddScalar();
  const int k = static_cast<int>(UnaryOps().size());
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, n);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, C(k) * n);
  const Var i = kb.AddOuter(n);
  for (int op = 0; op < k; ++op) {
    kb.Add(Store(out, Idx(C(op) * n, {{i, C(1)}}), Unary(UnaryOps()[op], Load(x, At(i)))));
  }
  return kb.Finish();
}

double RefUnary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kAbs: return std::fabs(x);
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kExp2: return std::exp2(x);
    case UnaryOp::kExpm1: return std::expm1(x);
    case UnaryOp::kSin: return std::sin(x);
    case UnaryOp::kCos: return std::cos(x);
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kSigmoid: return 1 / (1 + std::exp(-x));
    case UnaryOp::kErf: return std::erf(x);
    case UnaryOp::kRelu: return x > 0 ? x : 0;
    case UnaryOp::kGelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case UnaryOp::kGeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case UnaryOp::kSilu: return x / (1 + std::exp(-x));
    case UnaryOp::kFloor: return std::floor(x);
    case UnaryOp::kCeil: return std::ceil(x);
    case UnaryOp::kRound: return std::nearbyint(x);
    case UnaryOp::kTrunc: return std::trunc(x);
    case UnaryOp::kSign: return (x > 0) - (x < 0);
    default: return NAN;
  }
}

// Float binary ops on a, b f32[n0]: out[k * n0 + i] = op_k(a[i], b[i]).
const std::vector<BinaryOp>& FloatBinaryOps() {
  static const auto* ops = new std::vector<BinaryOp>{
      BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kTrueDiv, BinaryOp::kTruncDiv,
      BinaryOp::kFloorDiv, BinaryOp::kRemainder, BinaryOp::kFmod, BinaryOp::kPow,
      BinaryOp::kMaximum, BinaryOp::kMinimum};
  return *ops;
}

absl::StatusOr<Kernel> FloatBinary() {
  KernelBuilder kb("float binary");
  const Size n = kb.AddScalar();
  const int k = static_cast<int>(FloatBinaryOps().size());
  const Buffer a = kb.AddBuffer(kF32, Access::kRead, n);
  const Buffer b = kb.AddBuffer(kF32, Access::kRead, n);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, C(k) * n);
  const Var i = kb.AddOuter(n);
  for (int op = 0; op < k; ++op) {
    kb.Add(Store(out, Idx(C(op) * n, {{i, C(1)}}),
                 Binary(FloatBinaryOps()[op], Load(a, At(i)), Load(b, At(i)))));
  }
  return kb.Finish();
}

// Comparisons (as u8), logical ops and casts on a, b f32[n0]:
//   cmp[k * n0 + i] = u8(a cmp_k b) for eq, ne, lt, le, gt, ge
//   flags[i] = isnan(a) || isinf(b) (bool); land[i] = logical_and(a, b) (bool)
//   i32[i] = i32(a * 1000); u8[i] = u8(a); sel[i] = where(a > b, a, b); i64f[i] = f32(i64(a))
absl::StatusOr<Kernel> CompareAndCast() {
  KernelBuilder kb("compare and cast");
  const Size n = kb.AddScalar();
  const Buffer a = kb.AddBuffer(kF32, Access::kRead, n);
  const Buffer b = kb.AddBuffer(kF32, Access::kRead, n);
  const Buffer cmp = kb.AddBuffer(ScalarType::kUInt8, Access::kWrite, C(6) * n);
  const Buffer flags = kb.AddBuffer(ScalarType::kBool, Access::kWrite, n);
  const Buffer land = kb.AddBuffer(ScalarType::kBool, Access::kWrite, n);
  const Buffer i32 = kb.AddBuffer(kI32, Access::kWrite, n);
  const Buffer u8 = kb.AddBuffer(ScalarType::kUInt8, Access::kWrite, n);
  const Buffer sel = kb.AddBuffer(kF32, Access::kWrite, n);
  const Buffer i64f = kb.AddBuffer(kF32, Access::kWrite, n);
  const Var i = kb.AddOuter(n);
  const ExprOr x = Load(a, At(i)), y = Load(b, At(i));
  const BinaryOp cmps[] = {BinaryOp::kEq, BinaryOp::kNe, BinaryOp::kLt,
                           BinaryOp::kLe, BinaryOp::kGt, BinaryOp::kGe};
  for (int k = 0; k < 6; ++k) {
    kb.Add(Store(cmp, Idx(C(k) * n, {{i, C(1)}}), Cast(ScalarType::kUInt8, Binary(cmps[k], x, y))));
  }
  kb.Add(Store(flags, At(i), Binary(BinaryOp::kLogicalOr, Unary(UnaryOp::kIsNan, x),
                                    Unary(UnaryOp::kIsInf, y))));
  kb.Add(Store(land, At(i), Binary(BinaryOp::kLogicalAnd, x, y)));
  kb.Add(Store(i32, At(i), Cast(kI32, Mul(x, ConstFloat(kF32, 1000)))));
  kb.Add(Store(u8, At(i), Cast(ScalarType::kUInt8, x)));
  kb.Add(Store(sel, At(i), Select(Binary(BinaryOp::kGt, x, y), x, y)));
  kb.Add(Store(i64f, At(i), Cast(kF32, Cast(kI64, x))));
  return kb.Finish();
}

// Integer ops: i8 a, b -> add, mul, neg, abs (i8, wrapping); i32 c, d -> and, or, xor, not,
// shift_left, shift_right, pow, maximum (i32). out8[k * n0 + i], out32[k * n0 + i].
absl::StatusOr<Kernel> IntOps() {
  KernelBuilder kb("int ops");
  const Size n = kb.AddScalar();
  const ScalarType kI8 = ScalarType::kInt8;
  const Buffer a = kb.AddBuffer(kI8, Access::kRead, n);
  const Buffer b = kb.AddBuffer(kI8, Access::kRead, n);
  const Buffer c = kb.AddBuffer(kI32, Access::kRead, n);
  const Buffer d = kb.AddBuffer(kI32, Access::kRead, n);
  const Buffer out8 = kb.AddBuffer(kI8, Access::kWrite, C(4) * n);
  const Buffer out32 = kb.AddBuffer(kI32, Access::kWrite, C(8) * n);
  const Var i = kb.AddOuter(n);
  const ExprOr x = Load(a, At(i)), y = Load(b, At(i)), z = Load(c, At(i)), w = Load(d, At(i));
  const ExprOr r8[] = {Add(x, y), Mul(x, y), Unary(UnaryOp::kNeg, x), Unary(UnaryOp::kAbs, x)};
  for (int k = 0; k < 4; ++k) kb.Add(Store(out8, Idx(C(k) * n, {{i, C(1)}}), r8[k]));
  const ExprOr r32[] = {Binary(BinaryOp::kBitwiseAnd, z, w), Binary(BinaryOp::kBitwiseOr, z, w),
                        Binary(BinaryOp::kBitwiseXor, z, w), Unary(UnaryOp::kBitwiseNot, z),
                        Binary(BinaryOp::kShiftLeft, z, w), Binary(BinaryOp::kShiftRight, z, w),
                        Binary(BinaryOp::kPow, z, w), Max(z, w)};
  for (int k = 0; k < 8; ++k) kb.Add(Store(out32, Idx(C(k) * n, {{i, C(1)}}), r32[k]));
  return kb.Finish();
}

// constant_pad_nd(x, (2, 2), value=0.5) for x f32[n0]: a masked load with a negative offset, a
// mask built from the loop variable and a scalar, and a select for the pad value.
absl::StatusOr<Kernel> Pad() {
  KernelBuilder kb("pad");
  const Size n = kb.AddScalar();
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, n);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, n + C(4));
  const Var i = kb.AddOuter(n + C(4));
  const ExprOr inside =
      Binary(BinaryOp::kLogicalAnd, Binary(BinaryOp::kGe, LoopVar(i), ConstInt(kI64, 2)),
             Binary(BinaryOp::kLt, LoopVar(i), Add(ScalarParam(0), ConstInt(kI64, 2))));
  const ExprOr v = LoadMasked(x, Idx(C(-2), {{i, C(1)}}), inside);
  kb.Add(Store(out, At(i), Select(inside, v, ConstFloat(kF32, 0.5))));
  return kb.Finish();
}

// ---- the suite ------------------------------------------------------------------------------

enum KernelId {
  kBroadcast, kSliced, kRelu, kZeroDim, kIntDiv, kRowMaxMin, kSoftmax, kLogSoftmax, kLayerNorm,
  kVarMean, kColumnSum, kBf16, kF16, kFullSum, kUnary, kFloatBinary, kCompareCast, kIntOps,
  kPad, kSum1D, kNumKernels
};

// Parameterized by compiler: the whole suite runs on code from g++ and from clang++-14.
class CpuE2eTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!toolchain::FindProgram(GetParam()).ok()) GTEST_SKIP() << GetParam() << " not installed";
    auto it = modules_->find(GetParam());
    if (it == modules_->end()) {
      kiln_module* m = nullptr;
      Compile(GetParam(), &m);
      it = modules_->emplace(GetParam(), m).first;
    }
    module_ = it->second;
    ASSERT_NE(module_, nullptr) << "compile or load failed for " << GetParam();
  }

  static void Compile(const std::string& compiler, kiln_module** out) {
    std::vector<absl::StatusOr<Kernel>> ks(kNumKernels);
    ks[kBroadcast] = kt::BroadcastAddTransposed(67, 300);
    ks[kSliced] = SlicedExpanded();
    ks[kRelu] = ReluWithUnitDim();
    ks[kZeroDim] = ZeroDim();
    ks[kIntDiv] = IntDivision();
    ks[kRowMaxMin] = RowMaxMin();
    ks[kSoftmax] = kt::RowSoftmax(257, false);
    ks[kLogSoftmax] = kt::RowSoftmax(257, true);
    ks[kLayerNorm] = kt::LayerNorm(300, 1e-5f);
    ks[kVarMean] = VarMean();
    ks[kColumnSum] = kt::ColumnSum(123, 45);
    ks[kBf16] = kt::Bf16Chain(10007);
    ks[kF16] = F16Chain();
    ks[kFullSum] = FullSum();
    ks[kUnary] = ManyUnary();
    ks[kFloatBinary] = FloatBinary();
    ks[kCompareCast] = CompareAndCast();
    ks[kIntOps] = IntOps();
    ks[kPad] = Pad();
    ks[kSum1D] = kt::ColumnSum(100003, 1);  // one row: the reduction loop is split across threads
    std::vector<Kernel> kernels;
    for (int i = 0; i < kNumKernels; ++i) {
      ASSERT_TRUE(ks[i].ok()) << "kernel " << i << ": " << ks[i].status();
      kernels.push_back(*ks[i]);
    }
    CpuEmitOptions eo;
    eo.parallel_threshold = 4096;  // exercise the OpenMP path at test sizes
    absl::StatusOr<CpuSource> src = EmitCpuSource(kernels, eo);
    ASSERT_TRUE(src.ok()) << src.status();
    if (const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
      std::ofstream(absl::StrCat(dir, "/e2e_kernels.cc")) << src->source;  // for inspection
    }
    toolchain::CompileOptions co;
    co.compiler = compiler;
    co.march = "x86-64-v2";
    absl::StatusOr<toolchain::CompiledBinary> bin = toolchain::CompileSharedObject(src->source, co);
    ASSERT_TRUE(bin.ok()) << bin.status();
    if (!bin->log.empty()) std::cerr << "compiler log:\n" << bin->log;
    std::cerr << compiler << " compile took " << absl::FormatDuration(bin->timings.compile) << " for "
              << src->source.size() << " bytes of source\n";
    kiln_module* m = nullptr;
    ASSERT_EQ(kiln_module_load(bin->bytes.data(), bin->bytes.size(), &m), KILN_OK)
        << kiln_last_error();
    for (int i = 0; i < kNumKernels; ++i) {
      int32_t index = -1;
      ASSERT_EQ(kiln_module_add_kernel(m, src->symbols[i].c_str(), &index), KILN_OK);
      ASSERT_EQ(index, i);
    }
    *out = m;
  }
  static void TearDownTestSuite() {
    for (auto& [name, m] : *modules_) kiln_module_unload(m);
    modules_->clear();
  }

  void Run(KernelId k, std::vector<void*> buffers, std::vector<int64_t> scalars) {
    ASSERT_NE(module_, nullptr);
    ASSERT_EQ(kiln_run_kernel(module_, k, buffers.data(), scalars.data()), KILN_OK)
        << kiln_last_error();
  }

  std::vector<float> Random(size_t n, float lo = -3, float hi = 3) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }

  static std::map<std::string, kiln_module*>* modules_;
  kiln_module* module_ = nullptr;
  std::mt19937 rng_{12345};
};
std::map<std::string, kiln_module*>* CpuE2eTest::modules_ = new std::map<std::string, kiln_module*>();

bool Close(double got, double ref, double rtol, double atol) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  return std::fabs(got - ref) <= atol + rtol * std::fabs(ref);
}

#define EXPECT_CLOSE(got, ref, rtol, atol) \
  EXPECT_TRUE(Close((got), (ref), (rtol), (atol))) << "got " << (got) << " want " << (ref)

TEST_P(CpuE2eTest, BroadcastAddWithTransposedInput) {
  const int R = 67, Cc = 300;
  std::vector<float> a = Random(R * Cc), b = Random(Cc), out(R * Cc, NAN);
  Run(kBroadcast, {a.data(), b.data(), out.data()}, {});
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < Cc; ++j) {
      EXPECT_CLOSE(out[i * Cc + j], double(a[j * R + i]) + b[j], 1e-6, 0);
    }
  }
}

TEST_P(CpuE2eTest, SlicedAndExpandedInputs) {
  const int n0 = 5, n1 = 7;
  std::vector<float> x = Random(200), y = Random(n0), out(n0 * n1, NAN);
  Run(kSliced, {x.data(), y.data(), out.data()}, {n0, n1});
  for (int i = 0; i < n0; ++i) {
    for (int j = 0; j < n1; ++j) {
      EXPECT_CLOSE(out[i * n1 + j], double(x[(2 + i) * 20 + 3 + 2 * j]) * y[i] + 1, 1e-6, 1e-7);
    }
  }
}

TEST_P(CpuE2eTest, SizeOneAndZeroSizeDims) {
  std::vector<float> a = Random(3 * 9), out(3 * 9, NAN);
  a[4] = NAN;
  Run(kRelu, {a.data(), out.data()}, {3, 9});
  for (int i = 0; i < 27; ++i) EXPECT_CLOSE(out[i], a[i] > 0 || std::isnan(a[i]) ? a[i] : 0.0f, 0, 0);
  std::vector<float> sentinel(4, 7.0f);
  Run(kRelu, {sentinel.data(), sentinel.data()}, {0, 5});  // zero-size: touches nothing
  Run(kRelu, {sentinel.data(), sentinel.data()}, {4, 0});
  for (float v : sentinel) EXPECT_EQ(v, 7.0f);
  // Large enough for the parallel, blocked path (with a tail block).
  std::vector<float> big = Random(3 * 10007), big_out(big.size(), NAN);
  Run(kRelu, {big.data(), big_out.data()}, {3, 10007});
  for (size_t i = 0; i < big.size(); ++i) ASSERT_EQ(big_out[i], big[i] > 0 ? big[i] : 0.0f) << i;
}

TEST_P(CpuE2eTest, ZeroDimTensors) {
  double a = 1.5, b = -2.25, out = NAN;
  Run(kZeroDim, {&a, &b, &out}, {});
  EXPECT_EQ(out, -3.375);
}

TEST_P(CpuE2eTest, IntegerDivisionAndRemainderWithNegativeOperands) {
  std::vector<int64_t> a = {7, -7, 7, -7, 0, 5, -1, std::numeric_limits<int64_t>::min(), 9, -9};
  std::vector<int64_t> b = {2, 2, -2, -2, 3, 0, 5, -1, 3, 4};
  const size_t n = a.size();
  std::vector<int64_t> fl(n), tr(n), rem(n), fm(n);
  std::vector<int32_t> rem32(n);
  Run(kIntDiv, {a.data(), b.data(), fl.data(), tr.data(), rem.data(), fm.data(), rem32.data()},
      {static_cast<int64_t>(n)});
  const std::vector<int64_t> want_fl = {3, -4, -4, 3, 0, 0, -1, std::numeric_limits<int64_t>::min(), 3, -3};
  const std::vector<int64_t> want_tr = {3, -3, -3, 3, 0, 0, 0, std::numeric_limits<int64_t>::min(), 3, -2};
  const std::vector<int64_t> want_rem = {1, 1, -1, -1, 0, 0, 4, 0, 0, 3};
  const std::vector<int64_t> want_fm = {1, -1, 1, -1, 0, 0, -1, 0, 0, -1};
  EXPECT_EQ(fl, want_fl);
  EXPECT_EQ(tr, want_tr);
  EXPECT_EQ(rem, want_rem);
  EXPECT_EQ(fm, want_fm);
  // i32: casts wrap (INT64_MIN -> 0), the rest as in i64.
  const std::vector<int32_t> want_rem32 = {1, 1, -1, -1, 0, 0, 4, 0, 0, 3};
  EXPECT_EQ(rem32, want_rem32);
}

TEST_P(CpuE2eTest, MaxMinReductionsPropagateNan) {
  const int n = 6, Cc = 33;
  std::vector<float> x = Random(n * Cc);
  x[1 * Cc + 5] = NAN;                   // row 1: one NaN
  x[2 * Cc + 3] = NAN;                   // row 2: two NaNs: argmax/argmin take the first
  x[2 * Cc + 20] = NAN;
  x[3 * Cc + 7] = 10;                    // row 3: tie for max: the first wins
  x[3 * Cc + 9] = 10;
  for (int j = 0; j < Cc; ++j) x[4 * Cc + j] = -INFINITY;  // row 4: all -inf
  std::vector<float> mx(n), mn(n);
  std::vector<int64_t> amx(n), amn(n);
  Run(kRowMaxMin, {x.data(), mx.data(), mn.data(), amx.data(), amn.data()}, {n});
  for (int i = 0; i < n; ++i) {
    double rmx = -INFINITY, rmn = INFINITY;
    int64_t iamx = -1, iamn = -1;
    bool nan = false;
    for (int j = 0; j < Cc; ++j) {
      const float v = x[i * Cc + j];
      if (std::isnan(v)) {
        if (!nan) iamx = iamn = j;
        nan = true;
        continue;
      }
      if (nan) continue;
      if (iamx < 0 || v > rmx) { rmx = v; iamx = j; }
      if (iamn < 0 || v < rmn) { rmn = v; iamn = j; }
    }
    if (nan) rmx = rmn = NAN;
    EXPECT_CLOSE(mx[i], rmx, 0, 0);
    EXPECT_CLOSE(mn[i], rmn, 0, 0);
    EXPECT_EQ(amx[i], iamx) << "row " << i;
    EXPECT_EQ(amn[i], iamn) << "row " << i;
  }
  EXPECT_EQ(amx[3], 7);
  EXPECT_EQ(amx[2], 3);
}

void CheckSoftmax(const std::vector<float>& x, const std::vector<float>& out, int rows, int cols,
                  bool log) {
  for (int i = 0; i < rows; ++i) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < cols; ++j) m = std::max(m, double(x[i * cols + j]));
    for (int j = 0; j < cols; ++j) s += std::exp(x[i * cols + j] - m);
    for (int j = 0; j < cols; ++j) {
      const double v = x[i * cols + j] - m;
      const double ref = log ? v - std::log(s) : std::exp(v) / s;
      ASSERT_TRUE(Close(out[i * cols + j], ref, 1e-5, 1e-7))
          << "row " << i << " col " << j << " got " << out[i * cols + j] << " want " << ref;
    }
  }
}

TEST_P(CpuE2eTest, SoftmaxRows) {
  const int n = 40, Cc = 257;
  std::vector<float> x = Random(n * Cc, -20, 20), out(n * Cc);
  x[5 * Cc + 0] = -INFINITY;  // masked entries
  x[5 * Cc + 100] = -INFINITY;
  x[5 * Cc + 256] = -INFINITY;  // in the scalar tail after the lanes
  for (int j = 0; j < Cc; ++j) x[6 * Cc + j] = -INFINITY;  // fully masked row: NaN, as torch
  x[7 * Cc + 33] = NAN;                                    // a NaN poisons its row
  x[8 * Cc + 3] = INFINITY;  // +inf: exp(inf - inf) is NaN, so the sum and the row are NaN
  Run(kSoftmax, {x.data(), out.data()}, {n});
  CheckSoftmax(x, out, n, Cc, false);
  EXPECT_EQ(out[5 * Cc + 100], 0.0f);
  EXPECT_EQ(out[5 * Cc + 256], 0.0f);
  EXPECT_TRUE(std::isnan(out[6 * Cc + 10]));
  EXPECT_TRUE(std::isnan(out[7 * Cc + 200]));
  EXPECT_TRUE(std::isnan(out[8 * Cc + 3]));
  EXPECT_TRUE(std::isnan(out[8 * Cc + 4]));
}

TEST_P(CpuE2eTest, LogSoftmaxRows) {
  const int n = 40, Cc = 257;
  std::vector<float> x = Random(n * Cc, -20, 20), out(n * Cc);
  Run(kLogSoftmax, {x.data(), out.data()}, {n});
  CheckSoftmax(x, out, n, Cc, true);
}

TEST_P(CpuE2eTest, LayerNormWithWelford) {
  const int n = 33, Cc = 300;
  std::vector<float> x = Random(n * Cc), w = Random(Cc), b = Random(Cc);
  for (float& v : x) v += 100;  // a large mean: Welford keeps the variance accurate
  std::vector<float> out(n * Cc), mean(n), rstd(n);
  Run(kLayerNorm, {x.data(), w.data(), b.data(), out.data(), mean.data(), rstd.data()}, {n});
  for (int i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int j = 0; j < Cc; ++j) m += x[i * Cc + j];
    m /= Cc;
    for (int j = 0; j < Cc; ++j) v += (x[i * Cc + j] - m) * (x[i * Cc + j] - m);
    v /= Cc;
    const double r = 1 / std::sqrt(v + 1e-5);
    EXPECT_CLOSE(mean[i], m, 1e-6, 0);
    EXPECT_CLOSE(rstd[i], r, 1e-4, 0);
    for (int j = 0; j < Cc; ++j) {
      const double ref = (x[i * Cc + j] - m) * r * w[j] + b[j];
      ASSERT_TRUE(Close(out[i * Cc + j], ref, 1e-4, 1e-4)) << out[i * Cc + j] << " vs " << ref;
    }
  }
}

TEST_P(CpuE2eTest, VarMean) {
  const int n = 50, Cc = 129;
  std::vector<float> x = Random(n * Cc), var(n), mean(n);
  Run(kVarMean, {x.data(), var.data(), mean.data()}, {n});
  for (int i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int j = 0; j < Cc; ++j) m += x[i * Cc + j];
    m /= Cc;
    for (int j = 0; j < Cc; ++j) v += (x[i * Cc + j] - m) * (x[i * Cc + j] - m);
    v /= (Cc - 1);
    EXPECT_CLOSE(mean[i], m, 1e-5, 1e-7);
    EXPECT_CLOSE(var[i], v, 1e-5, 0);
  }
}

TEST_P(CpuE2eTest, ColumnReduction) {
  const int R = 123, Cc = 45;
  std::vector<float> x = Random(R * Cc), out(Cc);
  Run(kColumnSum, {x.data(), out.data()}, {});
  for (int c = 0; c < Cc; ++c) {
    double s = 0, abs_sum = 0;
    for (int r = 0; r < R; ++r) s += x[r * Cc + c], abs_sum += std::fabs(x[r * Cc + c]);
    EXPECT_NEAR(out[c], s, 1e-6 * abs_sum);
  }
}

TEST_P(CpuE2eTest, FullReductionOverOneDimIsSplitAcrossThreads) {
  std::vector<float> x = Random(100003);
  float out = NAN;
  Run(kSum1D, {x.data(), &out}, {});
  double s = 0, a = 0;
  for (float v : x) s += v, a += std::fabs(v);
  EXPECT_NEAR(out, s, 1e-6 * a);
}

TEST_P(CpuE2eTest, FullReductionOverTwoDims) {
  std::vector<float> x = Random(300 * 301);
  double out = NAN;
  Run(kFullSum, {x.data(), &out}, {300, 301});
  double s = 0;
  for (float v : x) s += v;
  EXPECT_NEAR(out, s, 1e-9 * x.size());
}

TEST_P(CpuE2eTest, Bf16Chain) {
  const int n = 10007;
  std::vector<float> fa = Random(n), fb = Random(n);
  std::vector<uint16_t> a(n), b(n), out(n);
  for (int i = 0; i < n; ++i) a[i] = kiln_cpu::f32_to_bf16(fa[i]), b[i] = kiln_cpu::f32_to_bf16(fb[i]);
  Run(kBf16, {a.data(), b.data(), out.data()}, {});
  for (int i = 0; i < n; ++i) {
    const double p = double(kiln_cpu::bf16_to_f32(a[i])) * kiln_cpu::bf16_to_f32(b[i]);
    const double ref = p / (1 + std::exp(-p)) + 1;
    ASSERT_TRUE(Close(kiln_cpu::bf16_to_f32(out[i]), ref, 1e-2, 1e-2)) << i;
  }
}

TEST_P(CpuE2eTest, F16Chain) {
  const int n = 5000;
  std::vector<float> fa = Random(n), fb = Random(n);
  std::vector<uint16_t> a(n), b(n), out(n);
  for (int i = 0; i < n; ++i) a[i] = kiln_cpu::f32_to_f16(fa[i]), b[i] = kiln_cpu::f32_to_f16(fb[i]);
  Run(kF16, {a.data(), b.data(), out.data()}, {n});
  for (int i = 0; i < n; ++i) {
    const double ref = std::tanh(double(kiln_cpu::f16_to_f32(a[i]))) * 2 - kiln_cpu::f16_to_f32(b[i]);
    ASSERT_TRUE(Close(kiln_cpu::f16_to_f32(out[i]), ref, 1e-2, 1e-3)) << i;
  }
}

TEST_P(CpuE2eTest, UnaryOpsMatchReference) {
  const int n = 20011;
  std::vector<float> x = Random(n, -6, 6);
  x[0] = 0.5f, x[1] = 1.5f, x[2] = 2.5f, x[3] = -0.5f, x[4] = -2.5f, x[5] = 0.0f, x[6] = NAN;
  const int k = static_cast<int>(UnaryOps().size());
  std::vector<float> out(static_cast<size_t>(k) * n, -1234.5f);
  Run(kUnary, {x.data(), out.data()}, {n});
  for (int op = 0; op < k; ++op) {
    for (int i = 0; i < n; ++i) {
      const UnaryOp u = UnaryOps()[op];
      double ref = RefUnary(u, x[i]);
      if (std::isnan(x[i])) {
        ref = u == UnaryOp::kSign ? 0.0 : NAN;  // torch: sign(NaN) = 0, relu(NaN) = NaN
      }
      ASSERT_TRUE(Close(out[op * n + i], ref, 1e-5, 1e-6))
          << UnaryOpName(u) << "(" << x[i] << ") = " << out[op * n + i] << ", want " << ref;
    }
  }
}

TEST_P(CpuE2eTest, FloatBinaryOpsMatchTorchSemantics) {
  const int n = 4099;
  std::vector<float> a = Random(n, -6, 6), b = Random(n, -6, 6);
  // Special operands: NaN, zero divisors, exact multiples, negative zero, infinities.
  const float sa[] = {NAN, 1.0f, 7.0f, -7.0f, 7.0f, -7.0f, 0.0f, 5.5f, INFINITY, 2.0f, -0.0f, 3.0f};
  const float sb[] = {1.0f, NAN, 2.0f, 2.0f, -2.0f, -2.0f, 3.0f, 0.0f, 2.0f, -INFINITY, 1.0f, 0.5f};
  for (int i = 0; i < 12; ++i) a[i] = sa[i], b[i] = sb[i];
  const int k = static_cast<int>(FloatBinaryOps().size());
  std::vector<float> out(static_cast<size_t>(k) * n);
  Run(kFloatBinary, {a.data(), b.data(), out.data()}, {n});
  for (int op = 0; op < k; ++op) {
    for (int i = 0; i < n; ++i) {
      const double x = a[i], y = b[i];
      const double q = x / y;
      double ref;
      switch (FloatBinaryOps()[op]) {
        case BinaryOp::kAdd: ref = x + y; break;
        case BinaryOp::kSub: ref = x - y; break;
        case BinaryOp::kMul: ref = x * y; break;
        case BinaryOp::kTrueDiv: ref = q; break;
        case BinaryOp::kTruncDiv: ref = std::trunc(q); break;
        case BinaryOp::kFloorDiv:  // torch (and Python): inf // y is NaN (fmod(inf, y) is NaN)
          // and x // -inf is -1 for x > 0 (the remainder keeps the divisor's sign).
          ref = y == 0          ? q
                : std::isinf(x) ? NAN
                : std::isinf(y) ? ((x != 0 && (x < 0) != (y < 0)) ? -1.0 : std::copysign(0.0, q))
                                : std::floor(q);
          break;
        case BinaryOp::kRemainder: {
          double r = std::fmod(x, y);
          if (r != 0 && ((r < 0) != (y < 0))) r += y;
          ref = r;
          break;
        }
        case BinaryOp::kFmod: ref = std::fmod(x, y); break;
        case BinaryOp::kPow: ref = std::pow(x, y); break;
        case BinaryOp::kMaximum: ref = std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y); break;
        case BinaryOp::kMinimum: ref = std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y); break;
        default: ref = NAN;
      }
      const BinaryOp o = FloatBinaryOps()[op];
      const bool near_integer_quotient = std::fabs(q - std::nearbyint(q)) < 1e-4 && i >= 12;
      if ((o == BinaryOp::kTruncDiv || o == BinaryOp::kFloorDiv) && near_integer_quotient) continue;
      ASSERT_TRUE(Close(out[op * n + i], ref, 1e-5, 1e-5))
          << BinaryOpName(o) << "(" << x << ", " << y << ") = " << out[op * n + i] << ", want " << ref;
    }
  }
  // torch: floor_divide(-0.0, 1) is -0.0; remainder(5.5, 0) is NaN; floor_divide(3, 0.5) is 6.
  const int fd = 5, rem = 6;
  EXPECT_TRUE(std::signbit(out[fd * n + 10]));
  EXPECT_TRUE(std::isnan(out[rem * n + 7]));
  EXPECT_EQ(out[fd * n + 11], 6.0f);
}

TEST_P(CpuE2eTest, ComparisonsLogicalOpsAndCasts) {
  const int n = 2051;
  std::vector<float> a = Random(n, -400, 400), b = Random(n, -400, 400);
  a[0] = NAN, b[1] = INFINITY, a[2] = b[2] = 1.5f, a[3] = 0.0f, b[4] = 0.0f;
  a[5] = 3e9f, a[6] = -1.7f, a[7] = 300.5f;
  std::vector<uint8_t> cmp(6 * n), u8(n);
  std::unique_ptr<bool[]> flags(new bool[n]), land(new bool[n]);
  std::vector<int32_t> i32(n);
  std::vector<float> sel(n), i64f(n);
  Run(kCompareCast, {a.data(), b.data(), cmp.data(), flags.get(), land.get(), i32.data(),
                     u8.data(), sel.data(), i64f.data()}, {n});
  for (int i = 0; i < n; ++i) {
    const float x = a[i], y = b[i];
    const bool want[] = {x == y, x != y, x < y, x <= y, x > y, x >= y};
    for (int k = 0; k < 6; ++k) ASSERT_EQ(cmp[k * n + i], want[k] ? 1 : 0) << k << " " << i;
    ASSERT_EQ(flags[i], std::isnan(x) || std::isinf(y)) << i;
    ASSERT_EQ(land[i], x != 0 && y != 0) << i;  // NaN is true
    ASSERT_TRUE(Close(sel[i], x > y ? x : y, 0, 0)) << i;
    if (i >= 8 && !std::isnan(x)) {
      ASSERT_EQ(i32[i], static_cast<int32_t>(x * 1000.0f)) << i;
      ASSERT_EQ(u8[i], static_cast<uint8_t>(static_cast<int32_t>(x))) << i;
      ASSERT_EQ(i64f[i], std::trunc(x)) << i;
    }
  }
  EXPECT_EQ(i32[0], INT32_MIN);          // NaN -> int32: INT32_MIN, as torch on x86
  EXPECT_EQ(i32[5], INT32_MIN);          // out of range
  EXPECT_EQ(u8[6], 255);                 // -1.7 -> -1 -> 255
  EXPECT_EQ(u8[7], 44);                  // 300 wraps
  EXPECT_TRUE(std::isnan(sel[0]) == false && sel[0] == b[0]);  // NaN > y is false
}

TEST_P(CpuE2eTest, IntegerOpsWrapAndNeverTrap) {
  const int n = 1031;
  std::uniform_int_distribution<int> d8(-128, 127), d32(-100000, 100000), dshift(-2, 40);
  std::vector<int8_t> a(n), b(n);
  std::vector<int32_t> c(n), d(n);
  for (int i = 0; i < n; ++i) a[i] = d8(rng_), b[i] = d8(rng_), c[i] = d32(rng_), d[i] = dshift(rng_);
  a[0] = -128, b[0] = -1, c[0] = -5, d[0] = 33, c[1] = 3, d[1] = 5, c[2] = 2, d[2] = -1;
  std::vector<int8_t> out8(4 * n);
  std::vector<int32_t> out32(8 * n);
  Run(kIntOps, {a.data(), b.data(), c.data(), d.data(), out8.data(), out32.data()}, {n});
  for (int i = 0; i < n; ++i) {
    const int8_t w8[] = {static_cast<int8_t>(a[i] + b[i]), static_cast<int8_t>(a[i] * b[i]),
                         static_cast<int8_t>(-a[i]), static_cast<int8_t>(a[i] < 0 ? -a[i] : a[i])};
    for (int k = 0; k < 4; ++k) ASSERT_EQ(out8[k * n + i], w8[k]) << k << " " << i;
    const int32_t x = c[i], y = d[i];
    const bool big = y < 0 || y >= 32;
    int64_t p = 1;
    if (y < 0) {
      p = x == 1 ? 1 : x == -1 ? (y % 2 == 0 ? 1 : -1) : 0;
    } else {
      uint32_t r = 1, base = static_cast<uint32_t>(x);
      for (int e = y; e > 0; --e) r *= base;
      p = static_cast<int32_t>(r);
    }
    const int32_t w32[] = {x & y, x | y, x ^ y, ~x,
                           big ? 0 : static_cast<int32_t>(static_cast<uint32_t>(x) << y),
                           big ? (x < 0 ? -1 : 0) : (x >> y), static_cast<int32_t>(p),
                           std::max(x, y)};
    for (int k = 0; k < 8; ++k) ASSERT_EQ(out32[k * n + i], w32[k]) << k << " " << i;
  }
  EXPECT_EQ(out8[2 * n + 0], -128);  // -(-128) wraps
  EXPECT_EQ(out8[3 * n + 0], -128);  // abs(-128) wraps, as torch
  EXPECT_EQ(out32[6 * n + 1], 243);  // 3 ** 5
  EXPECT_EQ(out32[6 * n + 2], 0);    // 2 ** -1 == 0 for integers
}

TEST_P(CpuE2eTest, MaskedLoadsPad) {
  for (int n : {0, 1, 5000}) {
    std::vector<float> x = Random(n), out(n + 4, NAN);
    Run(kPad, {x.data(), out.data()}, {n});
    for (int i = 0; i < n + 4; ++i) {
      ASSERT_EQ(out[i], (i >= 2 && i < n + 2) ? x[i - 2] : 0.5f) << n << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compilers, CpuE2eTest, ::testing::Values("g++", "clang++-14"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "g++" ? std::string("gcc") : std::string("clang");
                         });

}  // namespace
}  // namespace kiln::codegen
