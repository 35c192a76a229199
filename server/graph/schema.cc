#include "server/graph/schema.h"

#include <cctype>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace kiln::graph {

namespace {

using Base = SchemaType::Base;

struct BaseName {
  const char* name;
  Base base;
};
constexpr BaseName kBaseNames[] = {
    {"Tensor", Base::kTensor},         {"Scalar", Base::kScalar},
    {"int", Base::kInt},               {"SymInt", Base::kSymInt},
    {"float", Base::kFloat},           {"bool", Base::kBool},
    {"str", Base::kStr},               {"ScalarType", Base::kScalarType},
    {"Layout", Base::kLayout},         {"Device", Base::kDevice},
    {"MemoryFormat", Base::kMemoryFormat}, {"Generator", Base::kGenerator},
    {"Any", Base::kAny},
};

class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::StatusOr<Schema> Parse() {
    Schema schema;
    std::string qualified = Ident();
    if (qualified.empty()) return Error("expected the operator name");
    while (Peek() == '.') {
      ++pos_;
      std::string part = Ident();
      if (part.empty()) return Error("expected the overload name");
      if (schema.overload.empty() && schema.name.empty()) {
        schema.name = qualified;
        schema.overload = part;
      } else {
        return Error("too many '.' in the operator name");
      }
    }
    if (schema.name.empty()) schema.name = qualified;
    if (!Eat('(')) return Error("expected '('");
    bool kwarg_only = false;
    if (!Eat(')')) {
      while (true) {
        if (Eat('*')) {
          kwarg_only = true;
        } else {
          SchemaArg arg;
          auto type = Type();
          if (!type.ok()) return type.status();
          arg.type = *type;
          arg.name = Ident();
          if (arg.name.empty()) return Error("expected an argument name");
          arg.kwarg_only = kwarg_only;
          if (Eat('=')) {
            auto def = Default(arg.type);
            if (!def.ok()) return def.status();
            arg.default_value = NormalizeArg(arg.type, *def);
          }
          schema.args.push_back(std::move(arg));
        }
        if (Eat(')')) break;
        if (!Eat(',')) return Error("expected ',' or ')'");
      }
    }
    if (!Eat('-') || !Eat('>')) return Error("expected '->'");
    if (Eat('(')) {
      if (!Eat(')')) {
        while (true) {
          auto type = Type();
          if (!type.ok()) return type.status();
          schema.returns.push_back(*type);
          Ident();  // optional return name
          if (Eat(')')) break;
          if (!Eat(',')) return Error("expected ',' or ')' in the returns");
        }
      }
    } else {
      auto type = Type();
      if (!type.ok()) return type.status();
      schema.returns.push_back(*type);
      Ident();
    }
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing text");
    return schema;
  }

 private:
  void SkipSpace() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  char Peek() {
    SkipSpace();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool Eat(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  std::string Ident() {
    SkipSpace();
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) {
      ++pos_;
    }
    return std::string(s_.substr(start, pos_ - start));
  }
  absl::Status Error(absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("schema parse error at ", pos_, ": ", what, " in \"", s_, "\""));
  }

  absl::StatusOr<SchemaType> Type() {
    SchemaType t;
    std::string base = Ident();
    bool found = false;
    for (const BaseName& b : kBaseNames) {
      if (base == b.name) {
        t.base = b.base;
        found = true;
      }
    }
    if (!found) return Error(absl::StrCat("unknown type '", base, "'"));
    if (Peek() == '(') {  // alias annotation
      while (pos_ < s_.size() && s_[pos_] != ')') ++pos_;
      if (!Eat(')')) return Error("unterminated alias annotation");
    }
    if (Eat('?')) t.optional = true;
    if (Eat('[')) {
      t.is_list = true;
      t.item_optional = t.optional;
      t.optional = false;
      SkipSpace();
      size_t start = pos_;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ > start && !absl::SimpleAtoi(s_.substr(start, pos_ - start), &t.fixed_size)) {
        return Error("bad list size");
      }
      if (!Eat(']')) return Error("expected ']'");
      if (Eat('?')) t.optional = true;
    }
    if (Peek() == '(') {  // alias annotation after a list: Tensor(a)[] is handled above
      while (pos_ < s_.size() && s_[pos_] != ')') ++pos_;
      if (!Eat(')')) return Error("unterminated alias annotation");
    }
    return t;
  }

  absl::StatusOr<Arg> Scalar(absl::string_view text) {
    text = absl::StripAsciiWhitespace(text);
    if (text == "None") return Arg::None();
    if (text == "True") return Arg::Bool(true);
    if (text == "False") return Arg::Bool(false);
    if (text == "Mean") return Arg::Int(1);
    if (text == "Sum") return Arg::Int(2);
    if (text == "contiguous_format") return Arg::OfMemoryFormat(::kiln::v1::MEMORY_FORMAT_CONTIGUOUS);
    if (text.size() >= 2 && (text[0] == '"' || text[0] == '\'') && text.back() == text[0]) {
      return Arg::String(std::string(text.substr(1, text.size() - 2)));
    }
    int64_t i;
    if (absl::SimpleAtoi(text, &i)) return Arg::Int(i);
    double d;
    if (absl::SimpleAtod(text, &d)) return Arg::Float(d);
    return Error(absl::StrCat("bad default '", text, "'"));
  }

  absl::StatusOr<Arg> Default(const SchemaType& type) {
    SkipSpace();
    size_t start = pos_;
    int depth = 0;
    char quote = 0;
    for (; pos_ < s_.size(); ++pos_) {
      char c = s_[pos_];
      if (quote) {
        if (c == quote) quote = 0;
        continue;
      }
      if (c == '"' || c == '\'') quote = c;
      if (c == '[') ++depth;
      if (c == ']') --depth;
      if (depth == 0 && (c == ',' || c == ')')) break;
    }
    absl::string_view text = absl::StripAsciiWhitespace(s_.substr(start, pos_ - start));
    if (!text.empty() && text[0] == '[') {
      if (text.back() != ']') return Error("bad list default");
      std::vector<Arg> items;
      absl::string_view inner = absl::StripAsciiWhitespace(text.substr(1, text.size() - 2));
      while (!inner.empty()) {
        size_t comma = inner.find(',');
        auto item = Scalar(inner.substr(0, comma));
        if (!item.ok()) return item.status();
        items.push_back(*item);
        if (comma == absl::string_view::npos) break;
        inner = inner.substr(comma + 1);
      }
      return Arg::List(std::move(items));
    }
    (void)type;
    return Scalar(text);
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

std::string SchemaType::ToString() const {
  std::string s;
  for (const BaseName& b : kBaseNames) {
    if (b.base == base) s = b.name;
  }
  if (item_optional) s += "?";
  if (is_list) s += fixed_size > 0 ? absl::StrCat("[", fixed_size, "]") : "[]";
  if (optional) s += "?";
  return s;
}

std::string Schema::ToString() const {
  std::vector<std::string> parts;
  bool star = false;
  for (const SchemaArg& a : args) {
    if (a.kwarg_only && !star) {
      parts.push_back("*");
      star = true;
    }
    std::string p = absl::StrCat(a.type.ToString(), " ", a.name);
    if (a.default_value) absl::StrAppend(&p, "=", ArgToString(*a.default_value));
    parts.push_back(p);
  }
  std::vector<std::string> rets;
  for (const SchemaType& r : returns) rets.push_back(r.ToString());
  std::string ret = returns.size() == 1 ? rets[0] : absl::StrCat("(", absl::StrJoin(rets, ", "), ")");
  return absl::StrCat(name, overload.empty() ? "" : ".", overload, "(", absl::StrJoin(parts, ", "),
                      ") -> ", ret);
}

int Schema::FindArg(absl::string_view arg_name) const {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name == arg_name) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<Schema> ParseSchema(absl::string_view text) { return Parser(text).Parse(); }

Arg NormalizeArg(const SchemaType& type, Arg arg) {
  if (arg.kind == Arg::Kind::kSym && arg.sym.is_const()) arg = Arg::Int(arg.sym.value());
  if (type.is_list) {
    if (type.fixed_size > 0 && (arg.kind == Arg::Kind::kInt || arg.kind == Arg::Kind::kSym ||
                                arg.kind == Arg::Kind::kBool || arg.kind == Arg::Kind::kValue) &&
        type.base != Base::kTensor) {
      return Arg::List(std::vector<Arg>(type.fixed_size, arg));
    }
    if (arg.kind == Arg::Kind::kList && type.base == Base::kFloat) {
      for (Arg& item : arg.list) {
        if (item.kind == Arg::Kind::kInt) item = Arg::Float(static_cast<double>(item.i));
      }
    }
    return arg;
  }
  if (type.base == Base::kFloat && arg.kind == Arg::Kind::kInt) {
    return Arg::Float(static_cast<double>(arg.i));
  }
  return arg;
}

}  // namespace kiln::graph
