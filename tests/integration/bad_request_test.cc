// Malformed Attend streams sent with the raw generated stub: each gets the right gRPC code and a
// message naming the field, its log line says that code and the id it sent, the server stays
// up, and afterwards its memory and in-flight gauges are back at their baseline and a good
// request still matches the reference. Hostile request ids cannot forge or flood log lines, and
// the JSON log format parses.
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
#include "tests/integration/server_fixture.h"
#include "wire/status.h"

namespace attnserve::testing {
namespace {

namespace v1 = ::attnserve::v1;

// The server of this suite accepts chunks up to this size, so that one case can exceed it cheaply.
constexpr int64_t kMaxChunkBytes = int64_t{1} << 20;
// The good request every case starts from: f32 [1, 128, 2, 32], kv_heads 1, dense.
constexpr int64_t kTokens = 128;
constexpr int64_t kQHeads = 2;
constexpr int64_t kKvHeads = 1;
constexpr int64_t kHeadDim = 32;
constexpr int64_t kQBytes = kTokens * kQHeads * kHeadDim * 4;
constexpr int64_t kKvBytes = kTokens * kKvHeads * kHeadDim * 4;

v1::AttendHeader GoodHeader() {
  v1::AttendHeader h;
  h.set_request_id("bad-request-test");
  h.set_dtype(v1::DTYPE_F32);
  h.set_batch(1);
  h.set_tokens(kTokens);
  h.set_q_heads(kQHeads);
  h.set_kv_heads(kKvHeads);
  h.set_head_dim(kHeadDim);
  h.mutable_spec()->mutable_dense();
  h.set_return_lse(true);
  return h;
}

v1::AttendRequest HeaderMsg(const v1::AttendHeader& h) {
  v1::AttendRequest r;
  *r.mutable_header() = h;
  return r;
}

// `size` bytes of well-formed f32 values (so the data itself is never the problem).
std::string Payload(int64_t size, uint64_t seed) {
  std::string out(static_cast<size_t>(size), '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i + 4 <= size; i += 4) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    // A float in [1, 2): exponent 127, random mantissa.
    const uint32_t bits = 0x3f800000u | static_cast<uint32_t>((x >> 41) & 0x7fffffu);
    std::memcpy(out.data() + i, &bits, 4);
  }
  return out;
}

v1::AttendRequest ChunkMsg(v1::TensorKind kind, int64_t offset, int64_t size) {
  v1::AttendRequest r;
  r.mutable_chunk()->set_tensor(kind);
  r.mutable_chunk()->set_offset(offset);
  r.mutable_chunk()->set_data(Payload(size, static_cast<uint64_t>(offset) + kind));
  return r;
}

// Every byte of Q, K and V for `h` (sizes from its dims, f32), in chunks of `chunk` bytes.
std::vector<v1::AttendRequest> AllChunks(const v1::AttendHeader& h, int64_t chunk = 8192) {
  const int64_t rows = h.batch() * h.tokens() * h.head_dim() * 4;
  const std::pair<v1::TensorKind, int64_t> tensors[] = {{v1::TENSOR_Q, rows * h.q_heads()},
                                                        {v1::TENSOR_K, rows * h.kv_heads()},
                                                        {v1::TENSOR_V, rows * h.kv_heads()}};
  std::vector<v1::AttendRequest> out;
  for (const auto& [kind, total] : tensors) {
    for (int64_t off = 0; off < total; off += chunk) {
      out.push_back(ChunkMsg(kind, off, std::min(chunk, total - off)));
    }
  }
  return out;
}

// A header plus all chunks of it.
std::vector<v1::AttendRequest> FullRequest(const v1::AttendHeader& h) {
  std::vector<v1::AttendRequest> out = {HeaderMsg(h)};
  for (v1::AttendRequest& c : AllChunks(h)) out.push_back(std::move(c));
  return out;
}

std::vector<v1::AttendRequest> WithHeader(std::function<void(v1::AttendHeader&)> edit) {
  v1::AttendHeader h = GoodHeader();
  edit(h);
  return FullRequest(h);
}

// Only a header (edited from the good one): the server must refuse it before any chunk.
std::vector<v1::AttendRequest> HeaderOnly(std::function<void(v1::AttendHeader&)> edit) {
  v1::AttendHeader h = GoodHeader();
  edit(h);
  return {HeaderMsg(h)};
}

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

struct BadCase {
  std::string name;
  std::vector<v1::AttendRequest> messages;
  grpc::StatusCode code;
  // Substring the error message must contain: the field it names. Empty for the codes gRPC
  // produces on the client side (deadline, cancel), whose messages are gRPC's own.
  std::string field;
  absl::Duration deadline = absl::Seconds(30);
  // Cancel the call (ClientContext::TryCancel) after this many messages.
  int cancel_after = -1;
  // Whether response messages may precede the error: a stray chunk after a complete upload can
  // reach the server after the job has run and its response has started.
  bool may_respond = false;
};

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

// The whole server log (ChildProcess::Log reads a tail; this tail is everything these tests make).
constexpr size_t kWholeLog = size_t{64} << 20;

// The text-format request lines ("... [warning] attend id=... code=...") of a server log.
std::vector<std::string> AttendLines(const std::string& log) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "] attend ")) out.emplace_back(line);
  }
  return out;
}

// The key=value fields of a text request line, left to right (the first of a repeated key wins):
// a value is a bare token or double-quoted (returned without its quotes, escapes as written).
std::map<std::string, std::string> LineFields(const std::string& line) {
  std::map<std::string, std::string> out;
  size_t i = line.find("] attend ");
  if (i == std::string::npos) return out;
  i += 9;
  while (i < line.size()) {
    const size_t eq = line.find('=', i);
    if (eq == std::string::npos) break;
    const std::string key = line.substr(i, eq - i);
    std::string value;
    size_t j = eq + 1;
    if (j < line.size() && line[j] == '"') {
      for (++j; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) value += line[j++];
        value += line[j];
      }
      ++j;  // the closing quote
    } else {
      const size_t end = std::min(line.find(' ', j), line.size());
      value = line.substr(j, end - j);
      j = end;
    }
    out.emplace(key, value);
    i = j + 1;  // past the space
  }
  return out;
}

// Waits (up to 10 s) until the log holds more than `before` request lines and returns them all.
std::vector<std::string> WaitForAttendLines(ServerProcess& server, size_t before) {
  std::vector<std::string> lines;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    lines = AttendLines(server.process().Log(kWholeLog));
    if (lines.size() > before) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < give_up);
  return lines;
}

struct RawOutcome {
  grpc::Status status;
  int responses = 0;
};

// Sends `c.messages` on one Attend stream with the sync API, then WritesDone (unless cancelled),
// reads until the stream ends and returns the final status. Every step is bounded by the
// call's deadline.
RawOutcome SendRaw(v1::AttentionService::Stub* stub, const BadCase& c) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + c.deadline));
  std::unique_ptr<grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>> stream =
      stub->Attend(&context);
  bool cancelled = false;
  for (size_t i = 0; i < c.messages.size(); ++i) {
    if (c.cancel_after >= 0 && static_cast<int>(i) == c.cancel_after) {
      context.TryCancel();
      cancelled = true;
      break;
    }
    if (!stream->Write(c.messages[i])) break;  // the server already ended the call
  }
  if (!cancelled) stream->WritesDone();
  RawOutcome out;
  v1::AttendResponse response;
  // A stream that ends in an error carries no responses; a response stream is at most a header
  // plus the output chunks, all bounded by the deadline.
  while (stream->Read(&response)) ++out.responses;
  out.status = stream->Finish();
  return out;
}

class BadRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.extra_args = {"--log-level=debug", absl::StrCat("--max_chunk_bytes=", kMaxChunkBytes),
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

// An Attend call carrying raw message bytes, which the generated stub cannot send (truncated
// protobuf, a string field that is not UTF-8), then the half-close; the call's final status.
grpc::Status SendBytes(const std::shared_ptr<grpc::Channel>& channel,
                       const std::vector<std::string>& messages, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const grpc::internal::RpcMethod method("/attnserve.v1.AttentionService/Attend",
                                         grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &context));
  for (const std::string& m : messages) {
    grpc::Slice slice(m);
    grpc::ByteBuffer buffer(&slice, 1);
    if (!stream->Write(buffer)) break;
  }
  stream->WritesDone();
  grpc::ByteBuffer response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

// A serialized AttendRequest whose header.request_id holds `id` as is (proto3 strings must be
// UTF-8; this writes the bytes without checking): field 1 (header), field 1 (request_id).
std::string HeaderBytesWithId(const std::string& id) {
  EXPECT_LT(id.size(), 100u);
  std::string header = "\x0a";
  header += static_cast<char>(id.size());
  header += id;
  std::string request = "\x0a";
  request += static_cast<char>(header.size());
  return request + header;
}

struct HostileCase {
  std::string name;
  grpc::StatusCode code;
  std::string message;    // the client's error message names this
  std::string logged_id;  // the log line's id starts with this
  std::function<grpc::Status()> send;
};

// Request ids that try to start a new log line or flood one, and streams that fail below the
// message level (bytes that do not parse, a message above gRPC's size limit): each is refused
// with a status naming the rule, logged once with the code the client got, and the log holds
// no forged line and no line longer than a few KiB.
TEST_F(BadRequestTest, HostileRequestsCannotForgeOrFloodTheLog) {
  const std::string forged = "[2026-01-01 00:00:00.000] [info] attend id=forged code=OK";
  const auto header_only = [&](const std::string& id) {
    return [this, id] {
      v1::AttendHeader h = GoodHeader();
      h.set_request_id(id);
      BadCase c{"", {HeaderMsg(h)}, grpc::StatusCode::OK, ""};
      return SendRaw(stub_.get(), c).status;
    };
  };
  const auto ia = grpc::StatusCode::INVALID_ARGUMENT;
  std::vector<HostileCase> cases;
  cases.push_back({"newline_in_id", ia, "header.request_id: must be printable ASCII",
                   "evil\\x0a[2026-01-01", header_only("evil\n" + forged)});
  cases.push_back({"crlf_and_escape_in_id", ia, "header.request_id: must be printable ASCII",
                   "x\\x0d\\x0a\\x1b[2J", header_only("x\r\n\x1b[2J\n" + forged)});
  const std::string huge_id = std::string(1 << 20, 'A') + "\n" + forged;
  cases.push_back({"one_mib_id", ia, "header.request_id: must be at most 128 bytes",
                   absl::StrCat(std::string(128, 'A'), "...(", huge_id.size(), " bytes)"),
                   header_only(huge_id)});
  cases.push_back(
      {"id_not_utf8", ia, "header.request_id: not valid UTF-8", "bad\\xff\\xfeid", [this] {
         return SendBytes(channel_, {HeaderBytesWithId("bad\xff\xfeid")}, absl::Seconds(30));
       }});
  // The parser got as far as the id before the bytes ran out: the line shows it.
  cases.push_back({"truncated_protobuf", ia, "request message: not a valid AttendRequest",
                   "bad-request-test", [this] {
                     std::string bytes = HeaderMsg(GoodHeader()).SerializeAsString();
                     bytes.resize(bytes.size() - 3);
                     return SendBytes(channel_, {bytes}, absl::Seconds(30));
                   }});
  cases.push_back(
      {"chunk_above_grpc_limit", grpc::StatusCode::RESOURCE_EXHAUSTED, "larger than max",
       "too-large", [this] {
         // gRPC's own limit is --max-chunk-bytes + 1 MiB: 3 MiB is above it.
         v1::AttendHeader h = GoodHeader();
         h.set_request_id("too-large");
         h.set_tokens(32768);  // q is 8 MiB
         BadCase c{
             "", {HeaderMsg(h), ChunkMsg(v1::TENSOR_Q, 0, 3 << 20)}, grpc::StatusCode::OK, ""};
         return SendRaw(stub_.get(), c).status;
       }});
  // A printable id may hold spaces and '=': the line quotes it, so it cannot pose as fields.
  cases.push_back({"id_posing_as_fields", grpc::StatusCode::OK, "", "x code=CANCELLED y", [this] {
                     BadCase c{"", WithHeader([](v1::AttendHeader& h) {
                                 h.set_request_id("x code=CANCELLED y");
                               }),
                               grpc::StatusCode::OK, ""};
                     return SendRaw(stub_.get(), c).status;
                   }});

  for (const HostileCase& c : cases) {
    SCOPED_TRACE(c.name);
    const size_t before = AttendLines(server_->process().Log(kWholeLog)).size();
    const grpc::Status status = c.send();
    std::printf("%-24s -> %s: %.200s\n", c.name.c_str(), GrpcCodeName(status.error_code()).c_str(),
                status.error_message().c_str());
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_NE(status.error_message().find(c.message), std::string::npos)
        << "message \"" << status.error_message() << "\" does not say \"" << c.message << "\"";
    EXPECT_LT(status.error_message().size(), 4096u);
    const std::vector<std::string> lines = WaitForAttendLines(*server_, before);
    ASSERT_EQ(lines.size(), before + 1) << server_->Log();
    std::map<std::string, std::string> fields = LineFields(lines.back());
    EXPECT_TRUE(absl::StartsWith(fields["id"], c.logged_id)) << lines.back();
    EXPECT_EQ(fields["code"], GrpcCodeName(status.error_code())) << lines.back();
    ASSERT_TRUE(server_->Running()) << server_->Log();
  }

  const std::string log = server_->process().Log(kWholeLog);
  size_t longest = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    longest = std::max(longest, line.size());
    EXPECT_FALSE(absl::StartsWith(line, "[2026-01-01")) << "forged line: " << line;
    EXPECT_FALSE(absl::StartsWith(line, "x code=")) << "forged line: " << line;
  }
  EXPECT_LT(longest, 4096u) << "a log line of " << longest << " bytes";
  EXPECT_EQ(AttendLines(log).size(), cases.size());
}

// The value of attnserve_requests_total{code="CODE"} in Prometheus text (0 when absent).
double RequestsWithCode(const std::string& metrics, const std::string& code) {
  const std::string prefix = absl::StrCat("attnserve_requests_total{code=\"", code, "\"} ");
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (absl::StartsWith(line, prefix)) return std::stod(std::string(line.substr(prefix.size())));
  }
  return 0;
}

// The metric label agrees with the log line and the client: an oversized message (answered by
// gRPC) and a client cancel are counted under the code the client got.
TEST_F(BadRequestTest, MetricLabelIsTheCodeTheClientGot) {
  struct Case {
    std::string name;
    std::function<grpc::Status()> send;
  };
  const std::vector<Case> cases = {
      {"oversized",
       [this] {
         v1::AttendHeader h = GoodHeader();
         h.set_tokens(32768);
         BadCase c{"", {HeaderMsg(h), ChunkMsg(v1::TENSOR_Q, 0, 3 << 20)}, grpc::StatusCode::OK,
                   ""};
         return SendRaw(stub_.get(), c).status;
       }},
      {"cancelled", [this] {
         v1::AttendHeader h = GoodHeader();
         h.set_tokens(4096);
         BadCase c{"", FullRequest(h), grpc::StatusCode::OK, ""};
         c.cancel_after = 3;
         return SendRaw(stub_.get(), c).status;
       }}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::string> before = server_->ScrapeMetrics();
    ASSERT_TRUE(before.ok()) << before.status();
    const grpc::Status status = c.send();
    const std::string code = GrpcCodeName(status.error_code());
    // The call may still be winding down on the server: wait (bounded) for its count.
    double now = 0;
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up) {
      absl::StatusOr<std::string> after = server_->ScrapeMetrics();
      ASSERT_TRUE(after.ok()) << after.status();
      now = RequestsWithCode(*after, code);
      if (now > RequestsWithCode(*before, code)) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(now, RequestsWithCode(*before, code) + 1) << code;
  }
}

// Context and region names (and the errors quoting them) reach log lines sanitized: a name with
// a newline or 1 MiB long is refused or not found, and the log gains no forged or huge line.
TEST_F(BadRequestTest, ContextAndRegionNamesCannotForgeLogLines) {
  const std::string forged = "\n[2026-01-01 00:00:00.000] [info] create context ok";
  const std::string huge(1 << 20, 'n');
  for (const std::string& name : {"evil" + forged, huge + forged}) {
    {
      grpc::ClientContext context;
      v1::CreateContextRequest request;
      request.set_name(name);
      request.set_dtype(v1::DTYPE_F32);
      request.set_kv_heads(1);
      request.set_head_dim(32);
      v1::CreateContextResponse response;
      const grpc::Status s = stub_->CreateContext(&context, request, &response);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_LT(s.error_message().size(), 1024u);
    }
    {
      grpc::ClientContext context;
      v1::GetContextRequest request;
      request.set_name(name);
      v1::GetContextResponse response;
      const grpc::Status s = stub_->GetContext(&context, request, &response);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
      EXPECT_LT(s.error_message().size(), 1024u);
    }
    {
      grpc::ClientContext context;
      v1::AppendContextResponse response;
      std::unique_ptr<grpc::ClientWriter<v1::AppendContextRequest>> writer =
          stub_->AppendContext(&context, &response);
      v1::AppendContextRequest request;
      request.mutable_header()->set_context(name);
      request.mutable_header()->set_tokens(1);
      writer->Write(request);
      writer->WritesDone();
      const grpc::Status s = writer->Finish();
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    }
    {
      grpc::ClientContext context;
      v1::RegisterRegionRequest request;
      request.set_name(name);
      request.mutable_system()->set_shm_key("/attnserve-log-test\nforged");
      request.mutable_system()->set_bytes(4096);
      v1::RegisterRegionResponse response;
      const grpc::Status s = stub_->RegisterRegion(&context, request, &response);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_LT(s.error_message().size(), 1024u);
    }
  }
  // The append lines are written when the calls end: wait (bounded) for both.
  std::string log;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    log = server_->process().Log(kWholeLog);
    if (absl::StrContains(log, "append_context context=\"n") &&
        absl::StrContains(log, "append_context context=\"evil")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < give_up);
  EXPECT_TRUE(absl::StrContains(
      log, "append_context context=\"evil\\x0a[2026-01-01 00:00:00.000] [info] create context ok\" "
           "code=NOT_FOUND"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "register region \"evil\\x0a[2026-01-01")) << log;
  size_t longest = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    longest = std::max(longest, line.size());
    EXPECT_FALSE(absl::StartsWith(line, "[2026-01-01")) << "forged line: " << line;
  }
  EXPECT_LT(longest, 4096u) << "a log line of " << longest << " bytes";
}

// A call still running when the drain timeout passes is ended by the server's shutdown: its log
// line (and metrics label) says the code the client got, not a client cancel.
TEST(DrainOutcomeTest, CallEndedByTheShutdownIsLoggedWithTheClientsCode) {
  ServerOptions options;
  options.extra_args = {"--drain-timeout=1s"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel((*server)->target(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::AttentionService::Stub> stub = v1::AttentionService::NewStub(channel);
  // ~275 GFLOP of dense work (see deadline_expires_during_compute): far beyond the 1 s drain.
  v1::AttendHeader h = GoodHeader();
  h.set_request_id("outlives-the-drain");
  h.set_tokens(32768);
  h.set_q_heads(1);
  h.set_head_dim(64);
  BadCase c{"", {HeaderMsg(h)}, grpc::StatusCode::OK, ""};
  for (v1::AttendRequest& r : AllChunks(h, 256 << 10)) c.messages.push_back(std::move(r));
  c.deadline = absl::Seconds(120);
  RawOutcome out;
  std::thread call([&] { out = SendRaw(stub.get(), c); });
  // Until the request is queued or running (bounded).
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    absl::StatusOr<std::string> text = (*server)->ScrapeMetrics();
    if (text.ok()) {
      absl::StatusOr<double> received = MetricSum(*text, "attnserve_received_bytes_total");
      if (received.ok() && *received >= 24 << 20) break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE((*server)->Stop(absl::Seconds(60)).ok()) << (*server)->Log();
  call.join();
  std::printf("client got %s: %s\n", GrpcCodeName(out.status.error_code()).c_str(),
              out.status.error_message().c_str());
  EXPECT_NE(out.status.error_code(), grpc::StatusCode::OK);
  const std::vector<std::string> lines = AttendLines((*server)->process().Log(kWholeLog));
  ASSERT_EQ(lines.size(), 1u) << (*server)->Log();
  std::map<std::string, std::string> fields = LineFields(lines[0]);
  EXPECT_EQ(fields["id"], "outlives-the-drain") << lines[0];
  EXPECT_EQ(fields["code"], GrpcCodeName(out.status.error_code())) << lines[0];
  EXPECT_NE(fields["error"].find("server stopped"), std::string::npos) << lines[0];
}

// --log-format=json: every line the server logs is one JSON object with time, level and
// message; request lines carry their fields, hostile ids included, correctly escaped. Checked by
// Python's json module (an independent parser).
TEST(JsonLogTest, EveryLineParsesAndRequestLinesCarryTheirFields) {
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("json_log");
  ASSERT_TRUE(dir.ok()) << dir.status();
  ServerOptions options;
  options.extra_args = {"--log-format=json"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel((*server)->target(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::AttentionService::Stub> stub = v1::AttentionService::NewStub(channel);

  v1::AttendHeader good = GoodHeader();
  good.set_request_id("json \"quoted\" \\ id");
  BadCase ok_case{"", FullRequest(good), grpc::StatusCode::OK, ""};
  EXPECT_TRUE(SendRaw(stub.get(), ok_case).status.ok());
  v1::AttendHeader evil = GoodHeader();
  evil.set_request_id("evil\n{\"forged\": true}");
  BadCase evil_case{"", {HeaderMsg(evil)}, grpc::StatusCode::OK, ""};
  EXPECT_EQ(SendRaw(stub.get(), evil_case).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(SendBytes(channel, {HeaderBytesWithId("u\xc3\x28")}, absl::Seconds(30)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE((*server)->Stop().ok()) << (*server)->Log();

  const std::string path = (*dir)->File("server.log");
  {
    std::ofstream f(path, std::ios::binary);
    f << (*server)->process().Log(kWholeLog);
  }
  // Prints one line per request line: request_id, code, level, then whether the numeric fields
  // are numbers; "OTHER <line>" for lines that are not JSON objects; "LINES <n>" at the end.
  const std::string script = R"PY(
import json, sys
n = 0
for raw in open(sys.argv[1], 'rb').read().split(b'\n'):
    if not raw.strip():
        continue
    if not raw.startswith(b'{'):
        print('OTHER', raw.decode('ascii', 'replace'))
        continue
    o = json.loads(raw.decode('utf-8'))
    assert isinstance(o['time'], str) and isinstance(o['level'], str), o
    assert isinstance(o['message'], str), o
    n += 1
    if o['message'] == 'attend':
        nums = all(isinstance(o[k], (int, float)) for k in
                   ('bytes_in', 'bytes_out', 'receive_seconds', 'queue_seconds', 'total_seconds'))
        print('ATTEND', json.dumps([o['request_id'], o['code'], o['level'], nums]))
print('LINES', n)
)PY";
  CommandResult r =
      RunLogged("python3", "/usr/bin/python3", {"-c", script, path}, absl::Seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> attend;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (absl::StartsWith(line, "ATTEND ")) attend.emplace_back(line.substr(7));
    // Lines that are not the logger's: the start-up lines on stdout, protobuf's own complaint
    // about the UTF-8 (its logger, on stderr).
    if (absl::StartsWith(line, "OTHER ")) {
      EXPECT_TRUE(absl::StartsWith(line, "OTHER attnserve: ") ||
                  absl::StartsWith(line, "OTHER [libprotobuf "))
          << line;
    }
  }
  ASSERT_EQ(attend.size(), 3u) << r.output;
  EXPECT_EQ(attend[0], R"(["json \"quoted\" \\\\ id", "OK", "info", true])");
  EXPECT_EQ(attend[1], R"(["evil\\x0a{\"forged\": true}", "INVALID_ARGUMENT", "warning", true])");
  EXPECT_EQ(attend[2], R"(["u\\xc3(", "INVALID_ARGUMENT", "warning", true])");
  EXPECT_NE(r.output.find("LINES "), std::string::npos);
}

}  // namespace
}  // namespace attnserve::testing
