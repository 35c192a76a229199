#ifndef KILN_SERVER_GRAPH_OP_REGISTRY_H_
#define KILN_SERVER_GRAPH_OP_REGISTRY_H_

// The op registry: every op kiln understands, keyed by its FX target spelling
// ("aten.add.Tensor", "prims.convert_element_type.default", "operator.getitem", "operator.mul"),
// with its aten schema, its class, and an inference function that computes the output Type (dtype,
// shape, strides, device) from the argument types exactly as torch's meta functions do.
//
// Contract of an InferFn: it is called by the verifier only after every argument has been checked
// against the schema (CheckArgType), with args in schema order. It returns INVALID_ARGUMENT with a
// reason (without the node name: the verifier adds it) for inputs torch would refuse. In the Type
// it returns, an UNSPECIFIED dtype or an empty `strides` of a tensor of rank > 0 means "not
// inferred, take the graph's" (used where torch's result depends on the backend), and Kind::kUnknown
// means nothing is inferred (data-dependent shapes).
// An op missing from the registry is not an error: the node becomes a fallback.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/graph/ir.h"
#include "server/graph/schema.h"

namespace kiln::graph {

enum class OpClass : uint8_t { kPointwise, kReduction, kView, kExtern, kOther };
const char* OpClassName(OpClass c);

class InferContext;
using InferFn = std::function<absl::StatusOr<Type>(const InferContext&)>;

struct OpDef {
  std::string target;  // "aten.add.Tensor"
  Schema schema;
  OpClass op_class = OpClass::kOther;
  InferFn infer;
};

// nullptr when `target` is not in the registry.
const OpDef* FindOp(absl::string_view target);
// Every op, sorted by target.
std::vector<const OpDef*> AllOps();
// Schema strings that failed to parse or duplicate targets (empty unless a spec is wrong; tested).
std::vector<std::string> RegistryErrors();

// One operand of a pointwise op: a tensor, or a Python number ("wrapped scalar") of the category
// given by `scalar_dtype` (b8, i64, f64, c128).
struct Operand {
  const TensorType* tensor = nullptr;
  DType scalar_dtype = ::kiln::v1::DTYPE_UNSPECIFIED;
};

// Typed access to a node's (schema-ordered) arguments during inference.
class InferContext {
 public:
  InferContext(const Graph& graph, const Node& node, absl::Span<const int64_t> hints)
      : graph_(graph), node_(node), hints_(hints) {}

  const Graph& graph() const { return graph_; }
  const Node& node() const { return node_; }
  int num_args() const { return static_cast<int>(node_.args.size()); }
  const Arg& arg(int i) const;  // a None arg when out of range
  bool is_none(int i) const { return arg(i).kind == Arg::Kind::kNone; }
  // The type produced by the node that argument `a` refers to (kUnknown if none).
  const Type& ValueType(const Arg& a) const;

  const TensorType* tensor(int i) const;  // nullptr unless a tensor value
  absl::StatusOr<const TensorType*> RequireTensor(int i) const;
  absl::StatusOr<std::vector<const TensorType*>> TensorList(int i) const;  // nullptr for None items
  absl::StatusOr<std::optional<Operand>> GetOperand(int i) const;  // nullopt for None
  absl::StatusOr<SymExpr> Sym(int i) const;  // int / SymInt argument
  absl::StatusOr<SymExpr> SymOf(const Arg& a) const;
  absl::StatusOr<std::vector<SymExpr>> SymList(int i) const;
  absl::StatusOr<int64_t> Int(int i) const;  // must be a constant
  absl::StatusOr<std::vector<int64_t>> IntList(int i) const;
  std::optional<DType> OptDType(int i) const;
  bool Bool(int i) const;
  double Float(int i) const;
  std::string Str(int i) const;

  // `e` evaluated at the symbols' hints; `fallback` when that fails.
  int64_t Hint(const SymExpr& e, int64_t fallback = 0) const;
  // Equal symbolically, or equal at the hints.
  bool LikelyEqual(const SymExpr& a, const SymExpr& b) const;

 private:
  const Graph& graph_;
  const Node& node_;
  absl::Span<const int64_t> hints_;
};

// Registration, used by the ops_*.cc files.
struct OpSpec {
  const char* ns;      // "aten", "prims", "operator", ...
  const char* schema;  // the schema string
  OpClass op_class;
  InferFn infer;
  const char* target = nullptr;  // explicit target; default ns + "." + name + "." + overload|default
};
void RegisterPointwiseOps(std::vector<OpSpec>* specs);
void RegisterReductionOps(std::vector<OpSpec>* specs);
void RegisterViewOps(std::vector<OpSpec>* specs);
void RegisterMiscOps(std::vector<OpSpec>* specs);
void RegisterNnOps(std::vector<OpSpec>* specs);
void RegisterPoolOps(std::vector<OpSpec>* specs);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_OP_REGISTRY_H_
