#include "server/codegen/code_writer.h"

namespace kiln::codegen {

void CodeWriter::Line(absl::string_view text) {
  if (!text.empty()) out_.append(static_cast<size_t>(indent_) * 2, ' ');
  out_.append(text.data(), text.size());
  out_.push_back('\n');
}

void CodeWriter::Raw(absl::string_view text) {
  out_.append(text.data(), text.size());
  out_.push_back('\n');
}

void CodeWriter::Open(absl::string_view header) {
  Line(absl::StrCat(header, header.empty() ? "{" : " {"));
  ++indent_;
}

void CodeWriter::Close(absl::string_view trailer) {
  --indent_;
  Line(absl::StrCat("}", trailer));
}

}  // namespace kiln::codegen
