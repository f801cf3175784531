#include "core/tensor/npy.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// A fresh directory per test under gtest's temp dir.
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              absl::StrCat("attnserve_npy_", getpid(), "_", info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFileBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A 1.0 preamble + header exactly as numpy lays it out: `dict` padded with spaces to a 64-byte
// boundary, ending in '\n'. Used to hand-build files with headers numpy would never write.
std::string Header10(std::string_view dict) {
  size_t total = 10 + dict.size() + 1;
  const size_t pad = (64 - total % 64) % 64;
  const size_t hlen = dict.size() + pad + 1;
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(hlen & 0xff));
  out.push_back(static_cast<char>(hlen >> 8));
  out.append(dict);
  out.append(pad, ' ');
  out.push_back('\n');
  return out;
}

std::string LeBytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

void ExpectSameTensor(const HostTensor& a, const HostTensor& b) {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.dims(), b.dims());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << a.DebugString();
}

absl::Status ParseError(std::string_view bytes, std::optional<DType> want = std::nullopt) {
  auto t = ParseNpy(bytes, want);
  return t.ok() ? absl::OkStatus() : t.status();
}

// Every dtype and rank 0-4 (a zero-sized dim included) survives serialize -> parse and
// file write -> read bit for bit.
TEST(NpyTest, RoundTripsEveryDTypeAndRank) {
  const std::string dir = TestDir();
  const std::vector<std::vector<int64_t>> shapes = {{},           {7},       {3, 5}, {2, 3, 4},
                                                    {1, 5, 3, 8}, {2, 0, 3}, {70000}};
  uint64_t seed = 1;
  for (DType dtype : kAllDTypes) {
    for (const auto& dims : shapes) {
      auto t = HostTensor::Create(dtype, dims);
      ASSERT_TRUE(t.ok());
      FillUniform(*t, seed++);
      const std::string label = t->DebugString();

      auto parsed = ParseNpy(SerializeNpy(*t), dtype);
      ASSERT_TRUE(parsed.ok()) << label << ": " << parsed.status();
      ExpectSameTensor(*t, *parsed);

      const std::string path = absl::StrCat(dir, "/t.npy");
      ASSERT_TRUE(WriteNpy(path, *t).ok()) << label;
      EXPECT_EQ(ReadFileBytes(path), SerializeNpy(*t)) << label;
      // f32/f16 read back without a hint; bf16 needs one (the file says only '<u2').
      std::optional<DType> want;
      if (dtype == DType::kBF16) want = DType::kBF16;
      MemoryTracker tracker;
      auto read = ReadNpy(path, want, &tracker);
      ASSERT_TRUE(read.ok()) << label << ": " << read.status();
      ExpectSameTensor(*t, *read);
      EXPECT_EQ(tracker.in_use_bytes(), static_cast<int64_t>(read->nbytes()));
    }
  }
}

// The exact bytes numpy 1.x/2.x np.save writes for np.arange(6, dtype='<f4').reshape(2, 3),
// built field by field from the format spec.
TEST(NpyTest, SerializeIsByteExactWithNumpy) {
  auto t = HostTensor::Create(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) t->SetFloat(i, static_cast<float>(i));
  std::string want("\x93NUMPY", 6);
  want += std::string("\x01\x00", 2);  // version 1.0
  want += std::string("\x76\x00", 2);  // header length 118, little-endian: 10 + 118 = 128
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(dict.size(), 59u);
  want += dict;
  want += std::string(20, ' ');  // numpy's room for dim 0 to grow to 21 digits ("2" has 1)
  want += std::string(128 - 10 - 59 - 20 - 1, ' ');  // pad to the 64-byte boundary
  want += '\n';
  ASSERT_EQ(want.size(), 128u);
  const float values[6] = {0, 1, 2, 3, 4, 5};
  want += LeBytes(values, sizeof(values));
  EXPECT_EQ(SerializeNpy(*t), want);

  // Rank 1 uses the one-element tuple "(3,)"; bf16 is '<u2' with the raw bits.
  auto b = HostTensor::Create(DType::kBF16, {3});
  b->SetFloat(0, 1.0f);
  b->SetFloat(1, -2.0f);
  b->SetFloat(2, 0.5f);
  std::string want_b("\x93NUMPY\x01\x00\x76\x00", 10);
  want_b += "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
  want_b += std::string(128 - want_b.size() - 1, ' ');
  want_b += '\n';
  want_b += std::string("\x80\x3f\x00\xc0\x00\x3f", 6);
  EXPECT_EQ(SerializeNpy(*b), want_b);

  // A scalar has shape () and no growth padding.
  auto s = HostTensor::Create(DType::kF16, {});
  s->SetFloat(0, 1.0f);
  std::string want_s("\x93NUMPY\x01\x00\x76\x00", 10);
  want_s += "{'descr': '<f2', 'fortran_order': False, 'shape': (), }";
  want_s += std::string(128 - want_s.size() - 1, ' ');
  want_s += '\n';
  want_s += std::string("\x00\x3c", 2);
  EXPECT_EQ(SerializeNpy(*s), want_s);
}

TEST(NpyTest, ReadsHeadersNumpyCouldHaveWritten) {
  const float values[4] = {1.5f, -2.0f, 0.25f, 8.0f};
  const std::string data = LeBytes(values, sizeof(values));
  // Other key order, double quotes, no trailing comma, Python 2 longs, odd spacing, 16-byte
  // alignment of old numpy versions.
  for (std::string_view dict :
       {"{'shape': (2, 2), 'fortran_order': False, 'descr': '<f4'}",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2L, 2L), }",
        "{ 'descr' : '<f4' ,'fortran_order':False,'shape':( 2 , 2 , ) }"}) {
    auto t = ParseNpy(Header10(dict) + data, std::nullopt);
    ASSERT_TRUE(t.ok()) << dict << ": " << t.status();
    EXPECT_EQ(t->dims(), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(t->GetFloat(3), 8.0f);
  }
  std::string old_numpy("\x93NUMPY\x01\x00", 8);
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";
  dict += std::string(80 - 10 - dict.size() - 1, ' ') + "\n";  // 16-byte aligned
  old_numpy += std::string{static_cast<char>(dict.size()), '\0'} + dict + data;
  auto old = ParseNpy(old_numpy, DType::kF32);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->GetFloat(0), 1.5f);
}

TEST(NpyTest, ReadsVersion2Headers) {
  const uint16_t bits[2] = {0x3f80, 0x4000};  // bf16 1.0, 2.0
  std::string dict = "{'descr': '|V2', 'fortran_order': False, 'shape': (2,), }";
  const size_t pad = 64 - (12 + dict.size() + 1) % 64;
  const uint32_t hlen = static_cast<uint32_t>(dict.size() + pad + 1);
  std::string file("\x93NUMPY\x02\x00", 8);
  file += LeBytes(&hlen, 4);  // the test host is little-endian, like every supported one
  file += dict + std::string(pad, ' ') + "\n" + LeBytes(bits, sizeof(bits));
  auto t = ParseNpy(file, DType::kBF16);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::kBF16);
  EXPECT_EQ(t->GetFloat(1), 2.0f);
}

TEST(NpyTest, WritesVersion2WhenTheHeaderOutgrows1) {
  // 30000 dims of 1 make a ~90 kB header: more than the 1.0 format's 16-bit length allows.
  auto t = HostTensor::Create(DType::kF32, std::vector<int64_t>(30000, 1));
  ASSERT_TRUE(t.ok());
  t->SetFloat(0, 3.0f);
  const std::string bytes = SerializeNpy(*t);
  EXPECT_EQ(bytes[6], '\x02');
  EXPECT_EQ(bytes[7], '\x00');
  EXPECT_EQ((bytes.size() - 4) % 64, 0u);  // the data starts on a 64-byte boundary
  auto back = ParseNpy(bytes, std::nullopt);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensor(*t, *back);
}

TEST(NpyTest, Bf16AndDTypeHints) {
  auto t = HostTensor::Create(DType::kBF16, {2});
  FillUniform(*t, 3);
  const std::string bytes = SerializeNpy(*t);

  absl::Status s = ParseError(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'<u2'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("bf16"));

  s = ParseError(bytes, DType::kF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("f16 was asked for"));

  auto f = HostTensor::Create(DType::kF32, {2});
  FillUniform(*f, 4);
  s = ParseError(SerializeNpy(*f), DType::kBF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dtype '<f4' is f32, but bf16 was asked for"));
}

struct BadCase {
  std::string name;
  std::string bytes;
  std::string message;  // a substring the error must contain
};

TEST(NpyTest, RejectsCorruptFilesWithAMessage) {
  const float values[6] = {0, 1, 2, 3, 4, 5};
  const std::string data = LeBytes(values, sizeof(values));
  auto t = HostTensor::Create(DType::kF32, {2, 3});
  t->FromFloat32(values);
  const std::string good = SerializeNpy(*t);
  ASSERT_TRUE(ParseNpy(good, std::nullopt).ok());

  std::string bad_magic = good;
  bad_magic[1] = 'X';
  std::string bad_version = good;
  bad_version[6] = 4;
  std::string short_len = good;  // header length says 8 bytes: cuts the dict
  short_len[8] = 8;
  std::string long_len = good;  // header length beyond the end of the file
  long_len[9] = '\x7f';

  const std::vector<BadCase> cases = {
      {"empty", "", "magic"},
      {"bad magic", bad_magic, "magic"},
      {"truncated preamble", good.substr(0, 9), "truncated"},
      {"unsupported version", bad_version, "version 4.0"},
      {"truncated header", good.substr(0, 100), "truncated .npy header"},
      {"header length too long", long_len, "truncated .npy header"},
      {"header length too short", short_len, "malformed .npy header"},
      {"truncated data", good.substr(0, good.size() - 1), "data is 23 bytes, but shape (2, 3)"},
      {"trailing data", good + "x", "data is 25 bytes, but shape (2, 3) of <f4 needs 24"},
      {"fortran order",
       Header10("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }") + data,
       "fortran_order is True"},
      {"big-endian", Header10("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }") + data,
       "dtype '>f4' is big-endian"},
      {"f64", Header10("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }") + data,
       "dtype '<f8' is not supported (want <f4, <f2, or <u2/|V2 for bf16)"},
      {"structured",
       Header10("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }") + data,
       "structured"},
      {"missing shape", Header10("{'descr': '<f4', 'fortran_order': False, }") + data,
       "missing key 'shape'"},
      {"missing descr", Header10("{'fortran_order': False, 'shape': (6,)}") + data,
       "missing key 'descr'"},
      {"unknown key",
       Header10("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}") + data,
       "unexpected key 'x'"},
      {"duplicate key",
       Header10("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}") + data,
       "duplicate key 'descr'"},
      {"negative dim", Header10("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}") + data,
       "dims must be >= 0"},
      {"huge dim",
       Header10("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}") +
           data,
       "does not fit in int64"},
      {"shape overflow",
       Header10("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}") +
           data,
       "overflows"},
      {"shape not a tuple",
       Header10("{'descr': '<f4', 'fortran_order': False, 'shape': [6]}") + data,
       "shape must be a tuple"},
      {"fortran_order not bool",
       Header10("{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}") + data,
       "fortran_order must be True or False"},
      {"no closing brace",
       Header10("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)") + data,
       "malformed .npy header"},
      {"text after dict",
       Header10("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x") + data,
       "unexpected text after the header dict"},
      {"unterminated string", Header10("{'descr: '<f4'") + data, "malformed .npy header"},
  };
  for (const BadCase& c : cases) {
    absl::Status s = ParseError(c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("npy: ")) << c.name;  // the source is named
  }
}

TEST(NpyTest, FileErrorsNameThePath) {
  const std::string dir = TestDir();
  auto missing = ReadNpy(dir + "/nope.npy");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir + "/nope.npy"));

  const std::string bad = dir + "/q.npy";
  WriteFileBytes(bad, Header10("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }") +
                          std::string(8, '\0'));
  auto f64 = ReadNpy(bad);
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(f64.status().message()),
      HasSubstr(bad + ": dtype '<f8' is not supported (want <f4, <f2, or <u2/|V2 for bf16)"));

  // A file cut inside the data: the length check fires before any allocation.
  auto t = HostTensor::Create(DType::kF16, {1000});
  FillUniform(*t, 9);
  const std::string cut = dir + "/cut.npy";
  WriteFileBytes(cut, SerializeNpy(*t).substr(0, 1000));
  MemoryTracker tracker;
  auto truncated = ReadNpy(cut, std::nullopt, &tracker);
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(std::string(truncated.status().message()),
              HasSubstr("but shape (1000,) of <f2 needs 2000"));
  EXPECT_EQ(tracker.peak_bytes(), 0);

  // A tiny file shorter than any preamble.
  const std::string tiny = dir + "/tiny.npy";
  WriteFileBytes(tiny, "\x93NUM");
  auto tiny_read = ReadNpy(tiny);
  ASSERT_FALSE(tiny_read.ok());
  EXPECT_THAT(std::string(tiny_read.status().message()), HasSubstr("magic"));

  absl::Status w = WriteNpy(dir + "/no/such/dir/x.npy", *t);
  EXPECT_EQ(w.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(w.message()), HasSubstr("/no/such/dir/x.npy"));
  EXPECT_EQ(WriteNpy(dir + "/e.npy", HostTensor()).code(), absl::StatusCode::kInvalidArgument);
}

// Returns a Python interpreter that can import numpy, or "" when there is none.
std::string FindPythonWithNumpy() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("ATTNSERVE_PYTHON"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  }
  candidates.push_back(std::string(ATTNSERVE_SOURCE_DIR) + "/.venv/bin/python");
  candidates.push_back("python3");
  for (const std::string& py : candidates) {
    const std::string cmd = absl::StrCat("'", py, "' -c 'import numpy' >/dev/null 2>&1");
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

// numpy loads what WriteNpy writes (same values, and the same bytes np.save would write), and
// ReadNpy loads what np.save writes, for every dtype.
TEST(NpyInteropTest, NumpyReadsOursAndWeReadNumpys) {
  const std::string python = FindPythonWithNumpy();
  if (python.empty()) {
    GTEST_SKIP() << "no Python with numpy found ($ATTNSERVE_PYTHON, " << ATTNSERVE_SOURCE_DIR
                 << "/.venv/bin/python, python3); run scripts/bootstrap to get one";
  }
  const std::string dir = TestDir();
  struct Case {
    DType dtype;
    std::vector<int64_t> dims;
  };
  const std::vector<Case> cases = {{DType::kF32, {2, 3, 5, 7}},
                                   {DType::kF16, {4, 1, 9}},
                                   {DType::kBF16, {3, 33}},
                                   {DType::kF32, {}},
                                   {DType::kF16, {0, 4}}};
  std::vector<std::string> names;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto t = HostTensor::Create(cases[i].dtype, cases[i].dims);
    ASSERT_TRUE(t.ok());
    FillUniform(*t, 100 + i, -4.0f, 4.0f);
    const std::string name = absl::StrCat("c", i);
    ASSERT_TRUE(WriteNpy(absl::StrCat(dir, "/", name, ".npy"), *t).ok());
    // The expected values as float32, the shape and the dtype, in a side file numpy reads.
    std::vector<float> f(t->numel());
    t->ToFloat32(f.data());
    WriteFileBytes(absl::StrCat(dir, "/", name, ".f32"),
                   std::string_view(reinterpret_cast<const char*>(f.data()), f.size() * 4));
    WriteFileBytes(absl::StrCat(dir, "/", name, ".meta"),
                   std::string(DTypeName(t->dtype())) + " " + absl::StrJoin(t->dims(), ","));
    names.push_back(name);
  }
  // For each case: load ours and compare values; check np.save of the same array writes the
  // same bytes; np.save a fresh array (from the float values, times -1) for us to read back.
  const std::string script = R"PY(
import io, sys, numpy as np
d = sys.argv[1]
for name in sys.argv[2:]:
    dtype, dims = open(f"{d}/{name}.meta").read().split(" ")
    shape = tuple(int(x) for x in dims.split(",") if x)
    want = np.fromfile(f"{d}/{name}.f32", dtype="<f4").reshape(shape)
    got = np.load(f"{d}/{name}.npy")
    assert got.shape == shape, (name, got.shape, shape)
    if dtype == "bf16":
        assert got.dtype == np.dtype("<u2"), (name, got.dtype)
        as_f32 = (got.astype("<u4") << 16).view("<f4")
    else:
        assert got.dtype == np.dtype({"f32": "<f4", "f16": "<f2"}[dtype]), (name, got.dtype)
        as_f32 = got.astype("<f4")
    assert np.array_equal(as_f32, want), name
    if hasattr(np.lib.format, "GROWTH_AXIS_MAX_DIGITS"):  # numpy >= 1.23 pads like we do
        buf = io.BytesIO()
        np.save(buf, got)
        assert buf.getvalue() == open(f"{d}/{name}.npy", "rb").read(), name + ": bytes differ"
    neg = -want
    if dtype == "bf16":
        out = (neg.view("<u4") >> 16).astype("<u2")  # exact: -x only flips the sign bit
    else:
        out = neg.astype({"f32": "<f4", "f16": "<f2"}[dtype])
    np.save(f"{d}/{name}.from_numpy.npy", out)
print("ok")
)PY";
  WriteFileBytes(dir + "/check.py", script);
  const std::string cmd = absl::StrCat("'", python, "' '", dir, "/check.py' '", dir, "' ",
                                       absl::StrJoin(names, " "), " > '", dir, "/log.txt' 2>&1");
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "numpy check failed:\n" << ReadFileBytes(dir + "/log.txt");

  for (size_t i = 0; i < cases.size(); ++i) {
    std::optional<DType> want;
    if (cases[i].dtype == DType::kBF16) want = DType::kBF16;
    auto back = ReadNpy(absl::StrCat(dir, "/", names[i], ".from_numpy.npy"), want);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), cases[i].dtype);
    EXPECT_EQ(back->dims(), cases[i].dims);
    auto ours = HostTensor::Create(cases[i].dtype, cases[i].dims);
    FillUniform(*ours, 100 + i, -4.0f, 4.0f);
    for (int64_t j = 0; j < ours->numel(); ++j) {
      ASSERT_EQ(back->GetFloat(j), -ours->GetFloat(j)) << names[i] << " element " << j;
    }
  }
}

}  // namespace
}  // namespace attnserve
