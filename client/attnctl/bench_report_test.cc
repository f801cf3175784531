#include "client/attnctl/bench_report.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace attnserve::attnctl {
namespace {

BenchReportHeader Header(bool open_loop) {
  BenchReportHeader h;
  h.record = {"cpu: Test CPU", "2026-11-26T10:00:00Z", "abc123",
              "attnctl bench --spec '{\"dense\": {}}'"};
  h.server = "localhost:1";
  h.backend = "cpu";
  h.placement = "single on cpu:0";
  h.shape = {1, 64, 2, 16};
  h.kv_heads = 1;
  h.kv_tokens = 64;
  h.dtype = "bf16";
  h.spec_json = R"({"dense":{}})";
  h.request_bytes = 8192;
  h.response_bytes = 4096;
  h.open_loop = open_loop;
  h.transport = "grpc";
  return h;
}

std::vector<BenchRow> Rows(bool open_loop) {
  std::vector<BenchRow> rows(2);
  for (int i = 0; i < 2; ++i) {
    BenchRow& r = rows[i];
    if (open_loop) {
      r.target_rate = 10.0 * (i + 1);
      r.max_inflight = 8;
    } else {
      r.concurrency = i + 1;
    }
    r.requests = r.ok = 10 * (i + 1);
    r.elapsed_s = 1;
    r.requests_per_s = r.ok;
    r.p50 = 0.001;
    r.p90 = 0.002;
    r.p99 = 0.003;
    r.max = 0.004;
  }
  rows[1].failed = 3;
  rows[1].errors = {{"UNAVAILABLE", 2}, {"DEADLINE_EXCEEDED", 1}};
  return rows;
}

TEST(BenchReportTest, CsvHasAHeaderAndOneQuotedLinePerRow) {
  const std::string csv = ReportCsv(Header(false), Rows(false));
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << csv;
  EXPECT_EQ(lines[0].rfind("mode,concurrency,target_rate,max_inflight,requests,ok,", 0), 0u);
  EXPECT_NE(lines[0].find(",device,date,commit,command,"), std::string::npos);
  EXPECT_EQ(lines[1].rfind("concurrency,1,0,0,10,10,0,0,,1,10,", 0), 0u) << lines[1];
  EXPECT_NE(lines[2].find(",DEADLINE_EXCEEDED=1;UNAVAILABLE=2,"), std::string::npos) << lines[2];
  // The command and the spec hold commas or quotes: quoted, inner quotes doubled.
  EXPECT_NE(lines[1].find(R"("attnctl bench --spec '{""dense"": {}}'")"), std::string::npos)
      << lines[1];
  EXPECT_NE(lines[1].find(R"(,"{""dense"":{}}",8192,4096)"), std::string::npos) << lines[1];
}

TEST(BenchReportTest, JsonCarriesTheRunRecordAndRows) {
  const std::string json = ReportJson(Header(true), Rows(true)).Dump();
  EXPECT_EQ(json.rfind(R"({"device": "cpu: Test CPU", "date": "2026-11-26T10:00:00Z", )", 0), 0u)
      << json;
  EXPECT_NE(json.find(R"("mode": "rate")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("spec": {"dense":{}})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("rows": [{"target_rate": 10, "max_inflight": 8, "requests": 10, )"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("errors": {"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 2})"), std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("latency_s": {"p50": 0.001, "p90": 0.002, "p99": 0.003, "max": 0.004, )"),
            std::string::npos)
      << json;
}

TEST(BenchReportTest, TableHasOneLinePerRow) {
  const std::string table = ReportTable(Header(false), Rows(false));
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u) << table;
  EXPECT_NE(lines[2].find("concurrency"), std::string::npos) << table;
  EXPECT_NE(lines[2].find("p99 ms"), std::string::npos) << table;
  EXPECT_NE(lines[4].find("DEADLINE_EXCEEDED=1;UNAVAILABLE=2"), std::string::npos) << table;
  const std::string open = ReportTable(Header(true), Rows(true));
  EXPECT_NE(open.find("rate/s"), std::string::npos) << open;
  EXPECT_NE(open.find("scheduled start"), std::string::npos) << open;
}

}  // namespace
}  // namespace attnserve::attnctl
