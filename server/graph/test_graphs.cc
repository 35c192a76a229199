#include "server/graph/test_graphs.h"

#include "absl/strings/str_cat.h"
#include "server/graph/import.h"
#include "server/graph/op_registry.h"
#include "server/graph/verify.h"

namespace kiln::graph::testing {

namespace {
constexpr v1::DType kF32 = v1::DTYPE_FLOAT32;
constexpr v1::DType kBf16 = v1::DTYPE_BFLOAT16;
constexpr v1::DType kBool = v1::DTYPE_BOOL;
constexpr v1::DType kI64 = v1::DTYPE_INT64;
}  // namespace

v1::TensorMeta TMeta(v1::DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                     v1::DeviceKind device, int64_t offset) {
  v1::TensorMeta m;
  m.set_dtype(dtype);
  if (strides.empty()) {
    strides.resize(sizes.size());
    int64_t s = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      strides[i] = s;
      s *= sizes[i] > 1 ? sizes[i] : 1;
    }
  }
  for (int64_t s : sizes) m.add_sizes()->set_constant(s);
  for (int64_t s : strides) m.add_strides()->set_constant(s);
  if (offset != 0) m.mutable_storage_offset()->set_constant(offset);
  m.mutable_device()->set_kind(device);
  m.mutable_device()->set_index(device == v1::DEVICE_KIND_CUDA ? 0 : -1);
  m.set_layout(v1::LAYOUT_STRIDED);
  return m;
}

v1::ValueMeta T(v1::DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides, v1::DeviceKind device,
                int64_t offset) {
  v1::ValueMeta m;
  *m.mutable_tensor() = TMeta(dtype, std::move(sizes), std::move(strides), device, offset);
  return m;
}
v1::ValueMeta F32(std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset) {
  return T(kF32, std::move(sizes), std::move(strides), v1::DEVICE_KIND_CUDA, offset);
}
v1::ValueMeta Tuple(std::vector<v1::ValueMeta> items) {
  v1::ValueMeta m;
  for (auto& i : items) *m.mutable_list()->add_items() = std::move(i);
  return m;
}
v1::ValueMeta SymMeta(v1::SymExpr e) {
  v1::ValueMeta m;
  *m.mutable_sym_int()->mutable_expr() = std::move(e);
  return m;
}
v1::ValueMeta NoneMeta() {
  v1::ValueMeta m;
  m.mutable_none();
  return m;
}

v1::Argument Ref(const std::string& node) {
  v1::Argument a;
  a.set_node(node);
  return a;
}
v1::Argument I(int64_t v) {
  v1::Argument a;
  a.set_int_value(v);
  return a;
}
v1::Argument F(double v) {
  v1::Argument a;
  a.set_float_value(v);
  return a;
}
v1::Argument B(bool v) {
  v1::Argument a;
  a.set_bool_value(v);
  return a;
}
v1::Argument S(const std::string& v) {
  v1::Argument a;
  a.set_string_value(v);
  return a;
}
v1::Argument Dt(v1::DType d) {
  v1::Argument a;
  a.set_dtype(d);
  return a;
}
v1::Argument Dev(v1::DeviceKind kind, int32_t index) {
  v1::Argument a;
  a.mutable_device()->set_kind(kind);
  a.mutable_device()->set_index(index);
  return a;
}
v1::Argument Mf(v1::MemoryFormat m) {
  v1::Argument a;
  a.set_memory_format(m);
  return a;
}
v1::Argument None() {
  v1::Argument a;
  a.mutable_none();
  return a;
}
v1::Argument L(std::vector<v1::Argument> items, bool is_tuple) {
  v1::Argument a;
  for (auto& i : items) *a.mutable_list()->add_items() = std::move(i);
  a.mutable_list()->set_is_tuple(is_tuple);
  return a;
}
v1::Argument Ints(std::vector<int64_t> v) {
  std::vector<v1::Argument> items;
  for (int64_t x : v) items.push_back(I(x));
  return L(std::move(items));
}
v1::Argument SymArg(v1::SymExpr e) {
  v1::Argument a;
  *a.mutable_sym_int() = std::move(e);
  return a;
}

v1::SymExpr SymC(int64_t c) {
  v1::SymExpr e;
  e.set_op(v1::SymExpr::OP_CONSTANT);
  e.set_constant(c);
  return e;
}
v1::SymExpr SymS(int32_t index) {
  v1::SymExpr e;
  e.set_op(v1::SymExpr::OP_SYMBOL);
  e.set_symbol(index);
  return e;
}
v1::SymExpr SymOp(v1::SymExpr::Op op, std::vector<v1::SymExpr> args) {
  v1::SymExpr e;
  e.set_op(op);
  for (auto& a : args) *e.add_args() = std::move(a);
  return e;
}

GraphBuilder& GraphBuilder::Input(const std::string& name, v1::ValueMeta meta) {
  v1::Node* n = graph_.add_nodes();
  n->set_name(name);
  n->set_op(v1::Node::OP_PLACEHOLDER);
  n->set_target(name);
  *n->mutable_meta() = std::move(meta);
  return *this;
}

GraphBuilder& GraphBuilder::Call(const std::string& name, const std::string& target, std::vector<v1::Argument> args,
                                 v1::ValueMeta meta, std::vector<std::pair<std::string, v1::Argument>> kwargs) {
  v1::Node* n = graph_.add_nodes();
  n->set_name(name);
  n->set_op(v1::Node::OP_CALL_FUNCTION);
  n->set_target(target);
  for (auto& a : args) *n->add_args() = std::move(a);
  for (auto& [k, v] : kwargs) {
    v1::NamedArgument* na = n->add_kwargs();
    na->set_name(k);
    *na->mutable_value() = std::move(v);
  }
  *n->mutable_meta() = std::move(meta);
  n->mutable_debug()->set_stack_trace("File \"model.py\", line 42, in forward");
  return *this;
}

GraphBuilder& GraphBuilder::Output(std::vector<std::string> names) {
  v1::Node* n = graph_.add_nodes();
  n->set_name("output");
  n->set_op(v1::Node::OP_OUTPUT);
  n->set_target("output");
  std::vector<v1::Argument> items;
  for (const auto& name : names) items.push_back(name.empty() ? None() : Ref(name));
  *n->add_args() = L(std::move(items), true);
  return *this;
}

GraphBuilder& GraphBuilder::Symbol(const std::string& name, int64_t hint, int64_t min_value, int64_t max_value) {
  v1::Symbol* s = graph_.add_symbols();
  s->set_name(name);
  s->set_hint(hint);
  s->set_min_value(min_value);
  s->set_max_value(max_value);
  return *this;
}

v1::Graph MlpForward() {
  GraphBuilder b;
  b.Input("primals_1", F32({128, 64})).Input("primals_2", F32({128})).Input("primals_3", F32({32, 64}))
      .Input("primals_4", F32({10, 128})).Input("primals_5", F32({10}))
      .Call("t", "aten.t.default", {Ref("primals_1")}, F32({64, 128}, {1, 64}))
      .Call("addmm", "aten.addmm.default", {Ref("primals_2"), Ref("primals_3"), Ref("t")}, F32({32, 128}))
      .Call("relu", "aten.relu.default", {Ref("addmm")}, F32({32, 128}))
      .Call("t_1", "aten.t.default", {Ref("primals_4")}, F32({128, 10}, {1, 128}))
      .Call("addmm_1", "aten.addmm.default", {Ref("primals_5"), Ref("relu"), Ref("t_1")}, F32({32, 10}))
      .Call("_log_softmax", "aten._log_softmax.default", {Ref("addmm_1"), I(1), B(false)}, F32({32, 10}))
      .Output({"_log_softmax", "primals_3", "relu", "t_1"});
  v1::Graph g = b.Build();
  g.set_kind(v1::GRAPH_KIND_FORWARD);
  g.set_debug_name("forward of mlp.py:12 (graph 0)");
  return g;
}

v1::Graph MlpBackward() {
  GraphBuilder b;
  b.Input("primals_3", F32({32, 64})).Input("relu", F32({32, 128})).Input("primals_4", F32({10, 128}))
      .Input("tangents_1", F32({32, 10}))
      .Call("mm", "aten.mm.default", {Ref("tangents_1"), Ref("primals_4")}, F32({32, 128}))
      .Call("t_2", "aten.t.default", {Ref("tangents_1")}, F32({10, 32}, {1, 10}))
      .Call("mm_1", "aten.mm.default", {Ref("t_2"), Ref("relu")}, F32({10, 128}))
      .Call("sum_1", "aten.sum.dim_IntList", {Ref("tangents_1"), Ints({0}), B(true)}, F32({1, 10}))
      .Call("view", "aten.view.default", {Ref("sum_1"), Ints({10})}, F32({10}))
      .Call("le", "aten.le.Scalar", {Ref("relu"), I(0)}, T(kBool, {32, 128}))
      .Call("scalar_tensor", "aten.scalar_tensor.default", {F(0.0)}, F32({}),
            {{"dtype", Dt(kF32)}, {"layout", [] { v1::Argument a; a.set_layout(v1::LAYOUT_STRIDED); return a; }()},
             {"device", Dev(v1::DEVICE_KIND_CUDA, 0)}})
      .Call("where", "aten.where.self", {Ref("le"), Ref("scalar_tensor"), Ref("mm")}, F32({32, 128}))
      .Call("threshold_backward", "aten.threshold_backward.default", {Ref("mm"), Ref("relu"), I(0)}, F32({32, 128}))
      .Call("t_3", "aten.t.default", {Ref("threshold_backward")}, F32({128, 32}, {1, 128}))
      .Call("mm_2", "aten.mm.default", {Ref("t_3"), Ref("primals_3")}, F32({128, 64}))
      .Call("sum_2", "aten.sum.dim_IntList", {Ref("where"), Ints({0}), B(true)}, F32({1, 128}))
      .Call("view_1", "aten.view.default", {Ref("sum_2"), Ints({128})}, F32({128}))
      .Call("mul", "aten.mul.Tensor", {Ref("mm_2"), F(0.5)}, F32({128, 64}))
      .Output({"mul", "view_1", "", "mm_1", "view"});
  v1::Graph g = b.Build();
  g.set_kind(v1::GRAPH_KIND_BACKWARD);
  return g;
}

v1::Graph AttentionBlock() {
  auto bf = [](std::vector<int64_t> s, std::vector<int64_t> st = {}, int64_t off = 0) {
    return T(kBf16, std::move(s), std::move(st), v1::DEVICE_KIND_CUDA, off);
  };
  auto stat = T(kF32, {2, 16, 1});
  GraphBuilder b;
  b.Input("x", bf({2, 16, 64})).Input("ln_w", bf({64})).Input("ln_b", bf({64})).Input("w_qkv", bf({192, 64}))
      .Call("native_layer_norm", "aten.native_layer_norm.default",
            {Ref("x"), Ints({64}), Ref("ln_w"), Ref("ln_b"), F(1e-05)}, Tuple({bf({2, 16, 64}), stat, stat}))
      .Call("getitem", "operator.getitem", {Ref("native_layer_norm"), I(0)}, bf({2, 16, 64}))
      .Call("getitem_1", "operator.getitem", {Ref("native_layer_norm"), I(1)}, stat)
      .Call("getitem_2", "operator.getitem", {Ref("native_layer_norm"), I(2)}, stat)
      .Call("view", "aten.view.default", {Ref("getitem"), Ints({32, 64})}, bf({32, 64}))
      .Call("t", "aten.t.default", {Ref("w_qkv")}, bf({64, 192}, {1, 64}))
      .Call("mm", "aten.mm.default", {Ref("view"), Ref("t")}, bf({32, 192}))
      .Call("view_1", "aten.view.default", {Ref("mm"), Ints({2, 16, 192})}, bf({2, 16, 192}))
      .Call("split", "aten.split.Tensor", {Ref("view_1"), I(64), I(-1)},
            Tuple({bf({2, 16, 64}, {3072, 192, 1}), bf({2, 16, 64}, {3072, 192, 1}, 64),
                   bf({2, 16, 64}, {3072, 192, 1}, 128)}))
      .Call("getitem_3", "operator.getitem", {Ref("split"), I(0)}, bf({2, 16, 64}, {3072, 192, 1}))
      .Call("getitem_4", "operator.getitem", {Ref("split"), I(1)}, bf({2, 16, 64}, {3072, 192, 1}, 64))
      .Call("view_2", "aten.view.default", {Ref("getitem_3"), Ints({2, 16, 4, 16})}, bf({2, 16, 4, 16}, {3072, 192, 16, 1}))
      .Call("permute", "aten.permute.default", {Ref("view_2"), Ints({0, 2, 1, 3})}, bf({2, 4, 16, 16}, {3072, 16, 192, 1}))
      .Call("view_3", "aten.view.default", {Ref("getitem_4"), Ints({2, 16, 4, 16})},
            bf({2, 16, 4, 16}, {3072, 192, 16, 1}, 64))
      .Call("permute_1", "aten.permute.default", {Ref("view_3"), Ints({0, 2, 1, 3})},
            bf({2, 4, 16, 16}, {3072, 16, 192, 1}, 64))
      .Call("transpose", "aten.transpose.int", {Ref("permute_1"), I(-2), I(-1)},
            bf({2, 4, 16, 16}, {3072, 16, 1, 192}, 64))
      .Call("expand", "aten.expand.default", {Ref("permute"), Ints({2, 4, 16, 16})}, bf({2, 4, 16, 16}, {3072, 16, 192, 1}))
      .Call("clone", "aten.clone.default", {Ref("expand")}, bf({2, 4, 16, 16}),
            {{"memory_format", Mf(v1::MEMORY_FORMAT_CONTIGUOUS)}})
      .Call("_unsafe_view", "aten._unsafe_view.default", {Ref("clone"), Ints({8, 16, 16})}, bf({8, 16, 16}))
      .Call("expand_1", "aten.expand.default", {Ref("transpose"), Ints({2, 4, 16, 16})},
            bf({2, 4, 16, 16}, {3072, 16, 1, 192}, 64))
      .Call("clone_1", "aten.clone.default", {Ref("expand_1")}, bf({2, 4, 16, 16}),
            {{"memory_format", Mf(v1::MEMORY_FORMAT_CONTIGUOUS)}})
      .Call("_unsafe_view_1", "aten._unsafe_view.default", {Ref("clone_1"), Ints({8, 16, 16})}, bf({8, 16, 16}))
      .Call("bmm", "aten.bmm.default", {Ref("_unsafe_view"), Ref("_unsafe_view_1")}, bf({8, 16, 16}))
      .Call("view_4", "aten.view.default", {Ref("bmm"), Ints({2, 4, 16, 16})}, bf({2, 4, 16, 16}))
      .Call("mul", "aten.mul.Tensor", {Ref("view_4"), F(0.25)}, bf({2, 4, 16, 16}))
      .Call("amax", "aten.amax.default", {Ref("mul"), Ints({-1}), B(true)}, bf({2, 4, 16, 1}))
      .Call("sub", "aten.sub.Tensor", {Ref("mul"), Ref("amax")}, bf({2, 4, 16, 16}))
      .Call("exp", "aten.exp.default", {Ref("sub")}, bf({2, 4, 16, 16}))
      .Call("sum_1", "aten.sum.dim_IntList", {Ref("exp"), Ints({-1}), B(true)}, bf({2, 4, 16, 1}))
      .Call("div", "aten.div.Tensor", {Ref("exp"), Ref("sum_1")}, bf({2, 4, 16, 16}))
      .Call("_softmax", "aten._softmax.default", {Ref("mul"), I(-1), B(false)}, bf({2, 4, 16, 16}))
      .Call("convert_element_type", "prims.convert_element_type.default", {Ref("_softmax"), Dt(kF32)},
            T(kF32, {2, 4, 16, 16}))
      .Call("gelu", "aten.gelu.default", {Ref("mm")}, bf({32, 192}), {{"approximate", S("tanh")}})
      .Call("var_mean", "aten.var_mean.correction", {Ref("x"), Ints({2})},
            Tuple({bf({2, 16, 1}), bf({2, 16, 1})}), {{"correction", I(0)}, {"keepdim", B(true)}})
      .Call("_to_copy", "aten._to_copy.default", {Ref("x")}, T(kF32, {2, 16, 64}), {{"dtype", Dt(kF32)}})
      .Call("native_dropout", "aten.native_dropout.default", {Ref("div"), F(0.1), B(true)},
            Tuple({bf({2, 4, 16, 16}), T(kBool, {2, 4, 16, 16})}))
      .Call("argmax", "aten.argmax.default", {Ref("mm"), I(1)}, T(kI64, {32}))
      .Output({"convert_element_type", "gelu", "getitem_1", "getitem_2", "_to_copy", "native_dropout", "argmax",
               "var_mean"});
  return b.Build();
}

v1::Graph ConvBlock() {
  GraphBuilder b;
  b.Input("x", F32({4, 3, 32, 32})).Input("w", F32({16, 3, 3, 3})).Input("b", F32({16}))
      .Input("bn_w", F32({16})).Input("bn_b", F32({16})).Input("rm", F32({16})).Input("rv", F32({16}))
      .Call("convolution", "aten.convolution.default",
            {Ref("x"), Ref("w"), Ref("b"), Ints({1, 1}), Ints({1, 1}), Ints({1, 1}), B(false), Ints({0, 0}), I(1)},
            F32({4, 16, 32, 32}))
      .Call("bn", "aten._native_batch_norm_legit_functional.default",
            {Ref("convolution"), Ref("bn_w"), Ref("bn_b"), Ref("rm"), Ref("rv"), B(true), F(0.1), F(1e-05)},
            Tuple({F32({4, 16, 32, 32}), F32({16}), F32({16}), F32({16}), F32({16})}))
      .Call("getitem", "operator.getitem", {Ref("bn"), I(0)}, F32({4, 16, 32, 32}))
      .Call("getitem_3", "operator.getitem", {Ref("bn"), I(3)}, F32({16}))
      .Call("relu", "aten.relu.default", {Ref("getitem")}, F32({4, 16, 32, 32}))
      .Call("max_pool2d_with_indices", "aten.max_pool2d_with_indices.default", {Ref("relu"), Ints({2, 2}), Ints({2, 2})},
            Tuple({F32({4, 16, 16, 16}), T(kI64, {4, 16, 16, 16})}))
      .Call("getitem_5", "operator.getitem", {Ref("max_pool2d_with_indices"), I(0)}, F32({4, 16, 16, 16}))
      .Call("mean", "aten.mean.dim", {Ref("getitem_5"), Ints({-1, -2}), B(true)}, F32({4, 16, 1, 1}))
      .Call("view", "aten.view.default", {Ref("mean"), Ints({4, 16})}, F32({4, 16}))
      .Call("upsample_nearest2d", "aten.upsample_nearest2d.default", {Ref("getitem_5"), Ints({32, 32})},
            F32({4, 16, 32, 32}))
      .Output({"view", "getitem_3", "upsample_nearest2d"});
  return b.Build();
}

v1::Graph DynamicGraph() {
  GraphBuilder b;
  v1::ValueMeta x;
  {
    v1::TensorMeta* t = x.mutable_tensor();
    t->set_dtype(kF32);
    *t->add_sizes()->mutable_expr() = SymS(0);
    t->add_sizes()->set_constant(64);
    t->add_strides()->set_constant(64);
    t->add_strides()->set_constant(1);
    t->mutable_device()->set_kind(v1::DEVICE_KIND_CUDA);
  }
  v1::ValueMeta flat;
  {
    v1::TensorMeta* t = flat.mutable_tensor();
    t->set_dtype(kF32);
    *t->add_sizes()->mutable_expr() = SymOp(v1::SymExpr::OP_MUL, {SymC(64), SymS(0)});
    t->add_strides()->set_constant(1);
    t->mutable_device()->set_kind(v1::DEVICE_KIND_CUDA);
  }
  v1::ValueMeta rows = x;
  rows.mutable_tensor()->mutable_sizes()->RemoveLast();
  rows.mutable_tensor()->mutable_strides()->RemoveLast();
  rows.mutable_tensor()->mutable_strides(0)->set_constant(1);
  b.Symbol("s0", 8, 2, 1024)
      .Input("x", x)
      .Call("sym_size_int", "aten.sym_size.int", {Ref("x"), I(0)}, SymMeta(SymS(0)))
      .Call("mul", "operator.mul", {Ref("sym_size_int"), I(64)}, SymMeta(SymOp(v1::SymExpr::OP_MUL, {SymS(0), SymC(64)})))
      .Call("view", "aten.view.default", {Ref("x"), L({Ref("mul")})}, flat)
      .Call("add", "aten.add.Tensor", {Ref("x"), F(1.0)}, x)
      .Call("sum_1", "aten.sum.dim_IntList", {Ref("add"), Ints({1})}, rows)
      .Output({"view", "sum_1", "sym_size_int"});
  return b.Build();
}

v1::Graph CollectiveGraph(const std::string& group_name) {
  GraphBuilder b;
  b.Input("x", F32({8, 8}))
      .Call("all_reduce", "_c10d_functional.all_reduce.default", {Ref("x"), S("sum"), S(group_name)}, F32({8, 8}))
      .Call("wait_tensor", "_c10d_functional.wait_tensor.default", {Ref("all_reduce")}, F32({8, 8}))
      .Output({"wait_tensor"});
  return b.Build();
}

v1::Graph TrainingBatchNorm(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  auto c32 = [](std::vector<int64_t> s, std::vector<int64_t> st = {}) {
    return T(v1::DTYPE_FLOAT32, std::move(s), std::move(st), v1::DEVICE_KIND_CPU);
  };
  const std::vector<int64_t> c = {sizes[1]};
  const v1::ValueMeta x = c32(sizes, strides);
  GraphBuilder b;
  b.Input("x", x).Input("w", c32(c)).Input("bias", c32(c)).Input("rm", c32(c)).Input("rv", c32(c)).Input("go", x)
      .Call("bn", "aten._native_batch_norm_legit_functional.default",
            {Ref("x"), Ref("w"), Ref("bias"), Ref("rm"), Ref("rv"), B(true), F(0.1), F(1e-5)},
            Tuple({x, c32(c), c32(c), c32(c), c32(c)}))
      .Call("out", "operator.getitem", {Ref("bn"), I(0)}, x)
      .Call("smean", "operator.getitem", {Ref("bn"), I(1)}, c32(c))
      .Call("sinv", "operator.getitem", {Ref("bn"), I(2)}, c32(c))
      .Call("nrm", "operator.getitem", {Ref("bn"), I(3)}, c32(c))
      .Call("nrv", "operator.getitem", {Ref("bn"), I(4)}, c32(c))
      .Call("bwd", "aten.native_batch_norm_backward.default",
            {Ref("go"), Ref("x"), Ref("w"), Ref("rm"), Ref("rv"), Ref("smean"), Ref("sinv"), B(true), F(1e-5),
             L({B(true), B(true), B(true)})},
            Tuple({x, c32(c), c32(c)}))
      .Call("gi", "operator.getitem", {Ref("bwd"), I(0)}, x)
      .Call("gw", "operator.getitem", {Ref("bwd"), I(1)}, c32(c))
      .Call("gb", "operator.getitem", {Ref("bwd"), I(2)}, c32(c))
      .Output({"out", "smean", "sinv", "nrm", "nrv", "gi", "gw", "gb"});
  return b.Build();
}

std::vector<v1::Graph> AllTestGraphs() {
  return {MlpForward(), MlpBackward(), AttentionBlock(), ConvBlock(), DynamicGraph(), CollectiveGraph("tp:0")};
}

std::string InferString(const std::string& target, std::vector<v1::ValueMeta> inputs, std::vector<v1::Argument> args,
                        std::vector<std::pair<std::string, v1::Argument>> kwargs) {
  GraphBuilder b;
  for (size_t i = 0; i < inputs.size(); ++i) b.Input(absl::StrCat("a", i), inputs[i]);
  b.Call("op", target, std::move(args), NoneMeta(), std::move(kwargs));
  b.Output({"op"});
  v1::Graph proto = b.Build();
  proto.mutable_symbols()->CopyFrom(symbols_for_infer());
  auto g = ImportGraph(proto, GraphLimits());
  if (!g.ok()) return absl::StrCat("error: ", g.status().message());
  const Node& n = g->nodes[inputs.size()];
  if (n.op == nullptr) return "error: not in the registry";
  for (size_t i = 0; i < n.args.size(); ++i) {
    auto st = CheckArgType(*g, n.op->schema.args[i].type, n.args[i]);
    if (!st.ok()) return absl::StrCat("error: argument ", i, ": ", st.message());
  }
  const std::vector<int64_t> hints = g->Hints();
  InferContext ctx(*g, n, hints);
  auto t = n.op->infer(ctx);
  if (!t.ok()) return absl::StrCat("error: ", t.status().message());
  return TypeToString(*t);
}

google::protobuf::RepeatedPtrField<v1::Symbol>& symbols_for_infer() {
  static auto* s = new google::protobuf::RepeatedPtrField<v1::Symbol>();
  return *s;
}

v1::CompileRequest Request(v1::Graph graph, const std::string& cuda_arch) {
  v1::CompileRequest r;
  *r.mutable_graph() = std::move(graph);
  r.mutable_target()->set_device(v1::DEVICE_KIND_CUDA);
  r.mutable_target()->set_cuda_arch(cuda_arch);
  r.mutable_client()->set_hostname("node-17");
  r.mutable_client()->set_rank(3);
  return r;
}

}  // namespace kiln::graph::testing
