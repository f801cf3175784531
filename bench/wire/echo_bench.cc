// attnbench_echo: the wire ceiling. How fast can plain gRPC C++ move bytes through one
// bidirectional stream (and through N streams on N connections) on this host, with no attention
// work at all? attnserve's Attend stream is compared against this figure.
//
// The protocol (bench/wire/echo.proto): rpc Echo(stream Chunk) returns (stream Chunk). The server
// (the gRPC callback API, as server/grpc/attend_reactor.cc) sends every chunk back as it
// arrives, keeping at most kSlots chunks of a stream in memory. Each client pair owns a channel
// (its own HTTP/2 connection: a local subchannel pool and a distinct channel argument) and one
// stream on it; a writer thread sends --bytes in --chunk-bytes messages while the pair's thread
// reads the echoes and checks their sizes and sequence numbers. A pair first echoes
// --warmup-bytes untimed (connection set-up, HTTP/2 window growth), then all pairs meet at a
// barrier and the timed stream starts.
//
// Rate, each way: pairs * --bytes / (last echoed byte of any pair - first write of any pair),
// 1 GB = 1e9 bytes. The same bytes travel back, so both ways together move twice that.
//
//   attnbench_echo --mode=both [--bytes 268435456] [--chunk-bytes 4128768] [--pairs 1,8,16]
//                  [--warmup-bytes 16777216] [--timeout 120] [--json-out FILE]
//   attnbench_echo --mode=server --port 50099 [--serve-seconds 0]
//   attnbench_echo --mode=client --server HOST:50099 [...]
// --mode=both runs the server in this process on 127.0.0.1 (a free port): one command, one
// figure, but client and server share this host's cores. --timeout bounds each configuration:
// the streams' deadline, after which gRPC cancels them and the configuration reports an error.
// Exit code: 0 when every configuration finished, 1 otherwise.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/harness/flags.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/run_record.h"
#include "bench/wire/echo.grpc.pb.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, mode, "both", "server|client|both (server in this process on 127.0.0.1)");
ABSL_FLAG(int, port, 0, "server mode: port to listen on, on every interface (0: a free one)");
ABSL_FLAG(double, serve_seconds, 0,
          "server mode: stop after this many seconds (0: at SIGINT/SIGTERM)");
ABSL_FLAG(std::string, server, "", "client mode: the server, host:port");
ABSL_FLAG(int64_t, bytes, int64_t{256} << 20, "bytes each pair sends (and gets back)");
ABSL_FLAG(int64_t, chunk_bytes, (int64_t{4} << 20) - (int64_t{64} << 10),
          "payload bytes per message (attnserve's response chunk: 4 MiB - 64 KiB); a server "
          "accepts messages of max(64 MiB, this + 1 MiB)");
ABSL_FLAG(std::vector<std::string>, pairs, std::vector<std::string>({"1", "8", "16"}),
          "comma list of pair counts (channel + stream each), one configuration each");
ABSL_FLAG(int64_t, warmup_bytes, int64_t{16} << 20,
          "bytes each pair echoes untimed on its channel first (0: none)");
ABSL_FLAG(double, timeout, 120,
          "seconds a configuration may take before its streams are cancelled");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace attnserve::bench {
namespace {

using echo::Chunk;
using echo::EchoBench;

constexpr char kUsage[] =
    "attnbench_echo --mode=both|server|client [--bytes B] [--chunk-bytes C] [--pairs 1,8,16] "
    "[--server HOST:PORT] [--port P] [--timeout S] [--json-out FILE]\n"
    "The gRPC echo ceiling: N pairs of (channel, bidi stream) echo --bytes each; GB/s each way.";

constexpr int64_t kMinChunk = 8;  // room for the sequence number
constexpr int64_t kMaxChunk = int64_t{1} << 30;

struct Flags {
  std::string mode;
  int port = 0;
  double serve_seconds = 0;
  std::string server;
  int64_t bytes = 0, chunk_bytes = 0, warmup_bytes = 0;
  std::vector<int> pairs;
  double timeout = 0;
  std::string json_out;
};

absl::StatusOr<Flags> ReadFlags() {
  Flags f;
  f.mode = absl::GetFlag(FLAGS_mode);
  f.port = absl::GetFlag(FLAGS_port);
  f.serve_seconds = absl::GetFlag(FLAGS_serve_seconds);
  f.server = absl::GetFlag(FLAGS_server);
  f.bytes = absl::GetFlag(FLAGS_bytes);
  f.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  f.warmup_bytes = absl::GetFlag(FLAGS_warmup_bytes);
  f.timeout = absl::GetFlag(FLAGS_timeout);
  f.json_out = absl::GetFlag(FLAGS_json_out);
  if (f.mode != "both" && f.mode != "server" && f.mode != "client") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode: '", f.mode, "' is not one of server, client, both"));
  }
  if (f.mode == "client" && f.server.empty()) {
    return absl::InvalidArgumentError("--server: needed with --mode=client (host:port)");
  }
  if (f.port < 0 || f.port > 65535) return absl::InvalidArgumentError("--port: not in [0, 65535]");
  if (f.bytes < 1) return absl::InvalidArgumentError("--bytes: must be >= 1");
  if (f.warmup_bytes < 0) return absl::InvalidArgumentError("--warmup-bytes: must be >= 0");
  if (f.chunk_bytes < kMinChunk || f.chunk_bytes > kMaxChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk-bytes: must be in [", kMinChunk, ", ", kMaxChunk, "]"));
  }
  if (!(f.timeout > 0)) return absl::InvalidArgumentError("--timeout: must be > 0 seconds");
  for (const std::string& p : absl::GetFlag(FLAGS_pairs)) {
    int n = 0;
    if (!absl::SimpleAtoi(p, &n) || n < 1 || n > 1024) {
      return absl::InvalidArgumentError(absl::StrCat("--pairs: '", p, "' is not in [1, 1024]"));
    }
    f.pairs.push_back(n);
  }
  if (f.pairs.empty() && f.mode != "server") {
    return absl::InvalidArgumentError("--pairs: needs at least one count");
  }
  return f;
}

// The largest message either side accepts: at least 64 MiB, and a chunk plus framing.
int MaxMessageBytes(int64_t chunk_bytes) {
  return static_cast<int>(std::max<int64_t>(int64_t{64} << 20, chunk_bytes + (int64_t{1} << 20)));
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

// ---- server ----------------------------------------------------------------------------------

// One Echo call. Reads land in a ring of kSlots messages; the oldest is written back while the
// next is read, and reading pauses while the ring is full. Reactions may run concurrently, so
// state lives under mu_, and gRPC operations are started after mu_ is released (gRPC may run a
// reaction inline from inside them). Finish comes once, with no write in flight and no operation
// being started, so OnDone (which deletes the reactor) cannot overtake them.
class EchoReactor final : public grpc::ServerBidiReactor<Chunk, Chunk> {
 public:
  EchoReactor() {
    Execute(Locked([] {}));
  }

  void OnReadDone(bool ok) override {
    Execute(Locked([&] {
      reading_ = false;
      if (ok) {
        ++queued_;
      } else {
        read_closed_ = true;  // the client half-closed, or the call is going away
      }
    }));
  }

  void OnWriteDone(bool ok) override {
    Execute(Locked([&] {
      writing_ = false;
      head_ = (head_ + 1) % kSlots;
      --queued_;
      if (!ok && !outcome_) {
        outcome_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away mid-echo");
      }
    }));
  }

  void OnCancel() override {
    Execute(Locked([&] {
      if (!outcome_) outcome_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }));
  }

  void OnDone() override { delete this; }

 private:
  static constexpr int kSlots = 3;
  struct Actions {
    Chunk* read = nullptr;
    const Chunk* write = nullptr;
    std::optional<grpc::Status> finish;
  };

  // Runs `change` under mu_ and returns what to start next.
  template <typename F>
  Actions Locked(F change) {
    std::lock_guard<std::mutex> lock(mu_);
    change();
    return NextLocked();
  }

  Actions NextLocked() {
    Actions a;
    if (finished_) return a;
    if (!outcome_) {
      // The slot a read fills is (head_ + queued_): writes advance head_ as they drain queued_,
      // so it stays put while the read is in flight and never meets the slot being written.
      if (!reading_ && !read_closed_ && queued_ < kSlots) {
        reading_ = true;
        ++starting_;
        a.read = &slots_[(head_ + queued_) % kSlots];
      }
      if (!writing_ && queued_ > 0) {
        writing_ = true;
        ++starting_;
        a.write = &slots_[head_];
      }
      if (read_closed_ && !reading_ && queued_ == 0 && !writing_) outcome_ = grpc::Status::OK;
    }
    if (outcome_ && !writing_ && starting_ == 0) {
      finished_ = true;
      a.finish = *outcome_;
    }
    return a;
  }

  // Starts what `a` says; each round starts at least one operation, so the loop ends within the
  // stream's message count.
  void Execute(Actions a) {
    while (true) {
      if (a.finish) {
        Finish(*a.finish);  // touch nothing afterwards: OnDone may follow at once
        return;
      }
      const int started = (a.read != nullptr) + (a.write != nullptr);
      if (started == 0) return;
      if (a.read != nullptr) StartRead(a.read);
      if (a.write != nullptr) StartWrite(a.write);
      a = Locked([&] { starting_ -= started; });
    }
  }

  std::mutex mu_;
  Chunk slots_[kSlots];
  int head_ = 0;    // the oldest queued slot
  int queued_ = 0;  // read and not yet written back (the one being written included)
  int starting_ = 0;
  bool reading_ = false, writing_ = false, read_closed_ = false, finished_ = false;
  std::optional<grpc::Status> outcome_;
};

// Counts the distinct client connections (peer addresses) it served, to show that the pairs did
// not share one.
class EchoService final : public EchoBench::CallbackService {
 public:
  grpc::ServerBidiReactor<Chunk, Chunk>* Echo(grpc::CallbackServerContext* context) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_.insert(context->peer());
    }
    return new EchoReactor();
  }
  // The number of distinct peers since the last call.
  int TakePeerCount() {
    std::lock_guard<std::mutex> lock(mu_);
    const int n = static_cast<int>(peers_.size());
    peers_.clear();
    return n;
  }

 private:
  std::mutex mu_;
  std::set<std::string> peers_;
};

struct RunningServer {
  std::unique_ptr<EchoService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

absl::StatusOr<RunningServer> StartServer(const std::string& address, int64_t chunk_bytes) {
  RunningServer r;
  r.service = std::make_unique<EchoService>();
  grpc::ServerBuilder builder;
  // As attnserve: no SO_REUSEPORT, so a taken port fails instead of being shared.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &r.port);
  builder.SetMaxReceiveMessageSize(MaxMessageBytes(chunk_bytes));
  builder.SetMaxSendMessageSize(MaxMessageBytes(chunk_bytes));
  builder.RegisterService(r.service.get());
  r.server = builder.BuildAndStart();
  if (r.server == nullptr || r.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  return r;
}

// --mode=server: serves until SIGINT/SIGTERM, or --serve-seconds.
absl::Status Serve(const Flags& f) {
  // Blocked before gRPC starts its threads, so that only sigwait below receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ATTN_ASSIGN_OR_RETURN(RunningServer s,
                        StartServer(absl::StrCat("0.0.0.0:", f.port), f.chunk_bytes));
  std::printf("attnbench_echo: serving on 0.0.0.0:%d (gRPC %s)\n", s.port, grpc::Version().c_str());
  std::fflush(stdout);
  if (f.serve_seconds > 0) {
    timespec ts;
    ts.tv_sec = static_cast<time_t>(f.serve_seconds);
    ts.tv_nsec = static_cast<long>((f.serve_seconds - static_cast<double>(ts.tv_sec)) * 1e9);
    sigtimedwait(&set, nullptr, &ts);
  } else {
    int sig = 0;
    sigwait(&set, &sig);
  }
  s.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::printf("attnbench_echo: server stopped\n");
  return absl::OkStatus();
}

// ---- client ----------------------------------------------------------------------------------

using Stream = grpc::ClientReaderWriter<Chunk, Chunk>;

int64_t ChunkSize(int64_t index, int64_t bytes, int64_t chunk) {
  return std::min(chunk, bytes - index * chunk);
}

// Sends `bytes` in `chunk`-byte messages, each starting with its sequence number, then
// half-closes. One message buffer is reused. False when the stream broke.
bool WriteAll(Stream& stream, int64_t bytes, int64_t chunk) {
  Chunk msg;
  std::string* data = msg.mutable_data();
  data->assign(static_cast<size_t>(std::min(chunk, bytes)), '\x5a');
  bool ok = true;
  for (int64_t i = 0; i * chunk < bytes && ok; ++i) {
    const int64_t n = ChunkSize(i, bytes, chunk);
    if (static_cast<int64_t>(data->size()) != n) data->resize(static_cast<size_t>(n));
    if (n >= kMinChunk) std::memcpy(data->data(), &i, sizeof(i));
    ok = stream.Write(msg);
  }
  return stream.WritesDone() && ok;
}

// Reads the echoes of WriteAll's messages, in order; returns the bytes echoed (fewer when the
// stream ended early), or DATA_LOSS when an echo is not the message sent.
absl::StatusOr<int64_t> ReadAll(Stream& stream, int64_t bytes, int64_t chunk) {
  Chunk msg;
  int64_t got = 0;
  for (int64_t i = 0; got < bytes; ++i) {
    if (!stream.Read(&msg)) return got;
    const int64_t n = static_cast<int64_t>(msg.data().size());
    int64_t tag = i;
    if (n >= kMinChunk) std::memcpy(&tag, msg.data().data(), sizeof(tag));
    if (n != ChunkSize(i, bytes, chunk) || tag != i) {
      return absl::DataLossError(
          absl::StrFormat("echo %d: %d bytes with sequence number %d, expected %d bytes with %d", i,
                          n, tag, ChunkSize(i, bytes, chunk), i));
    }
    got += n;
  }
  return got;
}

struct Timing {
  Clock::time_point first_write, last_echo;
};

// One Echo stream of `bytes`. With `barrier`, waits there (with the stream open) before the
// first write, so that the timed streams of all pairs start together.
absl::StatusOr<Timing> EchoStream(EchoBench::Stub& stub, int64_t bytes, int64_t chunk,
                                  std::chrono::system_clock::time_point deadline,
                                  Barrier* barrier) {
  grpc::ClientContext context;
  context.set_deadline(deadline);
  std::unique_ptr<Stream> stream = stub.Echo(&context);
  if (barrier != nullptr && !barrier->Arrive()) {
    context.TryCancel();
    stream->Finish();
    return OtherRankFailed();
  }
  Timing t;
  t.first_write = Clock::now();
  bool wrote = false;
  std::thread writer([&] { wrote = WriteAll(*stream, bytes, chunk); });
  const absl::StatusOr<int64_t> echoed = ReadAll(*stream, bytes, chunk);
  t.last_echo = Clock::now();
  // A bad echo: cancel, which unblocks the writer. A stream that ended early is over already
  // (its status, e.g. the deadline's, is what Finish reports).
  if (!echoed.ok()) context.TryCancel();
  writer.join();
  const grpc::Status status = stream->Finish();
  if (!echoed.ok()) return echoed.status();
  if (!status.ok() || *echoed != bytes || !wrote) {
    const absl::Status s =
        status.ok() ? absl::InternalError("the stream ended early") : FromGrpc(status);
    return absl::Status(s.code(), absl::StrCat("echo stream: ", s.message(), " after ", *echoed,
                                               " of ", bytes, " bytes echoed"));
  }
  return t;
}

std::shared_ptr<grpc::Channel> PairChannel(const std::string& target, int pair, int64_t chunk) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(MaxMessageBytes(chunk));
  args.SetMaxSendMessageSize(MaxMessageBytes(chunk));
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // Its own subchannel, and arguments no other pair's channel has: its own HTTP/2 connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("attnbench_echo.pair", pair);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

struct ConfigResult {
  int pairs = 0;
  absl::Status status;
  double wall_s = 0, gbps = 0;    // aggregate, each way
  std::vector<double> pair_gbps;  // each pair's own rate, each way
  int connections = -1;           // distinct client connections the server saw (-1: unknown)
};

ConfigResult RunConfig(const Flags& f, const std::string& target, int pairs) {
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(
                            std::chrono::duration<double>(f.timeout));
  std::vector<Timing> timings(pairs);
  Barrier barrier(pairs);
  const auto body = [&](int pair) -> absl::Status {
    std::shared_ptr<grpc::Channel> channel = PairChannel(target, pair, f.chunk_bytes);
    if (!channel->WaitForConnected(deadline)) {
      return absl::UnavailableError(
          absl::StrCat("pair ", pair, ": no connection to ", target, " within --timeout"));
    }
    EchoBench::Stub stub(channel);
    if (f.warmup_bytes > 0) {
      ATTN_RETURN_IF_ERROR(
          EchoStream(stub, f.warmup_bytes, f.chunk_bytes, deadline, nullptr).status());
    }
    ATTN_ASSIGN_OR_RETURN(timings[pair],
                          EchoStream(stub, f.bytes, f.chunk_bytes, deadline, &barrier));
    return absl::OkStatus();
  };
  ConfigResult r;
  r.pairs = pairs;
  r.status = FirstFailure(RunRankThreads(pairs, body, &barrier));
  if (!r.status.ok() && std::chrono::system_clock::now() >= deadline) {
    r.status = absl::DeadlineExceededError(
        absl::StrCat("--timeout ", f.timeout, " s passed (", r.status.ToString(), ")"));
  }
  if (!r.status.ok()) return r;
  Clock::time_point first = timings[0].first_write, last = timings[0].last_echo;
  for (const Timing& t : timings) {
    first = std::min(first, t.first_write);
    last = std::max(last, t.last_echo);
    r.pair_gbps.push_back(static_cast<double>(f.bytes) / Seconds(t.first_write, t.last_echo) / 1e9);
  }
  r.wall_s = Seconds(first, last);
  r.gbps = static_cast<double>(f.bytes) * pairs / r.wall_s / 1e9;
  return r;
}

void PrintResult(const Flags& f, const ConfigResult& r) {
  if (!r.status.ok()) {
    std::printf("  pairs %3d: ERROR %s\n", r.pairs, r.status.ToString().c_str());
    return;
  }
  const auto [lo, hi] = std::minmax_element(r.pair_gbps.begin(), r.pair_gbps.end());
  std::printf(
      "  pairs %3d: %.3f GB each way in %.3f s: %.3f GB/s each way (%.3f both ways); "
      "per pair %.3f-%.3f GB/s%s\n",
      r.pairs, static_cast<double>(f.bytes) * r.pairs / 1e9, r.wall_s, r.gbps, 2 * r.gbps, *lo, *hi,
      r.connections < 0 ? "" : absl::StrCat("; ", r.connections, " connection(s)").c_str());
  std::fflush(stdout);
}

Json ResultJson(const Flags& f, const std::string& device, const std::string& target,
                const std::vector<ConfigResult>& results) {
  Json j = Json::Object();
  AddRunRecord(MakeRunRecord(device), j);
  j.Set("bench", "grpc_echo");
  j.Set("mode", f.mode);
  j.Set("server", target);
  j.Set("grpc_version", grpc::Version());
  j.Set("transport",
        "insecure HTTP/2; callback-API server; sync client streams (writer thread "
        "+ reader thread per pair); one channel and connection per pair");
  j.Set("bytes_per_pair", f.bytes);
  j.Set("chunk_bytes", f.chunk_bytes);
  j.Set("warmup_bytes_per_pair", f.warmup_bytes);
  j.Set("timeout_s", f.timeout);
  j.Set("rate_formula",
        "pairs * bytes_per_pair / (last echoed byte of any pair - first write of "
        "any pair), GB = 1e9 bytes, each way (both ways: twice that)");
  Json configs = Json::Array();
  for (const ConfigResult& r : results) {
    Json c = Json::Object();
    c.Set("pairs", r.pairs);
    if (r.status.ok()) {
      c.Set("bytes_each_way", f.bytes * r.pairs);
      c.Set("wall_s", r.wall_s);
      c.Set("gb_per_s_each_way", r.gbps);
      c.Set("gb_per_s_both_ways", 2 * r.gbps);
      c.Set("pair_gb_per_s_each_way", Json::ArrayOf(r.pair_gbps));
      if (r.connections >= 0) c.Set("server_connections", r.connections);
      c.Set("error", Json());
    } else {
      c.Set("error", r.status.ToString());
    }
    configs.Push(std::move(c));
  }
  j.Set("configs", std::move(configs));
  return j;
}

absl::Status RunClient(const Flags& f) {
  std::optional<RunningServer> local;
  std::string target = f.server;
  if (f.mode == "both") {
    ATTN_ASSIGN_OR_RETURN(RunningServer s, StartServer("127.0.0.1:0", f.chunk_bytes));
    target = absl::StrCat("127.0.0.1:", s.port);
    local = std::move(s);
  }
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const std::string device =
      absl::StrCat("cpu: ", CpuModelName(), ", ", threads, " hardware threads; ",
                   f.mode == "both" ? "client and server in one process over loopback"
                                    : absl::StrCat("client of ", target));
  std::printf(
      "attnbench_echo: %s, server %s, gRPC %s\n  %s\n  %lld bytes per pair in %lld-byte "
      "chunks, %lld warmup bytes per pair, timeout %g s per configuration\n",
      f.mode.c_str(), target.c_str(), grpc::Version().c_str(), device.c_str(),
      static_cast<long long>(f.bytes), static_cast<long long>(f.chunk_bytes),
      static_cast<long long>(f.warmup_bytes), f.timeout);
  std::fflush(stdout);
  std::vector<ConfigResult> results;
  for (const int pairs : f.pairs) {
    if (local) local->service->TakePeerCount();
    results.push_back(RunConfig(f, target, pairs));
    if (local) results.back().connections = local->service->TakePeerCount();
    PrintResult(f, results.back());
  }
  if (local) local->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!f.json_out.empty()) {
    ATTN_RETURN_IF_ERROR(WriteJsonOut(f.json_out, ResultJson(f, device, target, results)));
  }
  for (const ConfigResult& r : results) {
    if (!r.status.ok()) {
      return absl::Status(r.status.code(),
                          absl::StrCat("pairs ", r.pairs, ": ", r.status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Main() {
  ATTN_ASSIGN_OR_RETURN(const Flags f, ReadFlags());
  return f.mode == "server" ? Serve(f) : RunClient(f);
}

}  // namespace
}  // namespace attnserve::bench

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv, attnserve::bench::kUsage, "attnbench_echo",
                                     attnserve::bench::Main);
}
