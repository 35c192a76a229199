#ifndef KILN_SERVER_GRAPH_SYM_EXPR_H_
#define KILN_SERVER_GRAPH_SYM_EXPR_H_

// Symbolic integers (torch SymInt) in a canonical simplified form.
//
// Semantics: integers are mathematical integers evaluated in int64; Evaluate() fails (never wraps)
// on overflow or division by zero. FloorDiv and Mod round toward negative infinity (Python), CeilDiv
// toward positive infinity. Symbols are indices into Graph::symbols (names never enter a SymExpr).
//
// Canonical form, established by the factory functions (the only way to build a SymExpr):
//   * Add and Mul are flattened (no Add directly inside an Add, no Mul inside a Mul), their
//     arguments are sorted by Compare(), and constants are folded into at most one constant argument
//     (the first, since constants sort first). Like terms are combined: s0 + 2*s0 -> 3*s0.
//   * A constant coefficient is distributed over a sum: 2*(s0 + 1) -> 2*s0 + 2.
//   * Neg(x) is -1*x. Zero terms and unit factors are dropped; a one-argument Add/Mul is its argument.
//   * FloorDiv/CeilDiv/Mod fold constants and simplify exact division by a positive constant
//     ((4*s0 + 2) // 2 -> 2*s0 + 1, (4*s0 + 3) // 2 -> 2*s0 + 1, (4*s0) % 2 -> 0) and by a symbolic
//     factor (s0*s1 // s1 -> s0).
//   * Max/Min are flattened, deduplicated, sorted, and their constants folded into one.
//   * Folding that would overflow int64 is not done (the unfolded form is kept and still exact).
// Two expressions that are equal in this form compare equal with ==. Expressions that are
// mathematically equal but spelled differently (s0*(s1 + 1) vs s0*s1 + s0) may compare unequal.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kiln::graph {

class SymExpr {
 public:
  // Order matters: it is the canonical sort order of kinds.
  enum class Kind : uint8_t { kConst, kSymbol, kMul, kAdd, kFloorDiv, kCeilDiv, kMod, kMax, kMin };

  SymExpr();  // the constant 0
  static SymExpr Const(int64_t value);
  static SymExpr Symbol(int32_t index);
  static SymExpr Add(std::vector<SymExpr> terms);
  static SymExpr Mul(std::vector<SymExpr> factors);
  static SymExpr Neg(const SymExpr& x);
  static SymExpr FloorDiv(const SymExpr& a, const SymExpr& b);
  static SymExpr CeilDiv(const SymExpr& a, const SymExpr& b);
  static SymExpr Mod(const SymExpr& a, const SymExpr& b);
  static SymExpr Max(std::vector<SymExpr> args);
  static SymExpr Min(std::vector<SymExpr> args);

  Kind kind() const;
  bool is_const() const { return kind() == Kind::kConst; }
  bool is_const(int64_t v) const { return is_const() && value() == v; }
  // The constant of kConst, the symbol index of kSymbol; 0 otherwise.
  int64_t value() const;
  const std::vector<SymExpr>& args() const;
  // Number of nodes in the expression tree.
  int64_t size() const;

  // Fails on overflow, division by zero or a symbol index outside `symbol_values`.
  absl::StatusOr<int64_t> Evaluate(absl::Span<const int64_t> symbol_values) const;

  // Readable text: "2*s0 + 1", "(s0 // 2)", "max(s0, 4)". `symbol_name` maps an index to a name.
  std::string ToString() const;
  std::string ToString(const std::function<std::string(int32_t)>& symbol_name) const;

  // A total order on canonical expressions; 0 means equal.
  int Compare(const SymExpr& other) const;
  bool operator==(const SymExpr& o) const { return Compare(o) == 0; }
  bool operator!=(const SymExpr& o) const { return Compare(o) != 0; }
  bool operator<(const SymExpr& o) const { return Compare(o) < 0; }

 private:
  struct Rep;
  explicit SymExpr(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}
  static SymExpr MakeRaw(Kind kind, int64_t value, std::vector<SymExpr> args);
  // FloorDiv (kind kFloorDiv) and CeilDiv (kCeilDiv): the same simplifications, other rounding.
  static SymExpr Divide(const SymExpr& a, const SymExpr& b, Kind kind);
  std::shared_ptr<const Rep> rep_;  // null means the constant 0
};

inline SymExpr operator+(const SymExpr& a, const SymExpr& b) { return SymExpr::Add({a, b}); }
inline SymExpr operator-(const SymExpr& a, const SymExpr& b) {
  return SymExpr::Add({a, SymExpr::Neg(b)});
}
inline SymExpr operator*(const SymExpr& a, const SymExpr& b) { return SymExpr::Mul({a, b}); }

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_SYM_EXPR_H_
