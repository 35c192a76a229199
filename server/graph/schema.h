#ifndef KILN_SERVER_GRAPH_SCHEMA_H_
#define KILN_SERVER_GRAPH_SCHEMA_H_

// aten operator schemas, written as in native_functions.yaml and parsed here:
//   "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
//   "var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None,
//                        bool keepdim=False) -> (Tensor, Tensor)"
// Supported: types Tensor, Scalar, int, SymInt, float, bool, str, ScalarType, Layout, Device,
// MemoryFormat, Generator, Any; alias annotations ("Tensor(a!)") are accepted and dropped; "T?"
// (optional), "T[]"/"T[N]" (lists), "T?[]" (list of optionals), "*" (keyword-only marker); defaults
// None, True, False, integers, floats, [..] lists, quoted strings, and Mean/Sum (reduction enums).
// A parsed Schema is immutable; ParseSchema never crashes on bad text (the registry parses only
// literals written in this directory, and checks them at startup in tests).

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/graph/ir.h"

namespace kiln::graph {

struct SchemaType {
  enum class Base : uint8_t {
    kTensor, kScalar, kInt, kSymInt, kFloat, kBool, kStr, kScalarType, kLayout, kDevice,
    kMemoryFormat, kGenerator, kAny
  };
  Base base = Base::kAny;
  bool optional = false;       // "T?" or "T[]?"
  bool is_list = false;        // "T[]" or "T[N]"
  int fixed_size = 0;          // N of "T[N]", 0 otherwise
  bool item_optional = false;  // "T?[]"

  std::string ToString() const;
};

struct SchemaArg {
  std::string name;
  SchemaType type;
  bool kwarg_only = false;
  std::optional<Arg> default_value;  // normalized like an imported argument
};

struct Schema {
  std::string name;      // "add"
  std::string overload;  // "Tensor"; empty for the default overload
  std::vector<SchemaArg> args;
  std::vector<SchemaType> returns;

  // "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor" (defaults re-printed).
  std::string ToString() const;
  // Index of the argument called `name`, or -1.
  int FindArg(absl::string_view name) const;
};

absl::StatusOr<Schema> ParseSchema(absl::string_view text);

// Normalizes an argument for a schema parameter: an int for a float parameter becomes a float, a
// single int for an int[N] parameter becomes a list of N, a constant SymInt an int. Never fails:
// type errors are the verifier's (CheckArgType).
Arg NormalizeArg(const SchemaType& type, Arg arg);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_SCHEMA_H_
