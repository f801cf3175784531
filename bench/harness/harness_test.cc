#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/util/json.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/run_record.h"
#include "gtest/gtest.h"

namespace attnserve::bench {
namespace {

TEST(JsonTest, WritesFieldsInOrderWithResultFilePrecision) {
  Json j = Json::Object();
  j.Set("name", "dense \"n\"\n").Set("n", int64_t{65536}).Set("ms", 1.23456789);
  j.Set("nan", std::nan("")).Set("ok", true).Set("none", Json());
  j.Set("spec", Json::Raw(R"({"dense":{}})"));
  j.Set("runs", Json::ArrayOf(std::vector<double>{0.5, 0.25}));
  j.Set("n", 7);  // replaces in place
  EXPECT_EQ(j.Dump(),
            R"({"name": "dense \"n\"\n", "n": 7, "ms": 1.23457, "nan": null, "ok": true, )"
            R"("none": null, "spec": {"dense":{}}, "runs": [0.5, 0.25]})");
}

TEST(JsonTest, ExpandsTheOuterLevels) {
  Json j = Json::Object();
  j.Set("a", 1).Set("results", Json::Array().Push(Json::Object().Set("x", 2)));
  EXPECT_EQ(j.Dump(1), "{\n  \"a\": 1,\n  \"results\": [{\"x\": 2}]\n}");
  EXPECT_EQ(j.Dump(2), "{\n  \"a\": 1,\n  \"results\": [\n    {\"x\": 2}\n  ]\n}");
  EXPECT_EQ(Json::Array().Dump(2), "[]");
  EXPECT_EQ(JsonQuote(std::string("\x01", 1)), "\"\\u0001\"");
}

TEST(RankThreadsTest, BarrierAbortReleasesTheOtherRanks) {
  Barrier barrier(3);
  std::atomic<int> rounds{0};
  const std::vector<absl::Status> status = RunRankThreads(
      3,
      [&](int rank) -> absl::Status {
        for (int it = 0; it < 4; ++it) {
          if (rank == 2 && it == 2) return absl::InternalError("rank 2 broke");
          if (!barrier.Arrive()) return OtherRankFailed();
          if (rank == 0) ++rounds;
        }
        return absl::OkStatus();
      },
      &barrier);
  EXPECT_EQ(rounds.load(), 2);
  EXPECT_EQ(status[0], OtherRankFailed());
  EXPECT_EQ(FirstFailure(status), absl::InternalError("rank 2 broke"));
}

TEST(RankThreadsTest, Median) {
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 2, 3}), 2.5);
  EXPECT_TRUE(std::isnan(Median({})));
}

TEST(RunRecordTest, CommitOverrideAndFields) {
  EXPECT_EQ(BenchCommit("abc123"), "abc123");
  Json j = Json::Object();
  AddRunRecord(MakeRunRecord("cpu: test", "abc123"), j);
  const std::string text = j.Dump();
  EXPECT_NE(text.find(R"("device": "cpu: test", "date": ")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("commit": "abc123", "command": "")"), std::string::npos) << text;
}

}  // namespace
}  // namespace attnserve::bench
