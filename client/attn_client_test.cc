// AttnClient against an in-process scripted server: the download checks (header first, shapes,
// every byte exactly once), errors in the middle of the upload, and the retry rule (UNAVAILABLE
// before any response only; never INVALID_ARGUMENT, never after partial results).
#include "client/attn_client.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace attnserve::client {
namespace {

namespace v1 = ::attnserve::v1;

using Stream = grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>;
// Answers one call after its header (and, unless the service was built with read_all_first
// false, after the whole upload): writes responses and returns the final status. `call` counts
// the service's calls from 0.
using Script =
    std::function<grpc::Status(Stream* stream, const v1::AttendHeader& header, int call)>;

class ScriptedService final : public v1::AttentionService::Service {
 public:
  ScriptedService(Script script, bool read_all_first)
      : script_(std::move(script)), read_all_first_(read_all_first) {}

  grpc::Status Attend(grpc::ServerContext* context, Stream* stream) override {
    const int call = calls_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_.insert(context->peer());  // "ipv4:127.0.0.1:<the client's port>": one per connection
    }
    v1::AttendRequest request;
    if (!stream->Read(&request) || !request.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "header: must be the first message");
    }
    const v1::AttendHeader header = request.header();
    if (read_all_first_) {
      // Bounded by the client's upload (it half-closes after the last chunk) and its deadline.
      while (stream->Read(&request)) {
      }
    }
    return script_(stream, header, call);
  }

  int calls() const { return calls_.load(); }
  size_t peers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_.size();
  }

 private:
  Script script_;
  bool read_all_first_;
  std::atomic<int> calls_{0};
  mutable std::mutex mu_;
  std::set<std::string> peers_;
};

// A server on 127.0.0.1 (kernel-chosen port) running a ScriptedService.
class FakeServer {
 public:
  FakeServer(Script script, bool read_all_first = true)
      : service_(std::move(script), read_all_first) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5)); }

  std::unique_ptr<AttnClient> NewClient(int max_attempts = 1, int64_t chunk_bytes = 4 << 20,
                                        int connections = 1) {
    ClientOptions options;
    options.connections = connections;
    options.target = absl::StrCat("127.0.0.1:", port_);
    options.max_attempts = max_attempts;
    options.chunk_bytes = chunk_bytes;
    options.initial_backoff = absl::Milliseconds(10);
    options.max_backoff = absl::Milliseconds(20);
    absl::StatusOr<std::unique_ptr<AttnClient>> c = AttnClient::Create(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  int calls() const { return service_.calls(); }
  size_t peers() const { return service_.peers(); }
  bool started() const { return server_ != nullptr && port_ != 0; }

 private:
  ScriptedService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// f32 inputs [1, 16, 2, 8] (q) and [1, 16, 1, 8] (k, v).
struct Inputs {
  Inputs() {
    q = *HostTensor::Create(DType::kF32, {1, 16, 2, 8});
    k = *HostTensor::Create(DType::kF32, {1, 16, 1, 8});
    v = *HostTensor::Create(DType::kF32, {1, 16, 1, 8});
    FillUniform(q, 1);
    FillUniform(k, 2);
    FillUniform(v, 3);
    input.q = &q;
    input.k = &k;
    input.v = &v;
    input.spec.mutable_dense();
    input.return_lse = true;
  }
  HostTensor q, k, v;
  AttendInput input;
};

constexpr int64_t kOBytes = 16 * 2 * 8 * 4;  // O is [1, 16, 2, 8] f32
constexpr int64_t kLseBytes = 2 * 16 * 4;    // LSE is [1, 2, 16] f32

v1::AttendResponse ResponseHeader(const v1::AttendHeader& h) {
  v1::AttendResponse r;
  v1::AttendResponseHeader* rh = r.mutable_header();
  rh->set_request_id("fake");
  rh->set_dtype(h.dtype());
  for (int64_t d : {h.batch(), h.tokens(), h.q_heads(), h.head_dim()}) rh->add_o_shape(d);
  if (h.return_lse()) {
    for (int64_t d : {h.batch(), h.q_heads(), h.tokens()}) rh->add_lse_shape(d);
  }
  rh->set_o_bytes(h.batch() * h.tokens() * h.q_heads() * h.head_dim() * 4);
  rh->set_lse_bytes(h.return_lse() ? h.batch() * h.q_heads() * h.tokens() * 4 : 0);
  rh->set_backend("fake");
  return r;
}

// Byte i of a tensor's pattern is (i * 7 + salt) mod 251, so misplaced bytes show.
std::string Pattern(int64_t offset, int64_t size, int salt) {
  std::string s(static_cast<size_t>(size), '\0');
  for (int64_t i = 0; i < size; ++i) s[i] = static_cast<char>(((offset + i) * 7 + salt) % 251);
  return s;
}

v1::AttendResponse Chunk(v1::TensorKind kind, int64_t offset, int64_t size, int salt) {
  v1::AttendResponse r;
  r.mutable_chunk()->set_tensor(kind);
  r.mutable_chunk()->set_offset(offset);
  r.mutable_chunk()->set_data(Pattern(offset, size, salt));
  return r;
}

TEST(AttnClientTest, AssemblesChunksInAnyOrder) {
  FakeServer server([](Stream* s, const v1::AttendHeader& h, int) {
    s->Write(ResponseHeader(h));
    // O in 3 chunks, last first; LSE in 2.
    s->Write(Chunk(v1::TENSOR_O, 200, kOBytes - 200, 1));
    s->Write(Chunk(v1::TENSOR_LSE, 64, kLseBytes - 64, 2));
    s->Write(Chunk(v1::TENSOR_O, 0, 100, 1));
    s->Write(Chunk(v1::TENSOR_LSE, 0, 64, 2));
    s->Write(Chunk(v1::TENSOR_O, 100, 100, 1));
    return grpc::Status::OK;
  });
  ASSERT_TRUE(server.started());
  Inputs in;
  std::vector<Progress> progress;
  CallOptions call;
  call.timeout = absl::Seconds(10);
  call.progress = [&](const Progress& p) { progress.push_back(p); };
  absl::StatusOr<AttendResult> r = server.NewClient()->Attend(in.input, call);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->lse.has_value());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r->o.data()), kOBytes),
            Pattern(0, kOBytes, 1));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r->lse->data()), kLseBytes),
            Pattern(0, kLseBytes, 2));
  EXPECT_EQ(r->header.backend(), "fake");
  EXPECT_EQ(r->attempts, 1);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().received_bytes, kOBytes + kLseBytes);
  EXPECT_EQ(progress.back().receive_total_bytes, kOBytes + kLseBytes);
  EXPECT_EQ(progress.back().sent_bytes, progress.back().send_total_bytes);
}

struct BadResponseCase {
  std::string name;
  std::function<void(Stream*, const v1::AttendHeader&)> respond;
  std::string message;  // substring of the DATA_LOSS message
};

TEST(AttnClientTest, RejectsMalformedResponses) {
  const std::vector<BadResponseCase> cases = {
      {"overlap",
       [](Stream* s, const v1::AttendHeader& h) {
         s->Write(ResponseHeader(h));
         s->Write(Chunk(v1::TENSOR_O, 0, 200, 1));
         s->Write(Chunk(v1::TENSOR_O, 100, 200, 1));
       },
       "overlaps"},
      {"missing_bytes",
       [](Stream* s, const v1::AttendHeader& h) {
         s->Write(ResponseHeader(h));
         s->Write(Chunk(v1::TENSOR_O, 0, kOBytes - 4, 1));
         s->Write(Chunk(v1::TENSOR_LSE, 0, kLseBytes, 2));
       },
       absl::StrCat("4 of ", kOBytes, " bytes of O missing")},
      {"chunk_before_header",
       [](Stream* s, const v1::AttendHeader& h) { s->Write(Chunk(v1::TENSOR_O, 0, 16, 1)); },
       "before the response header"},
      {"past_the_end",
       [](Stream* s, const v1::AttendHeader& h) {
         s->Write(ResponseHeader(h));
         s->Write(Chunk(v1::TENSOR_LSE, kLseBytes - 8, 16, 2));
       },
       "runs past"},
      {"wrong_shape",
       [](Stream* s, const v1::AttendHeader& h) {
         v1::AttendResponse r = ResponseHeader(h);
         r.mutable_header()->set_o_shape(1, 17);
         s->Write(r);
       },
       "expected [1, 16, 2, 8]"},
      {"wrong_byte_count",
       [](Stream* s, const v1::AttendHeader& h) {
         v1::AttendResponse r = ResponseHeader(h);
         r.mutable_header()->set_o_bytes(kOBytes + 1);
         s->Write(r);
       },
       "o_bytes"},
      {"second_header",
       [](Stream* s, const v1::AttendHeader& h) {
         s->Write(ResponseHeader(h));
         s->Write(ResponseHeader(h));
       },
       "second response header"},
      {"input_tensor_in_response",
       [](Stream* s, const v1::AttendHeader& h) {
         s->Write(ResponseHeader(h));
         s->Write(Chunk(v1::TENSOR_Q, 0, 16, 1));
       },
       "unexpected tensor TENSOR_Q"},
      {"no_header_at_all", [](Stream*, const v1::AttendHeader&) {}, "no response header"},
  };
  for (const BadResponseCase& c : cases) {
    SCOPED_TRACE(c.name);
    FakeServer server([&](Stream* s, const v1::AttendHeader& h, int) {
      c.respond(s, h);
      return grpc::Status::OK;
    });
    ASSERT_TRUE(server.started());
    Inputs in;
    CallOptions call;
    call.timeout = absl::Seconds(10);
    absl::StatusOr<AttendResult> r = server.NewClient(/*max_attempts=*/3)->Attend(in.input, call);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status();
    EXPECT_EQ(server.calls(), 1) << "a malformed response must not be retried";
  }
}

TEST(AttnClientTest, ServerErrorMidUploadEndsTheCallAtOnce) {
  // The server refuses after the header without reading the 6 MiB upload (64 KiB chunks).
  FakeServer server(
      [](Stream*, const v1::AttendHeader&, int) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "spec.window.size: must be >= 0");
      },
      /*read_all_first=*/false);
  ASSERT_TRUE(server.started());
  HostTensor q = *HostTensor::Create(DType::kF32, {1, 8192, 8, 32});
  HostTensor k = *HostTensor::Create(DType::kF32, {1, 8192, 8, 32});
  q.FillBytes(0);
  k.FillBytes(0);
  AttendInput input;
  input.q = &q;
  input.k = &k;
  input.v = &k;
  input.spec.mutable_window()->set_size(-1);
  int64_t sent = 0;
  int64_t total = 0;
  CallOptions call;
  call.timeout = absl::Seconds(10);
  call.progress = [&](const Progress& p) {
    sent = p.sent_bytes;
    total = p.send_total_bytes;
  };
  absl::StatusOr<AttendResult> r =
      server.NewClient(/*max_attempts=*/3, /*chunk_bytes=*/64 << 10)->Attend(input, call);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(r.status().message(), "spec.window.size: must be >= 0");
  EXPECT_LT(sent, total);
  EXPECT_EQ(server.calls(), 1) << "INVALID_ARGUMENT must not be retried";
}

TEST(AttnClientTest, RetriesUnavailableBeforeAnyResponse) {
  FakeServer server([](Stream* s, const v1::AttendHeader& h, int call) {
    if (call < 2) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is draining");
    s->Write(ResponseHeader(h));
    s->Write(Chunk(v1::TENSOR_O, 0, kOBytes, 1));
    s->Write(Chunk(v1::TENSOR_LSE, 0, kLseBytes, 2));
    return grpc::Status::OK;
  });
  ASSERT_TRUE(server.started());
  Inputs in;
  CallOptions call;
  call.timeout = absl::Seconds(10);
  absl::StatusOr<AttendResult> r = server.NewClient(/*max_attempts=*/3)->Attend(in.input, call);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->attempts, 3);
  EXPECT_EQ(server.calls(), 3);

  // With one attempt fewer than needed the last UNAVAILABLE comes back.
  FakeServer again([](Stream*, const v1::AttendHeader&, int) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is draining");
  });
  absl::StatusOr<AttendResult> r2 = again.NewClient(/*max_attempts=*/2)->Attend(in.input, call);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r2.status().message(), "server is draining");
  EXPECT_EQ(again.calls(), 2);
}

TEST(AttnClientTest, NeverRetriesAfterPartialResults) {
  FakeServer server([](Stream* s, const v1::AttendHeader& h, int) {
    s->Write(ResponseHeader(h));
    s->Write(Chunk(v1::TENSOR_O, 0, 64, 1));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "device lost");
  });
  ASSERT_TRUE(server.started());
  Inputs in;
  CallOptions call;
  call.timeout = absl::Seconds(10);
  absl::StatusOr<AttendResult> r = server.NewClient(/*max_attempts=*/4)->Attend(in.input, call);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server.calls(), 1);
}

TEST(AttnClientTest, DeadlineBoundsTheCall) {
  FakeServer server([](Stream*, const v1::AttendHeader&, int) {
    absl::SleepFor(absl::Seconds(3));  // longer than the client's deadline
    return grpc::Status::OK;
  });
  ASSERT_TRUE(server.started());
  Inputs in;
  CallOptions call;
  call.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> r = server.NewClient(/*max_attempts=*/4)->Attend(in.input, call);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Calls go round robin over ClientOptions::connections separate TCP connections (one HTTP/2
// connection carries about one stream's bytes per second however many calls share it).
TEST(AttnClientTest, CallsAreSpreadOverTheConnections) {
  FakeServer server([](Stream* s, const v1::AttendHeader& h, int) {
    s->Write(ResponseHeader(h));
    s->Write(Chunk(v1::TENSOR_O, 0, kOBytes, 1));
    s->Write(Chunk(v1::TENSOR_LSE, 0, kLseBytes, 2));
    return grpc::Status::OK;
  });
  ASSERT_TRUE(server.started());
  Inputs in;
  CallOptions call;
  call.timeout = absl::Seconds(10);
  std::unique_ptr<AttnClient> client = server.NewClient(1, 4 << 20, /*connections=*/3);
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<AttendResult> r = client->Attend(in.input, call);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(r->o.data()), kOBytes),
              Pattern(0, kOBytes, 1));
  }
  EXPECT_EQ(server.calls(), 6);
  EXPECT_EQ(server.peers(), 3u);

  ClientOptions bad;
  bad.target = "127.0.0.1:1";
  for (int connections : {0, 65}) {
    bad.connections = connections;
    EXPECT_EQ(AttnClient::Create(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << connections;
  }
}

}  // namespace
}  // namespace attnserve::client
