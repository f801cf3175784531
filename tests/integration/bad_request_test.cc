// Malformed Attend streams sent with the raw generated stub: each gets the right gRPC code and a
// message naming the field, its log line says that code and the id it sent, the server stays
// up, and afterwards its memory and in-flight gauges are back at their baseline and a good
// request still matches the reference.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "client/attn_client.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "tests/integration/attend_streams.h"
#include "tests/integration/server_fixture.h"
#include "wire/status.h"

namespace attnserve::testing {
namespace {

std::vector<v1::AttendRequest> WithSpecJson(const std::string& json) {
  v1::AttendHeader h = GoodHeader();
  *h.mutable_spec() = SpecFromJson(json);
  return FullRequest(h);
}

enum class Where { kFirst, kLast };

// The good request with the chunks of one tensor replaced by `chunks`, sent right after the
// header (kFirst: the other tensors are still incomplete) or after everything else (kLast).
std::vector<v1::AttendRequest> WithChunksOf(v1::TensorKind kind,
                                            std::vector<v1::AttendRequest> chunks,
                                            Where where = Where::kLast) {
  std::vector<v1::AttendRequest> out = {HeaderMsg(GoodHeader())};
  if (where == Where::kFirst) {
    for (v1::AttendRequest& c : chunks) out.push_back(std::move(c));
  }
  for (v1::AttendRequest& c : AllChunks(GoodHeader())) {
    if (c.chunk().tensor() != kind) out.push_back(std::move(c));
  }
  if (where == Where::kLast) {
    for (v1::AttendRequest& c : chunks) out.push_back(std::move(c));
  }
  return out;
}

// Chunks that do not add up: short, missing, overlapping, out of range, out of order.
void AddChunkCases(std::vector<BadCase>& cases) {
  const auto ia = grpc::StatusCode::INVALID_ARGUMENT;
  cases.push_back({"q_short_by_4_bytes",
                   WithChunksOf(v1::TENSOR_Q, {ChunkMsg(v1::TENSOR_Q, 0, kQBytes - 4)}), ia,
                   "q: received"});
  cases.push_back({"missing_v", WithChunksOf(v1::TENSOR_V, {}), ia, "v: received 0 of"});
  cases.push_back({"duplicate_chunk",
                   WithChunksOf(v1::TENSOR_K,
                                {ChunkMsg(v1::TENSOR_K, 0, 4096), ChunkMsg(v1::TENSOR_K, 0, 4096)},
                                Where::kFirst),
                   ia, "chunk for k: bytes [0, 4096) overlap"});
  {
    BadCase c{"chunk_after_complete_upload",
              WithChunksOf(v1::TENSOR_K,
                           {ChunkMsg(v1::TENSOR_K, 0, kKvBytes), ChunkMsg(v1::TENSOR_K, 0, 4096)}),
              ia, "chunk for k"};
    c.may_respond = true;
    cases.push_back(std::move(c));
  }
  cases.push_back(
      {"overlapping_chunks",
       WithChunksOf(v1::TENSOR_Q,
                    {ChunkMsg(v1::TENSOR_Q, 0, 2000), ChunkMsg(v1::TENSOR_Q, 1000, 2000)},
                    Where::kFirst),
       ia, "chunk for q: bytes [1000, 3000) overlap"});
  cases.push_back(
      {"chunk_past_end",
       WithChunksOf(v1::TENSOR_K, {ChunkMsg(v1::TENSOR_K, kKvBytes - 1000, 2000)}, Where::kFirst),
       ia, "past the end"});
  cases.push_back({"negative_offset", WithChunksOf(v1::TENSOR_V, {ChunkMsg(v1::TENSOR_V, -8, 16)}),
                   ia, "offset"});
  {
    std::vector<v1::AttendRequest> m = {HeaderMsg(GoodHeader()), ChunkMsg(v1::TENSOR_Q, 0, 4096),
                                        HeaderMsg(GoodHeader())};
    cases.push_back({"second_header_after_chunks", m, ia, "header"});
  }
  {
    std::vector<v1::AttendRequest> m = {ChunkMsg(v1::TENSOR_Q, 0, 4096), HeaderMsg(GoodHeader())};
    cases.push_back({"chunk_before_header", m, ia, "header: must be the first message"});
  }
}

// Header fields out of range (dtype, dims, sizes).
void AddHeaderCases(std::vector<BadCase>& cases) {
  const auto ia = grpc::StatusCode::INVALID_ARGUMENT;
  cases.push_back({"unknown_dtype",
                   WithHeader([](v1::AttendHeader& h) { h.set_dtype(static_cast<v1::DType>(42)); }),
                   ia, "header.dtype"});
  cases.push_back({"unset_dtype",
                   WithHeader([](v1::AttendHeader& h) { h.set_dtype(v1::DTYPE_UNSPECIFIED); }), ia,
                   "header.dtype"});
  cases.push_back({"q_heads_not_multiple_of_kv_heads", HeaderOnly([](v1::AttendHeader& h) {
                     h.set_q_heads(3);
                     h.set_kv_heads(2);
                   }),
                   ia, "q_heads"});
  cases.push_back({"zero_tokens", HeaderOnly([](v1::AttendHeader& h) { h.set_tokens(0); }), ia,
                   "header.tokens"});
  cases.push_back({"negative_batch", HeaderOnly([](v1::AttendHeader& h) { h.set_batch(-1); }), ia,
                   "header.batch"});
  cases.push_back({"zero_kv_heads", HeaderOnly([](v1::AttendHeader& h) { h.set_kv_heads(0); }), ia,
                   "kv_heads"});
  cases.push_back({"head_dim_too_large",
                   HeaderOnly([](v1::AttendHeader& h) { h.set_head_dim(4096); }), ia, "head_dim"});
  // server/request_assembler.h: Q + K + V bytes above --max-request-bytes are RESOURCE_EXHAUSTED
  // (checked with saturating arithmetic before any allocation).
  cases.push_back({"header_claims_1e12_tokens",
                   HeaderOnly([](v1::AttendHeader& h) { h.set_tokens(1000000000000); }),
                   grpc::StatusCode::RESOURCE_EXHAUSTED, "header.tokens"});
}

// Specs that ValidateSpec refuses, each naming its field.
void AddSpecCases(std::vector<BadCase>& cases) {
  const auto ia = grpc::StatusCode::INVALID_ARGUMENT;
  cases.push_back(
      {"dilation_exceeds_segment",
       WithSpecJson(R"({"dilated": {"segmentLengths": [16, 64], "dilationRates": [1, 128]}})"), ia,
       "spec.dilated.dilation_rates[1]"});
  cases.push_back(
      {"dilated_length_mismatch",
       WithSpecJson(R"({"dilated": {"segmentLengths": [16, 64], "dilationRates": [1]}})"), ia,
       "spec.dilated"});
  cases.push_back(
      {"bad_block_size",
       WithSpecJson(R"({"blockSparse": {"blockSize": 96, "localWindow": {"width": 1}}})"), ia,
       "spec.block_sparse.block_size"});
  // 128 tokens at block size 64: 2 blocks, so column 5 is out of range.
  cases.push_back({"csr_column_out_of_range",
                   WithSpecJson(R"({"blockSparse": {"blockSize": 64, "csr": {"rowPtr": [0, 1, 2],
                                    "colIdx": [0, 5]}}})"),
                   ia, "spec.block_sparse.csr.col_idx"});
  cases.push_back({"csr_row_ptr_wrong_length",
                   WithSpecJson(R"({"blockSparse": {"blockSize": 64, "csr": {"rowPtr": [0, 1],
                                    "colIdx": [0]}}})"),
                   ia, "spec.block_sparse.csr.row_ptr"});
  cases.push_back({"random_keep_above_one",
                   WithSpecJson(R"({"blockSparse": {"blockSize": 64, "random": {"keep": 1.5}}})"),
                   ia, "spec.block_sparse.random.keep"});
  cases.push_back(
      {"negative_window", WithSpecJson(R"({"window": {"size": -3}})"), ia, "spec.window.size"});
  cases.push_back({"unset_spec_pattern",
                   WithHeader([](v1::AttendHeader& h) { h.mutable_spec()->Clear(); }), ia,
                   "spec.pattern"});
  cases.push_back({"block_sparse_without_generator",
                   WithSpecJson(R"({"blockSparse": {"blockSize": 64}})"), ia, "spec.block_sparse"});
  cases.push_back({"negative_scale",
                   WithHeader([](v1::AttendHeader& h) { h.mutable_spec()->set_scale(-1.0f); }), ia,
                   "spec.scale"});
}

// Messages the stream refuses: response chunk size, tensor kinds, an empty message, a chunk
// above the limit, a stream that ends mid-upload.
void AddMessageCases(std::vector<BadCase>& cases) {
  const auto ia = grpc::StatusCode::INVALID_ARGUMENT;
  cases.push_back({"negative_response_chunk_bytes",
                   WithHeader([](v1::AttendHeader& h) { h.set_response_chunk_bytes(-1); }), ia,
                   "header.response_chunk_bytes"});
  cases.push_back({"output_tensor_kind_in_request",
                   WithChunksOf(v1::TENSOR_Q, {ChunkMsg(v1::TENSOR_O, 0, kQBytes)}), ia,
                   "chunk.tensor"});
  cases.push_back({"unknown_tensor_kind",
                   WithChunksOf(v1::TENSOR_Q, {ChunkMsg(static_cast<v1::TensorKind>(42), 0, 64)}),
                   ia, "chunk.tensor"});
  cases.push_back(
      {"empty_message", {HeaderMsg(GoodHeader()), v1::AttendRequest()}, ia, "request.message"});
  {
    v1::AttendHeader h = GoodHeader();
    h.set_tokens(8192);  // q is 2 MiB, so one chunk can exceed the 1 MiB limit
    std::vector<v1::AttendRequest> m = {HeaderMsg(h),
                                        ChunkMsg(v1::TENSOR_Q, 0, kMaxChunkBytes + 4)};
    cases.push_back({"chunk_above_max_chunk_bytes", m, ia, "max-chunk-bytes"});
  }
  {
    // WritesDone after half of Q: the error names the bytes that never came.
    std::vector<v1::AttendRequest> m = {HeaderMsg(GoodHeader()),
                                        ChunkMsg(v1::TENSOR_Q, 0, kQBytes / 2)};
    cases.push_back({"stream_cut_mid_upload", m, ia,
                     absl::StrCat("q: received ", kQBytes / 2, " of ", kQBytes)});
  }
}

// Calls that end on the client's side: a deadline before or during compute, a cancel mid-upload.
void AddDeadlineAndCancelCases(std::vector<BadCase>& cases) {
  {
    // 16 MiB of f32 input and ~34 GFLOP of dense work: far more than 150 ms on the CPU backend.
    v1::AttendHeader h = GoodHeader();
    h.set_tokens(4096);
    h.set_q_heads(8);
    h.set_kv_heads(8);
    h.set_head_dim(64);
    BadCase c{"deadline_expires", FullRequest(h), grpc::StatusCode::DEADLINE_EXCEEDED, ""};
    c.deadline = absl::Milliseconds(150);
    cases.push_back(std::move(c));
  }
  {
    // 24 MiB of input (uploaded in tens of milliseconds in 256 KiB chunks) but ~275 GFLOP of
    // dense work (seconds on the CPU backend even where its GEMMs reach 150+ GFLOP/s: 16384
    // tokens, 69 GFLOP, once finished inside the deadline): the deadline passes while the request
    // is queued or computing, so the server must stop it and free its memory.
    v1::AttendHeader h = GoodHeader();
    h.set_tokens(32768);
    h.set_q_heads(1);
    h.set_head_dim(64);
    std::vector<v1::AttendRequest> m = {HeaderMsg(h)};
    for (v1::AttendRequest& r : AllChunks(h, 256 << 10)) m.push_back(std::move(r));
    BadCase c{"deadline_expires_during_compute", std::move(m), grpc::StatusCode::DEADLINE_EXCEEDED,
              ""};
    c.deadline = absl::Milliseconds(600);
    cases.push_back(std::move(c));
  }
  {
    v1::AttendHeader h = GoodHeader();
    h.set_tokens(4096);
    std::vector<v1::AttendRequest> m = FullRequest(h);
    BadCase c{"client_cancels_mid_upload", std::move(m), grpc::StatusCode::CANCELLED, ""};
    c.cancel_after = 3;
    cases.push_back(std::move(c));
  }
}

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  AddChunkCases(cases);
  AddHeaderCases(cases);
  AddSpecCases(cases);
  AddMessageCases(cases);
  AddDeadlineAndCancelCases(cases);
  return cases;
}

class BadRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.extra_args = {absl::StrCat("--max_chunk_bytes=", kMaxChunkBytes),
                          absl::StrCat("--chunk_bytes=", kMaxChunkBytes / 4)};
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start(options);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    channel_ =
        grpc::CreateCustomChannel(server_->target(), grpc::InsecureChannelCredentials(), args);
    stub_ = v1::AttentionService::NewStub(channel_);
  }

  // attnserve_device_memory_used_bytes (all devices) and attnserve_inflight_requests.
  absl::Status ReadGauges(double* memory, double* inflight) {
    absl::StatusOr<std::string> text = server_->ScrapeMetrics();
    if (!text.ok()) return text.status();
    absl::StatusOr<double> m = MetricSum(*text, "attnserve_device_memory_used_bytes");
    if (!m.ok()) return m.status();
    absl::StatusOr<double> f = MetricSum(*text, "attnserve_inflight_requests");
    if (!f.ok()) return f.status();
    *memory = *m;
    *inflight = *f;
    return absl::OkStatus();
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

TEST_F(BadRequestTest, EveryMalformedStreamIsRefusedAndTheServerRecovers) {
  double base_memory = 0;
  double base_inflight = 0;
  ASSERT_TRUE(ReadGauges(&base_memory, &base_inflight).ok());
  EXPECT_EQ(base_inflight, 0);

  const std::vector<BadCase> cases = BadCases();
  ASSERT_GE(cases.size(), 20u);
  for (BadCase c : cases) {
    SCOPED_TRACE(c.name);
    // Each case's headers carry its own id; the log line must show it, or "-" when the server
    // refused the stream before it read a header.
    const std::string id = "bad-" + c.name;
    for (v1::AttendRequest& m : c.messages) {
      if (m.has_header()) m.mutable_header()->set_request_id(id);
    }
    const std::string logged_id = c.messages.front().has_header() ? id : "-";
    const size_t lines_before = AttendLines(server_->process().Log(kWholeLog)).size();
    const absl::Time start = absl::Now();
    const RawOutcome out = SendRaw(stub_.get(), c);
    std::printf("%-36s -> %s: %s (%.3f s)\n", c.name.c_str(),
                std::string(absl::StatusCodeToString(
                                static_cast<absl::StatusCode>(out.status.error_code())))
                    .c_str(),
                out.status.error_message().c_str(), absl::ToDoubleSeconds(absl::Now() - start));
    EXPECT_EQ(out.status.error_code(), c.code) << out.status.error_message();
    EXPECT_NE(out.status.error_message().find(c.field), std::string::npos)
        << "message \"" << out.status.error_message() << "\" does not name \"" << c.field << "\"";
    if (!c.may_respond) {
      EXPECT_EQ(out.responses, 0);
    }
    const std::vector<std::string> lines = WaitForAttendLines(*server_, lines_before);
    ASSERT_EQ(lines.size(), lines_before + 1) << "one request line per call:\n" << server_->Log();
    std::map<std::string, std::string> fields = LineFields(lines.back());
    EXPECT_EQ(fields["id"], logged_id) << lines.back();
    EXPECT_EQ(fields["code"], GrpcCodeName(out.status.error_code())) << lines.back();
    ASSERT_TRUE(server_->Running()) << "attnserve died on case " << c.name << ":\n"
                                    << server_->Log();
    absl::Status health = server_->CheckHealth();
    ASSERT_TRUE(health.ok()) << health;
  }

  // Calls that were cancelled or ran out of time may still be winding down on a worker: poll the
  // gauges (bounded) until they are back at the baseline.
  double memory = -1;
  double inflight = -1;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    ASSERT_TRUE(ReadGauges(&memory, &inflight).ok());
    if (memory == base_memory && inflight == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(memory, base_memory) << "device memory not released";
  EXPECT_EQ(inflight, 0) << "calls still in flight";

  absl::StatusOr<std::string> text = server_->ScrapeMetrics();
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<double> refused = MetricSum(*text, "attnserve_requests_total");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_GE(*refused, static_cast<double>(cases.size()));

  // And a good request still works.
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  absl::StatusOr<Problem> problem =
      MakeProblem(DType::kF32, 1, 200, 4, 2, 32,
                  SpecFromJson(R"({"window": {"size": 16}, "causal": true})"), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  std::unique_ptr<client::AttnClient> attn = server_->NewClient();
  ASSERT_NE(attn, nullptr);
  client::AttendInput input = AttendInputFor(*problem);
  client::CallOptions call;
  call.timeout = absl::Seconds(60);
  absl::StatusOr<client::AttendResult> result = attn->Attend(input, call);
  ASSERT_TRUE(result.ok()) << result.status();
  absl::Status check =
      CheckResult(*problem, *result, OTolerance(DType::kF32), LseTolerance(DType::kF32));
  EXPECT_TRUE(check.ok()) << check;
}

// The client library surfaces a server error in the middle of an upload at once, with the
// server's message, instead of finishing the upload first.
TEST_F(BadRequestTest, ClientSurfacesServerErrorMidUpload) {
  // 8 MiB of bf16 input in 64 KiB chunks with an invalid spec that the server only sees in the
  // header: the call must fail long before 128 chunks have been written.
  absl::StatusOr<Problem> problem =
      MakeProblem(DType::kBF16, 1, 8192, 4, 4, 64,
                  SpecFromJson(R"({"dilated": {"segmentLengths": [8], "dilationRates": [9]}})"), 5);
  ASSERT_TRUE(problem.ok());
  client::ClientOptions options;
  options.target = server_->target();
  options.chunk_bytes = 64 << 10;
  absl::StatusOr<std::unique_ptr<client::AttnClient>> attn = client::AttnClient::Create(options);
  ASSERT_TRUE(attn.ok());
  client::AttendInput input = AttendInputFor(*problem);
  int64_t sent = 0;
  int64_t total = 0;
  client::CallOptions call;
  call.timeout = absl::Seconds(30);
  call.progress = [&](const client::Progress& p) {
    sent = p.sent_bytes;
    total = p.send_total_bytes;
  };
  absl::StatusOr<client::AttendResult> result = (*attn)->Attend(input, call);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(result.status().message().find("spec.dilated.dilation_rates[0]"), std::string::npos)
      << result.status();
  EXPECT_LT(sent, total) << "the whole upload was sent before the error surfaced";
}

}  // namespace
}  // namespace attnserve::testing
