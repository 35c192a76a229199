// Helpers for the cache's tests: scratch directories, deterministic keys and values, and file
// surgery (flip a byte, truncate) on real entry files.
#ifndef KILN_SERVER_CACHE_TEST_UTIL_H_
#define KILN_SERVER_CACHE_TEST_UTIL_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace kiln::cache::testing {

// A fresh directory under TEST_TMPDIR (or /tmp), removed at destruction.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/kiln_cache_XXXXXX";
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A valid key (64 lowercase hex) that differs for every i.
inline std::string TestKey(uint64_t i) {
  uint64_t x = i * 0x9e3779b97f4a7c15ULL + 0x12345;
  std::string out;
  for (int part = 0; part < 4; ++part) {
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ULL;
    out += absl::StrFormat("%016x", x);
  }
  return out;
}

// A deterministic value of `size` bytes for key i.
inline std::string TestValue(uint64_t i, size_t size) {
  std::string v(size, '\0');
  uint64_t x = i + 1;
  for (size_t j = 0; j < size; ++j) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    v[j] = static_cast<char>(x >> 56);
  }
  return v;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

inline void FlipByte(const std::string& path, size_t offset) {
  std::string data = ReadAll(path);
  data[offset] = static_cast<char>(data[offset] ^ 0x5a);
  WriteAll(path, data);
}

inline bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Regular files under `dir` (recursively) whose name starts with ".tmp.".
inline std::vector<std::string> TempFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && absl::StartsWith(e.path().filename().string(), ".tmp.")) {
      out.push_back(e.path().string());
    }
  }
  return out;
}

// Total size of the entry files (64-character names) under `dir`.
inline int64_t EntryFileBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename().string().size() == 64) {
      total += static_cast<int64_t>(e.file_size());
    }
  }
  return total;
}

}  // namespace kiln::cache::testing

#endif  // KILN_SERVER_CACHE_TEST_UTIL_H_
