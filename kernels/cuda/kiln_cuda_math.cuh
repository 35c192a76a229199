#ifndef KILN_KERNELS_CUDA_KILN_CUDA_MATH_CUH_
#define KILN_KERNELS_CUDA_KILN_CUDA_MATH_CUH_

// Scalar math with torch's semantics for generated CUDA kernels (see server/kernel/kernel_ir.h,
// "Semantics"), the device twin of kernels/cpu/kiln_math.h: the shared expression emitter writes
// kiln_cpu::f / std::f, and the CUDA emitter retargets both to kiln_cuda::f, so every name used
// there has an overload here. Accurate CUDA math (expf, erff...), never the __fast intrinsics
// (exceptions: exp_approx, below, for softmax exps whose results are rounded to 16 bits, and
// div_approx for Welford's counts); rsqrt is CUDA's rsqrtf (2 ulp), as in torch's own kernels;
// NaN-propagating maximum/minimum, Python floor division and remainder, trap-free integer
// division, float -> int casts as torch on x86-64.

#include "kernels/cuda/kiln_cuda_half.cuh"

namespace kiln_cuda {

template <typename T> KILN_DEV T inf();
template <> KILN_DEV float inf<float>() { return __uint_as_float(0x7f800000u); }
template <> KILN_DEV double inf<double>() { return __longlong_as_double(0x7ff0000000000000LL); }
template <typename T> KILN_DEV T nan();
template <> KILN_DEV float nan<float>() { return __uint_as_float(0x7fc00000u); }
template <> KILN_DEV double nan<double>() { return __longlong_as_double(0x7ff8000000000000LL); }

// Identities of max and min: -inf / +inf for floats, the type's extremes for integers.
template <typename T> KILN_DEV T lowest() {
  if constexpr (is_float<T>::value) { return -inf<T>(); } else { return int_traits<T>::lowest(); }
}
template <typename T> KILN_DEV T highest() {
  if constexpr (is_float<T>::value) { return inf<T>(); } else { return int_traits<T>::max(); }
}

#define KILN_F1(name, f32, f64)                          \
  KILN_DEV float name(float x) { return ::f32(x); }      \
  KILN_DEV double name(double x) { return ::f64(x); }
KILN_F1(exp, expf, exp)
KILN_F1(exp2, exp2f, exp2)
KILN_F1(expm1, expm1f, expm1)
KILN_F1(log, logf, log)
KILN_F1(log1p, log1pf, log1p)
KILN_F1(log2, log2f, log2)
KILN_F1(sqrt, sqrtf, sqrt)
KILN_F1(sin, sinf, sin)
KILN_F1(cos, cosf, cos)
KILN_F1(tanh, tanhf, tanh)
KILN_F1(erf, erff, erf)
KILN_F1(floor, floorf, floor)
KILN_F1(ceil, ceilf, ceil)
KILN_F1(nearbyint, rintf, rint)  // round half to even (the default rounding mode)
KILN_F1(trunc, truncf, trunc)
KILN_F1(fabs, fabsf, fabs)
#undef KILN_F1

template <typename T> KILN_DEV bool is_nan(T x) { return x != x; }

template <typename T> KILN_DEV T maximum(T a, T b) {
  if constexpr (is_float<T>::value) { return (a != a || a > b) ? a : b; } else { return a > b ? a : b; }
}
template <typename T> KILN_DEV T minimum(T a, T b) {
  if constexpr (is_float<T>::value) { return (a != a || a < b) ? a : b; } else { return a < b ? a : b; }
}

// maximum() in one instruction on sm_80+ (max.NaN: NaN if either is NaN), for the two-pass
// online softmax's row max, where only the max's value matters: a NaN comes back canonical (no
// payload) and max(-0, +0) is +0 (maximum() returns its second argument for equal values).
KILN_DEV float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return maximum(a, b);
#endif
}
KILN_DEV double max_nan(double a, double b) { return maximum(a, b); }

// exp(x) in one MUFU instruction: ex2.approx.ftz of x * log2(e). Relative error about 2^-22 plus
// |x| * 2^-24 (the product's rounding; x = -20: ~1.2e-6), results below 2^-126 flushed to 0;
// exp(-inf) = 0, exp(NaN) = NaN. The emitter uses it only for softmax exps whose results are
// rounded to f16/bf16 (2^-11 / 2^-8 relative; CudaKernelEmitter::PlanApproxExp), as Triton's exp
// does for every dtype; accurate expf (kiln_cuda::exp) everywhere else. Host and emulator: expf.
KILN_DEV float exp_approx(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
  return r;
#else
  return ::expf(x);
#endif
}

// x / y as rcp.approx and a multiply (__fdividef: 2 ulp for 2^-126 <= |y| < 2^126; NaN and inf
// propagate as in x / y). Only for Welford's counts: Update's mean step, delta / count, and
// Merge's weight, count_b / (count_a + count_b), where counts are whole numbers below 2^24 and
// the error is of the order of the step's own rounding. The IEEE
// division it replaces is a subroutine of tens of instructions per element: a channels-last
// batch-norm partial (bf16, 32 x 256 x 56 x 56, sums over 56 x 56 per (n, c)) took 52 us with it
// and 28 us with this on the H200, where reading the same bytes takes 16 us. Host and emulator:
// x / y.
KILN_DEV float div_approx(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fdividef(x, y);
#else
  return x / y;
#endif
}
KILN_DEV double div_approx(double x, double y) { return x / y; }

// 1 / sqrt(x) as torch's CUDA kernels compute it (its rsqrt and its batch norms' invstd call
// CUDA's rsqrtf / rsqrt): 2 ulp for f32 (denormals included, no flush), where an IEEE square root
// and division are a subroutine per element that made inference batch norms partly compute-bound
// (a 25.7 MB bf16 one: 13.0 us with them, 8.7 with rsqrtf on the H200). Host and emulator:
// 1 / sqrt(x).
KILN_DEV float rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrtf(x);
#else
  return 1.0f / ::sqrtf(x);
#endif
}
KILN_DEV double rsqrt(double x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrt(x);
#else
  return 1.0 / ::sqrt(x);
#endif
}

template <typename T> KILN_DEV T relu(T x) { return x > T(0) ? x : (x != x ? x : T(0)); }
template <typename T> KILN_DEV T sign(T x) { return static_cast<T>((T(0) < x) - (x < T(0))); }
template <typename T> KILN_DEV T sigmoid(T x) { return T(1) / (T(1) + kiln_cuda::exp(-x)); }
template <typename T> KILN_DEV T silu(T x) { return x / (T(1) + kiln_cuda::exp(-x)); }
template <typename T> KILN_DEV T gelu(T x) {
  return T(0.5) * x * (T(1) + kiln_cuda::erf(x * T(0.70710678118654752440)));
}
template <typename T> KILN_DEV T gelu_tanh(T x) {
  const T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + kiln_cuda::tanh(inner));
}

template <typename T> KILN_DEV T abs(T x) {
  if constexpr (is_float<T>::value) { return kiln_cuda::fabs(x); } else { return static_cast<T>(x < 0 ? -x : x); }
}
template <typename T> KILN_DEV bool is_inf(T x) {
  if constexpr (is_float<T>::value) { return kiln_cuda::fabs(x) == inf<T>(); } else { return false; }
}

KILN_DEV float fmod_f(float a, float b) { return ::fmodf(a, b); }
KILN_DEV double fmod_f(double a, double b) { return ::fmod(a, b); }
KILN_DEV float copysign_f(float a, float b) { return ::copysignf(a, b); }
KILN_DEV double copysign_f(double a, double b) { return ::copysign(a, b); }
KILN_DEV float pow_f(float a, float b) { return ::powf(a, b); }
KILN_DEV double pow_f(double a, double b) { return ::pow(a, b); }

template <typename T> KILN_DEV T div_trunc(T a, T b) {
  if constexpr (is_float<T>::value) {
    return kiln_cuda::trunc(a / b);
  } else {
    if (b == 0) return 0;
    if (int_traits<T>::is_signed && b == T(-1)) {
      return static_cast<T>(static_cast<typename int_traits<T>::unsigned_type>(0) -
                            static_cast<typename int_traits<T>::unsigned_type>(a));
    }
    return static_cast<T>(a / b);
  }
}

template <typename T> KILN_DEV T div_floor(T a, T b) {
  if constexpr (is_float<T>::value) {
    if (b == 0) return a / b;
    const T mod = fmod_f(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
    T floordiv;
    if (div != 0) {
      floordiv = kiln_cuda::floor(div);
      if (div - floordiv > T(0.5)) floordiv += T(1);
    } else {
      floordiv = copysign_f(T(0), a / b);
    }
    return floordiv;
  } else {
    if (b == 0) return 0;
    if (int_traits<T>::is_signed && b == T(-1)) return div_trunc(a, b);
    T q = static_cast<T>(a / b);
    const T r = static_cast<T>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) q = static_cast<T>(q - 1);
    return q;
  }
}

template <typename T> KILN_DEV T remainder(T a, T b) {
  if constexpr (is_float<T>::value) {
    T mod = fmod_f(a, b);
    if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;
    return mod;
  } else {
    if (b == 0) return 0;
    if (int_traits<T>::is_signed && b == T(-1)) return 0;
    T r = static_cast<T>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
    return r;
  }
}

template <typename T> KILN_DEV T fmod(T a, T b) {
  if constexpr (is_float<T>::value) {
    return fmod_f(a, b);
  } else {
    if (b == 0) return 0;
    if (int_traits<T>::is_signed && b == T(-1)) return 0;
    return static_cast<T>(a % b);
  }
}

template <typename T> KILN_DEV T pow(T a, T b) {
  if constexpr (is_float<T>::value) {
    return pow_f(a, b);
  } else {
    if (int_traits<T>::is_signed && b < 0) {
      if (a == 1) return 1;
      if (a == T(-1)) return (b % 2 == 0) ? T(1) : static_cast<T>(-1);
      return 0;
    }
    typedef typename int_traits<T>::unsigned_type U;
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

template <typename T> KILN_DEV T shift_left(T a, T b) {
  typedef typename int_traits<T>::unsigned_type U;
  if (b < 0 || b >= static_cast<T>(sizeof(T) * 8)) return 0;
  return static_cast<T>(static_cast<U>(a) << b);
}
template <typename T> KILN_DEV T shift_right(T a, T b) {
  if (b < 0 || b >= static_cast<T>(sizeof(T) * 8)) return a < 0 ? static_cast<T>(-1) : T(0);
  return static_cast<T>(a >> b);
}

// float -> integer as torch on x86-64: targets of up to 32 bits through int32, others through
// int64; NaN and out-of-range give that type's lowest value, then the result wraps.
template <typename To, typename From> KILN_DEV To float_to_int(From x) {
  if (sizeof(To) <= 4) {
    int32_t v;
    if (x != x || x >= static_cast<From>(2147483648.0) || x <= static_cast<From>(-2147483649.0)) {
      v = int_traits<int32_t>::lowest();
    } else {
      v = static_cast<int32_t>(x);
    }
    return static_cast<To>(static_cast<typename int_traits<To>::unsigned_type>(v));
  }
  int64_t v;
  if (x != x || x >= static_cast<From>(9.2233720368547758e18) ||
      x < static_cast<From>(-9.2233720368547758e18)) {
    v = int_traits<int64_t>::lowest();
  } else {
    v = static_cast<int64_t>(x);
  }
  return static_cast<To>(v);
}

}  // namespace kiln_cuda

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_MATH_CUH_
