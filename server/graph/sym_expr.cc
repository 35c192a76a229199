#include "server/graph/sym_expr.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::graph {

struct SymExpr::Rep {
  Kind kind;
  int64_t value;
  std::vector<SymExpr> args;
  int64_t size;
};

namespace {

using Kind = SymExpr::Kind;

const std::vector<SymExpr>& EmptyArgs() {
  static const auto* empty = new std::vector<SymExpr>();
  return *empty;
}

bool CheckedAdd(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }
bool CheckedMul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// Python floor division and modulo; false on division by zero or overflow.
bool PyFloorDiv(int64_t a, int64_t b, int64_t* out) {
  if (b == 0 || (a == std::numeric_limits<int64_t>::min() && b == -1)) return false;
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  *out = q;
  return true;
}
bool PyMod(int64_t a, int64_t b, int64_t* out) {
  if (b == 0) return false;
  if (b == -1) {
    *out = 0;
    return true;
  }
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  *out = r;
  return true;
}
bool PyCeilDiv(int64_t a, int64_t b, int64_t* out) {
  if (b == 0 || (a == std::numeric_limits<int64_t>::min() && b == -1)) return false;
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) == (b < 0))) ++q;
  *out = q;
  return true;
}

// Splits a canonical Add term into (coefficient, monomial). Constants have no monomial.
struct Term {
  int64_t coeff;
  std::optional<SymExpr> mono;
};

Term SplitTerm(const SymExpr& t) {
  if (t.is_const()) return {t.value(), std::nullopt};
  if (t.kind() == Kind::kMul && t.args()[0].is_const()) {
    // Only the first constant is the coefficient; further (unfolded, overflowing) constants stay.
    std::vector<SymExpr> rest(t.args().begin() + 1, t.args().end());
    if (rest.size() == 1) return {t.args()[0].value(), rest[0]};
    return {t.args()[0].value(), SymExpr::Mul(rest)};
  }
  return {1, t};
}

// x / c when every coefficient of x is divisible by c (c > 1).
std::optional<SymExpr> DivideExact(const SymExpr& x, int64_t c) {
  if (x.is_const()) {
    if (x.value() % c == 0) return SymExpr::Const(x.value() / c);
    return std::nullopt;
  }
  if (x.kind() == Kind::kMul && x.args()[0].is_const()) {
    if (x.args()[0].value() % c != 0) return std::nullopt;
    std::vector<SymExpr> f = x.args();
    f[0] = SymExpr::Const(f[0].value() / c);
    return SymExpr::Mul(std::move(f));
  }
  if (x.kind() == Kind::kAdd) {
    std::vector<SymExpr> terms;
    for (const SymExpr& t : x.args()) {
      auto q = DivideExact(t, c);
      if (!q) return std::nullopt;
      terms.push_back(*q);
    }
    return SymExpr::Add(std::move(terms));
  }
  return std::nullopt;
}

// Splits the terms of `x` into those divisible by c and the rest.
void SplitDivisible(const SymExpr& x, int64_t c, std::vector<SymExpr>* quotients,
                    std::vector<SymExpr>* rest) {
  const std::vector<SymExpr> single = {x};
  const std::vector<SymExpr>& terms = x.kind() == Kind::kAdd ? x.args() : single;
  for (const SymExpr& t : terms) {
    auto q = DivideExact(t, c);
    if (q) {
      quotients->push_back(*q);
    } else {
      rest->push_back(t);
    }
  }
}

// x / b when b = c*f1*...*fn (c > 0) divides every term of x exactly: each term's coefficient
// is divisible by c and its factors include f1..fn.
std::optional<SymExpr> DivideExactBy(const SymExpr& x, const SymExpr& b) {
  Term tb = SplitTerm(b);
  if (tb.coeff <= 0) return std::nullopt;
  std::vector<SymExpr> bf;
  if (tb.mono) {
    if (tb.mono->kind() == Kind::kMul) {
      bf = tb.mono->args();
    } else {
      bf = {*tb.mono};
    }
  }
  const std::vector<SymExpr> single = {x};
  const std::vector<SymExpr>& terms = x.kind() == Kind::kAdd ? x.args() : single;
  std::vector<SymExpr> out;
  for (const SymExpr& t : terms) {
    Term tt = SplitTerm(t);
    if (tt.coeff % tb.coeff != 0 || !tt.mono) return std::nullopt;
    std::vector<SymExpr> f;
    if (tt.mono->kind() == Kind::kMul) {
      f = tt.mono->args();
    } else {
      f = {*tt.mono};
    }
    for (const SymExpr& d : bf) {
      auto it = std::find(f.begin(), f.end(), d);
      if (it == f.end()) return std::nullopt;
      f.erase(it);
    }
    f.push_back(SymExpr::Const(tt.coeff / tb.coeff));
    out.push_back(SymExpr::Mul(std::move(f)));
  }
  return SymExpr::Add(std::move(out));
}

SymExpr MinMax(Kind kind, std::vector<SymExpr> in);

}  // namespace

SymExpr::SymExpr() = default;

SymExpr SymExpr::MakeRaw(Kind kind, int64_t value, std::vector<SymExpr> args) {
  int64_t size = 1;
  for (const SymExpr& a : args) size = std::min<int64_t>(size + a.size(), int64_t{1} << 40);
  return SymExpr(std::make_shared<const Rep>(Rep{kind, value, std::move(args), size}));
}

SymExpr SymExpr::Const(int64_t value) {
  if (value == 0) return SymExpr();
  return MakeRaw(Kind::kConst, value, {});
}

SymExpr SymExpr::Symbol(int32_t index) { return MakeRaw(Kind::kSymbol, index, {}); }

SymExpr::Kind SymExpr::kind() const { return rep_ ? rep_->kind : Kind::kConst; }
int64_t SymExpr::value() const { return rep_ ? rep_->value : 0; }
const std::vector<SymExpr>& SymExpr::args() const { return rep_ ? rep_->args : EmptyArgs(); }
int64_t SymExpr::size() const { return rep_ ? rep_->size : 1; }

SymExpr SymExpr::Add(std::vector<SymExpr> terms) {
  std::vector<SymExpr> flat;
  for (SymExpr& t : terms) {
    if (t.kind() == Kind::kAdd) {
      flat.insert(flat.end(), t.args().begin(), t.args().end());
    } else {
      flat.push_back(std::move(t));
    }
  }
  int64_t constant = 0;
  std::vector<SymExpr> out;
  std::vector<Term> split;
  for (const SymExpr& t : flat) {
    Term term = SplitTerm(t);
    if (!term.mono) {
      int64_t sum;
      if (CheckedAdd(constant, term.coeff, &sum)) {
        constant = sum;
      } else {
        out.push_back(t);
      }
      continue;
    }
    split.push_back(std::move(term));
  }
  std::stable_sort(split.begin(), split.end(),
                   [](const Term& a, const Term& b) { return *a.mono < *b.mono; });
  for (size_t i = 0; i < split.size();) {
    int64_t coeff = split[i].coeff;
    size_t j = i + 1;
    for (; j < split.size() && *split[j].mono == *split[i].mono; ++j) {
      int64_t sum;
      if (!CheckedAdd(coeff, split[j].coeff, &sum)) break;
      coeff = sum;
    }
    if (coeff == 1) {
      out.push_back(*split[i].mono);
    } else if (coeff != 0) {
      const SymExpr& mono = *split[i].mono;
      std::vector<SymExpr> f;
      f.reserve(1 + mono.args().size() + 1);
      f.push_back(Const(coeff));
      if (mono.kind() == Kind::kMul) {
        for (const SymExpr& m : mono.args()) f.push_back(m);
      } else {
        f.push_back(mono);
      }
      out.push_back(MakeRaw(Kind::kMul, 0, std::move(f)));
    }
    i = j;
  }
  if (constant != 0) out.push_back(Const(constant));
  std::sort(out.begin(), out.end());
  if (out.empty()) return Const(0);
  if (out.size() == 1) return out[0];
  return MakeRaw(Kind::kAdd, 0, std::move(out));
}

SymExpr SymExpr::Mul(std::vector<SymExpr> factors) {
  std::vector<SymExpr> flat;
  for (SymExpr& f : factors) {
    if (f.kind() == Kind::kMul) {
      flat.insert(flat.end(), f.args().begin(), f.args().end());
    } else {
      flat.push_back(std::move(f));
    }
  }
  int64_t coeff = 1;
  std::vector<SymExpr> extra_consts, others;
  for (SymExpr& f : flat) {
    if (f.is_const()) {
      if (f.value() == 0) return Const(0);
      int64_t p;
      if (CheckedMul(coeff, f.value(), &p)) {
        coeff = p;
      } else {
        extra_consts.push_back(f);
      }
    } else {
      others.push_back(std::move(f));
    }
  }
  if (others.empty() && extra_consts.empty()) return Const(coeff);
  if (others.size() == 1 && extra_consts.empty() && coeff != 1 && others[0].kind() == Kind::kAdd) {
    std::vector<SymExpr> terms;
    for (const SymExpr& t : others[0].args()) terms.push_back(Mul({Const(coeff), t}));
    return Add(std::move(terms));
  }
  std::sort(others.begin(), others.end());
  std::sort(extra_consts.begin(), extra_consts.end());
  if (coeff == 1 && extra_consts.empty() && others.size() == 1) return others[0];
  std::vector<SymExpr> args;
  if (coeff != 1) args.push_back(Const(coeff));
  args.insert(args.end(), extra_consts.begin(), extra_consts.end());
  args.insert(args.end(), others.begin(), others.end());
  if (args.size() == 1) return args[0];
  return MakeRaw(Kind::kMul, 0, std::move(args));
}

SymExpr SymExpr::Neg(const SymExpr& x) { return Mul({Const(-1), x}); }

SymExpr SymExpr::FloorDiv(const SymExpr& a, const SymExpr& b) {
  return Divide(a, b, Kind::kFloorDiv);
}

SymExpr SymExpr::CeilDiv(const SymExpr& a, const SymExpr& b) {
  return Divide(a, b, Kind::kCeilDiv);
}

SymExpr SymExpr::Divide(const SymExpr& a, const SymExpr& b, Kind kind) {
  if (b.is_const()) {
    const int64_t c = b.value();
    int64_t q;
    if (a.is_const() && (kind == Kind::kFloorDiv ? PyFloorDiv(a.value(), c, &q)
                                                 : PyCeilDiv(a.value(), c, &q))) {
      return Const(q);
    }
    if (c == 1) return a;
    if (c > 1) {
      if (auto exact = DivideExact(a, c)) return *exact;
      std::vector<SymExpr> quotients, rest;
      SplitDivisible(a, c, &quotients, &rest);
      if (!quotients.empty()) {
        quotients.push_back(Divide(Add(std::move(rest)), b, kind));
        return Add(std::move(quotients));
      }
    }
  } else {
    if (a == b) return Const(1);
    if (auto r = DivideExactBy(a, b)) return *r;
  }
  if (a.is_const(0)) return Const(0);
  return MakeRaw(kind, 0, {a, b});
}

SymExpr SymExpr::Mod(const SymExpr& a, const SymExpr& b) {
  if (b.is_const()) {
    const int64_t c = b.value();
    int64_t r;
    if (a.is_const() && PyMod(a.value(), c, &r)) return Const(r);
    if (c == 1 || c == -1) return Const(0);
    if (c > 1) {
      std::vector<SymExpr> quotients, rest;
      SplitDivisible(a, c, &quotients, &rest);
      if (rest.empty()) return Const(0);
      if (!quotients.empty()) return Mod(Add(std::move(rest)), b);
    }
  } else {
    if (a == b) return Const(0);
    if (DivideExactBy(a, b)) return Const(0);
  }
  if (a.is_const(0)) return Const(0);
  return MakeRaw(Kind::kMod, 0, {a, b});
}

namespace {

SymExpr MinMax(Kind kind, std::vector<SymExpr> in) {
  std::vector<SymExpr> flat;
  std::optional<int64_t> constant;
  for (SymExpr& x : in) {
    const std::vector<SymExpr> single = {x};
    const std::vector<SymExpr>& items = x.kind() == kind ? x.args() : single;
    for (const SymExpr& y : items) {
      if (y.is_const()) {
        int64_t v = y.value();
        if (!constant) {
          constant = v;
        } else {
          constant = kind == Kind::kMax ? std::max(*constant, v) : std::min(*constant, v);
        }
      } else {
        flat.push_back(y);
      }
    }
  }
  if (constant) flat.push_back(SymExpr::Const(*constant));
  std::sort(flat.begin(), flat.end());
  flat.erase(std::unique(flat.begin(), flat.end()), flat.end());
  if (flat.empty()) return SymExpr::Const(0);
  if (flat.size() == 1) return flat[0];
  return kind == Kind::kMax ? SymExpr::Max(std::move(flat)) : SymExpr::Min(std::move(flat));
}

}  // namespace

SymExpr SymExpr::Max(std::vector<SymExpr> args) {
  // Already canonical (called back from MinMax) when sorted, unique and flat.
  bool canonical = args.size() >= 2 && std::is_sorted(args.begin(), args.end());
  int consts = 0;
  for (size_t i = 0; canonical && i < args.size(); ++i) {
    if (args[i].kind() == Kind::kMax || (i > 0 && args[i] == args[i - 1])) canonical = false;
    if (args[i].is_const()) ++consts;
  }
  if (canonical && consts <= 1) return MakeRaw(Kind::kMax, 0, std::move(args));
  return MinMax(Kind::kMax, std::move(args));
}

SymExpr SymExpr::Min(std::vector<SymExpr> args) {
  bool canonical = args.size() >= 2 && std::is_sorted(args.begin(), args.end());
  int consts = 0;
  for (size_t i = 0; canonical && i < args.size(); ++i) {
    if (args[i].kind() == Kind::kMin || (i > 0 && args[i] == args[i - 1])) canonical = false;
    if (args[i].is_const()) ++consts;
  }
  if (canonical && consts <= 1) return MakeRaw(Kind::kMin, 0, std::move(args));
  return MinMax(Kind::kMin, std::move(args));
}

int SymExpr::Compare(const SymExpr& other) const {
  if (rep_ == other.rep_) return 0;
  if (kind() != other.kind()) return kind() < other.kind() ? -1 : 1;
  if (kind() == Kind::kConst || kind() == Kind::kSymbol) {
    if (value() == other.value()) return 0;
    return value() < other.value() ? -1 : 1;
  }
  const auto& a = args();
  const auto& b = other.args();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    int c = a[i].Compare(b[i]);
    if (c != 0) return c;
  }
  if (a.size() == b.size()) return 0;
  return a.size() < b.size() ? -1 : 1;
}

absl::StatusOr<int64_t> SymExpr::Evaluate(absl::Span<const int64_t> symbol_values) const {
  switch (kind()) {
    case Kind::kConst:
      return value();
    case Kind::kSymbol:
      if (value() < 0 || value() >= static_cast<int64_t>(symbol_values.size())) {
        return absl::InvalidArgumentError(absl::StrCat("symbol s", value(), " has no value"));
      }
      return symbol_values[value()];
    default:
      break;
  }
  std::vector<int64_t> v;
  v.reserve(args().size());
  for (const SymExpr& a : args()) {
    auto r = a.Evaluate(symbol_values);
    if (!r.ok()) return r.status();
    v.push_back(*r);
  }
  const auto overflow = [this] {
    return absl::InvalidArgumentError(absl::StrCat("int64 overflow evaluating ", ToString()));
  };
  int64_t acc = v[0];
  switch (kind()) {
    case Kind::kAdd:
      for (size_t i = 1; i < v.size(); ++i) {
        if (!CheckedAdd(acc, v[i], &acc)) return overflow();
      }
      return acc;
    case Kind::kMul:
      for (size_t i = 1; i < v.size(); ++i) {
        if (!CheckedMul(acc, v[i], &acc)) return overflow();
      }
      return acc;
    case Kind::kFloorDiv:
    case Kind::kCeilDiv:
    case Kind::kMod: {
      if (v[1] == 0) {
        return absl::InvalidArgumentError(absl::StrCat("division by zero evaluating ", ToString()));
      }
      bool ok = kind() == Kind::kFloorDiv ? PyFloorDiv(v[0], v[1], &acc)
                : kind() == Kind::kCeilDiv ? PyCeilDiv(v[0], v[1], &acc)
                                           : PyMod(v[0], v[1], &acc);
      if (!ok) return overflow();
      return acc;
    }
    case Kind::kMax:
      return *std::max_element(v.begin(), v.end());
    case Kind::kMin:
      return *std::min_element(v.begin(), v.end());
    default:
      return absl::InternalError("bad SymExpr kind");
  }
}

std::string SymExpr::ToString() const {
  return ToString([](int32_t i) { return absl::StrCat("s", i); });
}

std::string SymExpr::ToString(const std::function<std::string(int32_t)>& name) const {
  auto paren = [&](const SymExpr& e) {
    std::string s = e.ToString(name);
    return e.kind() == Kind::kAdd ? absl::StrCat("(", s, ")") : s;
  };
  switch (kind()) {
    case Kind::kConst:
      return absl::StrCat(value());
    case Kind::kSymbol:
      return name(static_cast<int32_t>(value()));
    case Kind::kAdd: {
      std::string out;
      std::string constant;
      for (const SymExpr& t : args()) {
        if (t.is_const()) {
          absl::StrAppend(&constant, t.value() < 0 && t.value() != std::numeric_limits<int64_t>::min()
                                         ? absl::StrCat(" - ", -t.value())
                                         : absl::StrCat(" + ", t.value()));
          continue;
        }
        const bool negative = t.kind() == Kind::kMul && t.args()[0].is_const() &&
                              t.args()[0].value() < 0 &&
                              t.args()[0].value() != std::numeric_limits<int64_t>::min();
        if (negative) {
          absl::StrAppend(&out, out.empty() ? "-" : " - ", SymExpr::Neg(t).ToString(name));
        } else {
          absl::StrAppend(&out, out.empty() ? "" : " + ", t.ToString(name));
        }
      }
      if (out.empty() && constant.size() > 3) {
        return constant[1] == '-' ? absl::StrCat("-", constant.substr(3)) : constant.substr(3);
      }
      return out + constant;
    }
    case Kind::kMul: {
      std::string out;
      size_t start = 0;
      if (args()[0].is_const(-1)) {
        out = "-";
        start = 1;
      }
      for (size_t i = start; i < args().size(); ++i) {
        absl::StrAppend(&out, i > start ? "*" : "", paren(args()[i]));
      }
      return out;
    }
    case Kind::kFloorDiv:
      return absl::StrCat("(", paren(args()[0]), " // ", paren(args()[1]), ")");
    case Kind::kCeilDiv:
      return absl::StrCat("ceil_div(", args()[0].ToString(name), ", ", args()[1].ToString(name), ")");
    case Kind::kMod:
      return absl::StrCat("(", paren(args()[0]), " % ", paren(args()[1]), ")");
    case Kind::kMax:
    case Kind::kMin: {
      std::vector<std::string> parts;
      for (const SymExpr& a : args()) parts.push_back(a.ToString(name));
      return absl::StrCat(kind() == Kind::kMax ? "max(" : "min(", absl::StrJoin(parts, ", "), ")");
    }
  }
  return "?";
}

}  // namespace kiln::graph
