#include "core/tensor/dtype.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

bool IsHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }

// The value of a binary16 pattern straight from the IEEE definition, in double.
double HalfValue(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return sign * std::numeric_limits<double>::infinity();  // NaN not asked for
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Round-to-nearest-even of a finite float to binary16, computed in double from first
// principles: pick the quantum of the binade, divide, let nearbyint (default mode: ties to
// even) round, scale back.
double ReferenceRoundToHalf(float f) {
  const double x = std::fabs(static_cast<double>(f));
  double quantum;
  if (x < 0x1p-14) {
    quantum = 0x1p-24;  // subnormal spacing
  } else {
    int e;
    std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
    quantum = std::ldexp(1.0, e - 1 - 10);
  }
  double r = std::nearbyint(x / quantum) * quantum;
  if (r > 65504.0) r = std::numeric_limits<double>::infinity();
  return std::signbit(f) ? -r : r;
}

double ReferenceRoundToBf16(float f) {
  const double x = std::fabs(static_cast<double>(f));
  double quantum;
  if (x < 0x1p-126) {
    quantum = 0x1p-133;  // float subnormal spacing with 7 mantissa bits
  } else {
    int e;
    std::frexp(x, &e);
    quantum = std::ldexp(1.0, e - 1 - 7);
  }
  double r = std::nearbyint(x / quantum) * quantum;
  const double bf16_max = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127
  if (r > bf16_max) r = std::numeric_limits<double>::infinity();
  return std::signbit(f) ? -r : r;
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
}

TEST(DTypeTest, ParseAcceptsShortAndLongNames) {
  for (auto [name, want] : std::vector<std::pair<const char*, DType>>{{"f32", DType::kF32},
                                                                      {"float32", DType::kF32},
                                                                      {"f16", DType::kF16},
                                                                      {"float16", DType::kF16},
                                                                      {"bf16", DType::kBF16},
                                                                      {"bfloat16", DType::kBF16}}) {
    auto parsed = ParseDType(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(*parsed, want) << name;
  }
  // Every name round-trips through DTypeName.
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  }
}

TEST(DTypeTest, ParseRejectsOthersNamingTheAcceptedValues) {
  for (const char* bad : {"", "fp8", "F32", "float64", "bf16 ", "half"}) {
    auto parsed = ParseDType(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(std::string("'") + bad + "'"));
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("f32"));
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("f16"));
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("bf16"));
  }
}

// Every binary16 pattern decodes to its IEEE value and encodes back to itself; NaNs stay NaNs
// (and keep their payload, made quiet).
TEST(HalfTest, AllPatternsRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    if (IsHalfNan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      const uint16_t back = FloatToHalf(f);
      ASSERT_TRUE(IsHalfNan(back)) << std::hex << i;
      EXPECT_EQ(back, h | 0x0200) << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), HalfValue(h)) << std::hex << i;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << i;
  }
}

// The portable bit-trick code and the (possibly F16C) scalar and bulk paths agree bit for bit
// on every pattern, so a build with or without F16C computes the same thing.
TEST(HalfTest, PortableScalarAndBulkPathsAgreeOnAllPatterns) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> bulk(65536);
  ConvertToFloat32(DType::kF16, halves.data(), bulk.data(), halves.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint32_t portable = Bits(dtype_internal::HalfToFloatPortable(h));
    ASSERT_EQ(Bits(HalfToFloat(h)), portable) << std::hex << i;
    ASSERT_EQ(Bits(bulk[i]), portable) << std::hex << i;
  }
  std::vector<uint16_t> back(65536);
  ConvertFromFloat32(DType::kF16, bulk.data(), back.data(), bulk.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(back[i], dtype_internal::FloatToHalfPortable(bulk[i])) << std::hex << i;
    ASSERT_EQ(back[i], FloatToHalf(bulk[i])) << std::hex << i;
  }
}

// float -> half against a first-principles reference on a sweep of float patterns (a prime
// stride through all 2^32, plus every pattern near each half rounding boundary).
TEST(HalfTest, FloatToHalfMatchesReferenceRounding) {
  std::vector<float> inputs;
  for (uint64_t u = 0; u < (1ull << 32); u += 1021)
    inputs.push_back(FromBits(static_cast<uint32_t>(u)));
  // Around each half's value and each midpoint between neighbours: the exact tie and +-1 ulp.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = static_cast<float>(HalfValue(static_cast<uint16_t>(h)));
    const float hi =
        static_cast<float>(h + 1 == 0x7c00 ? 65536.0 : HalfValue(static_cast<uint16_t>(h + 1)));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in float
    for (float v : {lo, mid}) {
      for (int d = -1; d <= 1; ++d) {
        const float w = FromBits(Bits(v) + d);
        inputs.push_back(w);
        inputs.push_back(-w);
      }
    }
  }
  std::vector<uint16_t> bulk(inputs.size());
  ConvertFromFloat32(DType::kF16, inputs.data(), bulk.data(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const float f = inputs[i];
    const uint16_t h = FloatToHalf(f);
    ASSERT_EQ(bulk[i], h) << "bulk vs scalar at " << std::hexfloat << f;
    ASSERT_EQ(dtype_internal::FloatToHalfPortable(f), h) << "portable at " << std::hexfloat << f;
    if (std::isnan(f)) {
      ASSERT_TRUE(IsHalfNan(h)) << std::hexfloat << f;
      continue;
    }
    const double want = ReferenceRoundToHalf(f);
    ASSERT_EQ(HalfValue(h), want) << std::hexfloat << f;
    ASSERT_EQ((h & 0x8000) != 0, std::signbit(f)) << std::hexfloat << f;
  }
}

TEST(HalfTest, TiesRoundToEvenSpotChecks) {
  // Near 1.0 the half ulp is 2^-10.
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);  // tie between 0x3c00 (even) and 0x3c01
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above the tie
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie between 0x3c01 and 0x3c02 (even)
  EXPECT_EQ(FloatToHalf(-(1.0f + 3 * 0x1p-11f)), 0xbc02);
  EXPECT_EQ(FloatToHalf(2048.0f + 1.0f), 0x6800);  // ulp 2 at 2048: tie -> 2048
  EXPECT_EQ(FloatToHalf(2048.0f + 3.0f), 0x6802);  // tie between 2050 and 2052 -> 2052
  // Subnormals: spacing 2^-24.
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // tie between 0 (even) and 2^-24
  EXPECT_EQ(FloatToHalf(0x1p-25f + 0x1p-40f), 0x0001);
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2 units -> 2
  EXPECT_EQ(FloatToHalf(-3 * 0x1p-25f), 0x8002);
  EXPECT_EQ(FloatToHalf(0x1p-14f - 0x1p-25f), 0x0400);  // tie: largest subnormal vs min normal
  EXPECT_EQ(FloatToHalf(0x1p-14f - 0x1p-24f), 0x03ff);  // largest subnormal, exact
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-10f), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(FloatToHalf(FLT_TRUE_MIN), 0x0000);
}

TEST(HalfTest, OverflowInfAndNan) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the midpoint to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the midpoint rounds to even: inf
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalf(FLT_MAX), 0x7c00);
  EXPECT_EQ(FloatToHalf(-FLT_MAX), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(IsHalfNan(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsHalfNan(FloatToHalf(-std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in bits that half drops must not become inf.
  EXPECT_EQ(FloatToHalf(FromBits(0x7f800001u)), 0x7e00);
  EXPECT_EQ(FloatToHalf(FromBits(0xff800001u)), 0xfe00);
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);
}

TEST(Bf16Test, AllPatternsRoundTrip) {
  std::vector<uint16_t> patterns(65536);
  for (uint32_t i = 0; i < 65536; ++i) patterns[i] = static_cast<uint16_t>(i);
  std::vector<float> bulk(65536);
  ConvertToFloat32(DType::kBF16, patterns.data(), bulk.data(), patterns.size());
  std::vector<uint16_t> back(65536);
  ConvertFromFloat32(DType::kBF16, bulk.data(), back.data(), bulk.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = Bf16ToFloat(b);
    ASSERT_EQ(Bits(f), i << 16) << std::hex << i;  // exact: bf16 is the top half of a float
    ASSERT_EQ(Bits(bulk[i]), i << 16) << std::hex << i;
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    if (nan) {
      EXPECT_EQ(FloatToBf16(f), b | 0x0040) << std::hex << i;  // quieted, payload kept
      EXPECT_EQ(back[i], b | 0x0040) << std::hex << i;
    } else {
      ASSERT_EQ(FloatToBf16(f), b) << std::hex << i;
      ASSERT_EQ(back[i], b) << std::hex << i;
    }
  }
}

TEST(Bf16Test, FloatToBf16MatchesReferenceRounding) {
  std::vector<float> inputs;
  for (uint64_t u = 0; u < (1ull << 32); u += 1021)
    inputs.push_back(FromBits(static_cast<uint32_t>(u)));
  // Exact ties and their neighbours in a few binades, subnormals included.
  for (uint32_t top : {0x0000u, 0x0001u, 0x007fu, 0x3f80u, 0x3f81u, 0x7f7eu, 0x7f7fu}) {
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u}) inputs.push_back(FromBits((top << 16) | low));
  }
  std::vector<uint16_t> bulk(inputs.size());
  ConvertFromFloat32(DType::kBF16, inputs.data(), bulk.data(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const float f = inputs[i];
    const uint16_t b = FloatToBf16(f);
    ASSERT_EQ(bulk[i], b) << std::hexfloat << f;
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(Bf16ToFloat(b))) << std::hexfloat << f;
      continue;
    }
    ASSERT_EQ(static_cast<double>(Bf16ToFloat(b)), ReferenceRoundToBf16(f)) << std::hexfloat << f;
    ASSERT_EQ(std::signbit(Bf16ToFloat(b)), std::signbit(f)) << std::hexfloat << f;
  }
}

TEST(Bf16Test, TiesRoundToEvenSpotChecks) {
  // Near 1.0 the bf16 ulp is 2^-7.
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);  // tie -> even 0x3f80
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie between 0x3f81 and 0x3f82 -> even
  EXPECT_EQ(FloatToBf16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  EXPECT_EQ(FloatToBf16(3.140625f), 0x4049);              // exactly representable
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);  // subnormal tie, odd -> up to even
  EXPECT_EQ(FloatToBf16(FromBits(0x00028000u)), 0x0002);  // subnormal tie, even -> stays
  EXPECT_EQ(FloatToBf16(FLT_MAX), 0x7f80);                // beyond the midpoint above bf16 max: inf
  EXPECT_EQ(FloatToBf16(-FLT_MAX), 0xff80);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fffu)), 0x7f7f);  // just below that midpoint
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f800001u)), 0x7fc0);  // NaN with low payload stays NaN
  EXPECT_EQ(FloatToBf16(FromBits(0xffffffffu)), 0xffff);
}

TEST(DTypeTest, RoundToDType) {
  const float x = 1.0f + 0x1p-9f + 0x1p-12f;
  EXPECT_EQ(RoundToDType(x, DType::kF32), x);
  EXPECT_EQ(RoundToDType(x, DType::kF16), 1.0f + 0x1p-9f);
  EXPECT_EQ(RoundToDType(x, DType::kBF16), 1.0f);
  EXPECT_EQ(RoundToDType(1e6f, DType::kF16), std::numeric_limits<float>::infinity());
  EXPECT_EQ(RoundToDType(1e6f, DType::kBF16), 999424.0f);
  EXPECT_TRUE(std::isnan(RoundToDType(std::nanf(""), DType::kF16)));
  EXPECT_TRUE(std::isnan(RoundToDType(std::nanf(""), DType::kBF16)));
}

TEST(DTypeTest, BulkF32IsACopy) {
  std::vector<float> in = {1.5f, -0.0f, std::numeric_limits<float>::infinity(), 0x1p-149f};
  std::vector<float> mid(in.size()), out(in.size());
  ConvertFromFloat32(DType::kF32, in.data(), mid.data(), in.size());
  ConvertToFloat32(DType::kF32, mid.data(), out.data(), mid.size());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(Bits(out[i]), Bits(in[i]));
}

}  // namespace
}  // namespace attnserve
