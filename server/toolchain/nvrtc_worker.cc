// kiln_nvrtc_worker: compiles one CUDA C++ source to a cubin (or PTX) with NVRTC, in its own
// process. kilnd runs one per compile (server/toolchain/nvrtc.h) with a time and memory limit, so
// that compiles scale across processes (threads in one process plateau) and a crash or hang in
// NVRTC never takes kilnd down. NVRTC is opened with dlopen: the same binary runs on machines
// with and without CUDA.
//
//   kiln_nvrtc_worker --nvrtc=LIB --version
//       prints NVRTC's version, e.g. "13.0"; exit 0.
//   kiln_nvrtc_worker --nvrtc=LIB --arch=sm_90 [--ptx] --src=FILE --out=FILE --log=FILE
//       exit 0: the binary is in --out; 1: the source did not compile (log in --log);
//       2: bad usage or NVRTC not loadable (message on stderr).

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The few NVRTC entry points kiln uses (nvrtc.h, stable C ABI since CUDA 7).
using nvrtcResult = int;
using nvrtcProgram = void*;
struct Nvrtc {
  const char* (*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int*, int*);
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*);
  nvrtcResult (*DestroyProgram)(nvrtcProgram*);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetPTX)(nvrtcProgram, char*);
};

int Usage(const std::string& message) {
  fprintf(stderr, "kiln_nvrtc_worker: %s\n", message.c_str());
  return 2;
}

bool Load(const std::string& library, Nvrtc* n, std::string* error) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    *error = std::string("cannot load NVRTC (") + library + "): " + dlerror();
    return false;
  }
  struct Sym {
    const char* name;
    void** slot;
  } syms[] = {
      {"nvrtcGetErrorString", reinterpret_cast<void**>(&n->GetErrorString)},
      {"nvrtcVersion", reinterpret_cast<void**>(&n->Version)},
      {"nvrtcCreateProgram", reinterpret_cast<void**>(&n->CreateProgram)},
      {"nvrtcDestroyProgram", reinterpret_cast<void**>(&n->DestroyProgram)},
      {"nvrtcCompileProgram", reinterpret_cast<void**>(&n->CompileProgram)},
      {"nvrtcGetProgramLogSize", reinterpret_cast<void**>(&n->GetProgramLogSize)},
      {"nvrtcGetProgramLog", reinterpret_cast<void**>(&n->GetProgramLog)},
      {"nvrtcGetCUBINSize", reinterpret_cast<void**>(&n->GetCUBINSize)},
      {"nvrtcGetCUBIN", reinterpret_cast<void**>(&n->GetCUBIN)},
      {"nvrtcGetPTXSize", reinterpret_cast<void**>(&n->GetPTXSize)},
      {"nvrtcGetPTX", reinterpret_cast<void**>(&n->GetPTX)},
  };
  for (const Sym& s : syms) {
    *s.slot = dlsym(handle, s.name);
    if (*s.slot == nullptr) {
      *error = std::string(library) + " has no symbol " + s.name + "; is it NVRTC?";
      return false;
    }
  }
  return true;
}

bool WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  std::string library, arch, src, out, log;
  bool version = false, ptx = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&a](const char* name) -> const char* {
      size_t n = strlen(name);
      return a.compare(0, n, name) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--nvrtc=")) {
      library = v;
    } else if (const char* v = value("--arch=")) {
      arch = v;
    } else if (const char* v = value("--src=")) {
      src = v;
    } else if (const char* v = value("--out=")) {
      out = v;
    } else if (const char* v = value("--log=")) {
      log = v;
    } else if (a == "--version") {
      version = true;
    } else if (a == "--ptx") {
      ptx = true;
    } else {
      return Usage("unknown argument '" + a + "'");
    }
  }
  if (library.empty()) return Usage("--nvrtc=LIBRARY is required");
  Nvrtc n{};
  std::string error;
  if (!Load(library, &n, &error)) return Usage(error);
  if (version) {
    int major = 0, minor = 0;
    if (n.Version(&major, &minor) != 0) return Usage("nvrtcVersion failed");
    printf("%d.%d\n", major, minor);
    return 0;
  }
  if (arch.size() < 4 || arch.compare(0, 3, "sm_") != 0 || src.empty() || out.empty() ||
      log.empty()) {
    return Usage("usage: --arch=sm_NN --src=FILE --out=FILE --log=FILE [--ptx]");
  }
  std::ifstream in(src, std::ios::binary);
  if (!in) return Usage("cannot read " + src);
  std::stringstream source;
  source << in.rdbuf();

  nvrtcProgram program = nullptr;
  std::string text = source.str();
  if (n.CreateProgram(&program, text.c_str(), "kiln.cu", 0, nullptr, nullptr) != 0) {
    return Usage("nvrtcCreateProgram failed");
  }
  // A real architecture gives SASS (cubin); a virtual one gives PTX for the driver to JIT.
  std::string arch_flag =
      "--gpu-architecture=" + (ptx ? "compute_" + arch.substr(3) : arch);
  std::vector<const char*> options = {arch_flag.c_str(), "--std=c++17", "-default-device"};
  nvrtcResult compiled =
      n.CompileProgram(program, static_cast<int>(options.size()), options.data());
  size_t log_size = 0;
  n.GetProgramLogSize(program, &log_size);
  std::string log_text(log_size, '\0');
  if (log_size > 0) n.GetProgramLog(program, log_text.data());
  while (!log_text.empty() && log_text.back() == '\0') log_text.pop_back();
  if (compiled != 0) {
    log_text = std::string(n.GetErrorString(compiled)) + "\n" + log_text;
    WriteFile(log, log_text);
    n.DestroyProgram(&program);
    return 1;
  }
  size_t size = 0;
  std::string binary;
  if (ptx) {
    n.GetPTXSize(program, &size);
    binary.resize(size);
    n.GetPTX(program, binary.data());
    while (!binary.empty() && binary.back() == '\0') binary.pop_back();
  } else {
    n.GetCUBINSize(program, &size);
    binary.resize(size);
    n.GetCUBIN(program, binary.data());
  }
  n.DestroyProgram(&program);
  if (!WriteFile(out, binary) || !WriteFile(log, log_text)) return Usage("cannot write " + out);
  return 0;
}
