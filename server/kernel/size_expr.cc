#include "server/kernel/size_expr.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::kernel {

Size Size::Const(int64_t value) {
  Size s;
  if (value != 0) s.terms_.push_back(Monomial{value, {}});
  return s;
}

Size Size::Param(int32_t index) {
  Size s;
  s.terms_.push_back(Monomial{1, {index}});
  return s;
}

void Size::Canonicalize() {
  std::sort(terms_.begin(), terms_.end(), [](const Monomial& a, const Monomial& b) {
    if (a.params.size() != b.params.size()) return a.params.size() < b.params.size();
    return a.params < b.params;
  });
  std::vector<Monomial> out;
  for (Monomial& m : terms_) {
    if (!out.empty() && out.back().params == m.params) {
      if (__builtin_add_overflow(out.back().coeff, m.coeff, &out.back().coeff)) overflowed_ = true;
    } else {
      out.push_back(std::move(m));
    }
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const Monomial& m) { return m.coeff == 0; }),
            out.end());
  terms_ = std::move(out);
}

Size operator+(const Size& a, const Size& b) {
  Size s;
  s.overflowed_ = a.overflowed_ || b.overflowed_;
  s.terms_ = a.terms_;
  s.terms_.insert(s.terms_.end(), b.terms_.begin(), b.terms_.end());
  s.Canonicalize();
  return s;
}

Size operator-(const Size& a, const Size& b) { return a + Size::Const(-1) * b; }

Size operator*(const Size& a, const Size& b) {
  Size s;
  s.overflowed_ = a.overflowed_ || b.overflowed_;
  for (const Size::Monomial& x : a.terms_) {
    for (const Size::Monomial& y : b.terms_) {
      Size::Monomial m;
      if (__builtin_mul_overflow(x.coeff, y.coeff, &m.coeff)) s.overflowed_ = true;
      m.params = x.params;
      m.params.insert(m.params.end(), y.params.begin(), y.params.end());
      std::sort(m.params.begin(), m.params.end());
      s.terms_.push_back(std::move(m));
    }
  }
  s.Canonicalize();
  return s;
}

absl::optional<int64_t> Size::AsConst() const {
  if (terms_.empty()) return 0;
  if (terms_.size() == 1 && terms_[0].params.empty()) return terms_[0].coeff;
  return absl::nullopt;
}

int32_t Size::MaxParam() const {
  int32_t m = -1;
  for (const Monomial& t : terms_) {
    for (int32_t p : t.params) m = std::max(m, p);
  }
  return m;
}

absl::optional<int64_t> Size::Evaluate(const std::vector<int64_t>& params) const {
  if (overflowed_) return absl::nullopt;
  int64_t total = 0;
  for (const Monomial& t : terms_) {
    int64_t v = t.coeff;
    for (int32_t p : t.params) {
      if (p < 0 || p >= static_cast<int32_t>(params.size())) return absl::nullopt;
      if (__builtin_mul_overflow(v, params[p], &v)) return absl::nullopt;
    }
    if (__builtin_add_overflow(total, v, &total)) return absl::nullopt;
  }
  return total;
}

std::string Size::ToString() const {
  if (terms_.empty()) return overflowed_ ? "<overflow>" : "0";
  std::vector<std::string> parts;
  for (const Monomial& t : terms_) {
    std::vector<std::string> f;
    if (t.coeff != 1 || t.params.empty()) f.push_back(absl::StrCat(t.coeff));
    for (int32_t p : t.params) f.push_back(absl::StrCat("n", p));
    parts.push_back(absl::StrJoin(f, "*"));
  }
  return absl::StrCat(absl::StrJoin(parts, " + "), overflowed_ ? " <overflow>" : "");
}

}  // namespace kiln::kernel
