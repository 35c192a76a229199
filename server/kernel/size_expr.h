#ifndef KILN_SERVER_KERNEL_SIZE_EXPR_H_
#define KILN_SERVER_KERNEL_SIZE_EXPR_H_

// Size: an int64 polynomial over a kernel's scalar parameters, used for loop extents, strides,
// offsets and buffer sizes. Dynamic shapes enter kernels only as scalar parameters `n<i>` (int64
// values passed at run time); anything that is not a polynomial in them (a floor division, a max)
// is computed by the plan and passed as a scalar parameter of its own.
//
// Canonical form (established by the constructors, the only way to build one): a sum of monomials
// `coeff * n<i> * n<j> ...` with sorted parameter lists, like terms combined, zero terms dropped and
// monomials sorted; so equal canonical sizes compare equal. Arithmetic is exact: a fold that would
// overflow int64 marks the Size `overflowed()`, which the verifier rejects.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/optional.h"

namespace kiln::kernel {

class Size {
 public:
  struct Monomial {
    int64_t coeff = 0;
    std::vector<int32_t> params;  // sorted scalar-parameter indices (with repetition)
    bool operator==(const Monomial& o) const { return coeff == o.coeff && params == o.params; }
  };

  Size() = default;  // the constant 0
  static Size Const(int64_t value);
  static Size Param(int32_t index);

  friend Size operator+(const Size& a, const Size& b);
  friend Size operator*(const Size& a, const Size& b);
  friend Size operator-(const Size& a, const Size& b);

  bool is_const() const { return terms_.empty() || (terms_.size() == 1 && terms_[0].params.empty()); }
  // The value of a constant Size; nullopt otherwise.
  absl::optional<int64_t> AsConst() const;
  bool is_const(int64_t v) const { return AsConst() == absl::optional<int64_t>(v); }
  bool overflowed() const { return overflowed_; }
  const std::vector<Monomial>& terms() const { return terms_; }
  // The largest scalar-parameter index used, or -1.
  int32_t MaxParam() const;

  // Value for the given parameter values; nullopt on overflow or a parameter out of range.
  absl::optional<int64_t> Evaluate(const std::vector<int64_t>& params) const;

  // "4*n0*n1 + 2"; "0" for zero.
  std::string ToString() const;

  bool operator==(const Size& o) const { return overflowed_ == o.overflowed_ && terms_ == o.terms_; }
  bool operator!=(const Size& o) const { return !(*this == o); }

 private:
  void Canonicalize();
  std::vector<Monomial> terms_;
  bool overflowed_ = false;
};

}  // namespace kiln::kernel

#endif  // KILN_SERVER_KERNEL_SIZE_EXPR_H_
