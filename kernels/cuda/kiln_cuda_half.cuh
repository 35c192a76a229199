#ifndef KILN_KERNELS_CUDA_KILN_CUDA_HALF_CUH_
#define KILN_KERNELS_CUDA_KILN_CUDA_HALF_CUH_

// Base definitions for generated CUDA kernels, compiled by NVRTC with no include path and no CUDA
// headers: fixed-width integer typedefs, KILN_DEV, bit casts, tiny type traits, and float16 /
// bfloat16 <-> float conversions. Buffers hold 16-bit patterns (uint16_t); values are computed in
// float. Conversions to 16 bits round to nearest even and keep NaN (quiet) and inf, by bit
// manipulation only (no cuda_fp16.h / cuda_bf16.h: they cost ~100 ms per NVRTC compile), so they
// are bit-identical to kernels/cpu/kiln_half.h; on sm_80+ the narrowing ones are one PTX cvt.rn
// (same bits, except that a NaN loses its sign and payload: 0x7fff, as torch's CUDA kernels).
//
// The headers of kernels/cuda also compile as plain C++17 on the host (without __CUDACC__), where
// KILN_DEV is `inline` and the device intrinsics used here have host stand-ins; helpers_test uses
// that to test conversions and merges against kernels/cpu. Embedded into every generated CUDA
// source (see kernels/cuda/BUILD.bazel).

#ifdef __CUDACC__
#define KILN_DEV __device__ __forceinline__
#ifdef __CUDACC_RTC__
// Generated kernels declare every loop variable of a lane whether or not its statements use it.
#pragma nv_diag_suppress 177
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#endif
#else  // host build of the helpers (tests)
#include <cmath>
#include <cstdint>
#include <cstring>
#define KILN_DEV inline
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline double __longlong_as_double(long long u) { double f; std::memcpy(&f, &u, 8); return f; }
#endif

namespace kiln_cuda {

template <typename T> struct is_float { static constexpr bool value = false; };
template <> struct is_float<float> { static constexpr bool value = true; };
template <> struct is_float<double> { static constexpr bool value = true; };

template <typename T> struct int_traits;
template <> struct int_traits<bool> {
  typedef unsigned char unsigned_type;
  static constexpr bool is_signed = false;
  KILN_DEV static bool lowest() { return false; }
  KILN_DEV static bool max() { return true; }
};
template <> struct int_traits<int8_t> {
  typedef uint8_t unsigned_type;
  static constexpr bool is_signed = true;
  KILN_DEV static int8_t lowest() { return -128; }
  KILN_DEV static int8_t max() { return 127; }
};
template <> struct int_traits<uint8_t> {
  typedef uint8_t unsigned_type;
  static constexpr bool is_signed = false;
  KILN_DEV static uint8_t lowest() { return 0; }
  KILN_DEV static uint8_t max() { return 255; }
};
template <> struct int_traits<int32_t> {
  typedef uint32_t unsigned_type;
  static constexpr bool is_signed = true;
  KILN_DEV static int32_t lowest() { return -2147483647 - 1; }
  KILN_DEV static int32_t max() { return 2147483647; }
};
template <> struct int_traits<int64_t> {
  typedef uint64_t unsigned_type;
  static constexpr bool is_signed = true;
  KILN_DEV static int64_t lowest() { return -9223372036854775807LL - 1; }
  KILN_DEV static int64_t max() { return 9223372036854775807LL; }
};

// What the shared expression emitter spells std::numeric_limits<int64_t>::min().
template <typename T> struct numeric_limits {
  KILN_DEV static T min() { return int_traits<T>::lowest(); }
};

KILN_DEV float bits_to_f32(uint32_t u) { return __uint_as_float(u); }
KILN_DEV uint32_t f32_to_bits(float f) { return __float_as_uint(f); }

KILN_DEV float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

KILN_DEV uint16_t f32_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t h;  // one F2FP instead of ~6 integer operations; a NaN comes back as 0x7fff
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
#endif
}

KILN_DEV float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

KILN_DEV float f16_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float f;  // exact
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));  // normal
  const float v = static_cast<float>(man) * 5.9604644775390625e-8f;  // subnormal: exact
  return sign ? -v : v;
#endif
}

KILN_DEV uint16_t f32_to_f16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t h;  // one F2FP instead of a dozen integer operations; a NaN comes back as 0x7fff
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const uint32_t u = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    const uint32_t exp = abs >> 23;
    if (exp < 102) return sign;
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;
    uint32_t q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t biased = abs - 0x38000000u;
  const uint32_t rounded = biased + 0xfffu + ((biased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
#endif
}
KILN_DEV float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

}  // namespace kiln_cuda

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_HALF_CUH_
