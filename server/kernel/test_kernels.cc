#include "server/kernel/test_kernels.h"

#include <limits>

namespace kiln::kernel::testing {

constexpr ScalarType kF32 = ScalarType::kFloat32;

absl::StatusOr<Kernel> BroadcastAddTransposed(int64_t rows, int64_t cols) {
  KernelBuilder kb("broadcast add, transposed input");
  const Size r = Size::Const(rows), c = Size::Const(cols);
  const Buffer a = kb.AddBuffer(kF32, Access::kRead, r * c);
  const Buffer b = kb.AddBuffer(kF32, Access::kRead, c);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, r * c);
  const Var i = kb.AddOuter(r), j = kb.AddOuter(c);
  const ExprOr x = Load(a, MakeIndex(Size(), {{i, Size::Const(1)}, {j, r}}));
  const ExprOr y = Load(b, MakeIndex(Size(), {{j, Size::Const(1)}}));
  kb.Add(Store(out, ContiguousIndex({i, j}, {r, c}), Add(x, y)));
  return kb.Finish();
}

absl::StatusOr<Kernel> RowSoftmax(int64_t cols, bool log) {
  KernelBuilder kb(log ? "log_softmax" : "softmax");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer in = kb.AddBuffer(kF32, Access::kRead, n * c);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator sm = kb.AddAccumulator(AccKind::kOnlineSoftmax, kF32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  kb.BeginPhase();
  kb.Add(Accumulate(sm, Load(in, idx)));
  kb.BeginPhase();
  const ExprOr shifted = Sub(Load(in, idx), AccRead(sm, AccField::kMax));
  kb.Add(Store(out, idx,
               log ? Sub(shifted, Log(AccRead(sm, AccField::kSum)))
                   : Div(Exp(shifted), AccRead(sm, AccField::kSum))));
  return kb.Finish();
}

absl::StatusOr<Kernel> LayerNorm(int64_t cols, float eps) {
  KernelBuilder kb("layer_norm");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, n * c);
  const Buffer w = kb.AddBuffer(kF32, Access::kRead, c);
  const Buffer b = kb.AddBuffer(kF32, Access::kRead, c);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, n * c);
  const Buffer mean = kb.AddBuffer(kF32, Access::kWrite, n);
  const Buffer rstd = kb.AddBuffer(kF32, Access::kWrite, n);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator wf = kb.AddAccumulator(AccKind::kWelford, kF32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  const Index cidx = MakeIndex(Size(), {{col, Size::Const(1)}});
  const Index ridx = MakeIndex(Size(), {{row, Size::Const(1)}});
  const ExprOr var = Div(AccRead(wf, AccField::kM2), AccRead(wf, AccField::kCount));
  const ExprOr r = Unary(UnaryOp::kRsqrt, Add(var, ConstFloat(kF32, eps)));
  kb.BeginPhase();
  kb.Add(Accumulate(wf, Load(x, idx)));
  kb.BeginPhase();
  const ExprOr normalized = Mul(Sub(Load(x, idx), AccRead(wf, AccField::kMean)), r);
  kb.Add(Store(out, idx, Add(Mul(normalized, Load(w, cidx)), Load(b, cidx))));
  kb.BeginBody();
  kb.Add(Store(mean, ridx, AccRead(wf, AccField::kMean)));
  kb.Add(Store(rstd, ridx, r));
  return kb.Finish();
}

absl::StatusOr<Kernel> ColumnSum(int64_t rows, int64_t cols) {
  KernelBuilder kb("column sum");
  const Size r = Size::Const(rows), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, r * c);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, c);
  const Var col = kb.AddOuter(c), row = kb.AddReduce(r);
  const Accumulator sum = kb.AddAccumulator(AccKind::kSum, kF32);
  kb.BeginPhase();
  kb.Add(Accumulate(sum, Load(x, MakeIndex(Size(), {{row, c}, {col, Size::Const(1)}}))));
  kb.BeginBody();
  kb.Add(Store(out, MakeIndex(Size(), {{col, Size::Const(1)}}), AccRead(sum, AccField::kValue)));
  return kb.Finish();
}

absl::StatusOr<Kernel> LayerNormWeightGrad(int64_t batch, int64_t rows, int64_t cols) {
  KernelBuilder kb("layer norm weight grad");
  const Size b = Size::Const(batch), r = Size::Const(rows), c = Size::Const(cols);
  const Buffer g = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, b * r * c);
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, b * r * c);
  const Buffer mean = kb.AddBuffer(kF32, Access::kRead, b * r);
  const Buffer rstd = kb.AddBuffer(kF32, Access::kRead, b * r);
  const Buffer dw = kb.AddBuffer(kF32, Access::kWrite, c);
  const Buffer db = kb.AddBuffer(kF32, Access::kWrite, c);
  const Var col = kb.AddOuter(c), i = kb.AddReduce(b), j = kb.AddReduce(r);
  const Accumulator sw = kb.AddAccumulator(AccKind::kSum, kF32);
  const Accumulator sb = kb.AddAccumulator(AccKind::kSum, kF32);
  const Index at = MakeIndex(Size(), {{i, r * c}, {j, c}, {col, Size::Const(1)}});
  const Index row = MakeIndex(Size(), {{i, r}, {j, Size::Const(1)}});
  const ExprOr gv = Cast(kF32, Load(g, at));
  kb.BeginPhase();
  kb.Add(Accumulate(sw, Mul(gv, Mul(Sub(Load(x, at), Load(mean, row)), Load(rstd, row)))));
  kb.Add(Accumulate(sb, gv));
  kb.BeginBody();
  const Index out = MakeIndex(Size(), {{col, Size::Const(1)}});
  kb.Add(Store(dw, out, AccRead(sw, AccField::kValue)));
  kb.Add(Store(db, out, AccRead(sb, AccField::kValue)));
  return kb.Finish();
}

absl::StatusOr<Kernel> SoftmaxThenBackward(int64_t cols) {
  KernelBuilder kb("softmax then its backward");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * c);
  const Buffer g = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, n * c);
  const Buffer out = kb.AddBuffer(ScalarType::kBFloat16, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator sm = kb.AddAccumulator(AccKind::kOnlineSoftmax, kF32);
  const Accumulator dot = kb.AddAccumulator(AccKind::kSum, kF32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  auto y = [&]() {
    return Div(Exp(Sub(Cast(kF32, Load(x, idx)), AccRead(sm, AccField::kMax))), AccRead(sm, AccField::kSum));
  };
  kb.BeginPhase();
  kb.Add(Accumulate(sm, Cast(kF32, Load(x, idx))));
  kb.BeginPhase();
  kb.Add(Accumulate(dot, Mul(Cast(kF32, Load(g, idx)), y())));
  kb.BeginPhase();
  kb.Add(Store(out, idx, Cast(ScalarType::kBFloat16,
                              Mul(y(), Sub(Cast(kF32, Load(g, idx)), AccRead(dot, AccField::kValue))))));
  return kb.Finish();
}

absl::StatusOr<Kernel> MaskedScaledSoftmax(int64_t cols, bool backward) {
  KernelBuilder kb(backward ? "masked scaled softmax then its backward" : "masked scaled softmax");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const ScalarType bf16 = ScalarType::kBFloat16;
  const Buffer x = kb.AddBuffer(bf16, Access::kRead, n * c);
  const Buffer keep = kb.AddBuffer(ScalarType::kBool, Access::kRead, n * c);
  Buffer g;
  if (backward) g = kb.AddBuffer(bf16, Access::kRead, n * c);
  const Buffer out = kb.AddBuffer(bf16, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator sm = kb.AddAccumulator(AccKind::kOnlineSoftmax, kF32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  // Built anew at each use (other nodes, the same value), as the lowering does per phase.
  auto v = [&]() {
    const ExprOr scaled = Cast(kF32, Cast(bf16, Mul(Cast(kF32, Load(x, idx)), ConstFloat(kF32, 0.125))));
    return Cast(kF32, Cast(bf16, Select(Load(keep, idx), scaled,
                                        ConstFloat(kF32, -std::numeric_limits<double>::infinity()))));
  };
  auto y = [&]() { return Div(Exp(Sub(v(), AccRead(sm, AccField::kMax))), AccRead(sm, AccField::kSum)); };
  kb.BeginPhase();
  kb.Add(Accumulate(sm, v()));
  kb.BeginPhase();
  if (!backward) {
    kb.Add(Store(out, idx, Cast(bf16, y())));
    return kb.Finish();
  }
  const Accumulator dot = kb.AddAccumulator(AccKind::kSum, kF32);
  kb.Add(Accumulate(dot, Mul(Cast(kF32, Load(g, idx)), y())));
  kb.BeginPhase();
  kb.Add(Store(out, idx, Cast(bf16, Mul(y(), Sub(Cast(kF32, Load(g, idx)), AccRead(dot, AccField::kValue))))));
  return kb.Finish();
}

absl::StatusOr<Kernel> Bf16Chain(int64_t n) {
  KernelBuilder kb("bf16 chain");
  const Size size = Size::Const(n);
  const Buffer a = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, size);
  const Buffer b = kb.AddBuffer(ScalarType::kBFloat16, Access::kRead, size);
  const Buffer out = kb.AddBuffer(ScalarType::kBFloat16, Access::kWrite, size);
  const Var i = kb.AddOuter(size);
  const Index idx = MakeIndex(Size(), {{i, Size::Const(1)}});
  const ExprOr prod = Mul(Cast(kF32, Load(a, idx)), Cast(kF32, Load(b, idx)));
  const ExprOr y = Add(Unary(UnaryOp::kSilu, prod), ConstFloat(kF32, 1.0));
  kb.Add(Store(out, idx, Cast(ScalarType::kBFloat16, y)));
  return kb.Finish();
}

constexpr ScalarType kBf16 = ScalarType::kBFloat16;

absl::StatusOr<Kernel> RowSoftmaxBf16(int64_t cols) {
  KernelBuilder kb("softmax bf16");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer in = kb.AddBuffer(kBf16, Access::kRead, n * c);
  const Buffer out = kb.AddBuffer(kBf16, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator sm = kb.AddAccumulator(AccKind::kOnlineSoftmax, kF32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  kb.BeginPhase();
  kb.Add(Accumulate(sm, Cast(kF32, Load(in, idx))));
  kb.BeginPhase();
  const ExprOr e = Exp(Sub(Cast(kF32, Load(in, idx)), AccRead(sm, AccField::kMax)));
  kb.Add(Store(out, idx, Cast(kBf16, Div(e, AccRead(sm, AccField::kSum)))));
  return kb.Finish();
}

absl::StatusOr<Kernel> RowSum(int64_t rows, int64_t cols, bool bf16) {
  KernelBuilder kb("row sum");
  const Size r = Size::Const(rows), c = Size::Const(cols);
  const ScalarType t = bf16 ? kBf16 : kF32;
  const Buffer in = kb.AddBuffer(t, Access::kRead, r * c);
  const Buffer out = kb.AddBuffer(t, Access::kWrite, r);
  const Var row = kb.AddOuter(r), col = kb.AddReduce(c);
  const Accumulator sum = kb.AddAccumulator(AccKind::kSum, kF32);
  kb.BeginPhase();
  kb.Add(Accumulate(sum, Cast(kF32, Load(in, ContiguousIndex({row, col}, {r, c})))));
  kb.BeginBody();
  kb.Add(Store(out, MakeIndex(Size(), {{row, Size::Const(1)}}), Cast(t, AccRead(sum, AccField::kValue))));
  return kb.Finish();
}

absl::StatusOr<Kernel> LayerNormBf16(int64_t cols, float eps) {
  KernelBuilder kb("layer_norm bf16");
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(kBf16, Access::kRead, n * c);
  const Buffer w = kb.AddBuffer(kBf16, Access::kRead, c);
  const Buffer b = kb.AddBuffer(kBf16, Access::kRead, c);
  const Buffer out = kb.AddBuffer(kBf16, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator wf = kb.AddAccumulator(AccKind::kWelford, kF32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  const Index cidx = MakeIndex(Size(), {{col, Size::Const(1)}});
  const ExprOr var = Div(AccRead(wf, AccField::kM2), AccRead(wf, AccField::kCount));
  const ExprOr r = Unary(UnaryOp::kRsqrt, Add(var, ConstFloat(kF32, eps)));
  kb.BeginPhase();
  kb.Add(Accumulate(wf, Cast(kF32, Load(x, idx))));
  kb.BeginPhase();
  const ExprOr normalized = Mul(Sub(Cast(kF32, Load(x, idx)), AccRead(wf, AccField::kMean)), r);
  kb.Add(Store(out, idx,
               Cast(kBf16, Add(Mul(normalized, Cast(kF32, Load(w, cidx))), Cast(kF32, Load(b, cidx))))));
  return kb.Finish();
}

absl::StatusOr<Kernel> RmsNorm(int64_t cols, float eps, bool bf16) {
  KernelBuilder kb(bf16 ? "rms_norm bf16" : "rms_norm");
  const ScalarType t = bf16 ? kBf16 : kF32;
  const Size n = kb.AddScalar(), c = Size::Const(cols);
  const Buffer x = kb.AddBuffer(t, Access::kRead, n * c);
  const Buffer w = kb.AddBuffer(t, Access::kRead, c);
  const Buffer out = kb.AddBuffer(t, Access::kWrite, n * c);
  const Var row = kb.AddOuter(n), col = kb.AddReduce(c);
  const Accumulator sum = kb.AddAccumulator(AccKind::kSum, kF32);
  const Index idx = ContiguousIndex({row, col}, {n, c});
  const Index cidx = MakeIndex(Size(), {{col, Size::Const(1)}});
  kb.BeginPhase();
  kb.Add(Accumulate(sum, Mul(Cast(kF32, Load(x, idx)), Cast(kF32, Load(x, idx)))));
  kb.BeginPhase();
  const ExprOr mean = Div(AccRead(sum, AccField::kValue), ConstFloat(kF32, static_cast<double>(cols)));
  const ExprOr r = Unary(UnaryOp::kRsqrt, Add(mean, ConstFloat(kF32, eps)));
  const ExprOr scaled = Mul(Cast(kF32, Load(x, idx)), r);
  kb.Add(Store(out, idx,
               bf16 ? Cast(kBf16, Mul(Cast(kF32, Cast(kBf16, scaled)), Cast(kF32, Load(w, cidx))))
                    : Mul(scaled, Load(w, cidx))));
  return kb.Finish();
}

absl::StatusOr<Kernel> TransposeAddColumnMajor(int64_t rows, int64_t cols) {
  KernelBuilder kb("transpose add, column-major output");
  const Size r = Size::Const(rows), c = Size::Const(cols);
  const Buffer a = kb.AddBuffer(kF32, Access::kRead, r * c);
  const Buffer b = kb.AddBuffer(kF32, Access::kRead, r * c);
  const Buffer out = kb.AddBuffer(kF32, Access::kWrite, r * c);
  const Var i = kb.AddOuter(r), j = kb.AddOuter(c);
  const Index column_major = MakeIndex(Size(), {{i, Size::Const(1)}, {j, r}});
  kb.Add(Store(out, column_major, Add(Load(a, column_major), Load(b, ContiguousIndex({i, j}, {r, c})))));
  return kb.Finish();
}

}  // namespace kiln::kernel::testing
