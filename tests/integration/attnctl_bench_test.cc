// attnctl bench's sweeps against the real server: a concurrency sweep and a fixed-rate (open
// loop) run write their CSV and JSON reports with one row per level or rate and sane numbers,
// and bad values of the sweep flags are usage errors (exit 2) that say what was wrong. Each run
// is about a second of load on small shapes.
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

#ifndef ATTNCTL_BINARY
#error "ATTNCTL_BINARY must be defined (path of the attnctl binary)"
#endif

namespace attnserve::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

class AttnctlBenchTest : public SharedServerTest<> {
 protected:
  void SetUp() override {
    SharedServerTest::SetUp();
    if (HasFatalFailure()) return;
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnctl_bench_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
  }

  // attnctl bench <args...> against the server, bounded.
  static CommandResult Bench(std::vector<std::string> args) {
    args.insert(args.begin(), {"bench", "--server=" + server_->target()});
    return RunLogged("attnctl", ATTNCTL_BINARY, args, absl::Seconds(30));
  }

  std::unique_ptr<TempDir> dir_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One CSV line's fields (quoted fields may hold commas; "" is a quote).
std::vector<std::string> CsvFields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

// The CSV file as one column-name -> value map per row.
std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::vector<std::string> lines = absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty());
  std::vector<std::map<std::string, std::string>> rows;
  if (lines.empty()) return rows;
  const std::vector<std::string> header = CsvFields(lines[0]);
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> fields = CsvFields(lines[i]);
    EXPECT_EQ(fields.size(), header.size()) << lines[i];
    std::map<std::string, std::string> row;
    for (size_t c = 0; c < header.size() && c < fields.size(); ++c) row[header[c]] = fields[c];
    rows.push_back(row);
  }
  return rows;
}

Struct ReadJson(const std::string& path) {
  Struct out;
  const std::string text = ReadFile(path);
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &out).ok()) << text;
  return out;
}

double Num(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  EXPECT_NE(it, s.fields().end()) << key;
  return it == s.fields().end() ? -1 : it->second.number_value();
}

// The run record and the problem, as every result file has them.
void ExpectRunRecord(const Struct& report) {
  const auto& f = report.fields();
  for (const char* key : {"device", "date", "commit", "command"}) {
    ASSERT_TRUE(f.count(key)) << key;
    EXPECT_FALSE(f.at(key).string_value().empty()) << key;
  }
  EXPECT_EQ(f.at("device").string_value().rfind("cpu: ", 0), 0u) << f.at("device").string_value();
  EXPECT_NE(f.at("command").string_value().find("bench"), std::string::npos);
  EXPECT_EQ(f.at("backend").string_value(), "cpu");
  EXPECT_EQ(f.at("shape").list_value().values_size(), 4);
  EXPECT_GT(Num(report, "request_bytes"), 0);
}

// Latencies ordered and positive; no error.
void ExpectSaneRow(const Struct& row) {
  const Struct& l = row.fields().at("latency_s").struct_value();
  EXPECT_GT(Num(l, "min"), 0);
  EXPECT_LE(Num(l, "min"), Num(l, "p50"));
  EXPECT_LE(Num(l, "p50"), Num(l, "p90"));
  EXPECT_LE(Num(l, "p90"), Num(l, "p99"));
  EXPECT_LE(Num(l, "p99"), Num(l, "max"));
  EXPECT_LT(Num(l, "max"), 5);
  EXPECT_EQ(Num(row, "failed"), 0);
  EXPECT_EQ(row.fields().at("errors").struct_value().fields_size(), 0);
  EXPECT_GT(Num(row, "ok"), 0);
  EXPECT_EQ(Num(row, "ok"), Num(row, "requests"));
  EXPECT_GT(Num(row, "requests_per_s"), 0);
  EXPECT_GT(Num(row, "bytes_per_s"), Num(row, "requests_per_s"));
}

TEST_F(AttnctlBenchTest, ConcurrencySweepWritesOneRowPerLevel) {
  const std::string csv = dir_->File("sweep.csv");
  const std::string json = dir_->File("sweep.json");
  CommandResult r =
      Bench({"--random=1,64,2,1,16", "--dtype=f32", "--concurrency=1,2", "--duration=1s",
             "--timeout=20s", "--report-csv", csv, "--report-json=" + json});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("concurrency"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("p99 ms"), std::string::npos) << r.output;

  const Struct report = ReadJson(json);
  ExpectRunRecord(report);
  EXPECT_EQ(report.fields().at("mode").string_value(), "concurrency");
  const auto& rows = report.fields().at("rows").list_value().values();
  ASSERT_EQ(rows.size(), 2);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const Struct& row = rows[i].struct_value();
    EXPECT_EQ(Num(row, "concurrency"), i + 1);
    ExpectSaneRow(row);
    EXPECT_GE(Num(row, "elapsed_s"), 0.9);
    EXPECT_LT(Num(row, "elapsed_s"), 5);
    // The rate is what was measured: requests over the run's time.
    EXPECT_NEAR(Num(row, "requests_per_s"), Num(row, "ok") / Num(row, "elapsed_s"),
                1e-3 * Num(row, "requests_per_s"));
  }

  const auto csv_rows = ReadCsv(csv);
  ASSERT_EQ(csv_rows.size(), 2u) << ReadFile(csv);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(csv_rows[i].at("mode"), "concurrency");
    EXPECT_EQ(csv_rows[i].at("concurrency"), absl::StrCat(i + 1));
    EXPECT_EQ(csv_rows[i].at("failed"), "0");
    EXPECT_EQ(csv_rows[i].at("errors"), "");
    EXPECT_GT(std::stod(csv_rows[i].at("requests_per_s")), 0);
    EXPECT_LE(std::stod(csv_rows[i].at("latency_p50_s")),
              std::stod(csv_rows[i].at("latency_p99_s")));
    EXPECT_EQ(csv_rows[i].at("device"), report.fields().at("device").string_value());
    EXPECT_EQ(csv_rows[i].at("commit"), report.fields().at("commit").string_value());
    EXPECT_NE(csv_rows[i].at("command").find("--concurrency=1,2"), std::string::npos);
  }
}

TEST_F(AttnctlBenchTest, FixedRateHoldsTheRate) {
  const std::string csv = dir_->File("rate.csv");
  const std::string json = dir_->File("rate.json");
  CommandResult r =
      Bench({"--random=1,64,2,1,16", "--dtype=f32", "--rate=20", "--duration=1s",
             "--max-inflight=8", "--timeout=20s", "--report-csv=" + csv, "--report-json=" + json});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rate/s"), std::string::npos) << r.output;

  const Struct report = ReadJson(json);
  ExpectRunRecord(report);
  EXPECT_EQ(report.fields().at("mode").string_value(), "rate");
  const auto& rows = report.fields().at("rows").list_value().values();
  ASSERT_EQ(rows.size(), 1);
  const Struct& row = rows[0].struct_value();
  ExpectSaneRow(row);
  EXPECT_EQ(Num(row, "target_rate"), 20);
  EXPECT_EQ(Num(row, "max_inflight"), 8);
  EXPECT_EQ(Num(row, "requests"), 20);  // 1 s at 20/s, every one sent
  EXPECT_EQ(Num(row, "dropped"), 0);
  // 20 requests over the 1 s schedule, or over a little more when the last answer comes after it
  // (ctest runs tests side by side on two cores: room for a slow last request).
  EXPECT_LE(Num(row, "requests_per_s"), 20.5);
  EXPECT_GE(Num(row, "requests_per_s"), 14);
  EXPECT_GE(Num(row, "max_send_lag_s"), 0);

  const auto csv_rows = ReadCsv(csv);
  ASSERT_EQ(csv_rows.size(), 1u) << ReadFile(csv);
  EXPECT_EQ(csv_rows[0].at("mode"), "rate");
  EXPECT_EQ(csv_rows[0].at("target_rate"), "20");
  EXPECT_EQ(csv_rows[0].at("requests"), "20");
  EXPECT_EQ(csv_rows[0].at("dropped"), "0");
  EXPECT_EQ(std::stod(csv_rows[0].at("requests_per_s")), Num(row, "requests_per_s"));
}

// --json prints the report document of a sweep on stdout (the files are optional).
TEST_F(AttnctlBenchTest, SweepJsonOnStdout) {
  CommandResult r = Bench({"--random=1,32,1,1,16", "--dtype=f32", "--rate=10,30", "--requests=5",
                           "--json", "--timeout=20s"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t begin = r.output.find('{');
  const size_t end = r.output.rfind('}');
  ASSERT_NE(begin, std::string::npos) << r.output;
  Struct report;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(r.output.substr(begin, end - begin + 1), &report)
          .ok())
      << r.output;
  const auto& rows = report.fields().at("rows").list_value().values();
  ASSERT_EQ(rows.size(), 2);
  EXPECT_EQ(Num(rows[0].struct_value(), "target_rate"), 10);
  EXPECT_EQ(Num(rows[1].struct_value(), "target_rate"), 30);
  for (const Value& row : rows) EXPECT_EQ(Num(row.struct_value(), "ok"), 5);
}

TEST_F(AttnctlBenchTest, BadSweepFlagsAreUsageErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--concurrency=1,,2"}, "--concurrency: expected a comma-separated list of integers"},
      {{"--concurrency=0"}, "--concurrency: expected a comma-separated list of integers 1..1024"},
      {{"--concurrency=2000"}, "1..1024"},
      {{"--rate=0"}, "--rate: expected a comma-separated list of numbers > 0"},
      {{"--rate=fast"}, "got 'fast'"},
      {{"--rate=10", "--concurrency=2"}, "--rate (open loop) and --concurrency"},
      {{"--max-inflight=4"}, "--max-inflight bounds the open loop of --rate"},
      {{"--rate=10", "--max-inflight=0"}, "--max-inflight: expected an integer >= 1"},
      {{"--rate=0.5", "--duration=1s"}, "sends no request"},
      {{"--report-json=" + dir_->File("no/such/dir.json")}, "--report-json: cannot write"},
      {{"--report-csv="}, "--report-csv: expected a file name"},
      {{"--report-csv=" + dir_->File("x"), "--report-json=" + dir_->File("x")},
       "name the same file"},
  };
  for (const auto& [flags, message] : cases) {
    // Each is refused before a request is sent.
    std::vector<std::string> args = {"--random=1,32,1,1,16"};
    args.insert(args.end(), flags.begin(), flags.end());
    CommandResult r = Bench(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("see attnctl bench --help"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace attnserve::testing
