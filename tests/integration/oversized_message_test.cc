// One 2 GiB Attend message against a 5 MiB max receive size (--max-chunk-bytes + 1 MiB) and a
// 64 MiB --grpc-memory-quota-bytes: the call ends with RESOURCE_EXHAUSTED, the server's peak
// (VmHWM) grows by less than 100 MiB, and its RSS comes back afterwards. gRPC 1.51 would buffer
// the whole message before refusing it; the quota cuts it off (docs/DESIGN.md "Hostile streams
// and memory"). The growth is printed. Also: a header with a 10^7-entry CSR.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "client/attn_client.h"
#include "core/reference/reference.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"
#include "wire/convert.h"

namespace attnserve::testing {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A field of /proc/<pid>/status in bytes ("VmRSS", "VmHWM"); 0 when unreadable.
int64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1) * 1024;
  }
  return 0;
}

// The server's RSS once it is at most `bound` (an idle server trims freed memory within a few
// hundred milliseconds), or after `timeout`, whichever comes first.
int64_t RssWithin(pid_t pid, int64_t bound, absl::Duration timeout) {
  int64_t rss = StatusBytes(pid, "VmRSS");
  const absl::Time deadline = absl::Now() + timeout;
  while (rss > bound && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    rss = StatusBytes(pid, "VmRSS");
  }
  return rss;
}

// One Attend call through the generic stub: `header` (a serialized AttendRequest), then one
// message of `payload_bytes` zero bytes, then the half-close, and the call's status. No read is
// posted: the server answers this call with a status only, and a read left pending when a write
// fails can keep Finish from completing. Every wait is bounded by `timeout`.
grpc::Status AttendRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& header,
                       int64_t payload_bytes, absl::Duration timeout) {
  static const std::string* const block = new std::string(kMiB, '\0');
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoSeconds(timeout);
  context.set_deadline(deadline);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, "/attnserve.v1.AttentionService/Attend", &cq);
  // One operation at a time; tag 1 for all of them. False when the queue gave up.
  auto await = [&](bool* ok) {
    void* tag = nullptr;
    return cq.AsyncNext(&tag, ok, deadline + std::chrono::seconds(5)) ==
           grpc::CompletionQueue::GOT_EVENT;
  };
  void* const tag = reinterpret_cast<void*>(1);
  bool ok = false;
  call->StartCall(tag);
  if (!await(&ok)) return grpc::Status(grpc::StatusCode::INTERNAL, "start timed out");
  if (ok) {
    grpc::Slice header_slice(header);
    grpc::ByteBuffer header_buffer(&header_slice, 1);
    call->Write(header_buffer, tag);
    if (!await(&ok)) return grpc::Status(grpc::StatusCode::INTERNAL, "write timed out");
  }
  if (ok) {
    std::vector<grpc::Slice> slices;
    for (int64_t sent = 0; sent < payload_bytes; sent += kMiB) {
      slices.emplace_back(block->data(), static_cast<size_t>(std::min(kMiB, payload_bytes - sent)),
                          grpc::Slice::STATIC_SLICE);
    }
    grpc::ByteBuffer payload(slices.data(), slices.size());
    call->Write(payload, tag);  // fails once the server has refused it
    if (!await(&ok)) return grpc::Status(grpc::StatusCode::INTERNAL, "write timed out");
  }
  if (ok) {
    call->WritesDone(tag);
    if (!await(&ok)) return grpc::Status(grpc::StatusCode::INTERNAL, "half-close timed out");
  }
  grpc::Status status;
  call->Finish(&status, tag);
  if (!await(&ok)) return grpc::Status(grpc::StatusCode::INTERNAL, "finish timed out");
  cq.Shutdown();
  void* ignored = nullptr;
  while (cq.Next(&ignored, &ok)) {
  }
  return status;
}

TEST(OversizedMessageTest, RefusedWithResourceExhaustedAndMemoryComesBack) {
  ServerOptions options;
  // The quota is what bounds the oversized message's cost (gRPC buffers it whole otherwise).
  options.extra_args = {"--max-chunk-bytes=4194304", "--grpc-memory-quota-bytes=67108864",
                        "--log-level=error"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const pid_t pid = (*server)->process().pid();
  const int64_t rss_start = StatusBytes(pid, "VmRSS");
  const int64_t hwm_start = StatusBytes(pid, "VmHWM");
  ASSERT_GT(rss_start, 0);

  // 2 GiB: past the 5 MiB limit by 400x, and as large as a gRPC length prefix can carry in its
  // signed range. The client sends raw bytes through the generic stub: the payload is 2048 views
  // of one 1 MiB block, so this process never holds 2 GiB either.
  constexpr int64_t kMessageBytes = 2048 * kMiB;
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto channel =
      grpc::CreateCustomChannel((*server)->target(), grpc::InsecureChannelCredentials(), args);
  v1::AttendRequest header;
  v1::AttendHeader* h = header.mutable_header();
  h->set_dtype(v1::DTYPE_F32);
  h->set_batch(1);
  h->set_tokens(8192);
  h->set_q_heads(16);
  h->set_kv_heads(16);
  h->set_head_dim(128);
  h->mutable_spec()->mutable_dense();
  const grpc::Status status =
      AttendRaw(channel, header.SerializeAsString(), kMessageBytes, absl::Seconds(120));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  std::printf("status: %d %s\n", static_cast<int>(status.error_code()),
              status.error_message().c_str());

  const int64_t hwm_growth = StatusBytes(pid, "VmHWM") - hwm_start;
  std::printf("oversized message of %lld MiB: server VmHWM growth %.1f MiB\n",
              static_cast<long long>(kMessageBytes / kMiB), hwm_growth / 1048576.0);
  EXPECT_LT(hwm_growth, 100 * kMiB) << "the message was buffered past --grpc-memory-quota-bytes";

  // Back to within 64 MiB of the start once the call is gone (trimmed when idle).
  const int64_t rss = RssWithin(pid, rss_start + 64 * kMiB, absl::Seconds(10));
  std::printf("server RSS: start %.1f MiB, after %.1f MiB\n", rss_start / 1048576.0,
              rss / 1048576.0);
  EXPECT_LE(rss, rss_start + 64 * kMiB);

  // And it still serves.
  EXPECT_TRUE((*server)->CheckHealth().ok());
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

// A header carrying a 10^7-entry CSR (about 10 MB on the wire, 80 MB once parsed): refused with
// RESOURCE_EXHAUSTED naming --max-spec-entries before the spec is converted, the parsed message
// freed with the call, and the server's RSS back afterwards. The peak growth is printed.
TEST(OversizedMessageTest, HugeCsrHeaderRefusedBeforeTheSpecIsConverted) {
  ServerOptions options;
  options.extra_args = {"--log-level=error"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const pid_t pid = (*server)->process().pid();
  const int64_t rss_start = StatusBytes(pid, "VmRSS");
  const int64_t hwm_start = StatusBytes(pid, "VmHWM");

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto channel =
      grpc::CreateCustomChannel((*server)->target(), grpc::InsecureChannelCredentials(), args);
  auto stub = v1::AttentionService::NewStub(channel);
  for (int round = 0; round < 3; ++round) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub->Attend(&context);
    v1::AttendRequest header;
    v1::AttendHeader* h = header.mutable_header();
    h->set_dtype(v1::DTYPE_BF16);
    h->set_batch(1);
    h->set_tokens(262144);  // 4096 blocks of 64: the shape allows 4096^2 col_idx entries
    h->set_q_heads(1);
    h->set_kv_heads(1);
    h->set_head_dim(64);
    v1::BlockSparse* bs = h->mutable_spec()->mutable_block_sparse();
    bs->set_block_size(64);
    v1::Csr* csr = bs->mutable_csr();
    csr->mutable_col_idx()->Resize(10'000'000, 1);
    for (int i = 0; i <= 4096; ++i) csr->add_row_ptr(0);
    EXPECT_GT(header.ByteSizeLong(), 9'000'000u);
    ASSERT_TRUE(stream->Write(header));
    stream->WritesDone();
    v1::AttendResponse response;
    while (stream->Read(&response)) {
    }
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_NE(status.error_message().find("spec.block_sparse.csr.col_idx"), std::string::npos)
        << status.error_message();
    EXPECT_NE(status.error_message().find("--max-spec-entries=4194304"), std::string::npos)
        << status.error_message();
  }
  const int64_t hwm_growth = StatusBytes(pid, "VmHWM") - hwm_start;
  std::printf("10^7-entry CSR header x 3: server VmHWM growth %.1f MiB\n", hwm_growth / 1048576.0);
  // One parse at a time (80 MB of int64s, plus the repeated field's doubling), never kept.
  EXPECT_LT(hwm_growth, 256 * kMiB);
  const int64_t rss = RssWithin(pid, rss_start + 64 * kMiB, absl::Seconds(10));
  std::printf("server RSS: start %.1f MiB, after %.1f MiB\n", rss_start / 1048576.0,
              rss / 1048576.0);
  EXPECT_LE(rss, rss_start + 64 * kMiB);
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

// Legitimate large requests in bursts: three bursts of 64 requests of 12 MiB of inputs each
// ([1, 2048, 8, 8, 64] f32, 16 calls at a time, a narrow window so the CPU backend spends its
// time on the buffers, not the math). Every answer equals the float64 reference, and once a burst
// is over the server's RSS is back within 64 MiB of its start: request buffers are unmapped when
// freed, malloc's mmap threshold is fixed at 1 MiB and the idle server trims its arenas
// (docs/DESIGN.md "Freed memory back to the OS"; before those, RSS stayed at ~514 MiB).
TEST(OversizedMessageTest, BurstsOfLargeRequestsGiveTheirMemoryBack) {
  ServerOptions options;
  options.extra_args = {"--log-level=error"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const pid_t pid = (*server)->process().pid();
  const int64_t rss_start = StatusBytes(pid, "VmRSS");
  ASSERT_GT(rss_start, 0);
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  absl::StatusOr<Problem> p = MakeProblem(DType::kF32, 1, 2048, 8, 8, 64,
                                          SpecFromJson(R"({"window": {"size": 16}})"), seed);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<ReferenceResult> ref =
      ReferenceAttention(*SpecFromProto(p->spec), p->q, p->k, p->v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  constexpr int kBursts = 3, kThreads = 16, kPerThread = 4;
  int64_t rss_peak = rss_start;
  for (int burst = 0; burst < kBursts; ++burst) {
    std::atomic<int> good{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        std::unique_ptr<client::AttnClient> c = (*server)->NewClient();
        for (int i = 0; i < kPerThread; ++i) {
          absl::StatusOr<client::AttendResult> r = c->Attend(AttendInputFor(*p));
          if (!r.ok()) {
            ADD_FAILURE() << r.status();
            continue;
          }
          const absl::Status check =
              CheckResultAgainst(*ref, *p, *r, OTolerance(DType::kF32), LseTolerance(DType::kF32));
          if (check.ok()) {
            ++good;
          } else {
            ADD_FAILURE() << check;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(good.load(), kThreads * kPerThread);
    rss_peak = std::max(rss_peak, StatusBytes(pid, "VmHWM"));
    const int64_t rss = RssWithin(pid, rss_start + 64 * kMiB, absl::Seconds(10));
    std::printf("burst %d: server RSS start %.1f MiB, peak %.1f MiB, after %.1f MiB\n", burst,
                rss_start / 1048576.0, rss_peak / 1048576.0, rss / 1048576.0);
    EXPECT_LE(rss, rss_start + 64 * kMiB) << "burst " << burst;
  }
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

}  // namespace
}  // namespace attnserve::testing
