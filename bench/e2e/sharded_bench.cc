// attnbench_sharded: decode against a context kept on one device next to the same context split
// over several (context parallel), in one server and one run.
//
// Two contexts of --context-tokens rows get identical rows (seeded chunks of --append-rows,
// a different seed per chunk): "one" with CreateContext.shards = 1, "split" with --shards. Then,
// per --q-lens entry:
//   latency:    --steps sequential decode steps against each (end to end, server compute and
//               kernel medians), and the last step's O and LSE of both compared (the split
//               context must give the one-device answer: max |dO| / max |O| and max |dLSE|);
//   throughput: --concurrency client threads, each --throughput-steps steps against one context
//               at a time, as decode steps per second.
// Prints a table and the ratios (split / one); --json-out writes the figures.
//
//   attnbench_sharded --server HOST:PORT [--context-tokens 2097152] [--shards 2]
//       [--append-rows 65536] [--q-heads 32] [--kv-heads 8] [--head-dim 128] [--q-lens 1,4,16]
//       [--steps 30] [--concurrency 8] [--throughput-steps 40] [--json-out FILE]
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "bench/e2e/context_client.h"
#include "bench/harness/flags.h"
#include "bench/harness/run_record.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

ABSL_FLAG(std::string, server, "localhost:50051", "attnserve address (plaintext)");
ABSL_FLAG(int64_t, context_tokens, int64_t{2} << 20, "rows of each context");
ABSL_FLAG(int32_t, shards, 2, "devices the split context is spread over");
ABSL_FLAG(int64_t, append_rows, 65536, "rows per AppendContext");
ABSL_FLAG(int64_t, q_heads, 32, "query heads");
ABSL_FLAG(int64_t, kv_heads, 8, "KV heads");
ABSL_FLAG(int64_t, head_dim, 128, "head dim");
ABSL_FLAG(std::vector<std::string>, q_lens, std::vector<std::string>({"1", "4", "16"}),
          "query rows per decode step");
ABSL_FLAG(int, steps, 30, "sequential timed steps per context and query count (after 3 untimed)");
ABSL_FLAG(int, concurrency, 8, "client threads of the throughput phase");
ABSL_FLAG(int, throughput_steps, 40, "steps per client thread in the throughput phase");
ABSL_FLAG(std::string, json_out, "", "write the figures here as JSON");

namespace attnserve {
namespace {

namespace v1 = ::attnserve::v1;
using bench::CallFigures;
using bench::FromGrpc;
using bench::Median;

float Bf16ToFloat(const char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

absl::StatusOr<v1::ContextStatus> CreateContext(v1::AttentionService::Stub& stub,
                                                const std::string& name, int32_t shards) {
  grpc::ClientContext ctx;
  v1::CreateContextRequest req;
  req.set_name(name);
  req.set_dtype(v1::DTYPE_BF16);
  req.set_kv_heads(absl::GetFlag(FLAGS_kv_heads));
  req.set_head_dim(absl::GetFlag(FLAGS_head_dim));
  req.set_capacity_tokens(absl::GetFlag(FLAGS_context_tokens));
  req.set_shards(shards);
  v1::CreateContextResponse resp;
  ATTN_RETURN_IF_ERROR(FromGrpc(stub.CreateContext(&ctx, req, &resp), "CreateContext " + name));
  return resp.context();
}

absl::Status DeleteContext(v1::AttentionService::Stub& stub, const std::string& name) {
  grpc::ClientContext ctx;
  v1::DeleteContextRequest req;
  req.set_name(name);
  v1::DeleteContextResponse resp;
  return FromGrpc(stub.DeleteContext(&ctx, req, &resp), "DeleteContext " + name);
}

std::string ShardList(const v1::ContextStatus& c) {
  std::vector<std::string> parts;
  for (const v1::ContextShard& s : c.shards()) {
    parts.push_back(absl::StrCat(s.device(), "[", s.start(), "+", s.reserved_tokens(), "]"));
  }
  return absl::StrJoin(parts, " ");
}

struct Latency {
  std::vector<double> wall, compute, kernel;
  std::string o, lse;  // the last step's outputs
  std::vector<std::string> devices;
};

absl::StatusOr<Latency> SequentialSteps(v1::AttentionService::Stub& stub, const v1::AttendHeader& h,
                                        const std::string& q) {
  Latency l;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int i = 0; i < steps + 3; ++i) {
    const bool last = i + 1 == steps + 3;
    ATTN_ASSIGN_OR_RETURN(CallFigures f,
                          bench::TimedAttend(stub, h, q, nullptr, nullptr, last ? &l.o : nullptr,
                                             last ? &l.lse : nullptr));
    if (i < 3) continue;
    l.wall.push_back(f.wall_s);
    l.compute.push_back(f.compute_s);
    l.kernel.push_back(f.kernel_s);
    l.devices = f.devices;
  }
  return l;
}

// Steps per second with `threads` clients each running `per_thread` steps at once.
absl::StatusOr<double> Throughput(v1::AttentionService::Stub& stub, const v1::AttendHeader& h,
                                  const std::string& q, int threads, int per_thread) {
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<std::thread> pool;
  const absl::Time t0 = absl::Now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        absl::StatusOr<CallFigures> f = bench::TimedAttend(stub, h, q, nullptr, nullptr);
        if (!f.ok()) {
          absl::MutexLock lock(&mu);
          if (first_error.ok()) first_error = f.status();
          return;
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  ATTN_RETURN_IF_ERROR(first_error);
  return threads * per_thread / seconds;
}

// max |a - b| over max |a| of two bf16 O tensors, and max |a - b| of two f32 LSE tensors
// (entries where both are -inf count as equal).
struct Difference {
  double o_rel = 0, lse_abs = 0;
};

absl::StatusOr<Difference> Compare(const Latency& a, const Latency& b) {
  if (a.o.size() != b.o.size() || a.lse.size() != b.lse.size() || a.o.empty() || a.lse.empty()) {
    return absl::InternalError(absl::StrCat("outputs differ in size: O ", a.o.size(), " vs ",
                                            b.o.size(), ", LSE ", a.lse.size(), " vs ",
                                            b.lse.size()));
  }
  double max_o = 0, max_do = 0;
  for (size_t i = 0; i < a.o.size(); i += 2) {
    const double x = Bf16ToFloat(&a.o[i]), y = Bf16ToFloat(&b.o[i]);
    max_o = std::max(max_o, std::fabs(x));
    max_do = std::max(max_do, std::fabs(x - y));
  }
  Difference d;
  d.o_rel = max_o > 0 ? max_do / max_o : max_do;
  for (size_t i = 0; i < a.lse.size(); i += 4) {
    float x, y;
    std::memcpy(&x, &a.lse[i], 4);
    std::memcpy(&y, &b.lse[i], 4);
    if (std::isinf(x) && std::isinf(y) && x == y) continue;
    d.lse_abs = std::max(d.lse_abs, std::fabs(static_cast<double>(x) - y));
  }
  return d;
}

Json LatencyJson(const Latency& l) {
  return Json::Object()
      .Set("end_to_end_s", Median(l.wall))
      .Set("compute_s", Median(l.compute))
      .Set("kernel_s", Median(l.kernel))
      .Set("devices", absl::StrJoin(l.devices, ","));
}

absl::Status Run() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::AttentionService::NewStub(channel);
  const int64_t n = absl::GetFlag(FLAGS_context_tokens), rows = absl::GetFlag(FLAGS_append_rows);
  const int64_t hq = absl::GetFlag(FLAGS_q_heads), hkv = absl::GetFlag(FLAGS_kv_heads),
                d = absl::GetFlag(FLAGS_head_dim);
  const std::string tag = absl::StrCat(absl::ToUnixMicros(absl::Now()));
  const std::string one = "one-" + tag, split = "split-" + tag;
  ATTN_ASSIGN_OR_RETURN(v1::ContextStatus one_status, CreateContext(*stub, one, 1));
  ATTN_ASSIGN_OR_RETURN(v1::ContextStatus split_status,
                        CreateContext(*stub, split, absl::GetFlag(FLAGS_shards)));
  std::printf("context %s on %s\ncontext %s on %s\n", one.c_str(), ShardList(one_status).c_str(),
              split.c_str(), ShardList(split_status).c_str());

  const absl::Time t0 = absl::Now();
  for (int64_t at = 0, chunk = 0; at < n; at += rows, ++chunk) {
    const int64_t r = std::min(rows, n - at);
    const std::string k = bench::RandomBf16(r * hkv * d, 2 * chunk + 10);
    const std::string v = bench::RandomBf16(r * hkv * d, 2 * chunk + 11);
    ATTN_RETURN_IF_ERROR(bench::AppendRows(*stub, one, r, k, v));
    ATTN_RETURN_IF_ERROR(bench::AppendRows(*stub, split, r, k, v));
  }
  std::printf("%lld rows appended to both in %.1f s\n", static_cast<long long>(n),
              absl::ToDoubleSeconds(absl::Now() - t0));

  v1::AttendHeader h;
  h.set_dtype(v1::DTYPE_BF16);
  h.set_batch(1);
  h.set_q_heads(hq);
  h.set_kv_heads(hkv);
  h.set_head_dim(d);
  h.set_return_lse(true);
  h.mutable_spec()->mutable_dense();
  h.mutable_spec()->set_causal(true);

  Json out = Json::Object();
  out.Set("command", bench::BenchCommandLine())
      .Set("context_tokens", n)
      .Set("one_device", ShardList(one_status))
      .Set("split", ShardList(split_status));
  Json cases = Json::Array();
  bool equal = true;
  const int threads = absl::GetFlag(FLAGS_concurrency);
  const int per_thread = absl::GetFlag(FLAGS_throughput_steps);
  std::printf(
      "\n| Nq | one: e2e / compute / kernel ms | split: e2e / compute / kernel ms | "
      "latency one/split | steps/s one | steps/s split | throughput split/one | "
      "max |dO|/max|O| | max |dLSE| |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& ql : absl::GetFlag(FLAGS_q_lens)) {
    const int64_t nq = std::stoll(ql);
    const std::string q = bench::RandomBf16(nq * hq * d, 1000 + nq);
    v1::AttendHeader dh = h;
    dh.set_tokens(nq);
    dh.set_context(one);
    ATTN_ASSIGN_OR_RETURN(Latency lat_one, SequentialSteps(*stub, dh, q));
    ATTN_ASSIGN_OR_RETURN(double tput_one, Throughput(*stub, dh, q, threads, per_thread));
    dh.set_context(split);
    ATTN_ASSIGN_OR_RETURN(Latency lat_split, SequentialSteps(*stub, dh, q));
    ATTN_ASSIGN_OR_RETURN(double tput_split, Throughput(*stub, dh, q, threads, per_thread));
    ATTN_ASSIGN_OR_RETURN(Difference diff, Compare(lat_one, lat_split));
    // bf16 outputs of two merge orders: a few ulps of bf16 (2^-8 relative) at most.
    const bool same = diff.o_rel <= 2e-2 && diff.lse_abs <= 1e-3;
    equal = equal && same;
    std::printf(
        "| %lld | %.3f / %.3f / %.3f | %.3f / %.3f / %.3f | %.2f | %.0f | %.0f | %.2f | "
        "%.2e | %.2e %s |\n",
        static_cast<long long>(nq), Median(lat_one.wall) * 1e3, Median(lat_one.compute) * 1e3,
        Median(lat_one.kernel) * 1e3, Median(lat_split.wall) * 1e3, Median(lat_split.compute) * 1e3,
        Median(lat_split.kernel) * 1e3, Median(lat_one.wall) / Median(lat_split.wall), tput_one,
        tput_split, tput_split / tput_one, diff.o_rel, diff.lse_abs, same ? "" : "FAIL");
    cases.Push(Json::Object()
                   .Set("q_len", nq)
                   .Set("one", LatencyJson(lat_one))
                   .Set("split", LatencyJson(lat_split))
                   .Set("steps_per_s_one", tput_one)
                   .Set("steps_per_s_split", tput_split)
                   .Set("throughput_ratio", tput_split / tput_one)
                   .Set("latency_ratio", Median(lat_one.wall) / Median(lat_split.wall))
                   .Set("o_max_rel_diff", diff.o_rel)
                   .Set("lse_max_abs_diff", diff.lse_abs)
                   .Set("equal", same));
  }
  out.Set("concurrency", threads).Set("throughput_steps", per_thread).Set("cases", cases);
  out.Set("equal", equal);
  ATTN_RETURN_IF_ERROR(DeleteContext(*stub, one));
  ATTN_RETURN_IF_ERROR(DeleteContext(*stub, split));
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    ATTN_RETURN_IF_ERROR(bench::WriteJsonOut(absl::GetFlag(FLAGS_json_out), out));
  }
  std::printf("outputs of the split context %s the one-device outputs\n",
              equal ? "equal" : "DIFFER FROM");
  return equal ? absl::OkStatus()
               : absl::InternalError("the split context's outputs differ from one device's");
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv,
                                     "attnbench_sharded: one-device vs split-context decode",
                                     "attnbench_sharded", &attnserve::Run);
}
