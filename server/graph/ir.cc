#include "server/graph/ir.h"

#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kiln::graph {

namespace v1 = ::kiln::v1;

bool IsKnownDType(int dtype) {
  return dtype != v1::DTYPE_UNSPECIFIED && v1::DType_IsValid(dtype);
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return "f32";
    case v1::DTYPE_FLOAT64: return "f64";
    case v1::DTYPE_FLOAT16: return "f16";
    case v1::DTYPE_BFLOAT16: return "bf16";
    case v1::DTYPE_INT8: return "i8";
    case v1::DTYPE_INT16: return "i16";
    case v1::DTYPE_INT32: return "i32";
    case v1::DTYPE_INT64: return "i64";
    case v1::DTYPE_UINT8: return "u8";
    case v1::DTYPE_BOOL: return "b8";
    case v1::DTYPE_COMPLEX64: return "c64";
    case v1::DTYPE_COMPLEX128: return "c128";
    case v1::DTYPE_FLOAT8_E4M3FN: return "f8e4m3fn";
    case v1::DTYPE_FLOAT8_E5M2: return "f8e5m2";
    case v1::DTYPE_UINT16: return "u16";
    case v1::DTYPE_UINT32: return "u32";
    case v1::DTYPE_UINT64: return "u64";
    default: return "?dtype";
  }
}

int64_t DTypeItemSize(DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BOOL: case v1::DTYPE_INT8: case v1::DTYPE_UINT8:
    case v1::DTYPE_FLOAT8_E4M3FN: case v1::DTYPE_FLOAT8_E5M2:
      return 1;
    case v1::DTYPE_FLOAT16: case v1::DTYPE_BFLOAT16: case v1::DTYPE_INT16: case v1::DTYPE_UINT16:
      return 2;
    case v1::DTYPE_FLOAT32: case v1::DTYPE_INT32: case v1::DTYPE_UINT32:
      return 4;
    case v1::DTYPE_FLOAT64: case v1::DTYPE_INT64: case v1::DTYPE_UINT64: case v1::DTYPE_COMPLEX64:
      return 8;
    case v1::DTYPE_COMPLEX128:
      return 16;
    default:
      return 0;
  }
}

bool IsFloatingDType(DType d) {
  return d == v1::DTYPE_FLOAT32 || d == v1::DTYPE_FLOAT64 || d == v1::DTYPE_FLOAT16 ||
         d == v1::DTYPE_BFLOAT16 || d == v1::DTYPE_FLOAT8_E4M3FN || d == v1::DTYPE_FLOAT8_E5M2;
}
bool IsComplexDType(DType d) { return d == v1::DTYPE_COMPLEX64 || d == v1::DTYPE_COMPLEX128; }
bool IsIntegralDType(DType d, bool include_bool) {
  switch (d) {
    case v1::DTYPE_INT8: case v1::DTYPE_INT16: case v1::DTYPE_INT32: case v1::DTYPE_INT64:
    case v1::DTYPE_UINT8: case v1::DTYPE_UINT16: case v1::DTYPE_UINT32: case v1::DTYPE_UINT64:
      return true;
    case v1::DTYPE_BOOL:
      return include_bool;
    default:
      return false;
  }
}

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case v1::DEVICE_KIND_CPU: return "cpu";
    case v1::DEVICE_KIND_CUDA: return "cuda";
    case v1::DEVICE_KIND_META: return "meta";
    default: return "?device";
  }
}

const char* LayoutName(Layout layout) {
  switch (layout) {
    case v1::LAYOUT_UNSPECIFIED: case v1::LAYOUT_STRIDED: return "strided";
    case v1::LAYOUT_SPARSE_COO: return "sparse_coo";
    case v1::LAYOUT_SPARSE_CSR: return "sparse_csr";
    case v1::LAYOUT_MKLDNN: return "mkldnn";
    default: return "?layout";
  }
}

const char* MemoryFormatName(MemoryFormat format) {
  switch (format) {
    case v1::MEMORY_FORMAT_CONTIGUOUS: return "contiguous_format";
    case v1::MEMORY_FORMAT_CHANNELS_LAST: return "channels_last";
    case v1::MEMORY_FORMAT_CHANNELS_LAST_3D: return "channels_last_3d";
    case v1::MEMORY_FORMAT_PRESERVE: return "preserve_format";
    default: return "?memory_format";
  }
}

std::vector<SymExpr> ContiguousStrides(const std::vector<SymExpr>& sizes) {
  std::vector<SymExpr> strides(sizes.size());
  SymExpr running = SymExpr::Const(1);
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = running;
    // torch: stride *= max(size, 1)
    running = sizes[i].is_const() && sizes[i].value() <= 1 ? running
              : sizes[i].is_const()                        ? running * sizes[i]
                                    : running * SymExpr::Max({sizes[i], SymExpr::Const(1)});
  }
  return strides;
}

SymExpr NumElements(const std::vector<SymExpr>& sizes) { return SymExpr::Mul(sizes); }

Type Type::Tensor(TensorType t) {
  Type r;
  r.kind = Kind::kTensor;
  r.tensor = std::move(t);
  return r;
}
Type Type::List(std::vector<Type> items) {
  Type r;
  r.kind = Kind::kList;
  r.items = std::move(items);
  return r;
}
Type Type::SymInt(SymExpr e) {
  Type r;
  r.kind = Kind::kSymInt;
  r.sym = std::move(e);
  return r;
}
Type Type::Scalar(DType dtype) {
  Type r;
  r.kind = Kind::kScalar;
  r.scalar_dtype = dtype;
  return r;
}
Type Type::None() {
  Type r;
  r.kind = Kind::kNone;
  return r;
}

Arg Arg::None() { return Arg(); }
Arg Arg::Value(int32_t node) {
  Arg a;
  a.kind = Kind::kValue;
  a.value = node;
  return a;
}
Arg Arg::Int(int64_t v) {
  Arg a;
  a.kind = Kind::kInt;
  a.i = v;
  return a;
}
Arg Arg::Float(double v) {
  Arg a;
  a.kind = Kind::kFloat;
  a.f = v;
  return a;
}
Arg Arg::Bool(bool v) {
  Arg a;
  a.kind = Kind::kBool;
  a.b = v;
  return a;
}
Arg Arg::String(std::string v) {
  Arg a;
  a.kind = Kind::kString;
  a.s = std::move(v);
  return a;
}
Arg Arg::OfDType(DType d) {
  Arg a;
  a.kind = Kind::kDType;
  a.dtype = d;
  return a;
}
Arg Arg::Device(DeviceKind kind, int32_t index) {
  Arg a;
  a.kind = Kind::kDevice;
  a.device = kind;
  a.device_index = index;
  return a;
}
Arg Arg::OfLayout(Layout l) {
  Arg a;
  a.kind = Kind::kLayout;
  a.layout = l;
  return a;
}
Arg Arg::OfMemoryFormat(MemoryFormat m) {
  Arg a;
  a.kind = Kind::kMemoryFormat;
  a.memory_format = m;
  return a;
}
Arg Arg::List(std::vector<Arg> items) {
  Arg a;
  a.kind = Kind::kList;
  a.list = std::move(items);
  return a;
}
Arg Arg::Sym(SymExpr e) {
  if (e.is_const()) return Int(e.value());
  Arg a;
  a.kind = Kind::kSym;
  a.sym = std::move(e);
  return a;
}

std::vector<int64_t> Graph::Hints() const {
  std::vector<int64_t> hints;
  hints.reserve(symbols.size());
  for (const SymbolInfo& s : symbols) {
    // An unbacked symbol has no hint (0): its lower bound stands in when that is positive.
    hints.push_back(s.hint == 0 && s.min_value > 0 ? s.min_value : s.hint);
  }
  return hints;
}

std::string SymToString(const SymExpr& e) { return e.ToString(); }

namespace {

std::string SymList(const std::vector<SymExpr>& v) {
  return absl::StrCat(
      "[", absl::StrJoin(v, ", ", [](std::string* out, const SymExpr& e) { out->append(e.ToString()); }),
      "]");
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = absl::StrFormat("%.17g", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::string TensorTypeToString(const TensorType& t) {
  std::string s = absl::StrCat(DTypeName(t.dtype), SymList(t.sizes), " strides ", SymList(t.strides));
  if (!t.storage_offset.is_const(0)) absl::StrAppend(&s, " offset ", t.storage_offset.ToString());
  absl::StrAppend(&s, " ", DeviceKindName(t.device));
  if (t.layout != v1::LAYOUT_STRIDED && t.layout != v1::LAYOUT_UNSPECIFIED) {
    absl::StrAppend(&s, " ", LayoutName(t.layout));
  }
  return s;
}

std::string TypeToString(const Type& t) {
  switch (t.kind) {
    case Type::Kind::kUnknown: return "?";
    case Type::Kind::kTensor: return TensorTypeToString(t.tensor);
    case Type::Kind::kList:
      return absl::StrCat("(", absl::StrJoin(t.items, ", ", [](std::string* out, const Type& i) {
                            out->append(TypeToString(i));
                          }), ")");
    case Type::Kind::kSymInt: return absl::StrCat("sym ", t.sym.ToString());
    case Type::Kind::kScalar: return absl::StrCat("scalar ", DTypeName(t.scalar_dtype));
    case Type::Kind::kNone: return "None";
  }
  return "?";
}

std::string ArgToString(const Arg& a) {
  switch (a.kind) {
    case Arg::Kind::kNone: return "None";
    case Arg::Kind::kValue: return absl::StrCat("%", a.value);
    case Arg::Kind::kInt: return absl::StrCat(a.i);
    case Arg::Kind::kFloat: return FormatDouble(a.f);
    case Arg::Kind::kBool: return a.b ? "True" : "False";
    case Arg::Kind::kString: return absl::StrCat("\"", absl::CEscape(a.s), "\"");
    case Arg::Kind::kDType: return DTypeName(a.dtype);
    case Arg::Kind::kDevice: return DeviceKindName(a.device);
    case Arg::Kind::kLayout: return LayoutName(a.layout);
    case Arg::Kind::kMemoryFormat: return MemoryFormatName(a.memory_format);
    case Arg::Kind::kList:
      return absl::StrCat("[", absl::StrJoin(a.list, ", ", [](std::string* out, const Arg& i) {
                            out->append(ArgToString(i));
                          }), "]");
    case Arg::Kind::kSym: return absl::StrCat("sym(", a.sym.ToString(), ")");
  }
  return "?";
}

std::string NodeKindName(NodeKind kind) {
  switch (kind) {
    case NodeKind::kInput: return "input";
    case NodeKind::kConstant: return "constant";
    case NodeKind::kCall: return "call";
    case NodeKind::kOutput: return "output";
  }
  return "?";
}

std::string PrintGraph(const Graph& graph) {
  std::string out;
  if (!graph.debug_name.empty()) absl::StrAppend(&out, "# ", graph.debug_name, "\n");
  for (size_t i = 0; i < graph.symbols.size(); ++i) {
    const SymbolInfo& s = graph.symbols[i];
    absl::StrAppend(&out, "# s", i, " = ", s.name, " (hint ", s.hint, ", range [", s.min_value,
                    ", ", s.max_value, "])\n");
  }
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    std::vector<std::string> args;
    for (const Arg& a : n.args) args.push_back(ArgToString(a));
    for (const auto& [name, a] : n.kwargs) args.push_back(absl::StrCat(name, "=", ArgToString(a)));
    switch (n.kind) {
      case NodeKind::kInput:
        absl::StrAppend(&out, "%", i, " = input ", n.input_index);
        break;
      case NodeKind::kConstant:
        absl::StrAppend(&out, "%", i, " = constant ", n.constant_index);
        break;
      case NodeKind::kCall:
        absl::StrAppend(&out, "%", i, " = ", n.target, n.is_fallback() ? " [fallback]" : "", "(",
                        absl::StrJoin(args, ", "), ")");
        break;
      case NodeKind::kOutput:
        absl::StrAppend(&out, "output(", absl::StrJoin(args, ", "), ")");
        break;
    }
    if (n.kind != NodeKind::kOutput) absl::StrAppend(&out, " : ", TypeToString(n.type));
    absl::StrAppend(&out, "  # ", n.name, "\n");
  }
  return out;
}

}  // namespace kiln::graph
