// What the standalone device experiments in tests/gpu share (softmax_bulk_experiment.cu,
// softmax_longrow_experiment.cu): error checks, the bulk copy engine and mbarriers in inline PTX,
// and a median timing of a launch by CUDA events. Header-only; each experiment is built alone with
// nvcc (its header says how).
#ifndef KILN_TESTS_GPU_EXPERIMENT_COMMON_CUH_
#define KILN_TESTS_GPU_EXPERIMENT_COMMON_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1);} } while (0)

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint64_t* b, uint32_t parity) {
  uint32_t ok;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(ok) : "r"(saddr(b)), "r"(parity) : "memory");
  return ok != 0;
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(b)) : "memory");
}
__device__ __forceinline__ float ex2(float x) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }

struct Timer {
  cudaEvent_t a, b;
  Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
};

// Median microseconds of `launch` over `reps` timed runs (after three untimed ones).
template <typename F>
static float median_us(F launch, int reps) {
  Timer t;
  std::vector<float> ms;
  for (int i = 0; i < 3; ++i) launch();
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(t.a));
    launch();
    CK(cudaEventRecord(t.b));
    CK(cudaEventSynchronize(t.b));
    float m; CK(cudaEventElapsedTime(&m, t.a, t.b)); ms.push_back(m * 1000.f);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

#endif  // KILN_TESTS_GPU_EXPERIMENT_COMMON_CUH_
