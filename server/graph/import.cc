#include "server/graph/import.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"

namespace kiln::graph {

namespace {

namespace v1 = ::kiln::v1;

// Printable, bounded form of a client string for messages.
std::string Quote(const std::string& s) {
  return absl::CEscape(s.size() > 200 ? s.substr(0, 200) + "..." : s);
}

class Importer {
 public:
  Importer(const v1::Graph& proto, const GraphLimits& limits) : proto_(proto), limits_(limits) {}

  absl::StatusOr<Graph> Run() {
    if (proto_.nodes_size() > limits_.max_nodes) {
      return absl::ResourceExhaustedError(absl::StrCat("graph has ", proto_.nodes_size(),
                                                       " nodes, more than the limit of ", limits_.max_nodes));
    }
    if (proto_.symbols_size() > limits_.max_symbols) {
      return absl::ResourceExhaustedError(absl::StrCat("graph has ", proto_.symbols_size(),
                                                       " symbols, more than the limit of ", limits_.max_symbols));
    }
    graph_.kind = v1::GraphKind_IsValid(proto_.kind()) ? proto_.kind() : v1::GRAPH_KIND_UNSPECIFIED;
    graph_.debug_name = proto_.debug_name().substr(0, limits_.max_string_bytes);
    for (const v1::Symbol& s : proto_.symbols()) {
      graph_.symbols.push_back(SymbolInfo{s.name().substr(0, limits_.max_string_bytes), s.hint(), s.min_value(),
                                          s.max_value()});
    }
    KILN_RETURN_IF_ERROR(ImportConstants());
    // Names first, so that a reference to a later node can be told from a dangling one.
    names_.reserve(proto_.nodes_size());
    for (int i = 0; i < proto_.nodes_size(); ++i) {
      const v1::Node& n = proto_.nodes(i);
      if (n.name().empty()) return absl::InvalidArgumentError(absl::StrCat("node #", i, " has no name"));
      if (static_cast<int64_t>(n.name().size()) > limits_.max_string_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat("node #", i, ": name longer than ", limits_.max_string_bytes,
                                                         " bytes"));
      }
      auto [it, inserted] = names_.emplace(n.name(), i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("node '", Quote(n.name()), "': duplicate node name (nodes #",
                                                       it->second, " and #", i, ")"));
      }
    }
    graph_.nodes.reserve(proto_.nodes_size());
    int output = -1;
    int num_inputs = 0;
    for (int i = 0; i < proto_.nodes_size(); ++i) {
      const v1::Node& n = proto_.nodes(i);
      if (output >= 0) {
        return Error(n, n.op() == v1::Node::OP_OUTPUT ? "second output node (a graph has exactly one)"
                                                       : "node after the output node");
      }
      Node node;
      node.name = n.name();
      current_ = i;
      current_node_ = &n;
      switch (n.op()) {
        case v1::Node::OP_PLACEHOLDER:
          node.kind = NodeKind::kInput;
          node.input_index = num_inputs++;
          break;
        case v1::Node::OP_GET_ATTR: {
          node.kind = NodeKind::kConstant;
          auto it = constant_names_.find(n.target());
          if (it == constant_names_.end()) {
            return Error(n, absl::StrCat("get_attr of unknown constant '", Quote(n.target()), "'"));
          }
          node.constant_index = it->second;
          break;
        }
        case v1::Node::OP_CALL_FUNCTION:
          node.kind = NodeKind::kCall;
          break;
        case v1::Node::OP_OUTPUT:
          node.kind = NodeKind::kOutput;
          output = i;
          break;
        case v1::Node::OP_CALL_METHOD:
          return Error(n, "call_method nodes are not produced by AOTAutograd and are not supported");
        case v1::Node::OP_CALL_MODULE:
          return Error(n, "call_module nodes are not produced by AOTAutograd and are not supported");
        default:
          return Error(n, absl::StrCat("unknown node op ", static_cast<int>(n.op())));
      }
      if (static_cast<int64_t>(n.target().size()) > limits_.max_string_bytes) {
        return Limit(n, absl::StrCat("target longer than ", limits_.max_string_bytes, " bytes"));
      }
      node.target = n.target();
      if (n.args_size() + n.kwargs_size() > limits_.max_args_per_node) {
        return Limit(n, absl::StrCat(n.args_size() + n.kwargs_size(), " arguments, more than the limit of ",
                                     limits_.max_args_per_node));
      }
      std::vector<Arg> args;
      args.reserve(n.args_size());
      for (int a = 0; a < n.args_size(); ++a) {
        KILN_ASSIGN_OR_RETURN(Arg arg, ConvertArg(n.args(a), 0, absl::StrCat("argument ", a)));
        args.push_back(std::move(arg));
      }
      std::vector<std::pair<std::string, Arg>> kwargs;
      for (const v1::NamedArgument& kw : n.kwargs()) {
        if (kw.name().empty() || static_cast<int64_t>(kw.name().size()) > limits_.max_string_bytes) {
          return Error(n, "keyword argument with an empty or overlong name");
        }
        KILN_ASSIGN_OR_RETURN(Arg arg, ConvertArg(kw.value(), 0, absl::StrCat("keyword argument '", kw.name(), "'")));
        for (const auto& [name, unused] : kwargs) {
          if (name == kw.name()) return Error(n, absl::StrCat("keyword argument '", Quote(kw.name()), "' given twice"));
        }
        kwargs.emplace_back(kw.name(), std::move(arg));
      }
      if (n.has_meta()) {
        KILN_ASSIGN_OR_RETURN(node.type, ConvertMeta(n.meta(), 0));
      } else if (node.kind != NodeKind::kOutput) {
        return Error(n, "node has no metadata (meta)");
      } else {
        node.type = Type::None();
      }
      if (node.kind == NodeKind::kCall) {
        node.op = FindOp(node.target);
        if (node.op != nullptr) {
          KILN_ASSIGN_OR_RETURN(node.args, BindArgs(*node.op, std::move(args), std::move(kwargs)));
        } else {
          std::sort(kwargs.begin(), kwargs.end(),
                    [](const auto& a, const auto& b) { return a.first < b.first; });
          node.args = std::move(args);
          node.kwargs = std::move(kwargs);
        }
      } else if (node.kind == NodeKind::kOutput) {
        if (args.size() != 1 || !kwargs.empty()) return Error(n, "the output node takes exactly one argument");
        node.args = std::move(args);
      } else if (!args.empty() || !kwargs.empty()) {
        return Error(n, "placeholder and get_attr nodes take no arguments");
      }
      graph_.nodes.push_back(std::move(node));
    }
    if (output < 0) return absl::InvalidArgumentError("graph has no output node");
    KILN_RETURN_IF_ERROR(ImportFreeLayoutOutputs(graph_.nodes[output]));
    return std::move(graph_);
  }

 private:
  absl::Status Error(const v1::Node& n, absl::string_view reason) {
    return absl::InvalidArgumentError(absl::StrCat("node '", Quote(n.name()), "' (", Quote(n.target()), "): ", reason));
  }
  absl::Status Limit(const v1::Node& n, absl::string_view reason) {
    return absl::ResourceExhaustedError(absl::StrCat("node '", Quote(n.name()), "' (", Quote(n.target()), "): ", reason));
  }
  // Errors outside node context (constants) have current_node_ == nullptr.
  absl::Status Err(absl::string_view reason, bool limit = false) {
    if (current_node_ == nullptr) {
      return limit ? absl::ResourceExhaustedError(reason) : absl::InvalidArgumentError(reason);
    }
    return limit ? Limit(*current_node_, reason) : Error(*current_node_, reason);
  }

  // Graph.free_layout_outputs: positions of the output node's list, ascending, each once.
  absl::Status ImportFreeLayoutOutputs(const Node& output) {
    const Arg& a = output.args[0];
    const int64_t count = a.kind == Arg::Kind::kList ? static_cast<int64_t>(a.list.size()) : 1;
    int64_t last = -1;
    for (int32_t p : proto_.free_layout_outputs()) {
      if (p < 0 || p >= count) {
        return absl::InvalidArgumentError(absl::StrCat("free_layout_outputs: position ", p, " is not one of the ",
                                                       count, " graph outputs"));
      }
      if (p <= last) {
        return absl::InvalidArgumentError(absl::StrCat("free_layout_outputs: position ", p,
                                                       " comes after ", last, " (the list must ascend, each position once)"));
      }
      last = p;
      graph_.free_layout_outputs.push_back(p);
    }
    return absl::OkStatus();
  }

  absl::Status ImportConstants() {
    int64_t total = 0;
    for (int i = 0; i < proto_.constants_size(); ++i) {
      const v1::TensorConstant& c = proto_.constants(i);
      total += static_cast<int64_t>(c.data().size());
      if (total > limits_.max_constant_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat("constants hold more than the limit of ",
                                                         limits_.max_constant_bytes, " bytes"));
      }
      if (!constant_names_.emplace(c.name(), i).second) {
        return absl::InvalidArgumentError(absl::StrCat("constant '", Quote(c.name()), "': duplicate constant name"));
      }
      Constant constant;
      constant.name = c.name().substr(0, limits_.max_string_bytes);
      auto type = ConvertTensor(c.meta());
      if (!type.ok()) {
        return absl::Status(type.status().code(),
                            absl::StrCat("constant '", Quote(c.name()), "': ", type.status().message()));
      }
      constant.type = *std::move(type);
      constant.data = c.data();
      graph_.constants.push_back(std::move(constant));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<SymExpr> ConvertSymExpr(const v1::SymExpr& e, int depth, int64_t* budget) {
    if (depth >= limits_.max_sym_expr_depth) {
      return Err(absl::StrCat("SymExpr nested deeper than ", limits_.max_sym_expr_depth), true);
    }
    if (--*budget < 0) return Err(absl::StrCat("SymExpr larger than ", limits_.max_sym_expr_nodes, " nodes"), true);
    const int n = e.args_size();
    auto want = [&](bool ok) -> absl::Status {
      if (ok) return absl::OkStatus();
      return Err(absl::StrCat("SymExpr op ", v1::SymExpr::Op_Name(e.op()), " with ", n, " arguments"));
    };
    std::vector<SymExpr> args;
    switch (e.op()) {
      case v1::SymExpr::OP_CONSTANT:
        KILN_RETURN_IF_ERROR(want(n == 0));
        return SymExpr::Const(e.constant());
      case v1::SymExpr::OP_SYMBOL:
        KILN_RETURN_IF_ERROR(want(n == 0));
        if (e.symbol() < 0 || e.symbol() >= proto_.symbols_size()) {
          return Err(absl::StrCat("SymExpr refers to symbol ", e.symbol(), " but the graph has ",
                                  proto_.symbols_size(), " symbols"));
        }
        return SymExpr::Symbol(e.symbol());
      case v1::SymExpr::OP_ADD: case v1::SymExpr::OP_MUL: case v1::SymExpr::OP_MAX: case v1::SymExpr::OP_MIN:
        KILN_RETURN_IF_ERROR(want(n >= 2));
        break;
      case v1::SymExpr::OP_NEG:
        KILN_RETURN_IF_ERROR(want(n == 1));
        break;
      case v1::SymExpr::OP_FLOOR_DIV: case v1::SymExpr::OP_CEIL_DIV: case v1::SymExpr::OP_MOD:
        KILN_RETURN_IF_ERROR(want(n == 2));
        break;
      default:
        return Err(absl::StrCat("SymExpr with unknown op ", static_cast<int>(e.op())));
    }
    for (const v1::SymExpr& a : e.args()) {
      KILN_ASSIGN_OR_RETURN(SymExpr x, ConvertSymExpr(a, depth + 1, budget));
      args.push_back(std::move(x));
    }
    switch (e.op()) {
      case v1::SymExpr::OP_ADD: return SymExpr::Add(std::move(args));
      case v1::SymExpr::OP_MUL: return SymExpr::Mul(std::move(args));
      case v1::SymExpr::OP_MAX: return SymExpr::Max(std::move(args));
      case v1::SymExpr::OP_MIN: return SymExpr::Min(std::move(args));
      case v1::SymExpr::OP_NEG: return SymExpr::Neg(args[0]);
      case v1::SymExpr::OP_FLOOR_DIV: return SymExpr::FloorDiv(args[0], args[1]);
      case v1::SymExpr::OP_CEIL_DIV: return SymExpr::CeilDiv(args[0], args[1]);
      default: return SymExpr::Mod(args[0], args[1]);
    }
  }

  absl::StatusOr<SymExpr> ConvertSym(const v1::SymExpr& e) {
    int64_t budget = limits_.max_sym_expr_nodes;
    return ConvertSymExpr(e, 0, &budget);
  }

  absl::StatusOr<SymExpr> ConvertSymInt(const v1::SymInt& s, const std::string& what, bool required) {
    switch (s.value_case()) {
      case v1::SymInt::kConstant: return SymExpr::Const(s.constant());
      case v1::SymInt::kExpr: return ConvertSym(s.expr());
      default:
        if (required) return Err(absl::StrCat(what, " has no value"));
        return SymExpr();
    }
  }

  absl::StatusOr<TensorType> ConvertTensor(const v1::TensorMeta& m) {
    TensorType t;
    if (!IsKnownDType(m.dtype())) return Err(absl::StrCat("unknown or unspecified dtype value ", m.dtype()));
    t.dtype = m.dtype();
    if (m.sizes_size() > limits_.max_rank) {
      return Err(absl::StrCat("tensor of rank ", m.sizes_size(), ", more than the limit of ", limits_.max_rank), true);
    }
    if (m.strides_size() != m.sizes_size()) {
      return Err(absl::StrCat("tensor has ", m.sizes_size(), " sizes but ", m.strides_size(), " strides"));
    }
    for (int i = 0; i < m.sizes_size(); ++i) {
      KILN_ASSIGN_OR_RETURN(SymExpr s, ConvertSymInt(m.sizes(i), absl::StrCat("size ", i), true));
      t.sizes.push_back(std::move(s));
      KILN_ASSIGN_OR_RETURN(SymExpr st, ConvertSymInt(m.strides(i), absl::StrCat("stride ", i), true));
      t.strides.push_back(std::move(st));
    }
    KILN_ASSIGN_OR_RETURN(t.storage_offset, ConvertSymInt(m.storage_offset(), "storage_offset", false));
    const v1::DeviceKind dk = m.device().kind();
    if (dk == v1::DEVICE_KIND_UNSPECIFIED || !v1::DeviceKind_IsValid(dk)) {
      return Err(absl::StrCat("unknown or unspecified device kind ", static_cast<int>(dk)));
    }
    t.device = dk;
    t.device_index = m.device().index();
    if (!v1::Layout_IsValid(m.layout())) return Err(absl::StrCat("unknown layout value ", static_cast<int>(m.layout())));
    t.layout = m.layout() == v1::LAYOUT_UNSPECIFIED ? v1::LAYOUT_STRIDED : m.layout();
    return t;
  }

  absl::StatusOr<Type> ConvertMeta(const v1::ValueMeta& m, int depth) {
    switch (m.kind_case()) {
      case v1::ValueMeta::kTensor: {
        KILN_ASSIGN_OR_RETURN(TensorType t, ConvertTensor(m.tensor()));
        return Type::Tensor(std::move(t));
      }
      case v1::ValueMeta::kList: {
        if (depth >= limits_.max_nesting_depth) {
          return Err(absl::StrCat("metadata lists nested deeper than ", limits_.max_nesting_depth), true);
        }
        if (m.list().items_size() > limits_.max_list_items) {
          return Err(absl::StrCat("metadata list of ", m.list().items_size(), " items, more than the limit of ",
                                  limits_.max_list_items), true);
        }
        std::vector<Type> items;
        for (const v1::ValueMeta& item : m.list().items()) {
          KILN_ASSIGN_OR_RETURN(Type t, ConvertMeta(item, depth + 1));
          items.push_back(std::move(t));
        }
        return Type::List(std::move(items));
      }
      case v1::ValueMeta::kSymInt: {
        KILN_ASSIGN_OR_RETURN(SymExpr e, ConvertSymInt(m.sym_int(), "sym_int metadata", true));
        return Type::SymInt(std::move(e));
      }
      case v1::ValueMeta::kNone:
        return Type::None();
      case v1::ValueMeta::kScalarDtype:
        if (!IsKnownDType(m.scalar_dtype())) return Err("unknown scalar dtype in metadata");
        return Type::Scalar(m.scalar_dtype());
      default:
        return Err("metadata (meta) has no kind");
    }
  }

  absl::StatusOr<Arg> ConvertArg(const v1::Argument& a, int depth, const std::string& what) {
    switch (a.value_case()) {
      case v1::Argument::kNode: {
        auto it = names_.find(a.node());
        if (it == names_.end()) return Err(absl::StrCat(what, " refers to unknown node '", Quote(a.node()), "'"));
        if (it->second == current_) return Err(absl::StrCat(what, " refers to the node itself (a cycle)"));
        if (it->second > current_) {
          return Err(absl::StrCat(what, " refers to node '", Quote(a.node()),
                                  "' defined later (a forward reference or a cycle)"));
        }
        if (graph_.nodes[it->second].kind == NodeKind::kOutput) return Err(absl::StrCat(what, " refers to the output node"));
        return Arg::Value(it->second);
      }
      case v1::Argument::kIntValue: return Arg::Int(a.int_value());
      case v1::Argument::kFloatValue: return Arg::Float(a.float_value());
      case v1::Argument::kBoolValue: return Arg::Bool(a.bool_value());
      case v1::Argument::kStringValue:
        if (static_cast<int64_t>(a.string_value().size()) > limits_.max_string_bytes) {
          return Err(absl::StrCat(what, ": string longer than ", limits_.max_string_bytes, " bytes"), true);
        }
        return Arg::String(a.string_value());
      case v1::Argument::kDtype:
        if (!IsKnownDType(a.dtype())) return Err(absl::StrCat(what, ": unknown dtype value ", a.dtype()));
        return Arg::OfDType(a.dtype());
      case v1::Argument::kDevice:
        if (a.device().kind() == v1::DEVICE_KIND_UNSPECIFIED || !v1::DeviceKind_IsValid(a.device().kind())) {
          return Err(absl::StrCat(what, ": unknown device kind ", static_cast<int>(a.device().kind())));
        }
        return Arg::Device(a.device().kind(), a.device().index());
      case v1::Argument::kLayout:
        if (a.layout() == v1::LAYOUT_UNSPECIFIED || !v1::Layout_IsValid(a.layout())) {
          return Err(absl::StrCat(what, ": unknown layout value ", static_cast<int>(a.layout())));
        }
        return Arg::OfLayout(a.layout());
      case v1::Argument::kMemoryFormat:
        if (a.memory_format() == v1::MEMORY_FORMAT_UNSPECIFIED || !v1::MemoryFormat_IsValid(a.memory_format())) {
          return Err(absl::StrCat(what, ": unknown memory format value ", static_cast<int>(a.memory_format())));
        }
        return Arg::OfMemoryFormat(a.memory_format());
      case v1::Argument::kNone: return Arg::None();
      case v1::Argument::kList: {
        if (depth >= limits_.max_nesting_depth) {
          return Err(absl::StrCat(what, ": lists nested deeper than ", limits_.max_nesting_depth), true);
        }
        if (a.list().items_size() > limits_.max_list_items) {
          return Err(absl::StrCat(what, ": list of ", a.list().items_size(), " items, more than the limit of ",
                                  limits_.max_list_items), true);
        }
        std::vector<Arg> items;
        items.reserve(a.list().items_size());
        for (const v1::Argument& item : a.list().items()) {
          KILN_ASSIGN_OR_RETURN(Arg x, ConvertArg(item, depth + 1, what));
          items.push_back(std::move(x));
        }
        return Arg::List(std::move(items));
      }
      case v1::Argument::kSymInt: {
        KILN_ASSIGN_OR_RETURN(SymExpr e, ConvertSym(a.sym_int()));
        return Arg::Sym(std::move(e));
      }
      default:
        return Err(absl::StrCat(what, " has no value"));
    }
  }

  absl::StatusOr<std::vector<Arg>> BindArgs(const OpDef& op, std::vector<Arg> args,
                                            std::vector<std::pair<std::string, Arg>> kwargs) {
    const Schema& s = op.schema;
    std::vector<std::optional<Arg>> bound(s.args.size());
    size_t positional = 0;
    for (const SchemaArg& a : s.args) positional += a.kwarg_only ? 0 : 1;
    if (args.size() > positional) {
      return Err(absl::StrCat("too many positional arguments (", args.size(), ") for schema ", s.ToString()));
    }
    for (size_t i = 0; i < args.size(); ++i) bound[i] = std::move(args[i]);
    for (auto& [name, value] : kwargs) {
      const int i = s.FindArg(name);
      if (i < 0) return Err(absl::StrCat("unexpected keyword argument '", Quote(name), "' for schema ", s.ToString()));
      if (bound[i]) return Err(absl::StrCat("argument '", name, "' given both by position and by keyword"));
      bound[i] = std::move(value);
    }
    std::vector<Arg> out;
    out.reserve(s.args.size());
    for (size_t i = 0; i < s.args.size(); ++i) {
      if (!bound[i]) {
        if (!s.args[i].default_value) {
          return Err(absl::StrCat("missing argument '", s.args[i].name, "' for schema ", s.ToString()));
        }
        out.push_back(*s.args[i].default_value);
      } else {
        out.push_back(NormalizeArg(s.args[i].type, *std::move(bound[i])));
      }
    }
    return out;
  }

  const v1::Graph& proto_;
  const GraphLimits& limits_;
  Graph graph_;
  absl::flat_hash_map<std::string, int> names_;
  absl::flat_hash_map<std::string, int> constant_names_;
  int current_ = -1;
  const v1::Node* current_node_ = nullptr;
};

}  // namespace

absl::StatusOr<Graph> ImportGraph(const v1::Graph& graph, const GraphLimits& limits) {
  return Importer(graph, limits).Run();
}

}  // namespace kiln::graph
