#include "core/tensor/dtype.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "invalid";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: '", absl::string_view(name.data(), name.size()),
                   "' is not a supported dtype (want f32/float32, f16/float16 or bf16/bfloat16)"));
}

namespace {

// f16 and bf16 buffers are handled as raw uint16_t bit patterns; the public signatures take
// `void*` only so that one entry point serves every dtype.
void HalfToFloatLoop(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#if defined(ATTNSERVE_DTYPE_USE_F16C)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void FloatToHalfLoop(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
#if defined(ATTNSERVE_DTYPE_USE_F16C)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

// bf16 needs no special instructions: both loops are shifts, adds and a select, which the
// compiler vectorises for whatever -march the build uses.
void Bf16ToFloatLoop(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

void FloatToBf16Loop(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

}  // namespace

void ConvertToFloat32(DType dtype, const void* in, float* out, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, in, n * sizeof(float));
      return;
    case DType::kF16:
      HalfToFloatLoop(static_cast<const uint16_t*>(in), out, n);
      return;
    case DType::kBF16:
      Bf16ToFloatLoop(static_cast<const uint16_t*>(in), out, n);
      return;
  }
}

void ConvertFromFloat32(DType dtype, const float* in, void* out, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, in, n * sizeof(float));
      return;
    case DType::kF16:
      FloatToHalfLoop(in, static_cast<uint16_t*>(out), n);
      return;
    case DType::kBF16:
      FloatToBf16Loop(in, static_cast<uint16_t*>(out), n);
      return;
  }
}

}  // namespace attnserve
