// Byte-level helpers shared by the cache's file formats: little-endian fixed-width integers,
// length-prefixed strings, and SHA-256 (OpenSSL EVP).
//
// Contract: ByteReader never reads past its input; every Read* returns false on truncation and
// leaves the reader in a failed state (ok() == false), so a decoder can read a whole record and
// check once. Nothing here allocates more than the input's size for a length read from the input.
#ifndef KILN_SERVER_CACHE_ENCODING_H_
#define KILN_SERVER_CACHE_ENCODING_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln::cache {

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 over the concatenation of `parts`.
Sha256Digest Sha256(std::initializer_list<absl::string_view> parts);
std::string Sha256Hex(absl::string_view data);

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Raw(absl::string_view bytes) { out_->append(bytes.data(), bytes.size()); }
  void String(absl::string_view s);  // u32 length + bytes

 private:
  std::string* out_;
};

class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}
  bool U32(uint32_t* v);
  bool U64(uint64_t* v);
  bool I64(int64_t* v);
  bool Raw(size_t n, absl::string_view* out);
  bool String(std::string* s);
  bool ok() const { return ok_; }
  size_t remaining() const { return in_.size(); }

 private:
  bool Fail() { return ok_ = false; }
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_ENCODING_H_
