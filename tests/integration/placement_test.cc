// Multi-device placement through the real server (CPU backend, --cpu-workers 2 and 3): ring- and
// data-parallel-hinted requests for dense, causal dense, window, dilated and block_sparse specs
// (N not divisible by the device count) equal the float64 reference and the single-placement
// result; the response header names the placement and every device used; the per-device token
// counters and the communicator byte counters (attnserve_nccl_bytes_total, which on the CPU
// backend counts in-process ring transfers) move; an auto-placed request picks a valid placement.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/attn_client.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

namespace attnserve::testing {
namespace {

namespace v1 = ::attnserve::v1;

// The sum of the samples of `name` whose label set contains every `key="value"` in `labels`.
double LabeledSum(const std::string& text, const std::string& name,
                  const std::vector<std::string>& labels) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, name + "{")) continue;
    const size_t close = line.find('}');
    if (close == absl::string_view::npos) continue;
    const absl::string_view label_text = line.substr(0, close);
    bool all = true;
    for (const std::string& l : labels) all = all && absl::StrContains(label_text, l);
    if (!all) continue;
    double v = 0;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(close + 1)), &v)) sum += v;
  }
  return sum;
}

// Max |a - b| / max(1, max |b|) over two f32 tensors of one shape.
double MaxRelDiff(const HostTensor& a, const HostTensor& b) {
  if (a.dims() != b.dims() || a.dtype() != DType::kF32 || b.dtype() != DType::kF32) return 1e30;
  const float* x = a.data_as<float>();
  const float* y = b.data_as<float>();
  double diff = 0, scale = 1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) {
      if (std::isfinite(x[i]) != std::isfinite(y[i])) return 1e30;
      continue;
    }
    diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
  }
  return diff / scale;
}

struct SpecCase {
  std::string name;
  std::string json;
  bool causal;
};

std::vector<SpecCase> Specs() {
  return {
      {"dense", R"({"dense": {}})", false},
      {"dense_causal", R"({"dense": {}})", true},
      {"window", R"({"window": {"size": 37}})", false},
      {"dilated", R"({"dilated": {"segmentLengths": [64, 128], "dilationRates": [1, 2]}})", true},
      {"block_sparse",
       R"({"blockSparse": {"blockSize": 64, "globalLocal": {"globalBlocks": 1, "width": 1}}})",
       true},
  };
}

class PlacementTest : public ::testing::TestWithParam<int> {};

TEST_P(PlacementTest, RingAndDataParallelMatchReferenceAndSingle) {
  const int workers = GetParam();
  ServerOptions options;
  options.extra_args = {absl::StrCat("--cpu-workers=", workers), "--cpu-threads=1"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::AttnClient> attn = (*server)->NewClient();
  ASSERT_NE(attn, nullptr);

  absl::StatusOr<v1::DescribeResponse> describe = attn->Describe();
  ASSERT_TRUE(describe.ok()) << describe.status();
  EXPECT_EQ(std::vector<std::string>(describe->placements().begin(), describe->placements().end()),
            (std::vector<std::string>{"single", "data_parallel", "ring"}));

  absl::StatusOr<std::string> before = (*server)->ScrapeMetrics();
  ASSERT_TRUE(before.ok()) << before.status();

  // B * Hkv = 4 units (data parallel over 2 or 3 devices; dilated [1, 2] keeps 1 KV head per
  // unit); N = 333 is divisible by neither 2 nor 3.
  const int64_t batch = 2, tokens = 333, q_heads = 4, kv_heads = 2, head_dim = 32;
  for (const SpecCase& c : Specs()) {
    v1::AttentionSpec spec = SpecFromJson(c.json);
    spec.set_causal(c.causal);
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat(workers, " workers, ", c.name, ", seed ", seed));
    absl::StatusOr<Problem> problem =
        MakeProblem(DType::kF32, batch, tokens, q_heads, kv_heads, head_dim, spec, seed);
    ASSERT_TRUE(problem.ok()) << problem.status();

    auto attend = [&](v1::Placement hint) -> absl::StatusOr<client::AttendResult> {
      client::AttendInput input = AttendInputFor(*problem);
      input.return_lse = true;
      input.placement = hint;
      input.request_id = absl::StrCat("placement-", c.name, "-", v1::Placement_Name(hint));
      client::CallOptions call;
      call.timeout = absl::Seconds(120);
      return attn->Attend(input, call);
    };

    absl::StatusOr<client::AttendResult> single = attend(v1::PLACEMENT_SINGLE);
    ASSERT_TRUE(single.ok()) << single.status() << "\n" << (*server)->Log();
    EXPECT_EQ(single->header.placement(), v1::PLACEMENT_SINGLE);
    EXPECT_EQ(single->header.devices_size(), 1);
    ASSERT_TRUE(single->lse.has_value());

    for (v1::Placement hint : {v1::PLACEMENT_RING, v1::PLACEMENT_DATA_PARALLEL}) {
      SCOPED_TRACE(v1::Placement_Name(hint));
      absl::StatusOr<client::AttendResult> r = attend(hint);
      ASSERT_TRUE(r.ok()) << r.status() << "\n" << (*server)->Log();
      EXPECT_EQ(r->header.placement(), hint);
      if (hint == v1::PLACEMENT_RING) {
        // A ring uses every device of the pool.
        EXPECT_EQ(r->header.devices_size(), workers);
      } else {
        EXPECT_GE(r->header.devices_size(), 2);
        EXPECT_LE(r->header.devices_size(), workers);
      }
      std::vector<std::string> devices(r->header.devices().begin(), r->header.devices().end());
      std::sort(devices.begin(), devices.end());
      EXPECT_TRUE(std::unique(devices.begin(), devices.end()) == devices.end());
      for (const std::string& d : devices) EXPECT_TRUE(absl::StartsWith(d, "cpu:")) << d;
      EXPECT_GT(r->header.flops(), 0.0);
      ASSERT_TRUE(r->lse.has_value());
      ErrorStats stats;
      absl::Status check = CheckResult(*problem, *r, OTolerance(DType::kF32),
                                       LseTolerance(DType::kF32), &stats);
      EXPECT_TRUE(check.ok()) << check;
      EXPECT_LE(MaxRelDiff(r->o, single->o), 1e-5);
      EXPECT_LE(MaxRelDiff(*r->lse, *single->lse), 1e-5);
      std::printf("%d workers %s %s: O rel err %.3e, LSE abs err %.3e, devices %d\n", workers,
                  c.name.c_str(), v1::Placement_Name(hint).c_str(), stats.o_rel,
                  stats.lse_max_abs, r->header.devices_size());
    }
  }

  // Auto: some valid placement, the right answer.
  {
    const uint64_t seed = FreshSeed();
    absl::StatusOr<Problem> problem = MakeProblem(DType::kF32, batch, tokens, q_heads, kv_heads,
                                                  head_dim, SpecFromJson(R"({"dense": {}})"), seed);
    ASSERT_TRUE(problem.ok()) << problem.status();
    client::AttendInput input = AttendInputFor(*problem);
    input.placement = v1::PLACEMENT_AUTO;
    absl::StatusOr<client::AttendResult> r = attn->Attend(input);
    ASSERT_TRUE(r.ok()) << r.status();
    const v1::Placement p = r->header.placement();
    EXPECT_TRUE(p == v1::PLACEMENT_SINGLE || p == v1::PLACEMENT_DATA_PARALLEL ||
                p == v1::PLACEMENT_RING)
        << v1::Placement_Name(p);
    EXPECT_EQ(r->header.devices_size() == 1, p == v1::PLACEMENT_SINGLE);
    absl::Status check = CheckResult(*problem, *r, OTolerance(DType::kF32),
                                     LseTolerance(DType::kF32));
    EXPECT_TRUE(check.ok()) << check;
  }

  absl::StatusOr<std::string> after = (*server)->ScrapeMetrics();
  ASSERT_TRUE(after.ok()) << after.status();
  for (int d = 0; d < workers; ++d) {
    const std::string device = absl::StrCat("device=\"cpu:", d, "\"");
    EXPECT_GT(LabeledSum(*after, "attnserve_device_tokens_total", {device}),
              LabeledSum(*before, "attnserve_device_tokens_total", {device}))
        << device;
    EXPECT_GT(LabeledSum(*after, "attnserve_device_busy_seconds_total", {device}),
              LabeledSum(*before, "attnserve_device_busy_seconds_total", {device}))
        << device;
    // Every device is a ring rank that sends its K/V shard on.
    EXPECT_GT(LabeledSum(*after, "attnserve_nccl_bytes_total", {device, "direction=\"send\""}), 0)
        << device;
    EXPECT_GT(LabeledSum(*after, "attnserve_nccl_bytes_total", {device, "direction=\"recv\""}), 0)
        << device;
  }
  // Everything released once the calls are over.
  EXPECT_EQ(LabeledSum(*after, "attnserve_device_memory_used_bytes", {}), 0);
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

INSTANTIATE_TEST_SUITE_P(Workers, PlacementTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "_workers");
                         });

}  // namespace
}  // namespace attnserve::testing
