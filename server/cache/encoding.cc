#include "server/cache/encoding.h"

#include <openssl/evp.h>

#include <cstring>

namespace kiln::cache {

Sha256Digest Sha256(std::initializer_list<absl::string_view> parts) {
  Sha256Digest digest{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  unsigned int len = 0;
  // EVP calls fail only on allocation failure; a zero digest then simply mismatches.
  if (ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1) {
    for (absl::string_view p : parts) EVP_DigestUpdate(ctx, p.data(), p.size());
    EVP_DigestFinal_ex(ctx, digest.data(), &len);
  }
  EVP_MD_CTX_free(ctx);
  return digest;
}

std::string Sha256Hex(absl::string_view data) {
  static constexpr char kHex[] = "0123456789abcdef";
  Sha256Digest d = Sha256({data});
  std::string out(64, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    out[2 * i] = kHex[d[i] >> 4];
    out[2 * i + 1] = kHex[d[i] & 15];
  }
  return out;
}

void ByteWriter::U32(uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out_->append(b, 4);
}

void ByteWriter::U64(uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out_->append(b, 8);
}

void ByteWriter::String(absl::string_view s) {
  U32(static_cast<uint32_t>(s.size()));
  Raw(s);
}

bool ByteReader::U32(uint32_t* v) {
  if (!ok_ || in_.size() < 4) return Fail();
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
  in_.remove_prefix(4);
  *v = r;
  return true;
}

bool ByteReader::U64(uint64_t* v) {
  if (!ok_ || in_.size() < 8) return Fail();
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
  in_.remove_prefix(8);
  *v = r;
  return true;
}

bool ByteReader::I64(int64_t* v) {
  uint64_t u = 0;
  if (!U64(&u)) return false;
  *v = static_cast<int64_t>(u);
  return true;
}

bool ByteReader::Raw(size_t n, absl::string_view* out) {
  if (!ok_ || in_.size() < n) return Fail();
  *out = in_.substr(0, n);
  in_.remove_prefix(n);
  return true;
}

bool ByteReader::String(std::string* s) {
  uint32_t n = 0;
  absl::string_view bytes;
  if (!U32(&n) || !Raw(n, &bytes)) return false;
  s->assign(bytes.data(), bytes.size());
  return true;
}

}  // namespace kiln::cache
