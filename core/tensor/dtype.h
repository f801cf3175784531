// Element types that travel on the wire and the exact conversions between them.
#ifndef ATTNSERVE_CORE_TENSOR_DTYPE_H_
#define ATTNSERVE_CORE_TENSOR_DTYPE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

// nvcc's passes are left out: device code has its own half types, and host passes of .cu files
// need not be built with the same -march.
#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#define ATTNSERVE_DTYPE_USE_F16C 1
#endif

namespace attnserve {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bytes per element: 4, 2, 2.
size_t DTypeSize(DType dtype);
// "f32", "f16", "bf16".
std::string_view DTypeName(DType dtype);
// Accepts "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16"; INVALID_ARGUMENT otherwise.
absl::StatusOr<DType> ParseDType(std::string_view name);

// IEEE binary16 <-> binary32. FloatToHalf rounds to nearest even, overflows to +-inf, keeps NaN a
// NaN and produces subnormals; HalfToFloat is exact.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// bfloat16 (the top 16 bits of a binary32) <-> binary32. FloatToBf16 rounds to nearest even and
// keeps NaN a (quiet) NaN; Bf16ToFloat is exact.
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

// Rounds f to the nearest value representable in dtype (identity for kF32).
float RoundToDType(float f, DType dtype);

// Whole-buffer conversions: n elements of `dtype` (raw little-endian bits) <-> float32, with the
// same results as the scalar functions above, element for element. These are the hot path for
// ToFloat32/FromFloat32 and tile loads: they use F16C when the build targets it and otherwise
// loops the compiler vectorises. `in` and `out` must not overlap.
void ConvertToFloat32(DType dtype, const void* in, float* out, size_t n);
void ConvertFromFloat32(DType dtype, const float* in, void* out, size_t n);

// ---------------------------------------------------------------------------------------------
// Definitions of the scalar conversions. They are inline because kernels and whole-tensor loops
// call them once per element; an out-of-line call there would cost more than the conversion.

namespace dtype_internal {

// Portable bit-level binary16 -> binary32 (exact). NaNs keep their payload and come out quiet,
// which is what the x86 F16C instruction does, so both paths give identical bits.
inline float HalfToFloatPortable(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;  // half exponent field, moved to float position
  uint32_t bits = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = bits & kShiftedExp;
  bits += (127u - 15u) << 23;  // rebias the exponent
  if (exp == kShiftedExp) {
    bits += (128u - 16u) << 23;                   // inf/NaN: exponent all ones
    if (bits & 0x007fffffu) bits |= 0x00400000u;  // NaN: set the quiet bit
  } else if (exp == 0) {
    // Zero or subnormal: m * 2^-24. Build 2^-14 + m * 2^-24 (a normal float) and subtract
    // 2^-14; both steps are exact and never touch float subnormals, so FTZ/DAZ cannot bite.
    bits += 1u << 23;
    bits = std::bit_cast<uint32_t>(std::bit_cast<float>(bits) - std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(bits | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

// Portable bit-level binary32 -> binary16, round to nearest even.
inline uint16_t FloatToHalfPortable(float f) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 2^16: at or above it is always inf
  // 0.5, whose ulp is 2^-24, the step between half subnormals: 0.5 + |f| leaves round(|f| / 2^-24)
  // in the low mantissa bits, rounded to nearest even by the FPU (default rounding mode).
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint32_t out;
  if (bits >= kF16Overflow) {
    // Inf stays inf; NaN keeps the top 10 payload bits and is quieted (as F16C does).
    out = bits > kF32Inf ? (0x7e00u | ((bits >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (bits < (113u << 23)) {
    // |f| < 2^-14: the result is a half subnormal or zero.
    const float sum = std::bit_cast<float>(bits) + std::bit_cast<float>(kDenormMagic);
    out = std::bit_cast<uint32_t>(sum) - kDenormMagic;
  } else {
    // Normal: rebias, then round to nearest even on the 13 dropped bits. A carry out of the
    // mantissa bumps the exponent, which is right (and turns 65520+ into inf).
    const uint32_t mant_odd = (bits >> 13) & 1u;
    bits += ((15u - 127u) << 23) + 0xfffu + mant_odd;
    out = bits >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

}  // namespace dtype_internal

// With F16C (x86-64-v3 and later) one instruction each way. The portable code gives the same
// bits (tests check all 65536 halves and a sweep of floats), so translation units built with and
// without F16C may be linked together.
#if defined(ATTNSERVE_DTYPE_USE_F16C)
inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
#else
inline float HalfToFloat(uint16_t h) { return dtype_internal::HalfToFloatPortable(h); }
inline uint16_t FloatToHalf(float f) { return dtype_internal::FloatToHalfPortable(f); }
#endif

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncating could clear every payload bit that survives and make it inf; set the
    // quiet bit instead.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even on the low 16 bits; a carry rounds up into the exponent (max -> inf).
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float RoundToDType(float f, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return HalfToFloat(FloatToHalf(f));
    case DType::kBF16:
      return Bf16ToFloat(FloatToBf16(f));
    case DType::kF32:
      break;
  }
  return f;
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_TENSOR_DTYPE_H_
