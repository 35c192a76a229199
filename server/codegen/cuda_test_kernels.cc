#include "server/codegen/cuda_test_kernels.h"

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::codegen::testing {

using namespace ::kiln::kernel;  // NOLINT: builds IR

// A pointwise kernel applying every unary and binary op valid for `t` to loads of a and b, each
// result stored to a buffer of its own (plus a masked load, a select and casts to every type).
absl::StatusOr<Kernel> EveryOp(ScalarType t, int64_t n) {
  KernelBuilder kb(absl::StrCat("every op ", ScalarTypeName(t)));
  const Size size = Size::Const(n);
  const Buffer a = kb.AddBuffer(t, Access::kRead, size);
  const Buffer b = kb.AddBuffer(t, Access::kRead, size);
  const Var i = kb.AddOuter(size);
  const Index idx = MakeIndex(Size(), {{i, Size::Const(1)}});
  auto store = [&](const ExprOr& v) {
    if (!v.ok()) return;
    kb.Add(Store(kb.AddBuffer((*v)->type, Access::kWrite, size), idx, v));
  };
  for (int op = 0; op <= static_cast<int>(UnaryOp::kBitwiseNot); ++op) {
    store(Unary(static_cast<UnaryOp>(op), Load(a, idx)));
  }
  for (int op = 0; op <= static_cast<int>(BinaryOp::kShiftRight); ++op) {
    store(Binary(static_cast<BinaryOp>(op), Load(a, idx), Load(b, idx)));
  }
  for (ScalarType to : {ScalarType::kBool, ScalarType::kInt8, ScalarType::kUInt8, ScalarType::kInt32,
                        ScalarType::kInt64, ScalarType::kFloat16, ScalarType::kBFloat16,
                        ScalarType::kFloat32, ScalarType::kFloat64}) {
    store(Cast(to, Load(a, idx)));
  }
  const ExprOr first = Binary(BinaryOp::kLt, LoopVar(i), ConstInt(ScalarType::kInt64, n / 2));
  store(LoadMasked(b, MakeIndex(Size::Const(-1), {{i, Size::Const(1)}}),
                   Binary(BinaryOp::kGe, LoopVar(i), ConstInt(ScalarType::kInt64, 1))));
  store(Select(first, Load(a, idx), Load(b, idx)));
  if (IsFloatType(t) && !IsHalfType(t)) {
    store(Add(Load(a, idx), ConstFloat(t, std::numeric_limits<double>::infinity())));
    store(Add(Load(a, idx), ConstFloat(t, -0.0)));
    store(Add(Load(a, idx), ConstFloat(t, std::numeric_limits<double>::quiet_NaN())));
  }
  return kb.Finish();
}

// Row kernels with every accumulator kind, a 2-D reduction space, dynamic sizes and a full
// reduction (no outer dims).
absl::StatusOr<Kernel> EveryAccumulator(ScalarType t, bool dynamic, int64_t r0, int64_t r1) {
  KernelBuilder kb("every accumulator");
  const Size n = dynamic ? kb.AddScalar() : Size::Const(37);
  const Size a = Size::Const(r0), b = Size::Const(r1);
  const Buffer x = kb.AddBuffer(t, Access::kRead, n * a * b);
  const Var row = kb.AddOuter(n);
  const Var i = kb.AddReduce(a), j = kb.AddReduce(b);
  const Index idx = ContiguousIndex({row, i, j}, {n, a, b});
  std::vector<Accumulator> accs;
  for (AccKind k : {AccKind::kSum, AccKind::kProd, AccKind::kMax, AccKind::kMin, AccKind::kArgMax,
                    AccKind::kArgMin}) {
    accs.push_back(kb.AddAccumulator(k, t));
  }
  const bool fl = IsFloatType(t);
  if (fl) {
    accs.push_back(kb.AddAccumulator(AccKind::kWelford, t));
    accs.push_back(kb.AddAccumulator(AccKind::kOnlineSoftmax, t));
  }
  kb.BeginPhase();
  for (const Accumulator& acc : accs) kb.Add(Accumulate(acc, Load(x, idx)));
  kb.BeginPhase();
  const Accumulator second = kb.AddAccumulator(AccKind::kSum, t);
  kb.Add(Accumulate(second, Sub(Load(x, idx), AccRead(accs[2], AccField::kValue))));
  kb.BeginBody();
  const Index ridx = MakeIndex(Size(), {{row, Size::Const(1)}});
  auto out = [&](const ExprOr& v) { kb.Add(Store(kb.AddBuffer((*v)->type, Access::kWrite, n), ridx, v)); };
  out(AccRead(accs[0], AccField::kValue));
  out(AccRead(accs[1], AccField::kValue));
  out(AccRead(accs[3], AccField::kValue));
  out(AccRead(accs[4], AccField::kIndex));
  out(AccRead(accs[5], AccField::kValue));
  out(AccRead(second, AccField::kValue));
  if (fl) {
    out(AccRead(accs[6], AccField::kM2));
    out(AccRead(accs[7], AccField::kSum));
  }
  return kb.Finish();
}

absl::StatusOr<Kernel> FullSum(int64_t n) {
  KernelBuilder kb("full sum");
  const Buffer x = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, Size::Const(n));
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, Size::Const(1));
  const Var r = kb.AddReduce(Size::Const(n));
  const Accumulator s = kb.AddAccumulator(AccKind::kSum, ScalarType::kFloat32);
  kb.BeginPhase();
  kb.Add(Accumulate(s, Load(x, MakeIndex(Size(), {{r, Size::Const(1)}}))));
  kb.BeginBody();
  kb.Add(Store(out, MakeIndex(Size(), {}), AccRead(s, AccField::kValue)));
  return kb.Finish();
}

absl::StatusOr<Kernel> SlicedRowSoftmax(ScalarType t, int64_t cols) {
  KernelBuilder kb(absl::StrCat("sliced softmax ", ScalarTypeName(t)));
  const Size n = kb.AddScalar(), c = Size::Const(cols), stride = Size::Const(cols + 1);
  const Buffer in = kb.AddBuffer(t, Access::kRead, n * stride);
  const Buffer out = kb.AddBuffer(t, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator sm = kb.AddAccumulator(AccKind::kOnlineSoftmax, ScalarType::kFloat32);
  const Index in_idx = MakeIndex(Size::Const(1), {{row, stride}, {col, Size::Const(1)}});
  const bool f32 = t == ScalarType::kFloat32;
  auto x = [&] { return f32 ? Load(in, in_idx) : Cast(ScalarType::kFloat32, Load(in, in_idx)); };
  kb.BeginPhase();
  kb.Add(Accumulate(sm, x()));
  kb.BeginPhase();
  const ExprOr y = Div(Exp(Sub(x(), AccRead(sm, AccField::kMax))), AccRead(sm, AccField::kSum));
  kb.Add(Store(out, ContiguousIndex({row, col}, {n, c}), f32 ? y : Cast(t, y)));
  return kb.Finish();
}

// Per (n, c) of a channels-last image: four statistics, each an accumulator array per thread of a
// vector column layout.
absl::StatusOr<Kernel> ChannelsLastPartials(int64_t hw, int64_t channels) {
  KernelBuilder kb("channels-last partials");
  const Size n = kb.AddScalar(), r = Size::Const(hw), c = Size::Const(channels);
  const Buffer x = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * r * c);
  const Buffer go = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * r * c);
  const Buffer mean = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, c);
  const Buffer invstd = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, c);
  const Var b = kb.AddOuter(n), ch = kb.AddOuter(c), row = kb.AddReduce(r);
  const Accumulator wf = kb.AddAccumulator(AccKind::kWelford, ScalarType::kFloat32);
  const Accumulator sum = kb.AddAccumulator(AccKind::kSum, ScalarType::kFloat32);
  const Accumulator dot = kb.AddAccumulator(AccKind::kSum, ScalarType::kFloat32);
  const Accumulator max = kb.AddAccumulator(AccKind::kMax, ScalarType::kFloat32);
  const Index idx = MakeIndex(Size(), {{b, r * c}, {row, c}, {ch, Size::Const(1)}});
  const Index cidx = MakeIndex(Size(), {{ch, Size::Const(1)}});
  const ExprOr xv = Cast(ScalarType::kFloat32, Load(x, idx));
  const ExprOr gv = Cast(ScalarType::kFloat32, Load(go, idx));
  kb.BeginPhase();
  kb.Add(Accumulate(wf, xv));
  kb.Add(Accumulate(sum, gv));
  kb.Add(Accumulate(dot, Mul(gv, Mul(Sub(xv, Load(mean, cidx)), Load(invstd, cidx)))));
  kb.Add(Accumulate(max, xv));
  kb.BeginBody();
  const Index out = ContiguousIndex({b, ch}, {n, c});
  for (const ExprOr& e : {AccRead(wf, AccField::kMean), AccRead(wf, AccField::kM2), AccRead(sum, AccField::kValue),
                          AccRead(dot, AccField::kValue), AccRead(max, AccField::kValue)}) {
    kb.Add(Store(kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, n * c), out, e));
  }
  return kb.Finish();
}

// A pointwise kernel over dynamic 3-D sizes with an in-place f16 buffer and 64-bit indices.
absl::StatusOr<Kernel> DynamicInPlace() {
  KernelBuilder kb("dynamic in place");
  const Size n0 = kb.AddScalar(), n1 = kb.AddScalar(), n2 = kb.AddScalar();
  const Buffer x = kb.AddBuffer(ScalarType::kFloat16, Access::kReadWrite, n0 * n1 * n2);
  const Buffer y = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, n1 * n2);
  const Var a = kb.AddOuter(n0), b = kb.AddOuter(n1), c = kb.AddOuter(n2);
  const Index idx = ContiguousIndex({a, b, c}, {n0, n1, n2});
  const ExprOr v = Mul(Cast(ScalarType::kFloat32, Load(x, idx)),
                       Load(y, ContiguousIndex({b, c}, {n1, n2})));
  kb.Add(Store(x, idx, Cast(ScalarType::kFloat16, v)));
  return kb.Finish();
}

// max_pool2d's backward in one dim: both loads masked by a test of h alone.
absl::StatusOr<Kernel> MaskedWindowGather(int64_t rows, int64_t cols) {
  KernelBuilder kb("masked window gather");
  const Size n = kb.AddScalar(), r = Size::Const(rows), c = Size::Const(cols);
  const Buffer at = kb.AddBuffer(ScalarType::kInt64, Access::kRead, n * r * c);
  const Buffer g = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * r * c);
  const Buffer out = kb.AddBuffer(ScalarType::kBFloat16, Access::kWrite, n * r * c);
  const Var b = kb.AddOuter(n), h = kb.AddOuter(r), j = kb.AddOuter(c);
  ExprOr sum = ConstFloat(ScalarType::kFloat32, 0.0);
  for (int64_t d = 0; d < 2; ++d) {
    const ExprOr mask = Binary(BinaryOp::kGe, LoopVar(h), ConstInt(ScalarType::kInt64, d));
    const Index idx = MakeIndex(Size::Const(-d * cols), {{b, r * c}, {h, c}, {j, Size::Const(1)}});
    const ExprOr hit = Binary(BinaryOp::kLogicalAnd, mask,
                              Binary(BinaryOp::kGe, LoadMasked(at, idx, mask),
                                     ConstInt(ScalarType::kInt64, 0)));
    sum = Add(sum, Select(hit, Cast(ScalarType::kFloat32, LoadMasked(g, idx, mask)),
                          ConstFloat(ScalarType::kFloat32, 0.0)));
  }
  kb.Add(Store(out, ContiguousIndex({b, h, j}, {n, r, c}), Cast(ScalarType::kBFloat16, sum)));
  return kb.Finish();
}


absl::StatusOr<Kernel> CatRowsBf16(int64_t rows_a, int64_t rows_c, int64_t cols) {
  KernelBuilder kb("cat rows bf16");
  const Size n = kb.AddScalar(), ra = Size::Const(rows_a), rc = Size::Const(rows_c);
  const Size c = Size::Const(cols), rows = Size::Const(rows_a + rows_c);
  const Buffer a = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * ra * c);
  const Buffer b = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * rc * c);
  const Buffer out = kb.AddBuffer(ScalarType::kBFloat16, Access::kWrite, n * rows * c);
  const Var i = kb.AddOuter(n), t = kb.AddOuter(rows), j = kb.AddOuter(c);
  const ExprOr in_a = Binary(BinaryOp::kLt, LoopVar(t), ConstInt(ScalarType::kInt64, rows_a));
  const ExprOr in_b = Binary(BinaryOp::kGe, LoopVar(t), ConstInt(ScalarType::kInt64, rows_a));
  const Index at_a = MakeIndex(Size(), {{i, ra * c}, {t, c}, {j, Size::Const(1)}});
  const Index at_b =
      MakeIndex(Size::Const(-rows_a * cols), {{i, rc * c}, {t, c}, {j, Size::Const(1)}});
  const ExprOr v = Select(in_a, Cast(ScalarType::kFloat32, LoadMasked(a, at_a, in_a)),
                          Cast(ScalarType::kFloat32, LoadMasked(b, at_b, in_b)));
  kb.Add(Store(out, ContiguousIndex({i, t, j}, {n, rows, c}),
               Cast(ScalarType::kBFloat16, Mul(v, ConstFloat(ScalarType::kFloat32, 2.0)))));
  return kb.Finish();
}

absl::StatusOr<Kernel> CatTransposedBf16(int64_t rows, int64_t cols) {
  KernelBuilder kb("cat transposed bf16");
  const Size n = kb.AddScalar(), r = Size::Const(rows), c = Size::Const(cols);
  const Size three_c = c * Size::Const(3);
  const Buffer q = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * r * c);
  const Buffer k = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * c * r);
  const Buffer v = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * r * c);
  const Buffer out = kb.AddBuffer(ScalarType::kBFloat16, Access::kWrite, n * r * three_c);
  const Var i = kb.AddOuter(n), t = kb.AddOuter(r), j = kb.AddOuter(three_c);
  auto in = [&](int64_t lo, int64_t hi) {
    const ExprOr from = Binary(BinaryOp::kGe, LoopVar(j), ConstInt(ScalarType::kInt64, lo));
    const ExprOr below = Binary(BinaryOp::kLt, LoopVar(j), ConstInt(ScalarType::kInt64, hi));
    return Binary(BinaryOp::kLogicalAnd, from, below);
  };
  const ExprOr in_q = in(0, cols), in_k = in(cols, 2 * cols), in_v = in(2 * cols, 3 * cols);
  const Index at_q = MakeIndex(Size(), {{i, r * c}, {t, c}, {j, Size::Const(1)}});
  const Index at_k =
      MakeIndex(Size::Const(-cols * rows), {{i, c * r}, {t, Size::Const(1)}, {j, r}});
  const Index at_v = MakeIndex(Size::Const(-2 * cols), {{i, r * c}, {t, c}, {j, Size::Const(1)}});
  auto f32 = [](const ExprOr& x) { return Cast(ScalarType::kFloat32, x); };
  const ExprOr value =
      Select(in_q, f32(LoadMasked(q, at_q, in_q)),
             Select(in_k, f32(LoadMasked(k, at_k, in_k)), f32(LoadMasked(v, at_v, in_v))));
  kb.Add(Store(out, ContiguousIndex({i, t, j}, {n, r, three_c}),
               Cast(ScalarType::kBFloat16, value)));
  return kb.Finish();
}

absl::StatusOr<Kernel> OneAccessTwoMasks(int64_t rows, int64_t cols) {
  KernelBuilder kb("one access two masks");
  const Size r = Size::Const(rows), c = Size::Const(cols);
  const Buffer a = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, r * c);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, r * c);
  const Var t = kb.AddOuter(r), j = kb.AddOuter(c);
  const Index at = ContiguousIndex({t, j}, {r, c});
  const ExprOr top = Binary(BinaryOp::kLt, LoopVar(t), ConstInt(ScalarType::kInt64, rows / 2));
  const ExprOr left = Binary(BinaryOp::kLt, LoopVar(j), ConstInt(ScalarType::kInt64, 3));
  const ExprOr zero = ConstFloat(ScalarType::kFloat32, 0.0);
  kb.Add(Store(out, at,
               Add(Select(top, LoadMasked(a, at, top), zero), Select(left, LoadMasked(a, at, left), zero))));
  return kb.Finish();
}

}  // namespace kiln::codegen::testing
