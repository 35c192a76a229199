#ifndef KILN_SERVER_CODEGEN_CODE_WRITER_H_
#define KILN_SERVER_CODEGEN_CODE_WRITER_H_

// CodeWriter: an indented line buffer for emitters (two spaces per level), with scope helpers and
// fresh-name counters. Holds no state from the graph; every name it hands out is generated.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kiln::codegen {

class CodeWriter {
 public:
  explicit CodeWriter(int indent = 0) : indent_(indent) {}
  // Appends one line at the current indentation (an empty `text` gives an empty line).
  void Line(absl::string_view text);
  template <typename... Args>
  void Linef(const Args&... args) {
    Line(absl::StrCat(args...));
  }
  // A line at column 0 (preprocessor directives, pragmas).
  void Raw(absl::string_view text);
  // "header {" and indent; Close() dedents and writes "}" plus `trailer`.
  void Open(absl::string_view header);
  void Close(absl::string_view trailer = "");
  int indent() const { return indent_; }

  // Fresh names: `prefix` followed by a counter shared by all prefixes ("v0", "v1", ...).
  std::string Fresh(absl::string_view prefix) { return absl::StrCat(prefix, next_id_++); }

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
  int indent_ = 0;
  int next_id_ = 0;
};

// Opens a scope in the constructor and closes it in the destructor.
class ScopedBlock {
 public:
  ScopedBlock(CodeWriter& w, absl::string_view header) : w_(w) { w_.Open(header); }
  ~ScopedBlock() { w_.Close(); }
  ScopedBlock(const ScopedBlock&) = delete;
  ScopedBlock& operator=(const ScopedBlock&) = delete;

 private:
  CodeWriter& w_;
};

}  // namespace kiln::codegen

#endif  // KILN_SERVER_CODEGEN_CODE_WRITER_H_
