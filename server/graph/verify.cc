#include "server/graph/verify.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"

namespace kiln::graph {

namespace {

namespace v1 = ::kiln::v1;
using Base = SchemaType::Base;

std::string Shape(const std::vector<SymExpr>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", ", [](std::string* o, const SymExpr& e) {
                        o->append(e.ToString());
                      }), "]");
}

const Type* ValueTypeOf(const Graph& g, const Arg& a) {
  if (a.kind != Arg::Kind::kValue || a.value < 0 || a.value >= static_cast<int32_t>(g.nodes.size())) return nullptr;
  return &g.nodes[a.value].type;
}

absl::Status CheckItem(const Graph& g, Base base, const Arg& a) {
  const Type* vt = ValueTypeOf(g, a);
  const bool sym_node = vt && vt->kind == Type::Kind::kSymInt;
  const bool scalar_node = vt && vt->kind == Type::Kind::kScalar;
  const bool number = a.kind == Arg::Kind::kInt || a.kind == Arg::Kind::kFloat || a.kind == Arg::Kind::kBool ||
                      a.kind == Arg::Kind::kSym || sym_node || scalar_node;
  bool ok = false;
  switch (base) {
    case Base::kTensor: ok = (vt && vt->kind == Type::Kind::kTensor) || number; break;
    case Base::kScalar: ok = number; break;
    case Base::kInt: case Base::kSymInt:
      ok = a.kind == Arg::Kind::kInt || a.kind == Arg::Kind::kSym || sym_node;
      break;
    case Base::kFloat:
      ok = a.kind == Arg::Kind::kFloat || a.kind == Arg::Kind::kInt || a.kind == Arg::Kind::kSym || sym_node ||
           scalar_node;
      break;
    case Base::kBool: ok = a.kind == Arg::Kind::kBool || scalar_node; break;
    case Base::kStr: ok = a.kind == Arg::Kind::kString; break;
    case Base::kScalarType: ok = a.kind == Arg::Kind::kDType; break;
    case Base::kLayout: ok = a.kind == Arg::Kind::kLayout; break;
    case Base::kDevice: ok = a.kind == Arg::Kind::kDevice; break;
    case Base::kMemoryFormat: ok = a.kind == Arg::Kind::kMemoryFormat; break;
    case Base::kGenerator: ok = false; break;
    case Base::kAny: ok = true; break;
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("got ", ArgToString(a)));
  return absl::OkStatus();
}

bool NumelIsZero(const TensorType& t, const std::vector<int64_t>& hints) {
  for (const SymExpr& s : t.sizes) {
    auto v = s.Evaluate(hints);
    if (v.ok() && *v == 0) return true;
  }
  return false;
}

class Verifier {
 public:
  Verifier(const Graph& g, const GraphLimits& limits) : g_(g), limits_(limits), hints_(g.Hints()) {}

  absl::Status Run() {
    if (static_cast<int64_t>(g_.nodes.size()) > limits_.max_nodes) {
      return absl::ResourceExhaustedError(absl::StrCat("graph has ", g_.nodes.size(), " nodes, more than the limit of ",
                                                       limits_.max_nodes));
    }
    if (static_cast<int64_t>(g_.symbols.size()) > limits_.max_symbols) {
      return absl::ResourceExhaustedError(absl::StrCat("graph has ", g_.symbols.size(),
                                                       " symbols, more than the limit of ", limits_.max_symbols));
    }
    for (size_t i = 0; i < g_.symbols.size(); ++i) {
      const SymbolInfo& s = g_.symbols[i];
      if (s.min_value > s.max_value && !(s.max_value == 0)) {
        return absl::InvalidArgumentError(absl::StrCat("symbol s", i, " ('", s.name, "') has range [", s.min_value,
                                                       ", ", s.max_value, "]"));
      }
    }
    if (g_.nodes.empty() || g_.nodes.back().kind != NodeKind::kOutput) {
      return absl::InvalidArgumentError("graph has no output node (it must be the last node)");
    }
    int64_t constant_bytes = 0;
    for (const Constant& c : g_.constants) {
      constant_bytes += static_cast<int64_t>(c.data.size());
      if (constant_bytes > limits_.max_constant_bytes) {
        return absl::ResourceExhaustedError("constants exceed the byte limit");
      }
      auto status = CheckTensor(c.type);
      if (!status.ok()) return absl::Status(status.code(), absl::StrCat("constant '", c.name, "': ", status.message()));
      int64_t numel = 1;
      for (const SymExpr& s : c.type.sizes) {
        if (!s.is_const() || __builtin_mul_overflow(numel, s.value(), &numel)) {
          return absl::InvalidArgumentError(absl::StrCat("constant '", c.name, "': sizes must be constant"));
        }
      }
      int64_t bytes;
      if (__builtin_mul_overflow(numel, DTypeItemSize(c.type.dtype), &bytes) ||
          bytes != static_cast<int64_t>(c.data.size())) {
        return absl::InvalidArgumentError(absl::StrCat("constant '", c.name, "': holds ", c.data.size(),
                                                       " bytes but its metadata needs ", numel, " elements of ",
                                                       DTypeName(c.type.dtype)));
      }
    }
    int32_t next_input = 0;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      index_ = static_cast<int32_t>(i);
      auto status = VerifyNode(n, &next_input);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("node '", absl::CEscape(n.name), "' (", absl::CEscape(n.target),
                                                        "): ", status.message()));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status VerifyNode(const Node& n, int32_t* next_input) {
    if (n.kind == NodeKind::kOutput && index_ + 1 != static_cast<int32_t>(g_.nodes.size())) {
      return absl::InvalidArgumentError("output node is not the last node (a graph has exactly one)");
    }
    for (const Arg& a : n.args) KILN_RETURN_IF_ERROR(CheckRefs(a, 0));
    for (const auto& kv : n.kwargs) KILN_RETURN_IF_ERROR(CheckRefs(kv.second, 0));
    switch (n.kind) {
      case NodeKind::kInput:
        if (n.input_index != (*next_input)++) {
          return absl::InvalidArgumentError(absl::StrCat("input index ", n.input_index, ", expected ", *next_input - 1));
        }
        return CheckType(n.type, 0);
      case NodeKind::kConstant: {
        if (n.constant_index < 0 || n.constant_index >= static_cast<int32_t>(g_.constants.size())) {
          return absl::InvalidArgumentError("get_attr of a missing constant");
        }
        KILN_RETURN_IF_ERROR(CheckType(n.type, 0));
        const TensorType& c = g_.constants[n.constant_index].type;
        if (n.type.kind != Type::Kind::kTensor || n.type.tensor.dtype != c.dtype || n.type.tensor.sizes != c.sizes) {
          return absl::InvalidArgumentError(absl::StrCat("metadata ", TypeToString(n.type),
                                                         " does not match the constant's ", TensorTypeToString(c)));
        }
        return absl::OkStatus();
      }
      case NodeKind::kOutput:
        if (n.args.size() != 1) return absl::InvalidArgumentError("the output node takes exactly one argument");
        return absl::OkStatus();
      case NodeKind::kCall:
        break;
    }
    if (n.target.empty()) return absl::InvalidArgumentError("call without a target");
    KILN_RETURN_IF_ERROR(CheckType(n.type, 0));
    if (n.op == nullptr) return absl::OkStatus();  // fallback: the client's metadata, range-checked
    const Schema& s = n.op->schema;
    if (n.args.size() != s.args.size() || !n.kwargs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("has ", n.args.size(), " arguments, schema ", s.ToString(),
                                                     " needs ", s.args.size()));
    }
    for (size_t i = 0; i < s.args.size(); ++i) {
      auto st = CheckArgType(g_, s.args[i].type, n.args[i]);
      if (!st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("argument ", i, " '", s.args[i].name, "' expects ",
                                                       s.args[i].type.ToString(), ", ", st.message()));
      }
    }
    InferContext ctx(g_, n, hints_);
    KILN_ASSIGN_OR_RETURN(Type inferred, n.op->infer(ctx));
    return Compare(ctx, inferred, n.type, "");
  }

  absl::Status CheckRefs(const Arg& a, int depth) {
    if (depth > limits_.max_nesting_depth) return absl::ResourceExhaustedError("argument lists nested too deeply");
    if (a.kind == Arg::Kind::kValue) {
      if (a.value < 0 || a.value >= index_) {
        return absl::InvalidArgumentError(absl::StrCat("refers to node %", a.value,
                                                       " which is not an earlier node (dangling, forward reference or cycle)"));
      }
      if (g_.nodes[a.value].kind == NodeKind::kOutput) return absl::InvalidArgumentError("refers to the output node");
    }
    if (a.kind == Arg::Kind::kList) {
      if (static_cast<int64_t>(a.list.size()) > limits_.max_list_items) {
        return absl::ResourceExhaustedError("argument list longer than the limit");
      }
      for (const Arg& item : a.list) KILN_RETURN_IF_ERROR(CheckRefs(item, depth + 1));
    }
    if (a.kind == Arg::Kind::kDType && !IsKnownDType(a.dtype)) return absl::InvalidArgumentError("unknown dtype argument");
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Eval(const SymExpr& e, const char* what) {
    auto v = e.Evaluate(hints_);
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(what, " ", e.ToString(), ": ", v.status().message()));
    if (*v < 0) {
      return absl::InvalidArgumentError(e.is_const() ? absl::StrCat("negative ", what, " ", *v)
                                                     : absl::StrCat("negative ", what, " ", e.ToString(), " = ", *v));
    }
    return *v;
  }

  absl::Status CheckTensor(const TensorType& t) {
    if (!IsKnownDType(t.dtype)) return absl::InvalidArgumentError(absl::StrCat("unknown dtype value ", t.dtype));
    if (t.device == v1::DEVICE_KIND_UNSPECIFIED || !v1::DeviceKind_IsValid(t.device)) {
      return absl::InvalidArgumentError("unknown or unspecified device kind");
    }
    if (!v1::Layout_IsValid(t.layout)) return absl::InvalidArgumentError("unknown layout");
    if (t.rank() > limits_.max_rank) {
      return absl::ResourceExhaustedError(absl::StrCat("tensor of rank ", t.rank(), ", more than the limit of ",
                                                       limits_.max_rank));
    }
    if (t.strides.size() != t.sizes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor has ", t.sizes.size(), " sizes but ", t.strides.size(),
                                                     " strides"));
    }
    KILN_ASSIGN_OR_RETURN(int64_t extent, Eval(t.storage_offset, "storage offset"));
    int64_t numel = 1;
    bool overflow = false;
    std::vector<int64_t> sizes;
    for (int64_t i = 0; i < t.rank(); ++i) {
      KILN_ASSIGN_OR_RETURN(int64_t size, Eval(t.sizes[i], "size"));
      sizes.push_back(size);
      overflow = overflow || __builtin_mul_overflow(numel, size, &numel);
    }
    if (overflow || numel > limits_.max_tensor_elements) {
      return absl::ResourceExhaustedError(absl::StrCat("tensor ", Shape(t.sizes), " has more than the limit of ",
                                                       limits_.max_tensor_elements, " elements"));
    }
    int64_t bytes;
    if (__builtin_mul_overflow(numel, DTypeItemSize(t.dtype), &bytes) || bytes > limits_.max_tensor_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("tensor ", Shape(t.sizes), " of ", DTypeName(t.dtype),
                                                       " has more than the limit of ", limits_.max_tensor_bytes, " bytes"));
    }
    for (int64_t i = 0; i < t.rank(); ++i) {
      KILN_ASSIGN_OR_RETURN(int64_t stride, Eval(t.strides[i], "stride"));
      if (numel == 0) continue;
      int64_t span;
      if (__builtin_mul_overflow(sizes[i] - 1, stride, &span) || __builtin_add_overflow(extent, span, &extent)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", Shape(t.sizes), " strides ", Shape(t.strides),
                                                       " address past int64"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckType(const Type& t, int depth) {
    switch (t.kind) {
      case Type::Kind::kTensor: return CheckTensor(t.tensor);
      case Type::Kind::kList:
        if (depth >= limits_.max_nesting_depth) return absl::ResourceExhaustedError("metadata nested too deeply");
        if (static_cast<int64_t>(t.items.size()) > limits_.max_list_items) {
          return absl::ResourceExhaustedError("metadata list longer than the limit");
        }
        for (const Type& i : t.items) KILN_RETURN_IF_ERROR(CheckType(i, depth + 1));
        return absl::OkStatus();
      case Type::Kind::kScalar:
        if (!IsKnownDType(t.scalar_dtype)) return absl::InvalidArgumentError("unknown scalar dtype");
        return absl::OkStatus();
      case Type::Kind::kSymInt: {
        auto v = t.sym.Evaluate(hints_);
        if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("SymInt metadata: ", v.status().message()));
        return absl::OkStatus();
      }
      case Type::Kind::kNone: return absl::OkStatus();
      case Type::Kind::kUnknown: return absl::InvalidArgumentError("node has no metadata");
    }
    return absl::OkStatus();
  }

  absl::Status Compare(const InferContext& ctx, const Type& inferred, const Type& given, const std::string& where) {
    auto mismatch = [&](const std::string& what, const std::string& a, const std::string& b) {
      return absl::InvalidArgumentError(absl::StrCat(where, "inferred ", what, " ", a, " but the graph says ", b));
    };
    if (inferred.kind == Type::Kind::kUnknown) return absl::OkStatus();
    if (inferred.kind != given.kind) return mismatch("type", TypeToString(inferred), TypeToString(given));
    switch (inferred.kind) {
      case Type::Kind::kList:
        if (inferred.items.size() != given.items.size()) {
          return mismatch("number of outputs", absl::StrCat(inferred.items.size()), absl::StrCat(given.items.size()));
        }
        for (size_t i = 0; i < inferred.items.size(); ++i) {
          KILN_RETURN_IF_ERROR(Compare(ctx, inferred.items[i], given.items[i], absl::StrCat(where, "output ", i, ": ")));
        }
        return absl::OkStatus();
      case Type::Kind::kSymInt:
        if (!ctx.LikelyEqual(inferred.sym, given.sym)) return mismatch("value", inferred.sym.ToString(), given.sym.ToString());
        return absl::OkStatus();
      case Type::Kind::kTensor: {
        const TensorType& a = inferred.tensor;
        const TensorType& b = given.tensor;
        if (a.dtype != v1::DTYPE_UNSPECIFIED && a.dtype != b.dtype) {
          return mismatch("dtype", DTypeName(a.dtype), DTypeName(b.dtype));
        }
        bool same_shape = a.rank() == b.rank();
        for (int64_t i = 0; same_shape && i < a.rank(); ++i) same_shape = ctx.LikelyEqual(a.sizes[i], b.sizes[i]);
        if (!same_shape) return mismatch("shape", Shape(a.sizes), Shape(b.sizes));
        if (!a.strides.empty() && !NumelIsZero(b, hints_)) {
          for (int64_t i = 0; i < a.rank(); ++i) {
            if (ctx.Hint(b.sizes[i], -1) == 1) continue;
            if (!ctx.LikelyEqual(a.strides[i], b.strides[i])) return mismatch("strides", Shape(a.strides), Shape(b.strides));
          }
          if (!ctx.LikelyEqual(a.storage_offset, b.storage_offset)) {
            return mismatch("storage offset", a.storage_offset.ToString(), b.storage_offset.ToString());
          }
        }
        if (a.device != v1::DEVICE_KIND_UNSPECIFIED && a.device != b.device) {
          return mismatch("device", DeviceKindName(a.device), DeviceKindName(b.device));
        }
        return absl::OkStatus();
      }
      default:
        return absl::OkStatus();
    }
  }

  const Graph& g_;
  const GraphLimits& limits_;
  std::vector<int64_t> hints_;
  int32_t index_ = 0;
};

}  // namespace

absl::Status CheckArgType(const Graph& graph, const SchemaType& type, const Arg& arg) {
  if (arg.kind == Arg::Kind::kNone) {
    if (type.optional || type.base == Base::kAny) return absl::OkStatus();
    return absl::InvalidArgumentError("got None");
  }
  if (!type.is_list) return CheckItem(graph, type.base, arg);
  if (arg.kind != Arg::Kind::kList) return absl::InvalidArgumentError(absl::StrCat("got ", ArgToString(arg)));
  // T[N] takes N items, or one (repeated), or none (the op's own default, e.g. stride=[]).
  if (type.fixed_size > 1 && arg.list.size() > 1 && static_cast<int>(arg.list.size()) != type.fixed_size) {
    return absl::InvalidArgumentError(absl::StrCat("got a list of ", arg.list.size(), " items"));
  }
  for (const Arg& item : arg.list) {
    if (item.kind == Arg::Kind::kNone && type.item_optional) continue;
    if (item.kind == Arg::Kind::kNone) return absl::InvalidArgumentError("got None in a list");
    KILN_RETURN_IF_ERROR(CheckItem(graph, type.base, item));
  }
  return absl::OkStatus();
}

absl::Status VerifyGraph(const Graph& graph, const GraphLimits& limits) { return Verifier(graph, limits).Run(); }
absl::Status VerifyGraph(const Graph& graph) { return VerifyGraph(graph, GraphLimits()); }

}  // namespace kiln::graph
