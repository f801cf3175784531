#include "core/cuda/engine_table.h"

#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

constexpr char kHeader[] = "gpu,dtype,head_dim,causal,pattern,tokens,own_ms,cudnn_ms,source\n";

EngineTable MustParse(const std::string& csv) {
  absl::StatusOr<EngineTable> t = EngineTable::Parse(csv, "test");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : EngineTable();
}

// The error of parsing kHeader + `rows` (rows start at line 2).
absl::Status RowError(const std::string& rows) {
  return EngineTable::Parse(absl::StrCat(kHeader, rows), "t.csv").status();
}

TEST(EngineTableTest, ParsesRows) {
  const EngineTable t =
      MustParse(absl::StrCat("# measured by hand\n", kHeader, "\n",
                             "NVIDIA H200, bf16,128,true,dense,16384,2.5,3.0,bench/results/x\r\n",
                             "NVIDIA H100 80GB HBM3,f16,64,0,window,4096,1,1.5,\n"));
  ASSERT_EQ(t.rows().size(), 2u);
  const EngineTableRow& a = t.rows()[0];
  EXPECT_EQ(a.gpu, "NVIDIA H200");
  EXPECT_EQ(a.dtype, DType::kBF16);
  EXPECT_EQ(a.head_dim, 128);
  EXPECT_TRUE(a.causal);
  EXPECT_EQ(a.pattern, "dense");
  EXPECT_EQ(a.tokens, 16384);
  EXPECT_DOUBLE_EQ(a.own_ms, 2.5);
  EXPECT_DOUBLE_EQ(a.cudnn_ms, 3.0);
  EXPECT_EQ(a.source, "bench/results/x");
  const EngineTableRow& b = t.rows()[1];
  EXPECT_EQ(b.gpu, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(b.dtype, DType::kF16);
  EXPECT_FALSE(b.causal);
  EXPECT_EQ(b.pattern, "window");
  EXPECT_EQ(b.source, "");
  EXPECT_TRUE(MustParse(kHeader).rows().empty());
}

TEST(EngineTableTest, BadHeader) {
  absl::Status st = EngineTable::Parse("", "t.csv").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("t.csv: no header line"));
  st = EngineTable::Parse("gpu,dtype,hd,causal\n", "t.csv").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("t.csv line 1, column 3"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("got 'hd'"));
  // Rows before a header: the first one is read as the header.
  st = EngineTable::Parse("\nNVIDIA H200,bf16,128,true,dense,16384,2.5,3.0,x\n", "t.csv").status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("t.csv line 2, column 1"));
  st = EngineTable::Parse(absl::StrCat("gpu,dtype,head_dim,causal,pattern,tokens,own_ms,",
                                       "cudnn_ms,source,extra\n"),
                          "t.csv")
           .status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("t.csv line 1: the header has 10 columns"));
}

TEST(EngineTableTest, BadRowsNameLineAndColumn) {
  struct Case {
    const char* row;
    const char* where;
    const char* got;
  };
  const Case cases[] = {
      {"G,bf16,128,true,dense,16384,2.5,3\n", "t.csv line 2: expected 9 fields", "got 8"},
      {",bf16,128,true,dense,16384,2.5,3,s\n", "line 2, column 1 (gpu)", "got ''"},
      {"G,f32,128,true,dense,16384,2.5,3,s\n", "line 2, column 2 (dtype)", "got 'f32'"},
      {"G,bf16,12x,true,dense,16384,2.5,3,s\n", "line 2, column 3 (head_dim)", "got '12x'"},
      {"G,bf16,128,yes,dense,16384,2.5,3,s\n", "line 2, column 4 (causal)", "got 'yes'"},
      {"G,bf16,128,true,dilated,16384,2.5,3,s\n", "line 2, column 5 (pattern)", "'dilated'"},
      {"G,bf16,128,true,dense,0,2.5,3,s\n", "line 2, column 6 (tokens)", "got '0'"},
      {"G,bf16,128,true,dense,16384,-1,3,s\n", "line 2, column 7 (own_ms)", "got '-1'"},
      {"G,bf16,128,true,dense,16384,2.5,nan,s\n", "line 2, column 8 (cudnn_ms)", "got 'nan'"},
  };
  for (const Case& c : cases) {
    const absl::Status st = RowError(c.row);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.row;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.where)) << c.row;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.got)) << c.row;
  }
  // A later line: the number counts every line, comments and blank ones included.
  const absl::Status st = RowError("G,bf16,128,true,dense,16384,2.5,3,s\n# c\n\nG,bf16,128\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("t.csv line 5: expected 9 fields"));
}

TEST(EngineTableTest, DuplicateCaseIsAnError) {
  const absl::Status st = RowError(
      "G,bf16,128,true,dense,16384,2.5,3,a\n"
      "G,bf16,128,false,dense,16384,2.5,3,a\n"
      "G,bfloat16,128,1,dense,16384,9,9,b\n");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("t.csv line 4: the same case as line 2"));
}

TEST(EngineTableTest, ReadFile) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/engine_table_test.csv");
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(kHeader, f);
  std::fputs("G,bf16,128,true,dense,16384,2.5,x,s\n", f);
  std::fclose(f);
  const absl::Status st = EngineTable::ReadFile(path).status();
  EXPECT_THAT(std::string(st.message()),
              HasSubstr(absl::StrCat(path, " line 2, column 8 (cudnn_ms)")));
  std::remove(path.c_str());
  const absl::Status missing = EngineTable::ReadFile(path).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr(path));
}

TEST(EngineTableTest, LookupPicksNearestTokensInLogScale) {
  const EngineTable t = MustParse(absl::StrCat(kHeader,
                                               "G,bf16,128,false,dense,4096,1,2,s4k\n"
                                               "G,bf16,128,false,dense,16384,3,2,s16k\n"
                                               "G,bf16,128,false,dense,65536,1,2,s64k\n"));
  auto n_of = [&](int64_t tokens) {
    auto d = t.Lookup("G", "dense", false, DType::kBF16, 128, tokens);
    return d.has_value() ? d->row.tokens : -1;
  };
  EXPECT_EQ(n_of(16384), 16384);
  EXPECT_EQ(n_of(9000), 16384);  // log: 9000 is nearer 16384 (x1.82) than 4096 (x2.20)
  EXPECT_EQ(n_of(7000), 4096);   // x1.71 from 4096, x2.34 from 16384
  EXPECT_EQ(n_of(8192), 16384);  // equally near: the larger N
  EXPECT_EQ(n_of(128), 4096);    // outside the measured range: the nearest end
  EXPECT_EQ(n_of(1 << 20), 65536);
  EXPECT_FALSE(t.Lookup("G", "dense", false, DType::kBF16, 128, 0).has_value());
}

TEST(EngineTableTest, OwnOnlyWithTheMargin) {
  const EngineTable t = MustParse(absl::StrCat(kHeader,
                                               "G,bf16,128,false,dense,100,0.97,1.0,s\n"
                                               "G,bf16,128,false,dense,1000,0.98,1.0,s\n"
                                               "G,bf16,128,false,dense,10000,1.5,1.0,s\n"
                                               "G,bf16,128,false,dense,100000,0.5,1.0,run/a\n"));
  auto engine = [&](int64_t tokens) {
    return t.Lookup("G", "dense", false, DType::kBF16, 128, tokens)->engine;
  };
  EXPECT_EQ(engine(100), EngineTableChoice::kOwn);      // exactly 3% faster
  EXPECT_EQ(engine(1000), EngineTableChoice::kCudnn);   // 2% faster: noise
  EXPECT_EQ(engine(10000), EngineTableChoice::kCudnn);  // slower
  EXPECT_EQ(engine(100000), EngineTableChoice::kOwn);
  const auto d = t.Lookup("G", "dense", false, DType::kBF16, 128, 120000);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->reason, "measured on G (N=100000): own 0.50 ms, cudnn 1.00 ms (run/a)");
}

TEST(EngineTableTest, OnlyRowsOfTheSameCase) {
  const EngineTable t =
      MustParse(absl::StrCat(kHeader, "NVIDIA H200,bf16,128,true,dense,16384,1,2,s\n"));
  auto has = [&](std::string_view model, std::string_view pattern, bool causal, DType dtype,
                 int64_t head_dim) {
    return t.Lookup(model, pattern, causal, dtype, head_dim, 16384).has_value();
  };
  EXPECT_TRUE(has("NVIDIA H200", "dense", true, DType::kBF16, 128));
  EXPECT_TRUE(has("NVIDIA H200", "dense", true, DType::kF32, 128));  // f32 runs in bf16
  EXPECT_FALSE(has("NVIDIA H100 80GB HBM3", "dense", true, DType::kBF16, 128));
  EXPECT_FALSE(has("NVIDIA H200 NVL", "dense", true, DType::kBF16, 128));
  EXPECT_FALSE(has("NVIDIA H200", "window", true, DType::kBF16, 128));
  EXPECT_FALSE(has("NVIDIA H200", "dense", false, DType::kBF16, 128));
  EXPECT_FALSE(has("NVIDIA H200", "dense", true, DType::kF16, 128));
  EXPECT_FALSE(has("NVIDIA H200", "dense", true, DType::kBF16, 64));
  EXPECT_FALSE(EngineTable().Lookup("NVIDIA H200", "dense", true, DType::kBF16, 128, 16384));
}

TEST(EngineTableTest, BuiltinTableHasTheH200Rows) {
  ASSERT_TRUE(EngineTable::Parse(BuiltinEngineTableCsv(), "built-in").ok());
  const std::shared_ptr<const EngineTable> t = BuiltinEngineTable();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t.get(), BuiltinEngineTable().get());  // parsed once
  EXPECT_GE(t->rows().size(), 8u);
  struct Want {
    int64_t head_dim;
    bool causal;
  };
  for (const Want& w : {Want{128, false}, Want{128, true}, Want{64, false}, Want{64, true}}) {
    const auto d = t->Lookup("NVIDIA H200", "dense", w.causal, DType::kBF16, w.head_dim, 16384);
    ASSERT_TRUE(d.has_value()) << w.head_dim << " " << w.causal;
    EXPECT_EQ(d->row.tokens, 16384);
    EXPECT_THAT(d->row.source, HasSubstr("bench/results/h200-2026-11-29-kernel19"));
    // As measured at N = 16384: our kernel >= 15% faster on all four (D = 64 0.84x / 0.78x,
    // D = 128 0.83x / 0.85x cuDNN's time).
    EXPECT_EQ(d->engine, EngineTableChoice::kOwn) << d->reason;
  }
  // N = 65536 at D = 128: 0.86x / 0.86x, ours; N = 4096: 0.94x / 0.96x, past the 3% margin,
  // ours too.
  for (const bool causal : {false, true}) {
    const auto far = t->Lookup("NVIDIA H200", "dense", causal, DType::kBF16, 128, 65536);
    ASSERT_TRUE(far.has_value());
    EXPECT_EQ(far->engine, EngineTableChoice::kOwn) << far->reason;
    const auto near = t->Lookup("NVIDIA H200", "dense", causal, DType::kBF16, 128, 4096);
    ASSERT_TRUE(near.has_value());
    EXPECT_EQ(near->engine, EngineTableChoice::kOwn) << near->reason;
  }
  const auto d = t->Lookup("NVIDIA H200", "dense", false, DType::kBF16, 128, 16384);
  EXPECT_EQ(d->reason,
            "measured on NVIDIA H200 (N=16384): own 2.94 ms, cudnn 3.52 ms "
            "(bench/results/h200-2026-11-29-kernel19/d-engine-table)");
}

}  // namespace
}  // namespace attnserve
