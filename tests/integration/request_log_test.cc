// The server's log against hostile and failing requests: request ids, context and region names
// that try to start a new line or flood one; calls that gRPC ends (an oversized message, a client
// cancel, the shutdown after the drain) logged and counted with the code the client got; the
// JSON log format parsed by Python's json module.
#include <algorithm>
#include <cstdint>
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
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "tests/integration/attend_streams.h"
#include "tests/integration/server_fixture.h"
#include "wire/status.h"

namespace attnserve::testing {
namespace {

class RequestLogTest : public ::testing::Test {
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

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

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
TEST_F(RequestLogTest, HostileRequestsCannotForgeOrFloodTheLog) {
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

// The metric label agrees with the log line and the client: an oversized message (answered by
// gRPC) and a client cancel are counted under the code the client got.
TEST_F(RequestLogTest, MetricLabelIsTheCodeTheClientGot) {
  struct Case {
    std::string name;
    std::function<grpc::Status()> send;
  };
  const std::vector<Case> cases = {
      {"oversized",
       [this] {
         v1::AttendHeader h = GoodHeader();
         h.set_tokens(32768);
         BadCase c{
             "", {HeaderMsg(h), ChunkMsg(v1::TENSOR_Q, 0, 3 << 20)}, grpc::StatusCode::OK, ""};
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
TEST_F(RequestLogTest, ContextAndRegionNamesCannotForgeLogLines) {
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
      log,
      "append_context context=\"evil\\x0a[2026-01-01 00:00:00.000] [info] create context ok\" "
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

// AppendContext's line says the code its client got, also when gRPC ended the call: an
// oversized chunk (RESOURCE_EXHAUSTED from gRPC), a cancel mid-upload, a half-close with rows
// missing.
TEST_F(RequestLogTest, AppendContextLinesSayTheClientsCode) {
  {
    grpc::ClientContext context;
    v1::CreateContextRequest request;
    request.set_name("log-append");
    request.set_dtype(v1::DTYPE_F32);
    request.set_kv_heads(1);
    request.set_head_dim(32);
    v1::CreateContextResponse response;
    const grpc::Status s = stub_->CreateContext(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  struct Case {
    std::string name;
    std::vector<v1::AppendContextRequest> messages;
    bool cancel = false;
  };
  v1::AppendContextRequest header;
  header.mutable_header()->set_context("log-append");
  header.mutable_header()->set_tokens(32768);  // K and V are 4 MiB each
  const auto chunk = [](v1::TensorKind kind, int64_t size) {
    v1::AppendContextRequest r;
    r.mutable_chunk()->set_tensor(kind);
    r.mutable_chunk()->set_data(Payload(size, 7));
    return r;
  };
  const std::vector<Case> cases = {
      {"oversized", {header, chunk(v1::TENSOR_K, 3 << 20)}},
      {"cancelled", {header, chunk(v1::TENSOR_K, 1 << 16)}, true},
      {"rows_missing", {header, chunk(v1::TENSOR_K, 1 << 16)}}};
  size_t seen = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::AppendContextResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::AppendContextRequest>> writer =
        stub_->AppendContext(&context, &response);
    for (const v1::AppendContextRequest& m : c.messages) {
      if (!writer->Write(m)) break;
    }
    if (c.cancel) {
      // Until the server has the chunk (bounded), so the cancel lands mid-upload.
      absl::SleepFor(absl::Milliseconds(200));
      context.TryCancel();
    } else {
      writer->WritesDone();
    }
    const grpc::Status s = writer->Finish();
    std::printf("%-14s -> %s: %s\n", c.name.c_str(), GrpcCodeName(s.error_code()).c_str(),
                s.error_message().c_str());
    EXPECT_NE(s.error_code(), grpc::StatusCode::OK);
    std::vector<std::string> lines;
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    do {
      lines.clear();
      for (absl::string_view line :
           absl::StrSplit(server_->process().Log(kWholeLog), '\n')) {
        if (absl::StrContains(line, "] append_context ")) lines.emplace_back(line);
      }
      if (lines.size() > seen) break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < give_up);
    ASSERT_EQ(lines.size(), seen + 1) << server_->Log();
    seen = lines.size();
    EXPECT_TRUE(absl::StrContains(
        lines.back(), absl::StrCat("append_context context=log-append code=",
                                   GrpcCodeName(s.error_code()), " ")))
        << lines.back();
  }
}

// A call still running when the drain timeout passes is ended by the server's shutdown: its log
// line (and metrics label) says the code the client got, not a client cancel.
TEST(DrainOutcomeTest, CallEndedByTheShutdownIsLoggedWithTheClientsCode) {
  ServerOptions options;
  options.extra_args = {"--drain-timeout=250ms"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel((*server)->target(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::AttentionService::Stub> stub = v1::AttentionService::NewStub(channel);
  // ~620 GFLOP of dense work (49152 tokens; see deadline_expires_during_compute): seconds on
  // the CPU backend, far beyond the 250 ms drain. (32768 tokens and a 1 s drain was not: a
  // 2-core machine whose GEMMs reach ~270 GFLOP/s finished those in 0.995 s, inside the drain.)
  v1::AttendHeader h = GoodHeader();
  h.set_request_id("outlives-the-drain");
  h.set_tokens(49152);
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
      if (received.ok() && *received >= 36 << 20) break;
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
  CommandResult r = RunLogged("python3", PYTHON3_BINARY, {"-c", script, path}, absl::Seconds(60));
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
