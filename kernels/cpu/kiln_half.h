#ifndef KILN_KERNELS_CPU_KILN_HALF_H_
#define KILN_KERNELS_CPU_KILN_HALF_H_

// float16 / bfloat16 for generated CPU kernels. Buffers hold the 16-bit patterns (uint16_t); values
// are computed in float. Conversions to 16 bits round to nearest even, keep NaN (quiet) and inf,
// and are identical on every compiler (bit manipulation only, no _Float16). Embedded into every
// generated translation unit (see kernels/cpu/BUILD.bazel); must stay self-contained C++17.

#include <cstdint>

#include "kernels/cpu/kiln_base.h"

namespace kiln_cpu {

inline float bits_to_f32(uint32_t u) { return bit_copy_f32(u); }
inline uint32_t f32_to_bits(float f) { return bit_copy_u32(f); }

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// Rounds a float to the nearest bfloat16 value, kept as a float.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));  // normal
  // Zero or subnormal: man * 2^-24, exact in float.
  const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: round abs * 2^24 to an integer, half to even.
    const uint32_t exp = abs >> 23;
    if (exp < 102) return sign;  // below half of the smallest subnormal
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // man * 2^(exp - 150) * 2^24 = man >> (126 - exp)
    uint32_t q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  const uint32_t biased = abs - 0x38000000u;  // exponent - 112
  const uint32_t rounded = biased + 0xfffu + ((biased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

// Rounds a float to the nearest float16 value, kept as a float.
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

}  // namespace kiln_cpu

#endif  // KILN_KERNELS_CPU_KILN_HALF_H_
