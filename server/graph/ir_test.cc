#include "server/graph/ir.h"

#include <gtest/gtest.h>

#include "server/graph/op_registry.h"
#include "server/graph/verify.h"

namespace kiln::graph {
namespace {

TensorType F32(std::vector<int64_t> sizes) {
  TensorType t;
  t.dtype = ::kiln::v1::DTYPE_FLOAT32;
  for (int64_t s : sizes) t.sizes.push_back(SymExpr::Const(s));
  t.strides = ContiguousStrides(t.sizes);
  t.device = ::kiln::v1::DEVICE_KIND_CUDA;
  return t;
}

// A graph built by hand, as a later stage would: verified and printed without the importer.
Graph HandBuilt() {
  Graph g;
  Node x;
  x.kind = NodeKind::kInput;
  x.name = "x";
  x.input_index = 0;
  x.type = Type::Tensor(F32({4, 8}));
  Node relu;
  relu.kind = NodeKind::kCall;
  relu.name = "relu";
  relu.target = "aten.relu.default";
  relu.op = FindOp(relu.target);
  relu.args = {Arg::Value(0)};
  relu.type = Type::Tensor(F32({4, 8}));
  Node out;
  out.kind = NodeKind::kOutput;
  out.name = "output";
  out.args = {Arg::List({Arg::Value(1)})};
  out.type = Type::None();
  g.nodes = {x, relu, out};
  return g;
}

TEST(IrTest, HandBuiltGraphVerifiesAndPrints) {
  Graph g = HandBuilt();
  EXPECT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);
  EXPECT_EQ(PrintGraph(g),
            "%0 = input 0 : f32[4, 8] strides [8, 1] cuda  # x\n"
            "%1 = aten.relu.default(%0) : f32[4, 8] strides [8, 1] cuda  # relu\n"
            "output([%1])  # output\n");
}

TEST(IrTest, HandBuiltGraphWithForwardReferenceFails) {
  Graph g = HandBuilt();
  g.nodes[1].args = {Arg::Value(1)};
  absl::Status st = VerifyGraph(g);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("node 'relu'"), std::string::npos) << st;
}

TEST(IrTest, HandBuiltGraphWithWrongArgCountFails) {
  Graph g = HandBuilt();
  g.nodes[1].args.push_back(Arg::Int(1));
  absl::Status st = VerifyGraph(g);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "node 'relu' (aten.relu.default): has 2 arguments, schema relu(Tensor self) -> Tensor needs 1");
}

TEST(IrTest, ContiguousStridesAndPrinting) {
  EXPECT_EQ(ArgToString(Arg::Float(1)), "1.0");
  EXPECT_EQ(ArgToString(Arg::Float(-0.0)), "-0.0");
  EXPECT_EQ(ArgToString(Arg::Int(1)), "1");
  EXPECT_EQ(ArgToString(Arg::String("a\"b")), "\"a\\\"b\"");
  EXPECT_EQ(ArgToString(Arg::Device(::kiln::v1::DEVICE_KIND_CUDA, 3)), "cuda");
  TensorType t = F32({2, 0, 3});
  EXPECT_EQ(TensorTypeToString(t), "f32[2, 0, 3] strides [3, 3, 1] cuda");
  EXPECT_EQ(Arg::Sym(SymExpr::Const(4)).kind, Arg::Kind::kInt);
}

}  // namespace
}  // namespace kiln::graph
