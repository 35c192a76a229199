#include "server/cache/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"

namespace kiln::cache {
namespace {

std::atomic<uint64_t> temp_counter{0};

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace

absl::Status ErrnoStatus(int err, absl::string_view what, absl::string_view path) {
  std::string message = absl::StrCat(what, " ", path, ": ", strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes,
                                           int64_t* file_size) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (file_size != nullptr) *file_size = st.st_size;
  std::string out(std::min<size_t>(static_cast<size_t>(st.st_size), max_bytes), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd.get(), &out[done], out.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;  // shrank under us: the caller sees a short read
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  return ReadFilePrefix(path, static_cast<size_t>(-1), nullptr);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<absl::string_view> parts, bool sync) {
  const std::string dir = DirName(path);
  const std::string tmp = absl::StrCat(dir, "/", kTempPrefix, path.substr(dir.size() + 1), ".",
                                       ::getpid(), ".", temp_counter.fetch_add(1));
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot create", tmp);
  for (absl::string_view part : parts) {
    size_t done = 0;
    while (done < part.size()) {
      ssize_t n = ::write(fd.get(), part.data() + done, part.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::unlink(tmp.c_str());
        return ErrnoStatus(err, "cannot write", tmp);
      }
      done += static_cast<size_t>(n);
    }
  }
  if (sync && ::fsync(fd.get()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot fsync", tmp);
  }
  if (::close(fd.Release()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot close", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot rename into", path);
  }
  if (sync) return FsyncDir(dir);
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot open directory", dir);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("empty directory name");
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  const std::string parent = DirName(dir);
  if (parent != dir && parent != "/" && parent != ".") {
    if (absl::Status s = MakeDirs(parent); !s.ok()) return s;
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "cannot create directory", dir);
  }
  return absl::OkStatus();
}

}  // namespace kiln::cache
