#include "server/kernel/test_kernels.h"

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

}  // namespace kiln::kernel::testing
