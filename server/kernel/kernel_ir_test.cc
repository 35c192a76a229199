#include "server/kernel/kernel_ir.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/kernel/printer.h"
#include "server/kernel/test_kernels.h"
#include "server/kernel/verifier.h"

namespace kiln::kernel {
namespace {

constexpr ScalarType kF32 = ScalarType::kFloat32;

TEST(SizeTest, CanonicalPolynomials) {
  const Size n0 = Size::Param(0), n1 = Size::Param(1);
  EXPECT_EQ(n0 * n1, n1 * n0);
  EXPECT_EQ((n0 + Size::Const(1)) * Size::Const(2), Size::Const(2) + n0 * Size::Const(2));
  EXPECT_EQ((n0 * Size::Const(4) + Size::Const(2)).ToString(), "2 + 4*n0");
  EXPECT_TRUE((n0 - n0).is_const(0));
  EXPECT_EQ((n0 * n1 + n0).Evaluate({3, 5}), absl::optional<int64_t>(18));
  EXPECT_EQ(n1.Evaluate({3}), absl::nullopt);
  EXPECT_TRUE((Size::Const(int64_t{1} << 62) * Size::Const(4)).overflowed());
}

TEST(MakeTest, TypeRules) {
  const Buffer f{0, kF32, Access::kRead, Size::Const(4)};
  const Buffer h{1, ScalarType::kBFloat16, Access::kRead, Size::Const(4)};
  const Buffer w{2, kF32, Access::kWrite, Size::Const(4)};
  const Index i0 = MakeIndex(Size(), {});
  EXPECT_TRUE(Add(Load(f, i0), Load(f, i0)).ok());
  // No implicit conversions; no arithmetic on 16-bit floats; no loads from write buffers.
  EXPECT_FALSE(Add(Load(f, i0), ConstFloat(ScalarType::kFloat64, 1)).ok());
  EXPECT_FALSE(Add(Load(h, i0), Load(h, i0)).ok());
  EXPECT_TRUE(Add(Cast(kF32, Load(h, i0)), Load(f, i0)).ok());
  EXPECT_FALSE(Load(w, i0).ok());
  EXPECT_FALSE(Store(w, i0, Load(h, i0)).ok());
  EXPECT_FALSE(Store(f, i0, Load(f, i0)).ok());
  EXPECT_FALSE(Unary(UnaryOp::kExp, ConstInt(ScalarType::kInt64, 1)).ok());
  EXPECT_FALSE(Binary(BinaryOp::kTrueDiv, ConstInt(ScalarType::kInt32, 1), ConstInt(ScalarType::kInt32, 2)).ok());
  EXPECT_EQ((*Binary(BinaryOp::kLt, Load(f, i0), Load(f, i0)))->type, ScalarType::kBool);
  EXPECT_FALSE(Select(Load(f, i0), Load(f, i0), Load(f, i0)).ok());
  // Constants must be exact in their type.
  EXPECT_FALSE(ConstFloat(kF32, 0.1).ok());
  EXPECT_TRUE(ConstFloat(kF32, 0.1f).ok());
  EXPECT_TRUE(ConstFloat(ScalarType::kBFloat16, 1.0078125).ok());
  EXPECT_FALSE(ConstFloat(ScalarType::kBFloat16, 1.001).ok());
  EXPECT_TRUE(ConstFloat(ScalarType::kFloat16, NAN).ok());
  EXPECT_FALSE(ConstInt(ScalarType::kInt8, 300).ok());
  // An error deep in an expression comes out at the top.
  const ExprOr bad = Exp(Add(Load(f, i0), ConstInt(ScalarType::kInt8, 1)));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "add")) << bad.status();
}

TEST(MakeTest, AccumulatorFields) {
  const Accumulator w{0, AccKind::kWelford, kF32};
  EXPECT_TRUE(AccRead(w, AccField::kMean).ok());
  EXPECT_FALSE(AccRead(w, AccField::kValue).ok());
  const Accumulator am{1, AccKind::kArgMax, kF32};
  EXPECT_EQ((*AccRead(am, AccField::kIndex))->type, ScalarType::kInt64);
  EXPECT_FALSE(Accumulate(am, ConstInt(ScalarType::kInt64, 1)).ok());
}

TEST(VerifierTest, CanonicalKernelsVerify) {
  EXPECT_TRUE(testing::BroadcastAddTransposed(3, 5).ok());
  EXPECT_TRUE(testing::RowSoftmax(7, true).ok());
  EXPECT_TRUE(testing::LayerNorm(7, 1e-5f).ok());
  EXPECT_TRUE(testing::ColumnSum(3, 4).ok());
  EXPECT_TRUE(testing::Bf16Chain(9).ok());
}

TEST(VerifierTest, AccumulatorReadBeforeItsPhaseCompletes) {
  KernelBuilder kb("bad");
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, Size::Const(8));
  const Buffer y = kb.AddBuffer(kF32, Access::kWrite, Size::Const(8));
  const Var r = kb.AddReduce(Size::Const(8));
  const Accumulator s = kb.AddAccumulator(AccKind::kSum, kF32);
  const Index at = MakeIndex(Size(), {{r, Size::Const(1)}});
  kb.BeginPhase();
  kb.Add(Accumulate(s, Load(x, at)));
  kb.Add(Store(y, at, AccRead(s, AccField::kValue)));  // same phase: not complete yet
  const absl::StatusOr<Kernel> k = kb.Finish();
  EXPECT_EQ(k.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(k.status().message(), "before its phase completes")) << k.status();
}

TEST(VerifierTest, IndexOutOfRange) {
  KernelBuilder kb("oob");
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, Size::Const(10));
  const Buffer y = kb.AddBuffer(kF32, Access::kWrite, Size::Const(10));
  const Var i = kb.AddOuter(Size::Const(10));
  kb.Add(Store(y, MakeIndex(Size(), {{i, Size::Const(1)}}),
               Load(x, MakeIndex(Size::Const(1), {{i, Size::Const(1)}}))));
  const absl::StatusOr<Kernel> k = kb.Finish();
  EXPECT_TRUE(absl::StrContains(k.status().message(), "index reaches 10 in b0 of 10")) << k.status();
}

TEST(VerifierTest, ReduceVarOutsidePhaseAndUnknownScalar) {
  KernelBuilder kb("scope");
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, Size::Const(4));
  const Buffer y = kb.AddBuffer(kF32, Access::kWrite, Size::Const(4));
  const Var r = kb.AddReduce(Size::Const(4));
  const Accumulator s = kb.AddAccumulator(AccKind::kSum, kF32);
  kb.BeginPhase();
  kb.Add(Accumulate(s, Load(x, MakeIndex(Size(), {{r, Size::Const(1)}}))));
  kb.BeginBody();
  kb.Add(Store(y, MakeIndex(Size(), {{r, Size::Const(1)}}), AccRead(s, AccField::kValue)));
  EXPECT_TRUE(absl::StrContains(kb.Finish().status().message(), "r0 used outside a phase"));

  KernelBuilder kb2("scalar");
  const Buffer z = kb2.AddBuffer(kF32, Access::kWrite, Size::Param(3));
  kb2.Add(Store(z, MakeIndex(Size(), {}), ConstFloat(kF32, 1)));
  EXPECT_TRUE(absl::StrContains(kb2.Finish().status().message(), "uses n3 of 0 scalars"));
}

TEST(VerifierTest, HandBuiltNodesAreRechecked) {
  absl::StatusOr<Kernel> k = testing::Bf16Chain(4);
  ASSERT_TRUE(k.ok());
  // Replace the stored value with a node that claims the wrong type.
  auto node = std::make_shared<ExprNode>(*k->body[0].value);
  node->type = ScalarType::kBFloat16;
  node->kind = ExprKind::kBinary;
  node->binary_op = BinaryOp::kAdd;
  node->args = {k->body[0].value, k->body[0].value};
  k->body[0].value = node;
  EXPECT_EQ(VerifyKernel(*k).code(), absl::StatusCode::kInternal);
}

TEST(VerifierTest, MaskedLoadsAreNotRangeChecked) {
  KernelBuilder kb("pad");
  const Buffer x = kb.AddBuffer(kF32, Access::kRead, Size::Const(4));
  const Buffer y = kb.AddBuffer(kF32, Access::kWrite, Size::Const(8));
  const Var i = kb.AddOuter(Size::Const(8));
  const Index shifted = MakeIndex(Size::Const(-2), {{i, Size::Const(1)}});
  const ExprOr mask = Binary(BinaryOp::kLogicalAnd,
                             Binary(BinaryOp::kGe, LoopVar(i), ConstInt(ScalarType::kInt64, 2)),
                             Binary(BinaryOp::kLt, LoopVar(i), ConstInt(ScalarType::kInt64, 6)));
  EXPECT_FALSE(LoadMasked(x, shifted, ConstInt(ScalarType::kInt32, 1)).ok());  // mask must be b8
  kb.Add(Store(y, MakeIndex(Size(), {{i, Size::Const(1)}}), LoadMasked(x, shifted, mask)));
  absl::StatusOr<Kernel> k = kb.Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_TRUE(absl::StrContains(PrintKernel(*k), "load(b0, o0 - 2, mask=logical_and(ge(o0, 2:i64)"))
      << PrintKernel(*k);
  // The same load without the mask is refused.
  KernelBuilder kb2("unmasked");
  const Buffer x2 = kb2.AddBuffer(kF32, Access::kRead, Size::Const(4));
  const Buffer y2 = kb2.AddBuffer(kF32, Access::kWrite, Size::Const(8));
  const Var j = kb2.AddOuter(Size::Const(8));
  kb2.Add(Store(y2, MakeIndex(Size(), {{j, Size::Const(1)}}),
                Load(x2, MakeIndex(Size::Const(-2), {{j, Size::Const(1)}}))));
  EXPECT_EQ(kb2.Finish().status().code(), absl::StatusCode::kInternal);
}

TEST(PrinterTest, PrintsKernels) {
  absl::StatusOr<Kernel> k = testing::RowSoftmax(16, false);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(PrintKernel(*k), R"(kernel "softmax"
  scalars: 1
  buffers: b0: f32 read [16*n0], b1: f32 write [16*n0]
  outer: o0 < n0
  reduce: r0 < 16
  accumulators: a0: online_softmax f32
  phase 0:
    a0 <- load(b0, 16*o0 + r0)
  phase 1:
    b1[16*o0 + r0] = true_div(exp(sub(load(b0, 16*o0 + r0), a0.max)), a0.sum)
  body:
)");
}

}  // namespace
}  // namespace kiln::kernel
