// Implementation of the C ABI in kiln_runtime.h. Standalone: C++17, libc and libdl only.

#include "kiln_runtime.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

struct kiln_module {
  void* handle = nullptr;
  int fd = -1;  // the memfd stays open while loaded, so /proc/self/fd/N names stay unique
  std::vector<kiln_kernel_fn> kernels;
  std::vector<std::string> symbols;
  std::unordered_map<std::string, int32_t> by_symbol;
};

namespace {

thread_local std::string g_last_error;

int Fail(int code, const std::string& message) {
  g_last_error = message;
  return code;
}

int Ok() {
  g_last_error.clear();
  return KILN_OK;
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

int MemFd() {
#ifdef SYS_memfd_create
  return static_cast<int>(syscall(SYS_memfd_create, "kiln-artifact", 1u /* MFD_CLOEXEC */));
#else
  errno = ENOSYS;
  return -1;
#endif
}

bool InFile(uint64_t offset, uint64_t length, size_t size) {
  return offset <= size && length <= size - offset;
}

// dlopen maps segments straight from the file: a truncated or inconsistent file would fault
// (SIGBUS) in the loader. So check the headers before dlopen: a 64-bit little-endian ET_DYN of
// this machine whose program and section headers and every segment's bytes lie inside `size`.
const char* CheckElf(const unsigned char* p, size_t size) {
  if (size < sizeof(Elf64_Ehdr) || std::memcmp(p, ELFMAG, SELFMAG) != 0) return "not an ELF file";
  Elf64_Ehdr eh;
  std::memcpy(&eh, p, sizeof(eh));
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return "not a 64-bit little-endian ELF file";
  }
  if (eh.e_type != ET_DYN) return "not a shared object";
#if defined(__x86_64__)
  if (eh.e_machine != EM_X86_64) return "built for another machine";
#elif defined(__aarch64__)
  if (eh.e_machine != EM_AARCH64) return "built for another machine";
#endif
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 ||
      !InFile(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr), size)) {
    return "bad program headers (truncated?)";
  }
  if (eh.e_shnum != 0 && (eh.e_shentsize != sizeof(Elf64_Shdr) ||
                          !InFile(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr), size))) {
    return "bad section headers (truncated?)";
  }
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, p + eh.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr), sizeof(ph));
    if (ph.p_type == PT_NULL) continue;
    if (!InFile(ph.p_offset, ph.p_filesz, size)) return "a segment lies past the end (truncated?)";
  }
  for (uint16_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, p + eh.e_shoff + uint64_t{i} * sizeof(Elf64_Shdr), sizeof(sh));
    if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL) continue;
    if (!InFile(sh.sh_offset, sh.sh_size, size)) return "a section lies past the end (truncated?)";
  }
  return nullptr;
}

int LoadImpl(const void* data, size_t size, kiln_module** out) {
  if (out == nullptr) return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_module_load: out is null");
  *out = nullptr;
  if (data == nullptr) return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_module_load: data is null");
  if (const char* why = CheckElf(static_cast<const unsigned char*>(data), size)) {
    return Fail(KILN_ERROR_LOAD, std::string("kiln_module_load: ") + why);
  }
  std::unique_ptr<kiln_module> m(new kiln_module());
  std::string path;
  int fd = MemFd();
  bool temp_file = false;
  if (fd >= 0) {
    path = "/proc/self/fd/" + std::to_string(fd);
  } else {
    const char* tmp = getenv("TMPDIR");
    path = std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") + "/kiln-artifact-XXXXXX";
    fd = mkstemp(&path[0]);
    if (fd < 0) return Fail(KILN_ERROR_INTERNAL, "kiln_module_load: no memfd and no temp file");
    temp_file = true;
  }
  if (!WriteAll(fd, data, size)) {
    if (temp_file) unlink(path.c_str());
    close(fd);
    return Fail(KILN_ERROR_INTERNAL, "kiln_module_load: cannot write the artifact");
  }
  dlerror();
  m->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (temp_file) unlink(path.c_str());
  if (m->handle == nullptr) {
    const char* err = dlerror();
    close(fd);
    return Fail(KILN_ERROR_LOAD,
                std::string("kiln_module_load: dlopen failed: ") + (err ? err : "unknown error"));
  }
  // Kernels may start an OpenMP runtime's thread pool. If unloading the last module dropped the
  // OpenMP library too, its idle threads would run unmapped code: pin it (RTLD_NODELETE).
  for (const char* omp : {"libgomp.so.1", "libomp.so.5", "libomp.so", "libiomp5.so"}) {
    if (void* h = dlopen(omp, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(h);
  }
  if (temp_file) {
    close(fd);
  } else {
    m->fd = fd;
  }
  *out = m.release();
  return Ok();
}

}  // namespace

extern "C" {

int kiln_runtime_abi_version(void) { return KILN_RUNTIME_ABI_VERSION; }

const char* kiln_last_error(void) { return g_last_error.c_str(); }

int kiln_module_load(const void* data, size_t size, kiln_module** out) {
  try {
    return LoadImpl(data, size, out);
  } catch (const std::bad_alloc&) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_module_load: out of memory");
  } catch (...) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_module_load: unexpected exception");
  }
}

int kiln_module_add_kernel(kiln_module* module, const char* symbol, int32_t* out_index) {
  if (module == nullptr || symbol == nullptr || out_index == nullptr) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_module_add_kernel: null argument");
  }
  try {
    auto it = module->by_symbol.find(symbol);
    if (it != module->by_symbol.end()) {
      *out_index = it->second;
      return Ok();
    }
    dlerror();
    void* f = dlsym(module->handle, symbol);
    if (f == nullptr) {
      return Fail(KILN_ERROR_NOT_FOUND,
                  std::string("kiln_module_add_kernel: no symbol ") + symbol + " in the module");
    }
    const int32_t index = static_cast<int32_t>(module->kernels.size());
    module->kernels.push_back(reinterpret_cast<kiln_kernel_fn>(f));
    module->symbols.push_back(symbol);
    module->by_symbol[symbol] = index;
    *out_index = index;
    return Ok();
  } catch (...) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_module_add_kernel: out of memory");
  }
}

int kiln_module_num_kernels(const kiln_module* module, int32_t* out_count) {
  if (module == nullptr || out_count == nullptr) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_module_num_kernels: null argument");
  }
  *out_count = static_cast<int32_t>(module->kernels.size());
  return Ok();
}

int kiln_run_steps(const kiln_module* module, const kiln_step* steps, int32_t num_steps) {
  if (module == nullptr) return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_run_steps: null module");
  if (num_steps < 0 || (num_steps > 0 && steps == nullptr)) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_run_steps: bad step table");
  }
  const int32_t n = static_cast<int32_t>(module->kernels.size());
  // Check the whole table first, so that a bad step runs nothing.
  for (int32_t i = 0; i < num_steps; ++i) {
    if (steps[i].kernel < 0 || steps[i].kernel >= n) {
      return Fail(KILN_ERROR_INVALID_ARGUMENT,
                  "kiln_run_steps: step " + std::to_string(i) + " names kernel " +
                      std::to_string(steps[i].kernel) + " of " + std::to_string(n));
    }
  }
  for (int32_t i = 0; i < num_steps; ++i) {
    module->kernels[steps[i].kernel](steps[i].buffers, steps[i].scalars);
  }
  return Ok();
}

int kiln_run_kernel(const kiln_module* module, int32_t kernel, void* const* buffers,
                    const int64_t* scalars) {
  kiln_step step;
  step.kernel = kernel;
  step.reserved = 0;
  step.buffers = buffers;
  step.scalars = scalars;
  return kiln_run_steps(module, &step, 1);
}

int kiln_module_unload(kiln_module* module) {
  if (module == nullptr) return Ok();
  int rc = KILN_OK;
  if (module->handle != nullptr && dlclose(module->handle) != 0) {
    const char* err = dlerror();
    rc = Fail(KILN_ERROR_INTERNAL, std::string("kiln_module_unload: ") + (err ? err : "dlclose"));
  }
  if (module->fd >= 0) close(module->fd);
  delete module;
  return rc == KILN_OK ? Ok() : rc;
}

}  // extern "C"
