#include "server/lower/lower.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"
#include "server/lower/lower_internal.h"
#include "spdlog/spdlog.h"

namespace kiln::lower {
namespace internal {

namespace v1 = ::kiln::v1;
using graph::Arg;
using graph::Node;
using graph::NodeKind;
using graph::Type;

std::optional<k::ScalarType> ToScalarType(graph::DType d) {
  switch (d) {
    case v1::DTYPE_FLOAT32: return k::ScalarType::kFloat32;
    case v1::DTYPE_FLOAT64: return k::ScalarType::kFloat64;
    case v1::DTYPE_FLOAT16: return k::ScalarType::kFloat16;
    case v1::DTYPE_BFLOAT16: return k::ScalarType::kBFloat16;
    case v1::DTYPE_INT8: return k::ScalarType::kInt8;
    case v1::DTYPE_UINT8: return k::ScalarType::kUInt8;
    case v1::DTYPE_INT32: return k::ScalarType::kInt32;
    case v1::DTYPE_INT64: return k::ScalarType::kInt64;
    case v1::DTYPE_BOOL: return k::ScalarType::kBool;
    default: return std::nullopt;
  }
}

k::ScalarType ComputeType(k::ScalarType t) { return k::IsHalfType(t) ? k::ScalarType::kFloat32 : t; }

std::vector<Affine> BroadcastIndex(const std::vector<int64_t>& in_sizes, const std::vector<Affine>& out) {
  std::vector<Affine> r(in_sizes.size());
  const size_t shift = out.size() - in_sizes.size();
  for (size_t d = 0; d < in_sizes.size(); ++d) r[d] = in_sizes[d] == 1 ? AffConst(0) : out[d + shift];
  return r;
}

k::ExprOr LiteralF(k::ScalarType t, double v) {
  if (k::IsFloatType(t)) {
    if (t == k::ScalarType::kFloat32) v = static_cast<double>(static_cast<float>(v));
    return k::ConstFloat(t, v);
  }
  if (t == k::ScalarType::kBool) return k::ConstBool(v != 0);
  return absl::UnimplementedError("float literal for an integer computation");
}

k::ExprOr Literal(k::ScalarType t, const Arg& a) {
  if (a.kind == Arg::Kind::kFloat) return LiteralF(t, a.f);
  int64_t i = 0;
  if (a.kind == Arg::Kind::kInt) {
    i = a.i;
  } else if (a.kind == Arg::Kind::kBool) {
    i = a.b ? 1 : 0;
  } else {
    return absl::UnimplementedError("non-numeric scalar argument");
  }
  if (k::IsFloatType(t)) return LiteralF(t, static_cast<double>(i));
  switch (t) {
    case k::ScalarType::kBool: return k::ConstBool(i != 0);
    case k::ScalarType::kInt8: return k::ConstInt(t, static_cast<int8_t>(i));
    case k::ScalarType::kUInt8: return k::ConstInt(t, static_cast<uint8_t>(i));
    case k::ScalarType::kInt32: return k::ConstInt(t, static_cast<int32_t>(i));
    default: return k::ConstInt(t, i);
  }
}

absl::StatusOr<int32_t> Lowerer::ValueOf(const Arg& a) const {
  if (a.kind != Arg::Kind::kValue || a.value < 0 || a.value >= static_cast<int32_t>(node_value.size()) ||
      node_value[a.value] < 0) {
    return absl::UnimplementedError("argument is not a tensor value");
  }
  return node_value[a.value];
}

absl::StatusOr<int32_t> Lowerer::KernelValueOf(const Arg& a) const {
  KILN_ASSIGN_OR_RETURN(int32_t v, ValueOf(a));
  if (!g_.values[v].kernel_dtype) return absl::UnimplementedError("operand dtype is not compiled");
  return v;
}

namespace {

absl::StatusOr<int64_t> Static(const graph::SymExpr& e) {
  if (!e.is_const()) return absl::UnimplementedError("dynamic shapes are not compiled yet; the client runs this graph eagerly");
  return e.value();
}

}  // namespace

absl::StatusOr<LValue> Lowerer::NewValue(int32_t node, const graph::TensorType& t, ValueKind kind) const {
  LValue v;
  v.kind = kind;
  v.node = node;
  const std::optional<k::ScalarType> st = ToScalarType(t.dtype);
  if (!st.has_value()) {
    if (kind == ValueKind::kPointwise || kind == ValueKind::kRowOutput) {
      return absl::UnimplementedError(absl::StrCat("dtype ", graph::DTypeName(t.dtype), " is not compiled"));
    }
    v.kernel_dtype = false;  // inputs, constants, step results and their views: steps may still use them
  }
  if (t.layout != v1::LAYOUT_STRIDED && t.layout != v1::LAYOUT_UNSPECIFIED) {
    return absl::UnimplementedError("non-strided layout");
  }
  v.dtype = st.value_or(k::ScalarType::kUInt8);
  for (const auto& s : t.sizes) {
    KILN_ASSIGN_OR_RETURN(int64_t x, Static(s));
    v.sizes.push_back(x);
  }
  for (const auto& s : t.strides) {
    KILN_ASSIGN_OR_RETURN(int64_t x, Static(s));
    v.strides.push_back(x);
  }
  if (v.strides.size() != v.sizes.size()) return absl::UnimplementedError("tensor without strides");
  KILN_ASSIGN_OR_RETURN(v.storage_offset, Static(t.storage_offset));
  v.meta.set_dtype(t.dtype);
  for (int64_t x : v.sizes) v.meta.add_sizes()->set_constant(x);
  for (int64_t x : v.strides) v.meta.add_strides()->set_constant(x);
  v.meta.mutable_storage_offset()->set_constant(v.storage_offset);
  v.meta.mutable_device()->set_kind(t.device);
  v.meta.mutable_device()->set_index(t.device_index);
  v.meta.set_layout(v1::LAYOUT_STRIDED);
  return v;
}

int32_t Lowerer::Add(LValue v) {
  v.id = static_cast<int32_t>(g_.values.size());
  g_.values.push_back(std::move(v));
  return g_.values.back().id;
}

namespace {

void CollectValues(const Lowerer& l, const Arg& a, std::vector<int32_t>* out, bool* bad) {
  if (a.kind == Arg::Kind::kValue) {
    auto v = l.ValueOf(a);
    if (v.ok()) {
      out->push_back(*v);
    } else {
      *bad = true;
    }
  } else if (a.kind == Arg::Kind::kList) {
    for (const Arg& x : a.list) CollectValues(l, x, out, bad);
  } else if (a.kind == Arg::Kind::kSym) {
    *bad = true;
  }
}

absl::Status LowerStep(Lowerer& l, int32_t node_index, bool fallback, const std::string& reason) {
  const Node& node = l.graph().nodes[node_index];
  ExternStep st;
  st.node = node_index;
  st.target = node.target;
  st.fallback = fallback;
  st.reason = reason;
  {
    const std::string name = node.op != nullptr ? node.op->schema.name : node.target;
    const size_t dot = name.find_last_of('.');
    const std::string base = node.op != nullptr || dot == std::string::npos ? name : name.substr(0, dot);
    st.mutates = !base.empty() && base.back() == '_';
    st.may_alias = node.op == nullptr || node.op->op_class == graph::OpClass::kView;
  }
  bool bad = false;
  for (const Arg& a : node.args) CollectValues(l, a, &st.inputs, &bad);
  for (const auto& kw : node.kwargs) CollectValues(l, kw.second, &st.inputs, &bad);
  if (bad) {
    return absl::UnimplementedError(absl::StrCat("node ", node.name, " (", node.target,
                                                 ") takes a non-tensor value the plan cannot pass"));
  }
  const int32_t step_id = static_cast<int32_t>(l.g().steps.size());
  auto make = [&](const Type& t, int32_t item) -> absl::StatusOr<int32_t> {
    if (t.kind != Type::Kind::kTensor) return -1;
    KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, t.tensor, ValueKind::kStepOutput));
    v.step = step_id;
    v.item = item;
    v.op = node.target;
    v.inputs = st.inputs;
    return l.Add(std::move(v));
  };
  if (node.type.kind == Type::Kind::kList) {
    std::vector<int32_t> items;
    for (size_t i = 0; i < node.type.items.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(int32_t v, make(node.type.items[i], static_cast<int32_t>(i)));
      items.push_back(v);
    }
    st.outputs = items;
    l.SetItems(node_index, items);
  } else if (node.type.kind == Type::Kind::kTensor) {
    KILN_ASSIGN_OR_RETURN(int32_t v, make(node.type, -1));
    st.outputs = {v};
    l.SetResult(node_index, v);
  } else if (node.type.kind != Type::Kind::kNone) {
    return absl::UnimplementedError(absl::StrCat("node ", node.name, " (", node.target,
                                                 ") produces a non-tensor value"));
  }
  l.g().steps.push_back(std::move(st));
  return absl::OkStatus();
}

absl::Status LowerView(Lowerer& l, int32_t node_index) {
  const Node& node = l.graph().nodes[node_index];
  if (node.args.empty()) return absl::UnimplementedError("view without a base");
  KILN_ASSIGN_OR_RETURN(int32_t base, l.ValueOf(node.args[0]));
  const std::string name = node.op->schema.name;
  if (name == "reshape" || name == "unfold") return absl::UnimplementedError(name + " is not lowered as a view");
  auto make = [&](const Type& t, int32_t item) -> absl::StatusOr<int32_t> {
    if (t.kind != Type::Kind::kTensor) return absl::UnimplementedError("view of a non-tensor");
    KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, t.tensor, ValueKind::kView));
    if (v.dtype != l.g().values[base].dtype || v.kernel_dtype != l.g().values[base].kernel_dtype) {
      return absl::UnimplementedError("view with a dtype change");
    }
    v.base = base;
    v.item = item;
    v.op = name;
    v.inputs = {base};
    return l.Add(std::move(v));
  };
  if (node.type.kind == Type::Kind::kList) {
    std::vector<int32_t> items;
    for (size_t i = 0; i < node.type.items.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(int32_t v, make(node.type.items[i], static_cast<int32_t>(i)));
      items.push_back(v);
    }
    l.SetItems(node_index, items);
  } else {
    KILN_ASSIGN_OR_RETURN(int32_t v, make(node.type, -1));
    l.SetResult(node_index, v);
  }
  return absl::OkStatus();
}

// An output that is a view of a computed value: the view itself when it covers its root once (a
// transpose or reshape of it, as AOTAutograd saves for a backward's matmuls; the plan then
// allocates the root as an output, plan_builder.cc), else its own copy (a slice or an expand,
// whose root would hold more memory than the output, or overlapping elements).
absl::StatusOr<int32_t> OutputValue(Lowerer& l, int32_t v) {
  OpGraph& g = l.g();
  if (g.values[v].kind != ValueKind::kView) return v;
  const LValue& root = g.values[ViewRoot(g, v)];
  const ValueKind rk = root.kind;
  if (rk == ValueKind::kInput || rk == ValueKind::kConstant || rk == ValueKind::kStepOutput) return v;
  bool overlapping = false;
  for (size_t d = 0; d < g.values[v].sizes.size(); ++d) {
    overlapping |= g.values[v].sizes[d] > 1 && g.values[v].strides[d] == 0;
  }
  if (!overlapping && g.values[v].numel() == root.numel()) return v;
  LValue c = g.values[v];
  c.kind = ValueKind::kPointwise;
  c.op = "copy_of_view";
  c.base = -1;
  c.inputs = {v};
  c.storage_offset = 0;
  c.meta.mutable_storage_offset()->set_constant(0);
  if (overlapping) {  // expanded: materialize densely
    int64_t s = 1;
    for (int d = static_cast<int>(c.sizes.size()) - 1; d >= 0; --d) {
      c.strides[d] = s;
      c.meta.mutable_strides(d)->set_constant(s);
      s *= std::max<int64_t>(c.sizes[d], 1);
    }
  }
  c.cheap = true;
  c.elem = [v](LoadContext& ctx, const std::vector<Affine>& idx) { return ctx.Load(v, idx); };
  return l.Add(std::move(c));
}

}  // namespace
}  // namespace internal

absl::StatusOr<OpGraph> LowerGraph(const graph::Graph& graph, const std::vector<int32_t>& fallback_nodes,
                                   const LowerOptions& options) {
  using namespace internal;  // NOLINT
  OpGraph g;
  g.graph = &graph;
  Lowerer l(graph, &g, options);
  l.node_value.assign(graph.nodes.size(), -1);
  l.node_items.assign(graph.nodes.size(), {});
  const std::set<int32_t> fallbacks(fallback_nodes.begin(), fallback_nodes.end());
  for (int32_t i = 0; i < static_cast<int32_t>(graph.nodes.size()); ++i) {
    const Node& node = graph.nodes[i];
    switch (node.kind) {
      case NodeKind::kInput:
      case NodeKind::kConstant: {
        if (node.type.kind != Type::Kind::kTensor) {
          return absl::UnimplementedError(absl::StrCat("input ", node.name,
                                                       " is not a tensor (dynamic shapes are not compiled yet; "
                                                       "the client runs this graph eagerly)"));
        }
        const bool is_input = node.kind == NodeKind::kInput;
        auto v = l.NewValue(i, node.type.tensor, is_input ? ValueKind::kInput : ValueKind::kConstant);
        if (!v.ok()) {
          if (absl::StrContains(v.status().message(), "dynamic")) return v.status();
          return absl::UnimplementedError(absl::StrCat(is_input ? "input " : "constant ", node.name, ": ",
                                                       v.status().message()));
        }
        v->op = is_input ? "input" : "constant";
        v->input_index = node.input_index;
        v->constant_index = node.constant_index;
        if (is_input) g.num_inputs = std::max(g.num_inputs, node.input_index + 1);
        l.SetResult(i, l.Add(std::move(*v)));
        break;
      }
      case NodeKind::kOutput: {
        if (node.args.empty()) return absl::InternalError("output node without arguments");
        // FX allows output(x) as well as output([x, ...]): a single value is a list of one.
        const std::vector<Arg> single = {node.args[0]};
        const std::vector<Arg>& outputs =
            node.args[0].kind == Arg::Kind::kList ? node.args[0].list : single;
        for (const Arg& a : outputs) {
          if (a.kind == Arg::Kind::kNone) {
            g.outputs.push_back(-1);
            continue;
          }
          auto v = l.ValueOf(a);
          if (!v.ok()) return absl::UnimplementedError("a graph output is not a tensor");
          KILN_ASSIGN_OR_RETURN(int32_t out, OutputValue(l, *v));
          g.outputs.push_back(out);
        }
        break;
      }
      case NodeKind::kCall: {
        if (node.target == "operator.getitem") {
          if (node.args.size() < 2 || node.args[0].kind != Arg::Kind::kValue || node.args[1].kind != Arg::Kind::kInt) {
            return absl::UnimplementedError(absl::StrCat("getitem ", node.name, " of a non-constant index"));
          }
          const auto& items = l.node_items[node.args[0].value];
          const int64_t idx = node.args[1].i;
          if (idx < 0 || idx >= static_cast<int64_t>(items.size()) || items[idx] < 0) {
            break;  // not a value (an empty or unused result): fails only if something reads it
          }
          l.SetResult(i, items[idx]);
          break;
        }
        absl::Status st;
        if (fallbacks.count(i) || node.op == nullptr) {
          st = LowerStep(l, i, /*fallback=*/true, "not in the op registry");
          KILN_RETURN_IF_ERROR(st);
          break;
        }
        if (node.op->op_class == graph::OpClass::kExtern) {
          KILN_RETURN_IF_ERROR(LowerStep(l, i, /*fallback=*/false, ""));
          break;
        }
        const size_t before = g.values.size(), rows_before = g.row_ops.size();
        switch (node.op->op_class) {
          case graph::OpClass::kView: st = LowerView(l, i); break;
          case graph::OpClass::kReduction: st = LowerRowNode(l, i); break;
          default: st = LowerPointwiseNode(l, i); break;
        }
        if (!st.ok()) {
          if (absl::StrContains(st.message(), "dynamic shapes")) return st;
          if (st.code() != absl::StatusCode::kUnimplemented) return st;
          g.values.resize(before);  // drop anything half-made
          g.row_ops.resize(rows_before);
          spdlog::debug("lower: node {} ({}) falls back: {}", node.name, node.target, std::string(st.message()));
          KILN_RETURN_IF_ERROR(LowerStep(l, i, /*fallback=*/true, std::string(st.message())));
        }
        break;
      }
    }
  }
  g.node_value = l.node_value;
  // Users.
  g.value_users.assign(g.values.size(), {});
  g.row_users.assign(g.values.size(), {});
  g.step_users.assign(g.values.size(), {});
  for (const LValue& v : g.values) {
    if (v.kind == ValueKind::kPointwise || v.kind == ValueKind::kView) {
      for (int32_t in : v.inputs) g.value_users[in].push_back(v.id);
    }
  }
  for (size_t r = 0; r < g.row_ops.size(); ++r) {
    for (int32_t in : g.row_ops[r].inputs) g.row_users[in].push_back(static_cast<int32_t>(r));
  }
  for (size_t s = 0; s < g.steps.size(); ++s) {
    for (int32_t in : g.steps[s].inputs) g.step_users[in].push_back(static_cast<int32_t>(s));
  }
  return g;
}

}  // namespace kiln::lower
