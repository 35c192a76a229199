#ifndef KILN_KERNELS_CPU_KILN_BASE_H_
#define KILN_KERNELS_CPU_KILN_BASE_H_

// The few standard facilities generated CPU kernels use, without the standard headers: type
// traits, limits, and libm functions as compiler builtins (g++ and clang expand them inline or call
// the same libm symbols as <cmath>). Parsing <cmath>, <algorithm> and <limits> took about 2/3 of
// the g++ time of a small graph; with this header a generated translation unit includes only
// <cstdint>. Embedded into every generated translation unit; must stay self-contained C++17.
//
// kiln_cpu::sqrt(x) etc. have float and double overloads with std::'s results; an integer
// argument converts to double, as std::sqrt(int) does. exp and erf are in kiln_math.h
// (vectorizable for float); fmod, copysign and pow are libm_fmod etc.

#include <cstdint>

namespace kiln_cpu {

template <typename T> struct is_floating_point { static constexpr bool value = false; };
template <> struct is_floating_point<float> { static constexpr bool value = true; };
template <> struct is_floating_point<double> { static constexpr bool value = true; };

template <typename T> struct is_signed { static constexpr bool value = T(-1) < T(0); };

template <typename T> struct make_unsigned;
template <> struct make_unsigned<bool> { using type = bool; };
template <> struct make_unsigned<char> { using type = unsigned char; };
template <> struct make_unsigned<signed char> { using type = unsigned char; };
template <> struct make_unsigned<unsigned char> { using type = unsigned char; };
template <> struct make_unsigned<short> { using type = unsigned short; };
template <> struct make_unsigned<unsigned short> { using type = unsigned short; };
template <> struct make_unsigned<int> { using type = unsigned int; };
template <> struct make_unsigned<unsigned int> { using type = unsigned int; };
template <> struct make_unsigned<long> { using type = unsigned long; };
template <> struct make_unsigned<unsigned long> { using type = unsigned long; };
template <> struct make_unsigned<long long> { using type = unsigned long long; };
template <> struct make_unsigned<unsigned long long> { using type = unsigned long long; };

// numeric_limits<T>::max() / ::lowest() for integers and bool.
template <typename T>
constexpr T int_max() {
  using U = typename make_unsigned<T>::type;
  return is_signed<T>::value ? static_cast<T>(static_cast<U>(~U(0)) >> 1) : static_cast<T>(~U(0));
}
template <typename T>
constexpr T int_lowest() {
  return is_signed<T>::value ? static_cast<T>(-int_max<T>() - 1) : T(0);
}

// std::min for loop bounds.
template <typename T>
constexpr T imin(T a, T b) { return b < a ? b : a; }

// numeric_limits<T>::infinity() / ::quiet_NaN(): 0 for non-float types, as there.
template <typename T>
inline T inf() {
  if constexpr (is_floating_point<T>::value) {
    return static_cast<T>(__builtin_inf());
  } else {
    return T(0);
  }
}
template <typename T>
inline T nan() {
  if constexpr (is_floating_point<T>::value) {
    return static_cast<T>(__builtin_nan(""));
  } else {
    return T(0);
  }
}

inline float bit_copy_f32(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint32_t bit_copy_u32(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof(u));
  return u;
}

#define KILN_CPU_MATH1(name)                                                   \
  inline float name(float x) { return __builtin_##name##f(x); }               \
  inline double name(double x) { return __builtin_##name(x); }                 \
  template <typename T>                                                        \
  inline double name(T x) { return __builtin_##name(static_cast<double>(x)); }
// Two-argument libm functions, named apart from kiln_math.h's torch-semantics templates.
#define KILN_CPU_MATH2(name)                                                                   \
  inline float libm_##name(float a, float b) { return __builtin_##name##f(a, b); }            \
  inline double libm_##name(double a, double b) { return __builtin_##name(a, b); }

KILN_CPU_MATH1(fabs)
KILN_CPU_MATH1(sqrt)
KILN_CPU_MATH1(exp2)
KILN_CPU_MATH1(expm1)
KILN_CPU_MATH1(log)
KILN_CPU_MATH1(log1p)
KILN_CPU_MATH1(log2)
KILN_CPU_MATH1(sin)
KILN_CPU_MATH1(cos)
KILN_CPU_MATH1(tanh)
KILN_CPU_MATH1(floor)
KILN_CPU_MATH1(ceil)
KILN_CPU_MATH1(trunc)
KILN_CPU_MATH1(nearbyint)
KILN_CPU_MATH2(fmod)
KILN_CPU_MATH2(copysign)
KILN_CPU_MATH2(pow)

#undef KILN_CPU_MATH1
#undef KILN_CPU_MATH2

}  // namespace kiln_cpu

#endif  // KILN_KERNELS_CPU_KILN_BASE_H_
