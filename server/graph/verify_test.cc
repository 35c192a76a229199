// Every verifier (and import) rule: the error code and a message naming the node and the reason.

#include "server/graph/verify.h"

#include <gtest/gtest.h>

#include "server/graph/import.h"
#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT
using ::absl::StatusCode;

absl::Status Check(const v1::Graph& g, const GraphLimits& limits = GraphLimits()) {
  auto ir = ImportGraph(g, limits);
  if (!ir.ok()) return ir.status();
  return VerifyGraph(*ir, limits);
}

void ExpectError(const absl::Status& st, StatusCode code, const std::string& want) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_NE(st.message().find(want), std::string::npos) << "message: " << st.message() << "\nwanted: " << want;
}

// A small valid graph: x, y -> add -> relu -> output.
GraphBuilder Base() {
  GraphBuilder b;
  b.Input("x", F32({4, 8})).Input("y", F32({4, 8}))
      .Call("add", "aten.add.Tensor", {Ref("x"), Ref("y")}, F32({4, 8}))
      .Call("relu", "aten.relu.default", {Ref("add")}, F32({4, 8}));
  return b;
}

TEST(VerifyTest, ValidGraphPasses) {
  EXPECT_TRUE(Check(Base().Output({"relu"}).Build()).ok());
  for (const v1::Graph& g : AllTestGraphs()) EXPECT_TRUE(Check(g).ok()) << Check(g);
}

TEST(VerifyTest, DanglingReference) {
  GraphBuilder b = Base();
  b.Call("mul", "aten.mul.Tensor", {Ref("relu"), Ref("nope")}, F32({4, 8})).Output({"mul"});
  ExpectError(Check(b.Build()), StatusCode::kInvalidArgument,
              "node 'mul' (aten.mul.Tensor): argument 1 refers to unknown node 'nope'");
}

TEST(VerifyTest, ForwardReference) {
  GraphBuilder b;
  b.Input("x", F32({4})).Call("a", "aten.relu.default", {Ref("b")}, F32({4}))
      .Call("b", "aten.relu.default", {Ref("x")}, F32({4})).Output({"a"});
  ExpectError(Check(b.Build()), StatusCode::kInvalidArgument,
              "node 'a' (aten.relu.default): argument 0 refers to node 'b' defined later (a forward reference or a cycle)");
}

TEST(VerifyTest, Cycle) {
  GraphBuilder b;
  b.Input("x", F32({4})).Call("a", "aten.add.Tensor", {Ref("x"), Ref("a")}, F32({4})).Output({"a"});
  ExpectError(Check(b.Build()), StatusCode::kInvalidArgument, "node 'a' (aten.add.Tensor): argument 1 refers to the node itself");
}

TEST(VerifyTest, DuplicateName) {
  GraphBuilder b = Base();
  b.Call("add", "aten.relu.default", {Ref("x")}, F32({4, 8})).Output({"add"});
  ExpectError(Check(b.Build()), StatusCode::kInvalidArgument, "node 'add': duplicate node name (nodes #2 and #4)");
}

TEST(VerifyTest, MissingAndDuplicateOutput) {
  ExpectError(Check(Base().Build()), StatusCode::kInvalidArgument, "graph has no output node");
  GraphBuilder b = Base();
  b.Output({"relu"});
  v1::Graph g = b.Build();
  *g.add_nodes() = g.nodes(g.nodes_size() - 1);
  g.mutable_nodes(g.nodes_size() - 1)->set_name("output_1");
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'output_1' (output): second output node");
  GraphBuilder c = Base();
  c.Output({"relu"});
  v1::Graph h = c.Build();
  v1::Node* late = h.add_nodes();
  *late = h.nodes(3);
  late->set_name("late");
  ExpectError(Check(h), StatusCode::kInvalidArgument, "node 'late' (aten.relu.default): node after the output node");
}

TEST(VerifyTest, UnknownEnumValues) {
  v1::Graph g = Base().Output({"relu"}).Build();
  g.mutable_nodes(2)->mutable_meta()->mutable_tensor()->set_dtype(static_cast<v1::DType>(999));
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'add' (aten.add.Tensor): unknown or unspecified dtype value 999");
  g = Base().Output({"relu"}).Build();
  g.mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_device()->set_kind(static_cast<v1::DeviceKind>(77));
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'x' (x): unknown or unspecified device kind 77");
  g = Base().Output({"relu"}).Build();
  g.mutable_nodes(0)->mutable_meta()->mutable_tensor()->set_layout(static_cast<v1::Layout>(42));
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'x' (x): unknown layout value 42");
  g = Base().Output({"relu"}).Build();
  g.mutable_nodes(2)->set_op(static_cast<v1::Node::Op>(9));
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'add' (aten.add.Tensor): unknown node op 9");
  g = Base().Output({"relu"}).Build();
  *g.mutable_nodes(3)->add_args() = Dt(static_cast<v1::DType>(55));
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'relu' (aten.relu.default): argument 1: unknown dtype value 55");
}

TEST(VerifyTest, NegativeAndOverflowingSizes) {
  GraphBuilder b;
  b.Input("x", F32({4, -2}, {1, 1})).Output({"x"});
  ExpectError(Check(b.Build()), StatusCode::kInvalidArgument, "node 'x' (x): negative size -2");
  GraphBuilder c;
  c.Input("x", F32({4, 2}, {-1, 1})).Output({"x"});
  ExpectError(Check(c.Build()), StatusCode::kInvalidArgument, "node 'x' (x): negative stride -1");
  GraphBuilder d;
  d.Input("x", F32({4, 2}, {int64_t{1} << 62, 1})).Output({"x"});
  ExpectError(Check(d.Build()), StatusCode::kInvalidArgument, "node 'x' (x): tensor [4, 2] strides [4611686018427387904, 1] address past int64");
  GraphBuilder e;
  e.Input("x", F32({int64_t{1} << 62, 4}, {4, 1})).Output({"x"});
  ExpectError(Check(e.Build()), StatusCode::kResourceExhausted, "node 'x' (x): tensor [4611686018427387904, 4] has more than");
}

TEST(VerifyTest, ArgumentCountsAndTypes) {
  GraphBuilder a = Base();
  a.Call("r", "aten.relu.default", {Ref("x"), Ref("y")}, F32({4, 8})).Output({"r"});
  ExpectError(Check(a.Build()), StatusCode::kInvalidArgument,
              "node 'r' (aten.relu.default): too many positional arguments (2) for schema relu(Tensor self) -> Tensor");
  GraphBuilder b = Base();
  b.Call("s", "aten.sum.dim_IntList", {Ref("x")}, F32({4})).Output({"s"});
  ExpectError(Check(b.Build()), StatusCode::kInvalidArgument, "node 's' (aten.sum.dim_IntList): missing argument 'dim'");
  GraphBuilder c = Base();
  c.Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1})}, F32({4}), {{"keep_dim", B(true)}}).Output({"s"});
  ExpectError(Check(c.Build()), StatusCode::kInvalidArgument, "node 's' (aten.sum.dim_IntList): unexpected keyword argument 'keep_dim'");
  GraphBuilder d = Base();
  d.Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1})}, F32({4}), {{"dim", Ints({1})}}).Output({"s"});
  ExpectError(Check(d.Build()), StatusCode::kInvalidArgument, "argument 'dim' given both by position and by keyword");
  GraphBuilder e = Base();
  e.Call("m", "aten.mul.Tensor", {Ref("x"), S("two")}, F32({4, 8})).Output({"m"});
  ExpectError(Check(e.Build()), StatusCode::kInvalidArgument,
              "node 'm' (aten.mul.Tensor): argument 1 'other' expects Tensor, got \"two\"");
  GraphBuilder f = Base();
  f.Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1}), I(1)}, F32({4})).Output({"s"});
  ExpectError(Check(f.Build()), StatusCode::kInvalidArgument, "argument 2 'keepdim' expects bool, got 1");
}

TEST(VerifyTest, MetadataContradictingInference) {
  GraphBuilder b;
  b.Input("x", F32({4, 8})).Input("y", F32({4, 8}))
      .Call("add_3", "aten.add.Tensor", {Ref("x"), Ref("y")}, F32({4, 9}, {8, 1})).Output({"add_3"});
  ExpectError(Check(b.Build()), StatusCode::kInvalidArgument,
              "node 'add_3' (aten.add.Tensor): inferred shape [4, 8] but the graph says [4, 9]");
  GraphBuilder c;
  c.Input("x", F32({4, 8})).Call("add", "aten.add.Tensor", {Ref("x"), Ref("x")}, T(v1::DTYPE_FLOAT16, {4, 8}))
      .Output({"add"});
  ExpectError(Check(c.Build()), StatusCode::kInvalidArgument, "node 'add' (aten.add.Tensor): inferred dtype f32 but the graph says f16");
  GraphBuilder d;
  d.Input("x", F32({4, 8})).Call("t", "aten.t.default", {Ref("x")}, F32({8, 4})).Output({"t"});
  ExpectError(Check(d.Build()), StatusCode::kInvalidArgument,
              "node 't' (aten.t.default): inferred strides [1, 8] but the graph says [4, 1]");
  GraphBuilder e;
  e.Input("x", F32({4, 8}))
      .Call("nl", "aten.native_layer_norm.default", {Ref("x"), Ints({8}), None(), None(), F(1e-5)},
            Tuple({F32({4, 8}), F32({4, 1})}))
      .Output({"nl"});
  ExpectError(Check(e.Build()), StatusCode::kInvalidArgument,
              "node 'nl' (aten.native_layer_norm.default): inferred number of outputs 3 but the graph says 2");
  GraphBuilder f;
  f.Input("x", F32({4, 8})).Call("v", "aten.view.default", {Ref("x"), Ints({5, 8})}, F32({5, 8})).Output({"v"});
  ExpectError(Check(f.Build()), StatusCode::kInvalidArgument,
              "node 'v' (aten.view.default): shape '[5, 8]' is invalid for input of size 32");
}

TEST(VerifyTest, SizeOneStridesAreNotCompared) {
  GraphBuilder b;
  b.Input("x", F32({4, 1})).Call("r", "aten.relu.default", {Ref("x")}, F32({4, 1}, {1, 7})).Output({"r"});
  EXPECT_TRUE(Check(b.Build()).ok());
}

TEST(VerifyTest, CallMethodAndCallModule) {
  v1::Graph g = Base().Output({"relu"}).Build();
  g.mutable_nodes(3)->set_op(v1::Node::OP_CALL_METHOD);
  ExpectError(Check(g), StatusCode::kInvalidArgument,
              "node 'relu' (aten.relu.default): call_method nodes are not produced by AOTAutograd");
  g.mutable_nodes(3)->set_op(v1::Node::OP_CALL_MODULE);
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'relu' (aten.relu.default): call_module nodes");
}

TEST(VerifyTest, FallbackOpsAreRangeCheckedOnly) {
  GraphBuilder b = Base();
  b.Call("weird", "aten.some_new_op.default", {Ref("relu"), S("x")}, F32({3, 3}), {{"z", I(1)}, {"a", I(2)}})
      .Output({"weird"});
  EXPECT_TRUE(Check(b.Build()).ok());
  GraphBuilder c = Base();
  c.Call("weird", "aten.some_new_op.default", {Ref("relu")}, F32({3, -3}, {3, 1})).Output({"weird"});
  ExpectError(Check(c.Build()), StatusCode::kInvalidArgument, "node 'weird' (aten.some_new_op.default): negative size");
}

TEST(VerifyTest, Limits) {
  v1::Graph g = Base().Output({"relu"}).Build();
  GraphLimits small;
  small.max_nodes = 3;
  ExpectError(Check(g, small), StatusCode::kResourceExhausted, "graph has 5 nodes, more than the limit of 3");
  GraphLimits rank;
  rank.max_rank = 1;
  ExpectError(Check(g, rank), StatusCode::kResourceExhausted, "node 'x' (x): tensor of rank 2, more than the limit of 1");
  GraphLimits args;
  args.max_args_per_node = 1;
  ExpectError(Check(g, args), StatusCode::kResourceExhausted, "node 'add' (aten.add.Tensor): 2 arguments, more than the limit of 1");
  GraphLimits elements;
  elements.max_tensor_elements = 16;
  ExpectError(Check(g, elements), StatusCode::kResourceExhausted, "node 'x' (x): tensor [4, 8] has more than the limit of 16 elements");
  GraphLimits bytes;
  bytes.max_tensor_bytes = 64;
  ExpectError(Check(g, bytes), StatusCode::kResourceExhausted, "node 'x' (x): tensor [4, 8] of f32 has more than the limit of 64 bytes");
  GraphLimits depth;
  depth.max_nesting_depth = 1;
  GraphBuilder nested = Base();
  nested.Call("n", "aten.foo.default", {L({L({I(1)})})}, F32({1})).Output({"n"});
  ExpectError(Check(nested.Build(), depth), StatusCode::kResourceExhausted, "node 'n' (aten.foo.default): argument 0: lists nested deeper than 1");
  GraphLimits syms;
  syms.max_symbols = 0;
  ExpectError(Check(DynamicGraph(), syms), StatusCode::kResourceExhausted, "graph has 1 symbols, more than the limit of 0");
  v1::Graph with_const = Base().Output({"relu"}).Build();
  v1::TensorConstant* c = with_const.add_constants();
  c->set_name("_tensor_constant0");
  *c->mutable_meta() = TMeta(v1::DTYPE_FLOAT32, {1024});
  c->set_data(std::string(4096, '\0'));
  GraphLimits consts;
  consts.max_constant_bytes = 1000;
  ExpectError(Check(with_const, consts), StatusCode::kResourceExhausted, "constants hold more than the limit of 1000 bytes");
  EXPECT_TRUE(Check(with_const).ok());
}

TEST(VerifyTest, ConstantsMustMatchTheirData) {
  GraphBuilder b;
  b.Output({});
  v1::Graph g = b.Build();
  v1::TensorConstant* c = g.add_constants();
  c->set_name("_tensor_constant0");
  *c->mutable_meta() = TMeta(v1::DTYPE_FLOAT32, {4});
  c->set_data(std::string(12, '\0'));
  ExpectError(Check(g), StatusCode::kInvalidArgument, "constant '_tensor_constant0': holds 12 bytes but its metadata needs 4 elements of f32");
  GraphBuilder d;
  d.Output({});
  v1::Graph h = d.Build();
  v1::Node* get = h.mutable_nodes()->Add();
  *get = h.nodes(0);
  get->set_name("c");
  get->set_op(v1::Node::OP_GET_ATTR);
  get->set_target("missing");
  h.mutable_nodes()->SwapElements(0, 1);
  ExpectError(Check(h), StatusCode::kInvalidArgument, "node 'c' (missing): get_attr of unknown constant 'missing'");
}

TEST(VerifyTest, BadSymExprs) {
  v1::Graph g = DynamicGraph();
  *g.mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_sizes(0)->mutable_expr() = SymS(3);
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'x' (x): SymExpr refers to symbol 3 but the graph has 1 symbols");
  g = DynamicGraph();
  *g.mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_sizes(0)->mutable_expr() =
      SymOp(v1::SymExpr::OP_FLOOR_DIV, {SymS(0)});
  ExpectError(Check(g), StatusCode::kInvalidArgument, "node 'x' (x): SymExpr op OP_FLOOR_DIV with 1 arguments");
  g = DynamicGraph();
  g.mutable_symbols(0)->set_min_value(10);
  g.mutable_symbols(0)->set_max_value(5);
  ExpectError(Check(g), StatusCode::kInvalidArgument, "symbol s0 ('s0') has range [10, 5]");
}

}  // namespace
}  // namespace kiln::graph
