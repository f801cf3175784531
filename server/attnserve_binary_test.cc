// The attnserve binary as a process: port files, Describe, health, /metrics over HTTP, and the
// SIGTERM drain (the call in progress completes, new calls get UNAVAILABLE, exit status 0).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"

extern char** environ;

namespace attnserve {
namespace {

using ::testing::HasSubstr;

std::optional<int> ReadPort(const std::string& path, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return std::nullopt;
}

// GET /metrics over a plain socket.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

class Process {
 public:
  explicit Process(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~Process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // Exit status, or -1 when it did not exit normally within `timeout`.
  int Wait(absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    while (absl::Now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

// One dense Attend of zeros; `request_id` (if not null) receives the id the response names.
grpc::Status AttendDense(v1::AttentionService::Stub* stub, int64_t tokens, int64_t heads,
                         int64_t dim, std::string* request_id = nullptr) {
  grpc::ClientContext ctx;
  auto stream = stub->Attend(&ctx);
  v1::AttendRequest req;
  v1::AttendHeader* h = req.mutable_header();
  h->set_dtype(v1::DTYPE_F32);
  h->set_batch(1);
  h->set_tokens(tokens);
  h->set_q_heads(heads);
  h->set_kv_heads(heads);
  h->set_head_dim(dim);
  h->mutable_spec()->mutable_dense();
  stream->Write(req);
  const std::string bytes(static_cast<size_t>(tokens * heads * dim * 4), '\0');
  for (auto kind : {v1::TENSOR_Q, v1::TENSOR_K, v1::TENSOR_V}) {
    req.Clear();
    req.mutable_chunk()->set_tensor(kind);
    req.mutable_chunk()->set_data(bytes);
    stream->Write(req);
  }
  stream->WritesDone();
  v1::AttendResponse resp;
  while (stream->Read(&resp)) {
    if (resp.has_header() && request_id != nullptr) *request_id = resp.header().request_id();
  }
  return stream->Finish();
}

TEST(AttnserveBinaryTest, ServesAndDrainsOnSigterm) {
  const std::string dir = ::testing::TempDir();
  const std::string port_file = absl::StrCat(dir, "/attnserve_binary_test.port");
  const std::string metrics_file = absl::StrCat(dir, "/attnserve_binary_test.mport");
  std::filesystem::remove(port_file);
  std::filesystem::remove(metrics_file);
  Process server({ATTNSERVE_BINARY, "--backend", "cpu", "--listen", "127.0.0.1:0", "--port-file",
                  port_file, "--metrics-listen=127.0.0.1:0", "--metrics-port-file", metrics_file,
                  "--drain-timeout=60s"});
  ASSERT_GT(server.pid(), 0);
  const std::optional<int> port = ReadPort(port_file, absl::Seconds(30));
  ASSERT_TRUE(port.has_value());
  const std::optional<int> metrics_port = ReadPort(metrics_file, absl::Seconds(5));
  ASSERT_TRUE(metrics_port.has_value());

  // Response chunks are up to 4 MiB of payload plus framing: above gRPC's default 4 MiB limit.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", *port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::AttentionService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::DescribeResponse d;
    ASSERT_TRUE(stub->Describe(&ctx, v1::DescribeRequest(), &d).ok());
    EXPECT_EQ(d.backend(), "cpu");
  }
  ASSERT_TRUE(AttendDense(stub.get(), 256, 2, 32).ok());
  std::string text = Scrape(*metrics_port);
  EXPECT_THAT(text, HasSubstr("attnserve_requests_total{code=\"OK\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("attnserve_device_memory_used_bytes{device=\"cpu:0\",uuid=\"cpu-0\"} 0"));
  EXPECT_THAT(text, HasSubstr("attnserve_nccl_bytes_total{device=\"cpu:0\",direction=\"send\"} 0"));

  // A call that runs for a while (~0.6 s of CPU work: with 4096 tokens, ~0.15 s, it could end
  // before the refused call below, and the server stop first); SIGTERM once it is in progress.
  auto long_call =
      std::async(std::launch::async, [&] { return AttendDense(stub.get(), 8192, 8, 64); });
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until &&
         Scrape(*metrics_port).find("attnserve_inflight_requests 1") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  absl::SleepFor(absl::Milliseconds(200));
  const grpc::Status refused = AttendDense(stub.get(), 64, 1, 16);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  const grpc::Status s = long_call.get();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(server.Wait(absl::Seconds(60)), 0);
}

// The id the server makes up for the first request (no request_id) of a fresh server process.
std::string FirstRequestId(const std::string& name) {
  const std::string port_file = absl::StrCat(::testing::TempDir(), "/", name, ".port");
  std::filesystem::remove(port_file);
  Process server({ATTNSERVE_BINARY, "--backend=cpu", "--listen=127.0.0.1:0",
                  "--metrics-listen=", absl::StrCat("--port-file=", port_file)});
  const std::optional<int> port = ReadPort(port_file, absl::Seconds(30));
  if (!port.has_value()) return "no port";
  auto stub = v1::AttentionService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials()));
  std::string id;
  const grpc::Status s = AttendDense(stub.get(), 16, 1, 16, &id);
  return s.ok() ? id : s.error_message();
}

// Generated request ids name the run: a restarted server does not hand out req-...-000001 again.
TEST(AttnserveBinaryTest, GeneratedRequestIdsDifferAcrossRestarts) {
  const std::string first = FirstRequestId("first_run");
  const std::string second = FirstRequestId("second_run");
  EXPECT_THAT(first, ::testing::MatchesRegex("req-[0-9a-f]{8}-000001"));
  EXPECT_THAT(second, ::testing::MatchesRegex("req-[0-9a-f]{8}-000001"));
  EXPECT_NE(first, second);
}

TEST(AttnserveBinaryTest, CudaBackendInCpuBuildFailsClearly) {
  Process server({ATTNSERVE_BINARY, "--backend=cuda", "--listen=127.0.0.1:0", "--metrics-listen="});
  ASSERT_GT(server.pid(), 0);
  const int code = server.Wait(absl::Seconds(30));
#if defined(ATTNSERVE_HAVE_CUDA)
  (void)code;  // depends on whether this machine has a GPU
#else
  EXPECT_EQ(code, 1);
#endif
}

// Everything the binary prints for `args` (stdout and stderr), and its exit code.
std::pair<std::string, int> Output(const std::string& args) {
  const std::string cmd = absl::StrCat(ATTNSERVE_BINARY, " ", args, " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {"popen failed", -1};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// --help lists the server's own flags as users type them (dashes), with defaults and
// descriptions, and every flag README.md's "Server flags" section names is among them.
TEST(AttnserveBinaryTest, HelpListsEveryDocumentedFlag) {
  const auto [help, code] = Output("--help");
  EXPECT_EQ(code, 0);
  EXPECT_THAT(help, ::testing::Not(::testing::HasSubstr("No flags matched")));
  EXPECT_THAT(help, ::testing::Not(::testing::HasSubstr("\n  --metrics_listen")));
  EXPECT_THAT(help, HasSubstr("  --metrics-listen (default \"0.0.0.0:9464\")\n"
                              "      Prometheus /metrics address host:port"));
  EXPECT_THAT(help, HasSubstr("  --drain-timeout (default 30s)\n"));
  EXPECT_THAT(help, HasSubstr("  --cpu-workers (default 1)\n"));
  EXPECT_THAT(help, HasSubstr("--flagfile"));
  EXPECT_EQ(Output("-h").first, help);
  std::ifstream readme(ATTNSERVE_README);
  ASSERT_TRUE(readme) << ATTNSERVE_README;
  std::string line, section;
  bool in_flags = false;
  while (std::getline(readme, line)) {
    if (line.rfind("## ", 0) == 0) in_flags = line == "## Server flags";
    if (in_flags) section += line + "\n";
  }
  ASSERT_FALSE(section.empty()) << "README.md has no \"## Server flags\" section";
  int documented = 0;
  for (size_t at = section.find("`--"); at != std::string::npos; at = section.find("`--", at + 1)) {
    size_t end = at + 3;
    while (end < section.size() && (std::isalnum(section[end]) || section[end] == '-')) ++end;
    const std::string flag = section.substr(at + 3, end - at - 3);
    if (flag == "help" || flag == "version" || flag == "flagfile") continue;
    ++documented;
    EXPECT_THAT(help, ::testing::HasSubstr(absl::StrCat("  --", flag, " (default "))) << flag;
  }
  EXPECT_GE(documented, 10);
}

TEST(AttnserveBinaryTest, VersionNamesVersionAndBuildType) {
  const auto [out, code] = Output("--version");
  EXPECT_EQ(code, 0);
  EXPECT_EQ(out,
            absl::StrCat("attnserve ", ATTNSERVE_VERSION, " (", ATTNSERVE_BUILD_TYPE, " build)\n"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("NDEBUG")));
}

// A flagfile may spell flags with dashes, as the command line does (and nest another one).
TEST(AttnserveBinaryTest, FlagfileTakesDashedNames) {
  const std::string dir = ::testing::TempDir();
  const std::string port_file = absl::StrCat(dir, "/attnserve_flagfile_test.port");
  const std::string metrics_file = absl::StrCat(dir, "/attnserve_flagfile_test.mport");
  const std::string inner = absl::StrCat(dir, "/attnserve_flagfile_test_inner.flags");
  const std::string flags = absl::StrCat(dir, "/attnserve_flagfile_test.flags");
  std::filesystem::remove(port_file);
  std::filesystem::remove(metrics_file);
  std::ofstream(inner) << "--metrics-port-file=" << metrics_file << "\n";
  std::ofstream(flags) << "# attnserve flags\n--backend=cpu\n--listen=127.0.0.1:0\n"
                       << "--metrics-listen=127.0.0.1:0\n--port-file=" << port_file << "\n"
                       << "--max-queue=7\n--flagfile=" << inner << "\n";
  Process server({ATTNSERVE_BINARY, absl::StrCat("--flagfile=", flags)});
  ASSERT_GT(server.pid(), 0);
  const std::optional<int> port = ReadPort(port_file, absl::Seconds(30));
  ASSERT_TRUE(port.has_value()) << "the server did not start with " << flags;
  ASSERT_TRUE(ReadPort(metrics_file, absl::Seconds(5)).has_value());
  auto stub = v1::AttentionService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::DescribeResponse d;
  ASSERT_TRUE(stub->Describe(&ctx, v1::DescribeRequest(), &d).ok());
  EXPECT_EQ(d.limits().max_queue(), 7);
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  EXPECT_EQ(server.Wait(absl::Seconds(30)), 0);
}

}  // namespace
}  // namespace attnserve
