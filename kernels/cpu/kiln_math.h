#ifndef KILN_KERNELS_CPU_KILN_MATH_H_
#define KILN_KERNELS_CPU_KILN_MATH_H_

// Scalar math with torch's semantics for generated CPU kernels (see server/kernel/kernel_ir.h,
// "Semantics"): NaN-propagating maximum/minimum, Python floor division and remainder, integer
// division that never traps, float -> int casts without undefined behaviour, gelu/silu/sigmoid.
// Generated code is compiled with -fwrapv (signed overflow wraps) and without -ffast-math.
// Embedded into every generated translation unit; must stay self-contained C++17.

#include <cstdint>

#include "kernels/cpu/kiln_base.h"
#include "kernels/cpu/kiln_half.h"

namespace kiln_cpu {

// The identity of max: -inf for floats, the lowest value for integers; and of min.
template <typename T>
inline T lowest() {
  if constexpr (is_floating_point<T>::value) {
    return -inf<T>();
  } else {
    return int_lowest<T>();
  }
}
template <typename T>
inline T highest() {
  if constexpr (is_floating_point<T>::value) {
    return inf<T>();
  } else {
    return int_max<T>();
  }
}

template <typename T>
inline bool is_nan(T x) { return x != x; }

// NaN-propagating maximum/minimum (torch.maximum, amax): NaN if either is NaN.
template <typename T>
inline T maximum(T a, T b) {
  if (is_floating_point<T>::value) return (a != a || a > b) ? a : b;
  return a > b ? a : b;
}
template <typename T>
inline T minimum(T a, T b) {
  if (is_floating_point<T>::value) return (a != a || a < b) ? a : b;
  return a < b ? a : b;
}

template <typename T>
inline T relu(T x) {
  return x > T(0) ? x : (x != x ? x : T(0));
}

template <typename T>
inline T sign(T x) {
  return static_cast<T>((T(0) < x) - (x < T(0)));
}

// Cody-Waite range reduction and the Cephes polynomial shared by exp and erf: for x in about
// [-110, 88.8], sets *k = round(x / ln2) and returns e^(x - k ln2) (about 1 ulp).
inline float exp_reduced(float x, float* k) {
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick (exact in default rounding).
  *k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - *k * 0.693359375f;
  r = r + *k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// exp for float that g++/clang vectorize without -ffast-math (glibc's expf is a scalar call):
// exp_reduced (max error about 1 ulp in the normal range) and a two-step scaling by 2^k so that
// overflow gives inf and underflow goes through subnormals to 0. exp(NaN) = NaN, exp(-inf) = 0,
// exp(inf) = inf. Branch-free on purpose.
inline float exp(float x) {
  const float xc = x < -110.0f ? -110.0f : (x > 88.8f ? 88.8f : x);  // NaN passes through
  float k;
  const float y = exp_reduced(xc, &k);
  const int32_t ki = static_cast<int32_t>(k);
  const int32_t k1 = ki / 2;
  const int32_t k2 = ki - k1;
  const float s1 = bits_to_f32(static_cast<uint32_t>(k1 + 127) << 23);
  const float s2 = bits_to_f32(static_cast<uint32_t>(k2 + 127) << 23);
  const float result = y * s1 * s2;
  return x != x ? x : result;
}
inline double exp(double x) { return __builtin_exp(x); }

// erf for float that g++/clang vectorize (glibc's erff is a scalar call, ~20x slower than the
// rest of a GELU): both of N. Juffa's minimax polynomials are evaluated and one is selected,
// x + x * p(x^2) for |x| <= 0.9277 and 1 - exp(q(|x|)) with x's sign above. q <= -0.9, so exp
// needs one scaling, and values below 2^-126 are 0 (they vanish next to 1). An exhaustive sweep
// over every float measured 1.016 ulp at worst. erf(NaN) = NaN, erf(+-inf) = +-1.
inline float erf(float x) {
  const float t = kiln_cpu::fabs(x);
  const float s = x * x;
  float q = -1.72853470e-5f * t + 3.83197126e-4f;
  q = q * s + (-3.88396438e-3f * t + 2.42546219e-2f);
  q = q * t - 1.06777877e-1f;
  q = q * t - 6.34846687e-1f;
  q = q * t - 1.28717512e-1f;
  q = q * t - t;
  float k;
  const float y = exp_reduced(q > -104.0f ? q : -104.0f, &k);  // NaN: the small branch is taken
  const int32_t ki = static_cast<int32_t>(k);
  const float e = ki > -126 ? y * bits_to_f32(static_cast<uint32_t>(ki + 127) << 23) : 0.0f;
  const float large = libm_copysign(1.0f - e, x);
  float p = -5.96761703e-4f;
  p = p * s + 4.99119423e-3f;
  p = p * s - 2.67681349e-2f;
  p = p * s + 1.12819925e-1f;
  p = p * s - 3.76125336e-1f;
  p = p * s + 1.28379166e-1f;
  const float small = p * x + x;
  return t > 0.927734375f ? large : small;
}
inline double erf(double x) { return __builtin_erf(x); }

template <typename T>
inline T sigmoid(T x) { return T(1) / (T(1) + kiln_cpu::exp(-x)); }
template <typename T>
inline T silu(T x) { return x / (T(1) + kiln_cpu::exp(-x)); }
template <typename T>
inline T gelu(T x) {
  return T(0.5) * x * (T(1) + kiln_cpu::erf(x * T(0.70710678118654752440)));
}
template <typename T>
inline T gelu_tanh(T x) {
  const T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + kiln_cpu::tanh(inner));
}

template <typename T>
inline T abs(T x) {
  if (is_floating_point<T>::value) return kiln_cpu::fabs(x);
  return static_cast<T>(x < 0 ? -x : x);
}

template <typename T>
inline bool is_inf(T x) {
  if (is_floating_point<T>::value) return kiln_cpu::fabs(x) == inf<T>();
  return false;
}

// Integer division rounding toward zero; 0 for a zero divisor; lowest / -1 wraps.
template <typename T>
inline T div_trunc(T a, T b) {
  if (is_floating_point<T>::value) return kiln_cpu::trunc(a / b);
  if (b == 0) return 0;
  if (is_signed<T>::value && b == T(-1)) return static_cast<T>(-a);
  return static_cast<T>(a / b);
}

// Floor division: Python's for integers (0 for a zero divisor), torch's div_floor for floats.
inline double div_floor_float(double a, double b) {
  if (b == 0) return a / b;
  const double mod = libm_fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  double floordiv;
  if (div != 0) {
    floordiv = kiln_cpu::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = libm_copysign(0.0, a / b);
  }
  return floordiv;
}
inline float div_floor_float(float a, float b) {
  if (b == 0) return a / b;
  const float mod = libm_fmod(a, b);
  float div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  float floordiv;
  if (div != 0) {
    floordiv = kiln_cpu::floor(div);
    if (div - floordiv > 0.5f) floordiv += 1.0f;
  } else {
    floordiv = libm_copysign(0.0f, a / b);
  }
  return floordiv;
}

template <typename T>
inline T div_floor(T a, T b) {
  if constexpr (is_floating_point<T>::value) {
    return div_floor_float(a, b);
  } else {
    if (b == 0) return 0;
    if (is_signed<T>::value && b == T(-1)) return static_cast<T>(-a);
    T q = static_cast<T>(a / b);
    const T r = static_cast<T>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) q = static_cast<T>(q - 1);
    return q;
  }
}

// Python remainder: the result has the divisor's sign. 0 for a zero integer divisor.
template <typename T>
inline T remainder(T a, T b) {
  if constexpr (is_floating_point<T>::value) {
    T mod = libm_fmod(a, b);
    if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;
    return mod;
  } else {
    if (b == 0) return 0;
    if (is_signed<T>::value && b == T(-1)) return 0;
    T r = static_cast<T>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
    return r;
  }
}

// C fmod: the result has the dividend's sign. 0 for a zero integer divisor.
template <typename T>
inline T fmod(T a, T b) {
  if constexpr (is_floating_point<T>::value) {
    return libm_fmod(a, b);
  } else {
    if (b == 0) return 0;
    if (is_signed<T>::value && b == T(-1)) return 0;
    return static_cast<T>(a % b);
  }
}

// pow: libm's pow for floats; for integers exponentiation by squaring with wrap-around, and torch's
// rule for negative exponents (1 for base 1, +-1 for base -1, 0 otherwise).
template <typename T>
inline T pow(T a, T b) {
  if constexpr (is_floating_point<T>::value) {
    return libm_pow(a, b);
  } else {
    if (is_signed<T>::value && b < 0) {
      if (a == 1) return 1;
      if (a == T(-1)) return (b % 2 == 0) ? 1 : static_cast<T>(-1);
      return 0;
    }
    using U = typename make_unsigned<T>::type;
    U result = 1, base = static_cast<U>(a);
    uint64_t e = static_cast<uint64_t>(b);
    while (e) {
      if (e & 1) result = static_cast<U>(result * base);
      base = static_cast<U>(base * base);
      e >>= 1;
    }
    return static_cast<T>(result);
  }
}

template <typename T>
inline T shift_left(T a, T b) {
  using U = typename make_unsigned<T>::type;
  if (b < 0 || b >= static_cast<T>(sizeof(T) * 8)) return 0;
  return static_cast<T>(static_cast<U>(a) << b);
}
template <typename T>
inline T shift_right(T a, T b) {
  if (b < 0 || b >= static_cast<T>(sizeof(T) * 8)) return a < 0 ? static_cast<T>(-1) : 0;
  return static_cast<T>(a >> b);
}

// float -> integer as torch on x86-64 (static_cast compiled to cvttss2si): targets of up to 32 bits
// convert through int32, others through int64; NaN and out-of-range values give that type's
// lowest value (INT32_MIN / INT64_MIN), and the result is then truncated (wraps) to the target.
// No undefined behaviour.
template <typename To, typename From>
inline To float_to_int(From x) {
  if (sizeof(To) <= 4) {
    int32_t v;
    if (x != x || x >= static_cast<From>(2147483648.0) || x <= static_cast<From>(-2147483649.0)) {
      v = int_lowest<int32_t>();
    } else {
      v = static_cast<int32_t>(x);
    }
    return static_cast<To>(static_cast<typename make_unsigned<To>::type>(v));
  }
  int64_t v;
  if (x != x || x >= static_cast<From>(9.2233720368547758e18) ||
      x < static_cast<From>(-9.2233720368547758e18)) {
    v = int_lowest<int64_t>();
  } else {
    v = static_cast<int64_t>(x);
  }
  return static_cast<To>(v);
}

}  // namespace kiln_cpu

#endif  // KILN_KERNELS_CPU_KILN_MATH_H_
