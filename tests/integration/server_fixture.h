// Support for the integration tests: a child process (the real attnserve binary, or Prometheus)
// started on loopback and stopped with SIGTERM then SIGKILL, a temporary directory, a minimal
// HTTP GET, a Prometheus text-format reader, and reference checks of Attend results.
#ifndef ATTNSERVE_TESTS_INTEGRATION_SERVER_FIXTURE_H_
#define ATTNSERVE_TESTS_INTEGRATION_SERVER_FIXTURE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attnserve.pb.h"
#include "client/attn_client.h"
#include "core/reference/reference.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"

namespace attnserve::testing {

// A directory under $TEST_TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  static absl::StatusOr<std::unique_ptr<TempDir>> Create(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// A child process with stdout and stderr sent to a log file. The child gets SIGKILL when the
// thread that spawned it ends (PR_SET_PDEATHSIG), so a crashed test leaves no server behind;
// spawn children from a thread that outlives them (the test's main thread).
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::string& binary,
                                                             const std::vector<std::string>& args,
                                                             const std::string& log_path);
  // Stop(default grace).
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // SIGTERM, then SIGKILL when the process has not exited after `grace`. Returns how it ended:
  // OK for exit code 0, INTERNAL naming the exit code or signal otherwise. Idempotent.
  absl::Status Stop(absl::Duration grace = absl::Seconds(15));
  // Whether the process is still running (reaps it when it has exited).
  bool Running();
  pid_t pid() const { return pid_; }
  // The log file's contents (its last `max_bytes`).
  std::string Log(size_t max_bytes = 16384) const;
  // "exited with code 1" / "killed by signal 9" / "running".
  std::string ExitDescription() const;
  // The exit code once the process has exited normally; nullopt while running or when a signal
  // ended it.
  std::optional<int> ExitCode() const;

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  std::optional<int> wait_status_;  // set once reaped
};

struct ServerOptions {
  // gRPC port on 127.0.0.1; 0 lets the kernel pick one (read back from --port-file).
  int port = 0;
  // Extra flags after the fixture's own (--listen, --port-file, --metrics-listen,
  // --metrics-port-file, --backend cpu), e.g. {"--max-queue=1", "--cpu-workers=1"}.
  std::vector<std::string> extra_args;
  absl::Duration startup_timeout = absl::Seconds(60);
  // How the fixture's clients (the start-up health check, NewClient) connect to a server started
  // with TLS or tokens: credentials (null: plaintext), the certificate's name, a bearer token.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;
  std::string token;
  // False: Start returns once the ports are open, without the health check (for a server that
  // no client can reach, e.g. one serving an expired certificate).
  bool wait_for_health = true;
};

// The real attnserve binary (ATTNSERVE_BINARY) on 127.0.0.1 with kernel-chosen ports.
class ServerProcess {
 public:
  // Starts the server and waits (bounded by startup_timeout) until both port files are written
  // and the health check says SERVING. On failure the server is stopped and the error carries
  // the tail of its log.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const ServerOptions& options = {});
  ~ServerProcess();

  const std::string& target() const { return target_; }  // "127.0.0.1:PORT"
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  ChildProcess& process() { return *process_; }
  bool Running() { return process_->Running(); }
  absl::Status Stop(absl::Duration grace = absl::Seconds(15)) { return process_->Stop(grace); }
  std::string Log() const { return process_->Log(); }

  // A client of this server (retries off, so the tests see each call's own status).
  std::unique_ptr<client::AttnClient> NewClient(int max_attempts = 1) const;
  // GET /metrics.
  absl::StatusOr<std::string> ScrapeMetrics() const;
  // OK when a health check within `timeout` says SERVING.
  absl::Status CheckHealth(absl::Duration timeout = absl::Seconds(5)) const;

 private:
  ServerProcess() = default;
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<ChildProcess> process_;
  ServerOptions options_;
  std::string target_;
  int port_ = 0;
  int metrics_port_ = 0;
};

// The outcome of a command run to completion.
struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string output;  // stdout and stderr, interleaved
};
// Runs `binary args...` with stdout and stderr captured, waiting at most `timeout` (then the
// process is killed and DEADLINE_EXCEEDED returned with its output so far).
absl::StatusOr<CommandResult> RunCommand(const std::string& binary,
                                         const std::vector<std::string>& args,
                                         absl::Duration timeout = absl::Seconds(120));

// RunCommand with the command line ("$ NAME args...") and the output printed to the test log; a
// command that could not run or did not finish in `timeout` is a test failure (and an empty
// result with exit code -1).
CommandResult RunLogged(const std::string& name, const std::string& binary,
                        const std::vector<std::string>& args, absl::Duration timeout);

// A test suite sharing one attnserve process (default options), started once for the suite (Base:
// ::testing::Test, or ::testing::TestWithParam<T> for a parameterized suite). When it did not
// start, every test fails with the reason; after the suite it must stop cleanly.
template <typename Base = ::testing::Test>
class SharedServerTest : public Base {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start();
    if (!s.ok()) {
      start_error_ = new std::string(s.status().ToString());
      return;
    }
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      EXPECT_TRUE(server_->Stop().ok()) << "attnserve did not stop cleanly:\n" << server_->Log();
      delete server_;
      server_ = nullptr;
    }
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << *start_error_; }

  inline static ServerProcess* server_ = nullptr;
  inline static std::string* start_error_ = nullptr;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
absl::StatusOr<int> PickFreePort();

// HTTP/1.0 GET http://127.0.0.1:port/path. Returns the body of a 200 response; other statuses
// and socket errors are errors. Bounded by `timeout`.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path,
                                    absl::Duration timeout = absl::Seconds(5));

// The sum of every sample of `name` (all label sets, the bare name only: not name_bucket etc.)
// in Prometheus text format. NOT_FOUND when no sample has that name.
absl::StatusOr<double> MetricSum(const std::string& text, const std::string& name);

// Uniform [-1, 1) values from `seed`, rounded to `dtype`.
HostTensor RandomTensor(DType dtype, const std::vector<int64_t>& dims, uint64_t seed);

// A fresh seed per call (time and a counter), for tests that print the seeds they use.
uint64_t FreshSeed();

// q, k, v of one request and the spec it is sent with.
struct Problem {
  HostTensor q, k, v;
  attnserve::v1::AttentionSpec spec;
  uint64_t seed = 0;
};
absl::StatusOr<Problem> MakeProblem(DType dtype, int64_t batch, int64_t tokens, int64_t q_heads,
                                    int64_t kv_heads, int64_t head_dim,
                                    const attnserve::v1::AttentionSpec& spec, uint64_t seed);
// The client input for `problem`: borrows its tensors, so `problem` must outlive the call.
client::AttendInput AttendInputFor(const Problem& problem);

// Compares an Attend result with the float64 reference of `problem`. OK when O's max relative
// error is <= o_tolerance, LSE's max absolute error (when LSE is present) <= lse_tolerance and no
// output is non-finite where the reference is finite; otherwise INTERNAL with the numbers.
absl::Status CheckResult(const Problem& problem, const client::AttendResult& result,
                         double o_tolerance, double lse_tolerance, ErrorStats* stats = nullptr);

// The same against a reference computed once (for many results of the same problem).
absl::Status CheckResultAgainst(const ReferenceResult& reference, const Problem& problem,
                                const client::AttendResult& result, double o_tolerance,
                                double lse_tolerance, ErrorStats* stats = nullptr);

// The test tolerances: O relative 1e-5 for f32 and 1e-2 for 16-bit dtypes; LSE absolute 1e-4 for
// f32 and 1e-2 otherwise.
double OTolerance(DType dtype);
double LseTolerance(DType dtype);

// Parses a spec from its proto3 JSON mapping; aborts the test binary on a malformed literal.
attnserve::v1::AttentionSpec SpecFromJson(const std::string& json);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_INTEGRATION_SERVER_FIXTURE_H_
