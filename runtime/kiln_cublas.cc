// Implementation of the C ABI in kiln_cublas.h. Standalone: C++17, libc and libdl only; cuBLASLt is
// opened with dlopen and the few declarations it needs are written here (values of cublasLt.h,
// library_types.h and cublas_api.h).

#include "kiln_cublas.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

// ---- cuBLASLt, declared by hand ----
using Status = int;  // cublasStatus_t
using Handle = void*;
using MatmulDesc = void*;
using Layout = void*;
using Preference = void*;
struct Algo {  // cublasLtMatmulAlgo_t
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};
constexpr Status kStatusSuccess = 0;
constexpr Status kStatusNotSupported = 15;
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;              // cudaDataType
constexpr int kCompute32F = 68, kCompute32FFastTf32 = 77;       // cublasComputeType_t
constexpr int32_t kOpN = 0, kOpT = 1;                           // cublasOperation_t
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8;
constexpr uint32_t kEpilogueDefault = 1, kEpilogueBias = 4;
constexpr int kLayoutBatchCount = 5, kLayoutStridedBatchOffset = 6;
constexpr int kPrefMaxWorkspaceBytes = 1, kPrefMinAlignmentA = 5;  // B, C, D: 6, 7, 8
// kiln.v1.DType values (proto/kiln/v1/graph.proto).
constexpr int64_t kDTypeF32 = 1, kDTypeF16 = 3, kDTypeBF16 = 4;
// Param indices (server/lower/gemm_step.h GemmParam).
enum {
  kBatch, kM, kN, kK, kDType, kABs, kARs, kACs, kBBs, kBRs, kBCs, kDBs, kDRs, kCKind, kCBs, kCRs, kFlags,
  kWorkspaceBytes
};
constexpr int64_t kCNone = 0, kCBias = 1, kCMatrix = 2;
static_assert(kWorkspaceBytes + 1 == KILN_GEMM_NUM_PARAMS, "params out of step with kiln_cublas.h");

struct Lt {
  Status (*Create)(Handle*);
  size_t (*GetVersion)();
  const char* (*GetStatusName)(Status);  // optional
  Status (*MatmulDescCreate)(MatmulDesc*, int, int);
  Status (*MatmulDescDestroy)(MatmulDesc);
  Status (*MatmulDescSetAttribute)(MatmulDesc, int, const void*, size_t);
  Status (*MatrixLayoutCreate)(Layout*, int, uint64_t, uint64_t, int64_t);
  Status (*MatrixLayoutDestroy)(Layout);
  Status (*MatrixLayoutSetAttribute)(Layout, int, const void*, size_t);
  Status (*MatmulPreferenceCreate)(Preference*);
  Status (*MatmulPreferenceDestroy)(Preference);
  Status (*MatmulPreferenceSetAttribute)(Preference, int, const void*, size_t);
  Status (*MatmulAlgoGetHeuristic)(Handle, MatmulDesc, Layout, Layout, Layout, Layout, Preference, int,
                                   HeuristicResult*, int*);
  Status (*Matmul)(Handle, MatmulDesc, const void*, const void*, Layout, const void*, Layout, const void*,
                   const void*, Layout, void*, Layout, const Algo*, void*, size_t, void*);
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
Lt g_lt;
int g_init_code = KILN_ERROR_UNAVAILABLE;
std::string g_init_error;

std::string StatusText(Status s) {
  const char* name = g_lt.GetStatusName != nullptr ? g_lt.GetStatusName(s) : nullptr;
  return name != nullptr ? std::string(name) : "cublasStatus_t " + std::to_string(s);
}

int LtFail(const char* call, Status s) {
  return Fail(s == kStatusNotSupported ? KILN_ERROR_UNSUPPORTED : KILN_ERROR_CUBLAS,
              std::string(call) + ": " + StatusText(s));
}

void* OpenLibrary(std::string* tried) {
  const char* env = getenv("KILN_LIBCUBLASLT_PATH");
  if (env != nullptr && env[0] != '\0') {
    *tried = env;
    return dlopen(env, RTLD_NOW | RTLD_LOCAL);
  }
  const char* names[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
  for (const char* name : names) {  // the copy torch loaded
    if (void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return h;
  }
  *tried = "libcublasLt.so.13, libcublasLt.so.12 (loaded in the process or not), libcublasLt.so";
  for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return nullptr;
}

void LoadLt() {
  std::string tried;
  void* h = OpenLibrary(&tried);
  if (h == nullptr) {
    const char* err = dlerror();
    g_init_error = "cannot load cuBLASLt (tried " + tried + "; set KILN_LIBCUBLASLT_PATH to use another path): " +
                   (err != nullptr ? err : "dlopen failed");
    return;
  }
  struct Sym {
    const char* name;
    void** slot;
    bool required;
  } syms[] = {
      {"cublasLtCreate", reinterpret_cast<void**>(&g_lt.Create), true},
      {"cublasLtGetVersion", reinterpret_cast<void**>(&g_lt.GetVersion), true},
      {"cublasLtGetStatusName", reinterpret_cast<void**>(&g_lt.GetStatusName), false},
      {"cublasLtMatmulDescCreate", reinterpret_cast<void**>(&g_lt.MatmulDescCreate), true},
      {"cublasLtMatmulDescDestroy", reinterpret_cast<void**>(&g_lt.MatmulDescDestroy), true},
      {"cublasLtMatmulDescSetAttribute", reinterpret_cast<void**>(&g_lt.MatmulDescSetAttribute), true},
      {"cublasLtMatrixLayoutCreate", reinterpret_cast<void**>(&g_lt.MatrixLayoutCreate), true},
      {"cublasLtMatrixLayoutDestroy", reinterpret_cast<void**>(&g_lt.MatrixLayoutDestroy), true},
      {"cublasLtMatrixLayoutSetAttribute", reinterpret_cast<void**>(&g_lt.MatrixLayoutSetAttribute), true},
      {"cublasLtMatmulPreferenceCreate", reinterpret_cast<void**>(&g_lt.MatmulPreferenceCreate), true},
      {"cublasLtMatmulPreferenceDestroy", reinterpret_cast<void**>(&g_lt.MatmulPreferenceDestroy), true},
      {"cublasLtMatmulPreferenceSetAttribute", reinterpret_cast<void**>(&g_lt.MatmulPreferenceSetAttribute), true},
      {"cublasLtMatmulAlgoGetHeuristic", reinterpret_cast<void**>(&g_lt.MatmulAlgoGetHeuristic), true},
      {"cublasLtMatmul", reinterpret_cast<void**>(&g_lt.Matmul), true},
  };
  for (const Sym& s : syms) {
    *s.slot = dlsym(h, s.name);
    if (*s.slot == nullptr && s.required) {
      g_init_error = std::string("cuBLASLt has no symbol ") + s.name + " (too old?)";
      std::memset(&g_lt, 0, sizeof(g_lt));
      return;
    }
  }
  g_init_code = KILN_OK;
}

int EnsureLt() {
  std::call_once(g_once, LoadLt);
  if (g_init_code != KILN_OK) return Fail(g_init_code, g_init_error);
  return KILN_OK;
}

// The descriptors and algorithm of one GEMM shape (destroyed with the cache).
struct Plan {
  MatmulDesc desc = nullptr;
  Layout a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // cuBLAS's A (our B), B (our A), C, D
  Algo algo{};
  size_t workspace = 0;

  ~Plan() {
    for (Layout l : {a, b, c, d}) {
      if (l != nullptr) g_lt.MatrixLayoutDestroy(l);
    }
    if (desc != nullptr) g_lt.MatmulDescDestroy(desc);
  }
};

struct Device {
  std::mutex mu;
  Handle handle = nullptr;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans;
};
constexpr size_t kMaxPlans = 4096;  // per device; the cache is emptied when full

std::mutex g_devices_mu;
std::map<int, std::unique_ptr<Device>> g_devices;

int64_t Alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

const char* CheckParams(const int64_t* p) {
  auto layout_ok = [](int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
    const int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    return (cs == 1 && rs >= c1) || (rs == 1 && cs >= r1);
  };
  if (p[kBatch] < 1 || p[kBatch] > INT32_MAX || p[kM] < 1 || p[kN] < 1 || p[kK] < 1) return "bad sizes";
  if (p[kDType] != kDTypeF32 && p[kDType] != kDTypeF16 && p[kDType] != kDTypeBF16) return "bad dtype";
  if (!layout_ok(p[kM], p[kK], p[kARs], p[kACs])) return "bad layout of A";
  if (!layout_ok(p[kK], p[kN], p[kBRs], p[kBCs])) return "bad layout of B";
  if (p[kDRs] < p[kN]) return "bad layout of D";
  for (int s : {kABs, kBBs, kDBs}) {
    if (p[kBatch] == 1 ? p[s] != 0 : p[s] <= 0) return "bad batch stride";
  }
  if (p[kCKind] < kCNone || p[kCKind] > kCMatrix) return "bad c_kind";
  if (p[kCKind] == kCBias && p[kBatch] != 1) return "a bias with batch > 1";
  if (p[kCKind] == kCMatrix && (p[kCRs] != p[kDRs] || p[kCBs] != p[kDBs])) return "a C matrix not laid out like D";
  if (p[kWorkspaceBytes] < 0) return "bad workspace size";
  return nullptr;
}

int MakeLayout(int type, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch, int64_t batch_stride, Layout* out) {
  Status s = g_lt.MatrixLayoutCreate(out, type, rows, cols, ld);
  if (s != kStatusSuccess) return LtFail("cublasLtMatrixLayoutCreate", s);
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    s = g_lt.MatrixLayoutSetAttribute(*out, kLayoutBatchCount, &count, sizeof(count));
    if (s == kStatusSuccess) {
      s = g_lt.MatrixLayoutSetAttribute(*out, kLayoutStridedBatchOffset, &batch_stride, sizeof(batch_stride));
    }
    if (s != kStatusSuccess) return LtFail("cublasLtMatrixLayoutSetAttribute", s);
  }
  return KILN_OK;
}

// Row-major D = A @ B is column-major D^T = B^T @ A^T: cuBLAS's A is our B, its B our A.
int BuildPlan(Handle handle, const int64_t* p, const int64_t* align, uint64_t ws_bytes, Plan* plan) {
  const int type = p[kDType] == kDTypeF32 ? kR32F : p[kDType] == kDTypeF16 ? kR16F : kR16BF;
  const bool tf32 = p[kDType] == kDTypeF32 && (p[kFlags] & 1) != 0;
  Status s = g_lt.MatmulDescCreate(&plan->desc, tf32 ? kCompute32FFastTf32 : kCompute32F, kR32F);
  if (s != kStatusSuccess) return LtFail("cublasLtMatmulDescCreate", s);
  const int64_t m = p[kM], n = p[kN], k = p[kK], batch = p[kBatch];
  const bool b_row_major = p[kBCs] == 1;  // our B [k, n] with unit column stride
  const bool a_row_major = p[kACs] == 1;
  const int32_t trans_a = b_row_major ? kOpN : kOpT, trans_b = a_row_major ? kOpN : kOpT;
  const uint32_t epilogue = p[kCKind] == kCBias ? kEpilogueBias : kEpilogueDefault;
  s = g_lt.MatmulDescSetAttribute(plan->desc, kDescTransA, &trans_a, sizeof(trans_a));
  if (s == kStatusSuccess) s = g_lt.MatmulDescSetAttribute(plan->desc, kDescTransB, &trans_b, sizeof(trans_b));
  if (s == kStatusSuccess) s = g_lt.MatmulDescSetAttribute(plan->desc, kDescEpilogue, &epilogue, sizeof(epilogue));
  if (s != kStatusSuccess) return LtFail("cublasLtMatmulDescSetAttribute", s);
  int rc = b_row_major ? MakeLayout(type, n, k, p[kBRs], batch, p[kBBs], &plan->a)
                       : MakeLayout(type, k, n, p[kBCs], batch, p[kBBs], &plan->a);
  if (rc == KILN_OK) {
    rc = a_row_major ? MakeLayout(type, k, m, p[kARs], batch, p[kABs], &plan->b)
                     : MakeLayout(type, m, k, p[kACs], batch, p[kABs], &plan->b);
  }
  if (rc == KILN_OK) rc = MakeLayout(type, n, m, p[kDRs], batch, p[kDBs], &plan->d);
  if (rc == KILN_OK) rc = MakeLayout(type, n, m, p[kDRs], batch, p[kDBs], &plan->c);
  if (rc != KILN_OK) return rc;
  Preference pref = nullptr;
  s = g_lt.MatmulPreferenceCreate(&pref);
  if (s != kStatusSuccess) return LtFail("cublasLtMatmulPreferenceCreate", s);
  const uint64_t max_ws = ws_bytes;
  s = g_lt.MatmulPreferenceSetAttribute(pref, kPrefMaxWorkspaceBytes, &max_ws, sizeof(max_ws));
  for (int i = 0; i < 4 && s == kStatusSuccess; ++i) {  // cuBLAS's A, B, C, D
    const uint32_t a = static_cast<uint32_t>(align[i]);
    s = g_lt.MatmulPreferenceSetAttribute(pref, kPrefMinAlignmentA + i, &a, sizeof(a));
  }
  HeuristicResult result{};
  int found = 0;
  if (s == kStatusSuccess) {
    s = g_lt.MatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->d, pref, 1, &result, &found);
  }
  g_lt.MatmulPreferenceDestroy(pref);
  if (s != kStatusSuccess) return LtFail("cublasLtMatmulAlgoGetHeuristic", s);
  if (found == 0) {
    return Fail(KILN_ERROR_UNSUPPORTED, "cublasLtMatmulAlgoGetHeuristic: no algorithm for this GEMM");
  }
  plan->algo = result.algo;
  plan->workspace = result.workspace_size;
  return KILN_OK;
}

int MatmulImpl(int device, const int64_t* p, double alpha_d, double beta_d, void* const* buffers, void* stream) {
  if (const char* why = CheckParams(p)) return Fail(KILN_ERROR_INVALID_ARGUMENT, std::string("kiln_cublas_matmul: ") + why);
  void* d = buffers[0];
  const void* a = buffers[1];
  const void* b = buffers[2];
  const void* c = buffers[3];
  void* ws = buffers[4];
  if (d == nullptr || a == nullptr || b == nullptr || (p[kCKind] != kCNone) != (c != nullptr) ||
      (p[kWorkspaceBytes] > 0 && ws == nullptr)) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cublas_matmul: buffers do not match the params");
  }
  if (int rc = EnsureLt(); rc != KILN_OK) return rc;
  if (int rc = kiln_cuda_make_device_current(device); rc != KILN_OK) {
    return Fail(rc, std::string("kiln_cublas_matmul: ") + kiln_cuda_last_error());
  }
  Device* dev = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_devices_mu);
    std::unique_ptr<Device>& slot = g_devices[device];
    if (!slot) slot = std::make_unique<Device>();
    dev = slot.get();
  }
  std::lock_guard<std::mutex> lock(dev->mu);
  if (dev->handle == nullptr) {
    const Status s = g_lt.Create(&dev->handle);
    if (s != kStatusSuccess) return LtFail("cublasLtCreate", s);
  }
  // cuBLAS's A, B, C, D are our B, A, C (or D), D.
  const int64_t align[4] = {Alignment(b), Alignment(a), Alignment(c != nullptr && p[kCKind] == kCMatrix ? c : d),
                            Alignment(d)};
  // cublasLtMatmul needs a 256-byte aligned workspace; a misaligned one (a plan placed it so) is
  // not used at all, so only algorithms without workspace are chosen.
  const uint64_t ws_bytes =
      ws != nullptr && reinterpret_cast<uintptr_t>(ws) % 256 == 0 ? static_cast<uint64_t>(p[kWorkspaceBytes]) : 0;
  std::vector<int64_t> key(p, p + KILN_GEMM_NUM_PARAMS);
  key.insert(key.end(), align, align + 4);
  key.push_back(static_cast<int64_t>(ws_bytes));
  auto it = dev->plans.find(key);
  if (it == dev->plans.end()) {
    auto plan = std::make_unique<Plan>();
    if (int rc = BuildPlan(dev->handle, p, align, ws_bytes, plan.get()); rc != KILN_OK) return rc;
    if (dev->plans.size() >= kMaxPlans) dev->plans.clear();
    it = dev->plans.emplace(std::move(key), std::move(plan)).first;
  }
  Plan& plan = *it->second;
  if (p[kCKind] == kCBias) {
    const Status s = g_lt.MatmulDescSetAttribute(plan.desc, kDescBiasPointer, &c, sizeof(c));
    if (s != kStatusSuccess) return LtFail("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", s);
  }
  const float alpha = static_cast<float>(alpha_d);
  const float beta = p[kCKind] == kCMatrix ? static_cast<float>(beta_d) : 0.0f;
  const void* c_ptr = p[kCKind] == kCMatrix ? c : d;
  const Status s = g_lt.Matmul(dev->handle, plan.desc, &alpha, b, plan.a, a, plan.b, &beta, c_ptr, plan.c, d, plan.d,
                               &plan.algo, ws_bytes > 0 ? ws : nullptr, static_cast<size_t>(ws_bytes), stream);
  if (s != kStatusSuccess) return LtFail("cublasLtMatmul", s);
  return Ok();
}

}  // namespace

extern "C" {

const char* kiln_cublas_last_error(void) { return g_error.c_str(); }

int kiln_cublas_init(size_t* out_version) {
  if (int rc = EnsureLt(); rc != KILN_OK) return rc;
  if (out_version != nullptr) *out_version = g_lt.GetVersion();
  return Ok();
}

int kiln_cublas_matmul(int device, const int64_t* params, int32_t num_params, double alpha, double beta,
                       void* const* buffers, void* stream) {
  if (params == nullptr || buffers == nullptr || num_params != KILN_GEMM_NUM_PARAMS) {
    return Fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cublas_matmul: null params/buffers or " +
                                                 std::to_string(num_params) + " params (expected " +
                                                 std::to_string(KILN_GEMM_NUM_PARAMS) + ")");
  }
  try {
    return MatmulImpl(device, params, alpha, beta, buffers, stream);
  } catch (const std::bad_alloc&) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_cublas_matmul: out of memory");
  } catch (...) {
    return Fail(KILN_ERROR_INTERNAL, "kiln_cublas_matmul: unexpected exception");
  }
}

}  // extern "C"
