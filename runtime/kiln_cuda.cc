// Implementation of the C ABI in kiln_cuda.h. Standalone: C++17, libc and libdl only; the NVIDIA
// driver is opened with dlopen and the few driver API declarations it needs are written here.

#include "kiln_cuda.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdlib.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// ---- the driver API, declared by hand (cuda.h, stable C ABI) ----
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
constexpr CUresult kCudaSuccess = 0;
constexpr int kAttrMaxThreadsPerBlock = 0;      // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
constexpr int kAttrMaxDynamicSharedBytes = 8;   // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kAttrRequiredClusterWidth = 11;   // CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH
constexpr int kAttrNonPortableCluster = 14;     // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
constexpr int kPortableClusterSize = 8;
constexpr uint16_t kEmCuda = 190;
constexpr int kMaxParams = 512;                 // 4 KB of 8-byte kernel parameters

struct Driver {
  CUresult (*Init)(unsigned int);
  CUresult (*DriverGetVersion)(int*);
  CUresult (*GetErrorName)(CUresult, const char**);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetDevice)(CUdevice*);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncGetAttribute)(int*, int, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*);  // optional (12.4+)
};

thread_local std::string g_error;

int Fail(int code, const std::string& message) {
  g_error = message;
  return code;
}

int Ok() {
  g_error.clear();
  return KILN_OK;
}

std::once_flag g_once;
Driver g_driver;
int g_init_code = KILN_ERROR_UNAVAILABLE;
std::string g_init_error;

std::string ResultText(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_driver.GetErrorName != nullptr) g_driver.GetErrorName(r, &name);
  if (g_driver.GetErrorString != nullptr) g_driver.GetErrorString(r, &text);
  std::string out = name != nullptr ? name : ("CUresult " + std::to_string(r));
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

int CudaFail(const char* call, CUresult r) {
  return Fail(KILN_ERROR_CUDA, std::string(call) + ": " + ResultText(r));
}

void LoadDriver() {
  const char* env = getenv("KILN_LIBCUDA_PATH");
  const std::string path = env != nullptr && env[0] != '\0' ? env : "libcuda.so.1";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = dlerror();
    g_init_error = "cannot load the NVIDIA driver library " + path + " (no NVIDIA driver on this "
                   "machine? set KILN_LIBCUDA_PATH to use another path): " +
                   (err != nullptr ? err : "dlopen failed");
    return;
  }
  struct Sym {
    const char* names[2];
    void** slot;
    bool required;
  } syms[] = {
      {{"cuInit", nullptr}, reinterpret_cast<void**>(&g_driver.Init), true},
      {{"cuDriverGetVersion", nullptr}, reinterpret_cast<void**>(&g_driver.DriverGetVersion), true},
      {{"cuGetErrorName", nullptr}, reinterpret_cast<void**>(&g_driver.GetErrorName), true},
      {{"cuGetErrorString", nullptr}, reinterpret_cast<void**>(&g_driver.GetErrorString), true},
      {{"cuDeviceGet", nullptr}, reinterpret_cast<void**>(&g_driver.DeviceGet), true},
      {{"cuDeviceGetCount", nullptr}, reinterpret_cast<void**>(&g_driver.DeviceGetCount), true},
      {{"cuCtxGetCurrent", nullptr}, reinterpret_cast<void**>(&g_driver.CtxGetCurrent), true},
      {{"cuCtxSetCurrent", nullptr}, reinterpret_cast<void**>(&g_driver.CtxSetCurrent), true},
      {{"cuCtxGetDevice", nullptr}, reinterpret_cast<void**>(&g_driver.CtxGetDevice), true},
      {{"cuDevicePrimaryCtxRetain", nullptr},
       reinterpret_cast<void**>(&g_driver.DevicePrimaryCtxRetain), true},
      {{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"},
       reinterpret_cast<void**>(&g_driver.DevicePrimaryCtxRelease), true},
      {{"cuModuleLoadData", nullptr}, reinterpret_cast<void**>(&g_driver.ModuleLoadData), true},
      {{"cuModuleUnload", nullptr}, reinterpret_cast<void**>(&g_driver.ModuleUnload), true},
      {{"cuModuleGetFunction", nullptr}, reinterpret_cast<void**>(&g_driver.ModuleGetFunction), true},
      {{"cuFuncGetAttribute", nullptr}, reinterpret_cast<void**>(&g_driver.FuncGetAttribute), true},
      {{"cuFuncSetAttribute", nullptr}, reinterpret_cast<void**>(&g_driver.FuncSetAttribute), true},
      {{"cuLaunchKernel", nullptr}, reinterpret_cast<void**>(&g_driver.LaunchKernel), true},
      {{"cuStreamSynchronize", nullptr}, reinterpret_cast<void**>(&g_driver.StreamSynchronize), true},
      {{"cuFuncGetParamInfo", nullptr}, reinterpret_cast<void**>(&g_driver.FuncGetParamInfo), false},
  };
  for (const Sym& s : syms) {
    *s.slot = nullptr;
    for (const char* name : s.names) {
      if (name != nullptr && *s.slot == nullptr) *s.slot = dlsym(h, name);
    }
    if (*s.slot == nullptr && s.required) {
      g_init_error = path + " has no symbol " + s.names[0] + " (driver too old?)";
      std::memset(&g_driver, 0, sizeof(g_driver));
      return;
    }
  }
  const CUresult r = g_driver.Init(0);
  if (r != kCudaSuccess) {
    g_init_error = "cuInit: " + ResultText(r) + " (no usable NVIDIA GPU?)";
    return;
  }
  g_init_code = KILN_OK;
}

int EnsureDriver() {
  std::call_once(g_once, LoadDriver);
  if (g_init_code != KILN_OK) return Fail(g_init_code, g_init_error);
  return KILN_OK;
}

bool InImage(uint64_t offset, uint64_t length, size_t size) {
  return offset <= size && length <= size - offset;
}

// A cubin the driver can read without running past `size`: 64-bit little-endian ELF for EM_CUDA
// whose headers, segments and sections lie inside.
const char* CheckCubin(const unsigned char* p, size_t size) {
  if (size < sizeof(Elf64_Ehdr)) return "too short for a cubin";
  Elf64_Ehdr eh;
  std::memcpy(&eh, p, sizeof(eh));
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return "not a 64-bit little-endian ELF file";
  }
  if (eh.e_machine != kEmCuda) return "an ELF file that is not a cubin (machine is not EM_CUDA)";
  if (eh.e_phnum != 0 && (eh.e_phentsize != sizeof(Elf64_Phdr) ||
                          !InImage(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr), size))) {
    return "bad program headers (truncated?)";
  }
  if (eh.e_shnum == 0 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
      !InImage(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr), size)) {
    return "bad section headers (truncated?)";
  }
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, p + eh.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr), sizeof(ph));
    if (ph.p_type != PT_NULL && !InImage(ph.p_offset, ph.p_filesz, size)) {
      return "a segment lies past the end (truncated?)";
    }
  }
  for (uint16_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, p + eh.e_shoff + uint64_t{i} * sizeof(Elf64_Shdr), sizeof(sh));
    if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL) continue;
    if (!InImage(sh.sh_offset, sh.sh_size, size)) return "a section lies past the end (truncated?)";
  }
  return nullptr;
}

bool LooksLikePtx(const char* p, size_t size) {
  const std::string head(p, size < 4096 ? size : 4096);
  return head.find(".version") != std::string::npos && head.find(".target") != std::string::npos;
}

struct Kernel {
  CUfunction function = nullptr;
  int max_threads = 0;
  int num_params = -1;  // -1: the driver cannot tell
};

}  // namespace

struct kiln_cuda_module {
  CUmodule module = nullptr;
  CUcontext context = nullptr;
  int retained_device = -1;  // the primary context of this device was retained by the load
  std::vector<Kernel> kernels;
  std::unordered_map<std::string, int32_t> by_symbol;
};

namespace {

int MakeCurrent(CUcontext ctx) {
  CUcontext current = nullptr;
  CUresult r = g_driver.CtxGetCurrent(&current);
  if (r != kCudaSuccess) return CudaFail("cuCtxGetCurrent", r);
  if (current == ctx) return KILN_OK;
  r = g_driver.CtxSetCurrent(ctx);
  if (r != kCudaSuccess) return CudaFail("cuCtxSetCurrent", r);
  return KILN_OK;
}

int LoadImpl(const void* data, size_t size, int device, kiln_cuda_module** out) {
  if (out == nullptr) return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_module_load: out is null");
  *out = nullptr;
  if (data == nullptr || size == 0) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_module_load: no bytes");
  }
  const unsigned char* p = static_cast<const unsigned char*>(data);
  std::string ptx;
  if (size >= 4 && std::memcmp(p, ELFMAG, SELFMAG) == 0) {
    if (const char* why = CheckCubin(p, size)) {
      return Fail(KILN_ERROR_LOAD, std::string("kiln_cuda_module_load: ") + why);
    }
  } else if (LooksLikePtx(static_cast<const char*>(data), size)) {
    ptx.assign(static_cast<const char*>(data), size);  // NUL-terminated copy
  } else {
    return Fail(KILN_ERROR_LOAD, "kiln_cuda_module_load: neither a cubin nor PTX");
  }
  if (int rc = EnsureDriver(); rc != KILN_OK) return rc;
  std::unique_ptr<kiln_cuda_module> m(new kiln_cuda_module());
  CUresult r = g_driver.CtxGetCurrent(&m->context);
  if (r != kCudaSuccess) return CudaFail("cuCtxGetCurrent", r);
  if (m->context == nullptr) {
    int count = 0;
    r = g_driver.DeviceGetCount(&count);
    if (r != kCudaSuccess) return CudaFail("cuDeviceGetCount", r);
    if (device < 0 || device >= count) {
      return Fail(count == 0 ? KILN_ERROR_UNAVAILABLE : KILN_ERROR_INVALID_ARGUMENT,
                  "kiln_cuda_module_load: device " + std::to_string(device) + " of " +
                      std::to_string(count));
    }
    CUdevice dev = 0;
    r = g_driver.DeviceGet(&dev, device);
    if (r != kCudaSuccess) return CudaFail("cuDeviceGet", r);
    r = g_driver.DevicePrimaryCtxRetain(&m->context, dev);
    if (r != kCudaSuccess) return CudaFail("cuDevicePrimaryCtxRetain", r);
    m->retained_device = dev;
    r = g_driver.CtxSetCurrent(m->context);
    if (r != kCudaSuccess) {
      g_driver.DevicePrimaryCtxRelease(dev);
      return CudaFail("cuCtxSetCurrent", r);
    }
  }
  r = g_driver.ModuleLoadData(&m->module, ptx.empty() ? data : ptx.c_str());
  if (r != kCudaSuccess) {
    if (m->retained_device >= 0) g_driver.DevicePrimaryCtxRelease(m->retained_device);
    return Fail(r == 200 || r == 209 || r == 218 || r == 222 ? KILN_ERROR_LOAD : KILN_ERROR_CUDA,
                "cuModuleLoadData: " + ResultText(r) +
                    " (a cubin for another GPU architecture, or a PTX newer than the driver?)");
  }
  *out = m.release();
  return Ok();
}

}  // namespace

extern "C" {

const char* kiln_cuda_last_error(void) { return g_error.c_str(); }

int kiln_cuda_init(void) {
  if (int rc = EnsureDriver(); rc != KILN_OK) return rc;
  return Ok();
}

int kiln_cuda_driver_version(int* out_version) {
  if (out_version == nullptr) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_driver_version: null argument");
  }
  if (int rc = EnsureDriver(); rc != KILN_OK) return rc;
  const CUresult r = g_driver.DriverGetVersion(out_version);
  if (r != kCudaSuccess) return CudaFail("cuDriverGetVersion", r);
  return Ok();
}

int kiln_cuda_module_load(const void* data, size_t size, int device, kiln_cuda_module** out) {
  try {
    return LoadImpl(data, size, device, out);
  } catch (const std::bad_alloc&) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_cuda_module_load: out of memory");
  } catch (...) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_cuda_module_load: unexpected exception");
  }
}

int kiln_cuda_module_add_kernel(kiln_cuda_module* module, const char* symbol, int32_t* out_index) {
  if (module == nullptr || symbol == nullptr || out_index == nullptr) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_module_add_kernel: null argument");
  }
  try {
    auto it = module->by_symbol.find(symbol);
    if (it != module->by_symbol.end()) {
      *out_index = it->second;
      return Ok();
    }
    if (int rc = MakeCurrent(module->context); rc != KILN_OK) return rc;
    Kernel k;
    CUresult r = g_driver.ModuleGetFunction(&k.function, module->module, symbol);
    if (r != kCudaSuccess) {
      return Fail(KILN_ERROR_NOT_FOUND, std::string("kiln_cuda_module_add_kernel: no kernel ") +
                                            symbol + " in the module (" + ResultText(r) + ")");
    }
    r = g_driver.FuncGetAttribute(&k.max_threads, kAttrMaxThreadsPerBlock, k.function);
    if (r != kCudaSuccess) return CudaFail("cuFuncGetAttribute", r);
    // A kernel of __cluster_dims__ over the portable 8 blocks (kiln's 16 x 512-thread row
    // clusters) launches only once it allows non-portable cluster sizes.
    int cluster_width = 0;
    if (g_driver.FuncGetAttribute(&cluster_width, kAttrRequiredClusterWidth, k.function) ==
            kCudaSuccess &&
        cluster_width > kPortableClusterSize) {
      r = g_driver.FuncSetAttribute(k.function, kAttrNonPortableCluster, 1);
      if (r != kCudaSuccess) {
        return Fail(KILN_ERROR_CUDA, std::string("kiln_cuda_module_add_kernel: kernel ") + symbol +
                                         " has clusters of " + std::to_string(cluster_width) +
                                         " blocks, and this driver or GPU refuses sizes over 8 "
                                         "(cuFuncSetAttribute: " + ResultText(r) + ")");
      }
    }
    if (g_driver.FuncGetParamInfo != nullptr) {
      size_t offset = 0, bytes = 0;
      int n = 0;
      while (n <= kMaxParams &&
             g_driver.FuncGetParamInfo(k.function, static_cast<size_t>(n), &offset, &bytes) ==
                 kCudaSuccess) {
        ++n;
      }
      k.num_params = n;
    }
    const int32_t index = static_cast<int32_t>(module->kernels.size());
    module->kernels.push_back(k);
    module->by_symbol[symbol] = index;
    *out_index = index;
    return Ok();
  } catch (...) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_cuda_module_add_kernel: out of memory");
  }
}

int kiln_cuda_module_num_kernels(const kiln_cuda_module* module, int32_t* out_count) {
  if (module == nullptr || out_count == nullptr) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_module_num_kernels: null argument");
  }
  *out_count = static_cast<int32_t>(module->kernels.size());
  return Ok();
}

int kiln_cuda_run_launches(const kiln_cuda_module* module, const kiln_cuda_launch* launches,
                           int32_t num_launches, void* stream) {
  if (module == nullptr) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_run_launches: null module");
  }
  if (num_launches < 0 || (num_launches > 0 && launches == nullptr)) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_run_launches: bad launch table");
  }
  const int32_t n = static_cast<int32_t>(module->kernels.size());
  for (int32_t i = 0; i < num_launches; ++i) {
    const kiln_cuda_launch& l = launches[i];
    // Built only for a message: this check runs on every launch of every call.
    auto where = [i] { return "kiln_cuda_run_launches: launch " + std::to_string(i) + ": "; };
    if (l.kernel < 0 || l.kernel >= n) {
      return Fail(KILN_ERROR_INVALID_ARGUMENT,
                  where() + "kernel " + std::to_string(l.kernel) + " of " + std::to_string(n));
    }
    const Kernel& k = module->kernels[l.kernel];
    if (l.grid_x == 0 || l.grid_x > 0x7fffffffu) {
      return Fail(KILN_ERROR_INVALID_ARGUMENT, where() + "grid " + std::to_string(l.grid_x));
    }
    if (l.block_x == 0 || l.block_x > static_cast<uint32_t>(k.max_threads)) {
      return Fail(KILN_ERROR_INVALID_ARGUMENT, where() + "block " + std::to_string(l.block_x) +
                                                   " (the kernel allows 1.." +
                                                   std::to_string(k.max_threads) + ")");
    }
    if (l.shared_bytes > (1u << 20)) {
      return Fail(KILN_ERROR_INVALID_ARGUMENT, where() + "shared bytes " + std::to_string(l.shared_bytes));
    }
    if (l.num_buffers < 0 || l.num_scalars < 0 || l.num_buffers + l.num_scalars > kMaxParams ||
        (l.num_buffers > 0 && l.buffers == nullptr) || (l.num_scalars > 0 && l.scalars == nullptr)) {
      return Fail(KILN_ERROR_INVALID_ARGUMENT, where() + "bad buffer or scalar table");
    }
    if (k.num_params >= 0 && k.num_params != l.num_buffers + l.num_scalars) {
      return Fail(KILN_ERROR_INVALID_ARGUMENT,
                  where() + std::to_string(l.num_buffers + l.num_scalars) +
                      " arguments for a kernel with " + std::to_string(k.num_params) +
                      " parameters");
    }
  }
  if (num_launches == 0) return Ok();
  if (int rc = MakeCurrent(module->context); rc != KILN_OK) return rc;
  void* params[kMaxParams];
  for (int32_t i = 0; i < num_launches; ++i) {
    const kiln_cuda_launch& l = launches[i];
    const Kernel& k = module->kernels[l.kernel];
    for (int32_t j = 0; j < l.num_buffers; ++j) params[j] = const_cast<void**>(&l.buffers[j]);
    for (int32_t j = 0; j < l.num_scalars; ++j) {
      params[l.num_buffers + j] = const_cast<int64_t*>(&l.scalars[j]);
    }
    if (l.shared_bytes > 48 * 1024) {
      const CUresult r = g_driver.FuncSetAttribute(k.function, kAttrMaxDynamicSharedBytes,
                                                   static_cast<int>(l.shared_bytes));
      if (r != kCudaSuccess) return CudaFail("cuFuncSetAttribute", r);
    }
    const CUresult r = g_driver.LaunchKernel(k.function, l.grid_x, 1, 1, l.block_x, 1, 1,
                                             l.shared_bytes, static_cast<CUstream>(stream),
                                             params, nullptr);
    if (r != kCudaSuccess) {
      return Fail(KILN_ERROR_CUDA, "kiln_cuda_run_launches: launch " + std::to_string(i) +
                                       ": cuLaunchKernel: " + ResultText(r));
    }
  }
  return Ok();
}

int kiln_cuda_make_device_current(int device) {
  if (int rc = EnsureDriver(); rc != KILN_OK) return rc;
  CUcontext current = nullptr;
  CUresult r = g_driver.CtxGetCurrent(&current);
  if (r != kCudaSuccess) return CudaFail("cuCtxGetCurrent", r);
  if (current != nullptr) {
    CUdevice dev = -1;
    r = g_driver.CtxGetDevice(&dev);
    if (r != kCudaSuccess) return CudaFail("cuCtxGetDevice", r);
    if (dev == device) return Ok();
  }
  // The primary context of `device`, retained once for the life of the process (as torch's is).
  static std::mutex mu;
  static std::unordered_map<int, CUcontext> retained;
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = retained.find(device);
    if (it == retained.end()) {
      int count = 0;
      r = g_driver.DeviceGetCount(&count);
      if (r != kCudaSuccess) return CudaFail("cuDeviceGetCount", r);
      if (device < 0 || device >= count) {
        return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_make_device_current: device " +
                                                     std::to_string(device) + " of " + std::to_string(count));
      }
      CUdevice dev = 0;
      r = g_driver.DeviceGet(&dev, device);
      if (r != kCudaSuccess) return CudaFail("cuDeviceGet", r);
      r = g_driver.DevicePrimaryCtxRetain(&ctx, dev);
      if (r != kCudaSuccess) return CudaFail("cuDevicePrimaryCtxRetain", r);
      retained[device] = ctx;
    } else {
      ctx = it->second;
    }
  }
  r = g_driver.CtxSetCurrent(ctx);
  if (r != kCudaSuccess) return CudaFail("cuCtxSetCurrent", r);
  return Ok();
}

int kiln_cuda_stream_synchronize(void* stream) {
  if (int rc = EnsureDriver(); rc != KILN_OK) return rc;
  const CUresult r = g_driver.StreamSynchronize(static_cast<CUstream>(stream));
  if (r != kCudaSuccess) return CudaFail("cuStreamSynchronize", r);
  return Ok();
}

int kiln_cuda_module_unload(kiln_cuda_module* module) {
  if (module == nullptr) return Ok();
  int rc = KILN_OK;
  if (module->module != nullptr) {
    rc = MakeCurrent(module->context);
    if (rc == KILN_OK) {
      const CUresult r = g_driver.ModuleUnload(module->module);
      if (r != kCudaSuccess) rc = CudaFail("cuModuleUnload", r);
    }
  }
  if (module->retained_device >= 0) g_driver.DevicePrimaryCtxRelease(module->retained_device);
  delete module;
  return rc == KILN_OK ? Ok() : rc;
}

}  // extern "C"
