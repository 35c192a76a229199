#include "server/graph/key.h"

#include <gtest/gtest.h>

#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

CompilerIdentity Compiler() { return CompilerIdentity{{{"nvrtc", "13.0"}, {"cxx", "g++ 12.2.0"}}}; }

CacheKey KeyOf(const v1::CompileRequest& r, const CompilerIdentity& c = Compiler()) {
  auto p = PrepareGraph(r, GraphLimits(), c);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? p->key : CacheKey{};
}
std::string Key(const v1::CompileRequest& r, const CompilerIdentity& c = Compiler()) { return KeyOf(r, c).hex; }

// sum(x, [1]) written in different spellings.
v1::Graph SumGraph(int spelling, const std::string& x_name = "x") {
  GraphBuilder b;
  b.Input(x_name, F32({4, 8}));
  switch (spelling) {
    case 0:
      b.Call("s", "aten.sum.dim_IntList", {Ref(x_name), Ints({1})}, F32({4}));
      break;
    case 1:
      b.Call("s", "aten.sum.dim_IntList", {Ref(x_name)}, F32({4}), {{"dim", Ints({1})}});
      break;
    case 2:
      b.Call("s", "aten.sum.dim_IntList", {Ref(x_name), Ints({1}), B(false)}, F32({4}), {{"dtype", None()}});
      break;
    default:
      b.Call("s", "aten.sum.dim_IntList", {Ref(x_name), L({I(1)}, true)}, F32({4}), {{"keepdim", B(false)}});
  }
  b.Output({"s"});
  return b.Build();
}

TEST(KeyTest, StableAcrossSpellings) {
  const std::string k = Key(Request(SumGraph(0)));
  EXPECT_EQ(k.size(), 64u);
  for (int s = 1; s < 4; ++s) EXPECT_EQ(Key(Request(SumGraph(s))), k) << "spelling " << s;
}

TEST(KeyTest, StableUnderRenamedNodesAndDebugInfo) {
  v1::Graph g = MlpForward();
  const std::string k = Key(Request(g));
  v1::Graph renamed = g;
  std::map<std::string, std::string> names;
  for (int i = 0; i < renamed.nodes_size(); ++i) names[renamed.nodes(i).name()] = "n" + std::to_string(i);
  std::function<void(v1::Argument*)> fix = [&](v1::Argument* a) {
    if (a->has_node()) a->set_node(names[a->node()]);
    if (a->has_list()) {
      for (auto& item : *a->mutable_list()->mutable_items()) fix(&item);
    }
  };
  for (auto& n : *renamed.mutable_nodes()) {
    n.set_name(names[n.name()]);
    if (n.op() == v1::Node::OP_PLACEHOLDER) n.set_target(n.name());
    for (auto& a : *n.mutable_args()) fix(&a);
    n.mutable_debug()->set_stack_trace("elsewhere");
    n.mutable_debug()->add_module_path("layers.3");
  }
  renamed.set_debug_name("other");
  renamed.set_kind(v1::GRAPH_KIND_INFERENCE);
  EXPECT_EQ(Key(Request(renamed)), k);
}

TEST(KeyTest, StableAcrossDeviceIndicesAndProcessGroups) {
  v1::Graph g = MlpForward();
  v1::Graph moved = g;
  for (auto& n : *moved.mutable_nodes()) {
    if (n.meta().has_tensor()) n.mutable_meta()->mutable_tensor()->mutable_device()->set_index(3);
    if (n.meta().has_tensor()) n.mutable_meta()->mutable_tensor()->set_requires_grad(true);
  }
  EXPECT_EQ(Key(Request(moved)), Key(Request(g)));
  EXPECT_EQ(Key(Request(CollectiveGraph("tp:0"))), Key(Request(CollectiveGraph("tp:17"))));
  // The reduce op is not rank-specific.
  v1::Graph avg = CollectiveGraph("tp:0");
  avg.mutable_nodes(1)->mutable_args(1)->set_string_value("avg");
  EXPECT_NE(Key(Request(avg)), Key(Request(CollectiveGraph("tp:0"))));
  // The factory's device index, as an argument, is not hashed either.
  v1::Graph bwd = MlpBackward();
  const std::string k = Key(Request(bwd));
  for (auto& n : *bwd.mutable_nodes()) {
    for (auto& kw : *n.mutable_kwargs()) {
      if (kw.value().has_device()) kw.mutable_value()->mutable_device()->set_index(5);
    }
  }
  EXPECT_EQ(Key(Request(bwd)), k);
}

TEST(KeyTest, NotAffectedByUnhashedOptionsOrClient) {
  v1::CompileRequest r = Request(MlpForward());
  const std::string k = Key(r);
  r.mutable_options()->set_keep_source(true);
  r.mutable_options()->set_compile_timeout_ms(1234);
  r.mutable_client()->set_hostname("other");
  r.mutable_client()->set_rank(7);
  r.mutable_client()->set_torch_version("2.11.0");
  EXPECT_EQ(Key(r), k);
}

TEST(KeyTest, ChangesWithEverythingThatChangesCode) {
  const v1::CompileRequest base = Request(SumGraph(0));
  const std::string k = Key(base);
  auto differs = [&](const v1::CompileRequest& r, const CompilerIdentity& c = Compiler()) {
    EXPECT_NE(Key(r, c), k);
  };
  v1::CompileRequest shape = base;  // x: [4, 8] -> [4, 9]
  shape.mutable_graph()->mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_sizes(1)->set_constant(9);
  shape.mutable_graph()->mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_strides(0)->set_constant(9);
  differs(shape);
  v1::CompileRequest dtype = base;
  dtype.mutable_graph()->mutable_nodes(0)->mutable_meta()->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT16);
  dtype.mutable_graph()->mutable_nodes(1)->mutable_meta()->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT16);
  differs(dtype);
  v1::CompileRequest stride = base;  // x transposed in memory
  stride.mutable_graph()->mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_strides(0)->set_constant(1);
  stride.mutable_graph()->mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_strides(1)->set_constant(4);
  differs(stride);
  v1::CompileRequest arch = base;
  arch.mutable_target()->set_cuda_arch("sm_80");
  differs(arch);
  v1::CompileRequest cpu = base;
  cpu.mutable_target()->set_device(v1::DEVICE_KIND_CPU);
  cpu.mutable_target()->clear_cuda_arch();
  cpu.mutable_target()->set_cpu_isa("x86-64-v3");
  differs(cpu);
  differs(base, CompilerIdentity{{{"nvrtc", "13.1"}, {"cxx", "g++ 12.2.0"}}});
  for (int option = 0; option < 3; ++option) {
    v1::CompileRequest o = base;
    if (option == 0) o.mutable_options()->set_cuda_emit_ptx(true);
    if (option == 1) o.mutable_options()->set_disable_fusion(true);
    if (option == 2) o.mutable_options()->set_deterministic(true);
    differs(o);
  }
  v1::CompileRequest keepdim = Request(SumGraph(0));
  v1::Node* s = keepdim.mutable_graph()->mutable_nodes(1);
  *s->add_args() = B(true);
  *s->mutable_meta() = F32({4, 1});
  differs(keepdim);
}

TEST(KeyTest, RecordExplainsMisses) {
  CacheKey a = KeyOf(Request(SumGraph(0)));
  v1::CompileRequest r = Request(SumGraph(0));
  r.mutable_target()->set_cuda_arch("sm_80");
  CacheKey b = KeyOf(r);
  const std::string text = FormatKeyRecord(a.record);
  EXPECT_NE(text.find("format = kiln-graph-key/1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("target.cuda_arch = sm_90\n"), std::string::npos);
  EXPECT_NE(text.find("input[0].meta = f32[4, 8] strides [8, 1] cuda\n"), std::string::npos);
  EXPECT_NE(text.find("node[1].target = aten.sum.dim_IntList\n"), std::string::npos);
  EXPECT_NE(text.find("node[1].arg[0] = %0\n"), std::string::npos);
  EXPECT_NE(text.find("compiler.nvrtc = 13.0\n"), std::string::npos);
  EXPECT_EQ(DiffKeyRecords(a.record, b.record), std::vector<std::string>({"target.cuda_arch: sm_90 -> sm_80"}));
  EXPECT_TRUE(DiffKeyRecords(a.record, a.record).empty());
  const std::string c = FormatKeyRecord(KeyOf(Request(CollectiveGraph("g"))).record);
  EXPECT_NE(c.find("node[1].arg[2] = <group>\n"), std::string::npos) << c;
}

TEST(KeyTest, TargetValidation) {
  v1::Target t;
  t.set_device(v1::DEVICE_KIND_CUDA);
  for (const char* ok : {"sm_80", "sm_90", "sm_90a", "sm_100a", "sm_120"}) {
    t.set_cuda_arch(ok);
    EXPECT_TRUE(ValidateTarget(t).ok()) << ok;
  }
  for (const char* bad : {"", "sm_9", "compute_90", "sm_90b", "sm_1000", "sm_90;rm -rf", "SM_90"}) {
    t.set_cuda_arch(bad);
    EXPECT_FALSE(ValidateTarget(t).ok()) << bad;
  }
  v1::Target c;
  c.set_device(v1::DEVICE_KIND_CPU);
  for (const char* ok : {"x86-64-v3", "x86-64-v4", "armv8.2-a+sve", "znver4", "skylake-avx512"}) {
    c.set_cpu_isa(ok);
    EXPECT_TRUE(ValidateTarget(c).ok()) << ok;
  }
  c.set_cpu_isa("native");
  absl::Status st = ValidateTarget(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("machine"), std::string::npos) << st;
  for (const char* bad : {"", "-march=x", "x86 64", "X86-64", "a\"b"}) {
    c.set_cpu_isa(bad);
    EXPECT_FALSE(ValidateTarget(c).ok()) << bad;
  }
  v1::Target none;
  EXPECT_FALSE(ValidateTarget(none).ok());
}

}  // namespace
}  // namespace kiln::graph
