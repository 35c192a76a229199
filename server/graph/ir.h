#ifndef KILN_SERVER_GRAPH_IR_H_
#define KILN_SERVER_GRAPH_IR_H_

// The typed graph IR of the graph path: what import produces, what verify checks, what key hashes,
// and what the compiler stages after hashing lower.
//
// Semantics:
//   * A Graph is a list of Nodes in evaluation order (FX order). A node refers to earlier nodes only,
//     by index (Arg::Kind::kValue); so the graph is acyclic by construction. Inputs come first in
//     practice but may appear anywhere; exactly one kOutput node comes last.
//   * Every node produces one Type (a tensor, a list of types for multi-output ops, a symbolic int,
//     a Python scalar, or None). The output node produces None.
//   * Tensor metadata: sizes and strides are in elements and may be symbolic (SymExpr over
//     Graph::symbols); storage_offset likewise. Element (i0, .., in) lives at storage element
//     offset + sum(ik * stride_k). Sizes, strides and offsets are non-negative (torch refuses
//     negative strides). device_index is carried but never hashed or compared.
//   * Broadcasting, type promotion and view semantics are torch's (see op_registry.h / infer.h).
//     Floats are IEEE doubles; NaN, inf and -0.0 are kept exactly.
//   * A kCall node has a registry OpDef (op != nullptr): `args` then holds one entry per schema
//     argument in schema order, keyword arguments moved to their positions, defaults filled in and
//     values normalized (a float parameter holds a float, an int[N] parameter a list of N). A call
//     with op == nullptr is a fallback (run by torch on the client): `args` and `kwargs` are kept as
//     the client wrote them (kwargs sorted by name) and its type is the client's metadata.
//   * Node names are the client's (FX) names: used in messages only, never hashed.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/v1/graph.pb.h"
#include "server/graph/sym_expr.h"

namespace kiln::graph {

using DType = ::kiln::v1::DType;
using DeviceKind = ::kiln::v1::DeviceKind;
using Layout = ::kiln::v1::Layout;
using MemoryFormat = ::kiln::v1::MemoryFormat;

// dtype helpers. A "known" dtype is a valid, specified enum value.
bool IsKnownDType(int dtype);
const char* DTypeName(DType dtype);  // "f32", "bf16", "i64", "b8", ...
int64_t DTypeItemSize(DType dtype);  // bytes; 0 for unknown
bool IsFloatingDType(DType dtype);   // f16, bf16, f32, f64, float8 kinds
bool IsComplexDType(DType dtype);
bool IsIntegralDType(DType dtype, bool include_bool);
const char* DeviceKindName(DeviceKind kind);
const char* LayoutName(Layout layout);
const char* MemoryFormatName(MemoryFormat format);

struct TensorType {
  DType dtype = ::kiln::v1::DTYPE_UNSPECIFIED;
  std::vector<SymExpr> sizes;
  std::vector<SymExpr> strides;
  SymExpr storage_offset;
  DeviceKind device = ::kiln::v1::DEVICE_KIND_UNSPECIFIED;
  int32_t device_index = -1;  // never hashed or compared
  Layout layout = ::kiln::v1::LAYOUT_STRIDED;

  int64_t rank() const { return static_cast<int64_t>(sizes.size()); }
};

// Contiguous (row-major) strides for `sizes`, as torch computes them (size-0/1 dims count as 1).
std::vector<SymExpr> ContiguousStrides(const std::vector<SymExpr>& sizes);
// The product of `sizes`.
SymExpr NumElements(const std::vector<SymExpr>& sizes);

struct Type {
  enum class Kind : uint8_t { kUnknown, kTensor, kList, kSymInt, kScalar, kNone };
  Kind kind = Kind::kUnknown;
  TensorType tensor;        // kTensor
  std::vector<Type> items;  // kList
  SymExpr sym;              // kSymInt
  DType scalar_dtype = ::kiln::v1::DTYPE_UNSPECIFIED;  // kScalar: f64 (float), i64 (int), bool

  static Type Tensor(TensorType t);
  static Type List(std::vector<Type> items);
  static Type SymInt(SymExpr e);
  static Type Scalar(DType dtype);
  static Type None();
};

struct Arg {
  enum class Kind : uint8_t {
    kNone, kValue, kInt, kFloat, kBool, kString, kDType, kDevice, kLayout, kMemoryFormat, kList, kSym
  };
  Kind kind = Kind::kNone;
  int32_t value = -1;  // kValue: index of the node
  int64_t i = 0;       // kInt
  double f = 0;        // kFloat
  bool b = false;      // kBool
  std::string s;       // kString
  DType dtype = ::kiln::v1::DTYPE_UNSPECIFIED;
  DeviceKind device = ::kiln::v1::DEVICE_KIND_UNSPECIFIED;
  int32_t device_index = -1;  // never hashed
  Layout layout = ::kiln::v1::LAYOUT_UNSPECIFIED;
  MemoryFormat memory_format = ::kiln::v1::MEMORY_FORMAT_UNSPECIFIED;
  std::vector<Arg> list;  // kList
  SymExpr sym;            // kSym: never a constant (constants are kInt)

  static Arg None();
  static Arg Value(int32_t node);
  static Arg Int(int64_t v);
  static Arg Float(double v);
  static Arg Bool(bool v);
  static Arg String(std::string v);
  static Arg OfDType(DType d);
  static Arg Device(DeviceKind kind, int32_t index = -1);
  static Arg OfLayout(Layout l);
  static Arg OfMemoryFormat(MemoryFormat m);
  static Arg List(std::vector<Arg> items);
  static Arg Sym(SymExpr e);  // a constant expression becomes kInt
};

struct OpDef;  // op_registry.h

enum class NodeKind : uint8_t { kInput, kConstant, kCall, kOutput };

struct Node {
  NodeKind kind = NodeKind::kCall;
  std::string name;    // the client's name; messages only
  std::string target;  // kCall: "aten.add.Tensor"; kInput/kConstant: the client's target (not hashed)
  const OpDef* op = nullptr;  // kCall: registry entry, or nullptr for a fallback
  std::vector<Arg> args;      // see the header comment; kOutput: args[0] is the list of outputs
  std::vector<std::pair<std::string, Arg>> kwargs;  // fallback calls only, sorted by name
  Type type;
  int32_t input_index = -1;     // kInput: position among the graph inputs
  int32_t constant_index = -1;  // kConstant: index into Graph::constants

  bool is_fallback() const { return kind == NodeKind::kCall && op == nullptr; }
};

struct SymbolInfo {
  std::string name;  // messages only
  int64_t hint = 0;  // the value seen at capture time (0: unknown); used to order and compare, never hashed
  int64_t min_value = 0;  // 0/0: unknown; an unbounded side is INT64_MIN / INT64_MAX
  int64_t max_value = 0;
};

struct Constant {
  std::string name;  // never hashed
  TensorType type;
  std::string data;  // contiguous row-major little-endian elements
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<SymbolInfo> symbols;
  std::vector<Constant> constants;
  ::kiln::v1::GraphKind kind = ::kiln::v1::GRAPH_KIND_UNSPECIFIED;
  std::string debug_name;
  // Output positions whose strides kilnd may choose (v1::Graph.free_layout_outputs), ascending.
  std::vector<int32_t> free_layout_outputs;

  // The symbols' hints, indexable by symbol index (a missing hint, 0, is replaced by a positive
  // min_value). Used to order strides and to compare expressions, never hashed.
  std::vector<int64_t> Hints() const;
};

// Printing. Symbols print as s<index>; node references as %<index>.
std::string SymToString(const SymExpr& e);
std::string TensorTypeToString(const TensorType& t);  // "f32[4, 8] strides [8, 1] cuda"
std::string TypeToString(const Type& t);
std::string ArgToString(const Arg& a);
std::string NodeKindName(NodeKind kind);

// The whole graph as readable text, one line per node:
//   %2 = aten.add.Tensor(%0, %1, 1) : f32[4, 8] strides [8, 1] cuda   # add
std::string PrintGraph(const Graph& graph);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_IR_H_
