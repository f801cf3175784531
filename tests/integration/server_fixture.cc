#include "tests/integration/server_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "wire/convert.h"

#ifndef ATTNSERVE_BINARY
#error "ATTNSERVE_BINARY must be defined (path of the attnserve binary)"
#endif

namespace attnserve::testing {
namespace {

std::string ErrnoText(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A whole positive integer followed by a newline (so a half-written file does not count).
std::optional<int> ReadPortFile(const std::string& path) {
  const std::string text = ReadFile(path);
  if (text.empty() || text.back() != '\n') return std::nullopt;
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) || port <= 0 || port > 65535) {
    return std::nullopt;
  }
  return port;
}

}  // namespace

// ---- TempDir ----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TempDir>> TempDir::Create(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = absl::StrCat(base != nullptr && *base ? base : "/tmp", "/", prefix, "XXXXXX");
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return absl::InternalError(ErrnoText("mkdtemp " + templ));
  return std::unique_ptr<TempDir>(new TempDir(buf.data()));
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

// ---- ChildProcess -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const std::string& binary, const std::vector<std::string>& args, const std::string& log_path) {
  if (access(binary.c_str(), X_OK) != 0) return absl::NotFoundError(ErrnoText(binary));
  // Everything the child needs is prepared before fork: between fork and exec only
  // async-signal-safe calls are allowed (the test process has gRPC threads).
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(ErrnoText("open " + log_path));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(ErrnoText("fork"));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(log_fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() { Stop().IgnoreError(); }

bool ChildProcess::Running() {
  if (wait_status_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    wait_status_ = status;
    return false;
  }
  return r == 0;
}

absl::Status ChildProcess::Stop(absl::Duration grace) {
  if (Running()) {
    kill(pid_, SIGTERM);
    const absl::Time give_up = absl::Now() + grace;
    while (Running() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
    if (Running()) {
      kill(pid_, SIGKILL);
      int status = 0;
      if (waitpid(pid_, &status, 0) == pid_) wait_status_ = status;
      return absl::InternalError(absl::StrCat("pid ", pid_, " did not exit within ",
                                              absl::FormatDuration(grace), " of SIGTERM; killed"));
    }
  }
  if (wait_status_ && WIFEXITED(*wait_status_) && WEXITSTATUS(*wait_status_) == 0) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("pid ", pid_, " ", ExitDescription()));
}

std::string ChildProcess::ExitDescription() const {
  if (!wait_status_) return "running";
  if (WIFEXITED(*wait_status_))
    return absl::StrCat("exited with code ", WEXITSTATUS(*wait_status_));
  if (WIFSIGNALED(*wait_status_)) return absl::StrCat("killed by signal ", WTERMSIG(*wait_status_));
  return "ended";
}

std::optional<int> ChildProcess::ExitCode() const {
  if (!wait_status_ || !WIFEXITED(*wait_status_)) return std::nullopt;
  return WEXITSTATUS(*wait_status_);
}

std::string ChildProcess::Log(size_t max_bytes) const {
  std::string log = ReadFile(log_path_);
  if (log.size() > max_bytes) log = "..." + log.substr(log.size() - max_bytes);
  return log;
}

CommandResult RunLogged(const std::string& name, const std::string& binary,
                        const std::vector<std::string>& args, absl::Duration timeout) {
  std::string line = name;
  for (const std::string& a : args) absl::StrAppend(&line, " ", a);
  std::printf("$ %s\n", line.c_str());
  absl::StatusOr<CommandResult> r = RunCommand(binary, args, timeout);
  if (!r.ok()) {
    ADD_FAILURE() << r.status();
    return {};
  }
  std::printf("%s(exit %d)\n", r->output.c_str(), r->exit_code);
  return *r;
}

absl::StatusOr<CommandResult> RunCommand(const std::string& binary,
                                         const std::vector<std::string>& args,
                                         absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnserve_cmd_");
  if (!dir.ok()) return dir.status();
  absl::StatusOr<std::unique_ptr<ChildProcess>> process =
      ChildProcess::Spawn(binary, args, (*dir)->File("output"));
  if (!process.ok()) return process.status();
  const absl::Time give_up = absl::Now() + timeout;
  while ((*process)->Running() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
  CommandResult result;
  if ((*process)->Running()) {
    (*process)->Stop(absl::Seconds(2)).IgnoreError();
    return absl::DeadlineExceededError(absl::StrCat(binary, " did not finish within ",
                                                    absl::FormatDuration(timeout), "; output:\n",
                                                    (*process)->Log()));
  }
  result.exit_code = (*process)->ExitCode().value_or(-1);
  result.output = (*process)->Log(size_t{1} << 20);
  return result;
}

// ---- ServerProcess ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(const ServerOptions& options) {
  std::unique_ptr<ServerProcess> server(new ServerProcess());
  server->options_ = options;
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnserve_it_");
  if (!dir.ok()) return dir.status();
  server->dir_ = *std::move(dir);
  const std::string port_file = server->dir_->File("port");
  const std::string metrics_port_file = server->dir_->File("metrics_port");
  std::vector<std::string> args = {absl::StrCat("--listen=127.0.0.1:", options.port),
                                   "--port-file=" + port_file, "--metrics-listen=127.0.0.1:0",
                                   "--metrics-port-file=" + metrics_port_file, "--backend=cpu"};
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> process =
      ChildProcess::Spawn(ATTNSERVE_BINARY, args, server->dir_->File("attnserve.log"));
  if (!process.ok()) return process.status();
  server->process_ = *std::move(process);

  auto fail = [&](const std::string& why) {
    server->process_->Stop(absl::Seconds(5)).IgnoreError();
    return absl::UnavailableError(absl::StrCat("attnserve did not become ready: ", why, " (",
                                               server->process_->ExitDescription(), "); its log:\n",
                                               server->process_->Log()));
  };
  const absl::Time give_up = absl::Now() + options.startup_timeout;
  while (absl::Now() < give_up) {
    if (!server->process_->Running()) return fail("the process ended");
    if (server->port_ == 0) {
      if (std::optional<int> p = ReadPortFile(port_file)) server->port_ = *p;
    }
    if (server->metrics_port_ == 0) {
      if (std::optional<int> p = ReadPortFile(metrics_port_file)) server->metrics_port_ = *p;
    }
    if (server->port_ != 0 && server->metrics_port_ != 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (server->port_ == 0 || server->metrics_port_ == 0) {
    return fail(
        absl::StrCat("no port files after ", absl::FormatDuration(options.startup_timeout)));
  }
  server->target_ = absl::StrCat("127.0.0.1:", server->port_);
  if (!options.wait_for_health) return server;
  absl::Status health = absl::UnknownError("not checked");
  while (absl::Now() < give_up) {
    if (!server->process_->Running()) return fail("the process ended");
    health = server->CheckHealth(absl::Seconds(1));
    if (health.ok()) return server;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return fail(absl::StrCat("health check: ", health.ToString()));
}

ServerProcess::~ServerProcess() {
  if (process_) process_->Stop().IgnoreError();
}

std::unique_ptr<client::AttnClient> ServerProcess::NewClient(int max_attempts) const {
  client::ClientOptions options;
  options.target = target_;
  options.max_attempts = max_attempts;
  options.credentials = options_.credentials;
  options.tls_server_name = options_.tls_server_name;
  options.token = options_.token;
  absl::StatusOr<std::unique_ptr<client::AttnClient>> c = client::AttnClient::Create(options);
  if (!c.ok()) {
    ADD_FAILURE() << "AttnClient::Create: " << c.status();
    return nullptr;
  }
  return *std::move(c);
}

absl::StatusOr<std::string> ServerProcess::ScrapeMetrics() const {
  return HttpGet(metrics_port_, "/metrics");
}

absl::Status ServerProcess::CheckHealth(absl::Duration timeout) const {
  std::unique_ptr<client::AttnClient> c = NewClient();
  if (c == nullptr) return absl::InternalError("no client");
  client::CallOptions call;
  call.timeout = timeout;
  return c->Health(call);
}

// ---- HTTP, metrics ----------------------------------------------------------------------------

absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(ErrnoText("socket"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string err = ErrnoText("bind 127.0.0.1:0");
    close(fd);
    return absl::InternalError(err);
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

namespace {

// Decodes a "Transfer-Encoding: chunked" body.
absl::StatusOr<std::string> Dechunk(std::string_view body) {
  std::string out;
  // Each round consumes one chunk; a body of n bytes has at most n chunks.
  for (size_t rounds = 0; rounds <= body.size() + 1; ++rounds) {
    const size_t eol = body.find("\r\n");
    if (eol == std::string_view::npos) return absl::DataLossError("chunked body: no size line");
    std::string size_hex(body.substr(0, eol));
    if (size_t semi = size_hex.find(';'); semi != std::string::npos) size_hex.resize(semi);
    uint64_t size = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_hex), &size)) {
      return absl::DataLossError("chunked body: bad chunk size");
    }
    body.remove_prefix(eol + 2);
    if (size == 0) return out;
    if (body.size() < size + 2) return absl::DataLossError("chunked body: truncated chunk");
    out.append(body.substr(0, size));
    body.remove_prefix(size + 2);
  }
  return absl::DataLossError("chunked body: no terminating chunk");
}

}  // namespace

absl::StatusOr<std::string> HttpGet(int port, const std::string& path, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(ErrnoText("socket"));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  tv.tv_usec = static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(ErrnoText(absl::StrCat("connect 127.0.0.1:", port)));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1:", port,
                                           "\r\nAccept: */*\r\nConnection: close\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError(ErrnoText("send"));
  }
  std::string response;
  const absl::Time give_up = absl::Now() + timeout;
  char buf[65536];
  // Ends at EOF (the server closes after the response), on a socket timeout, or at give_up.
  while (absl::Now() < give_up) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DeadlineExceededError(ErrnoText(absl::StrCat("recv from 127.0.0.1:", port)));
    }
    response.append(buf, static_cast<size_t>(n));
    if (response.size() > (size_t{64} << 20)) {
      return absl::ResourceExhaustedError("HTTP response larger than 64 MiB");
    }
  }
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("GET ", path, ": no HTTP header in the response"));
  }
  const std::string header = response.substr(0, header_end);
  std::string body = response.substr(header_end + 4);
  const std::vector<std::string> status_line =
      absl::StrSplit(header.substr(0, header.find("\r\n")), ' ');
  if (status_line.size() < 2 || status_line[1] != "200") {
    return absl::UnavailableError(absl::StrCat(
        "GET ", path, ": ", header.substr(0, header.find("\r\n")), "\n", body.substr(0, 512)));
  }
  std::string lower_header = header;
  for (char& c : lower_header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower_header.find("transfer-encoding: chunked") != std::string::npos) return Dechunk(body);
  return body;
}

absl::StatusOr<double> MetricSum(const std::string& text, const std::string& name) {
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, name)) continue;
    absl::string_view rest = line.substr(name.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;  // a longer name
    if (rest[0] == '{') {
      const size_t close = rest.rfind('}');
      if (close == absl::string_view::npos) continue;
      rest = rest.substr(close + 1);
    }
    rest = absl::StripLeadingAsciiWhitespace(rest);
    // "value [timestamp]"
    const std::string value(rest.substr(0, rest.find(' ')));
    double v = 0;
    if (value == "+Inf") {
      v = INFINITY;
    } else if (value == "-Inf") {
      v = -INFINITY;
    } else if (!absl::SimpleAtod(value, &v)) {
      continue;
    }
    sum += v;
    found = true;
  }
  if (!found) return absl::NotFoundError(absl::StrCat("no samples of ", name));
  return sum;
}

// ---- Problems and reference checks ------------------------------------------------------------

HostTensor RandomTensor(DType dtype, const std::vector<int64_t>& dims, uint64_t seed) {
  absl::StatusOr<HostTensor> t = HostTensor::Create(dtype, dims);
  if (!t.ok()) {
    ADD_FAILURE() << "HostTensor::Create: " << t.status();
    return HostTensor();
  }
  FillUniform(*t, seed);
  return *std::move(t);
}

uint64_t FreshSeed() {
  static std::atomic<uint64_t> counter{0};
  const uint64_t now = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  uint64_t z = now + 0x9E3779B97F4A7C15ull * (counter.fetch_add(1) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & 0xFFFFFFFFFFFFull;  // 48 bits: short enough to paste into a rerun
}

absl::StatusOr<Problem> MakeProblem(DType dtype, int64_t batch, int64_t tokens, int64_t q_heads,
                                    int64_t kv_heads, int64_t head_dim,
                                    const attnserve::v1::AttentionSpec& spec, uint64_t seed) {
  Problem p;
  p.seed = seed;
  p.spec = spec;
  p.q = RandomTensor(dtype, {batch, tokens, q_heads, head_dim}, seed);
  p.k = RandomTensor(dtype, {batch, tokens, kv_heads, head_dim}, seed + 1);
  p.v = RandomTensor(dtype, {batch, tokens, kv_heads, head_dim}, seed + 2);
  if (p.q.empty() || p.k.empty() || p.v.empty()) {
    return absl::InternalError("could not allocate the inputs");
  }
  return p;
}

absl::Status CheckResult(const Problem& problem, const client::AttendResult& result,
                         double o_tolerance, double lse_tolerance, ErrorStats* stats_out) {
  absl::StatusOr<AttentionSpec> spec = SpecFromProto(problem.spec);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<ReferenceResult> ref = ReferenceAttention(*spec, problem.q, problem.k, problem.v);
  if (!ref.ok()) return ref.status();
  return CheckResultAgainst(*ref, problem, result, o_tolerance, lse_tolerance, stats_out);
}

absl::Status CheckResultAgainst(const ReferenceResult& reference, const Problem& problem,
                                const client::AttendResult& result, double o_tolerance,
                                double lse_tolerance, ErrorStats* stats_out) {
  const ReferenceResult* ref = &reference;
  if (result.o.dims() != problem.q.dims() || result.o.dtype() != problem.q.dtype()) {
    return absl::InternalError(
        absl::StrCat("O is ", result.o.DebugString(), ", expected ", problem.q.DebugString()));
  }
  const ErrorStats stats = CompareToReference(*ref, result.o, result.lse ? &*result.lse : nullptr);
  if (stats_out != nullptr) *stats_out = stats;
  if (stats.nonfinite != 0 || !(stats.o_rel <= o_tolerance) ||
      !(stats.lse_max_abs <= lse_tolerance) || stats.checked == 0) {
    return absl::InternalError(absl::StrFormat(
        "seed %d: O max rel err %.3e (tolerance %.1e, max abs %.3e), LSE max abs err %.3e "
        "(tolerance %.1e), non-finite %d, checked %d",
        problem.seed, stats.o_rel, o_tolerance, stats.o_max_abs, stats.lse_max_abs, lse_tolerance,
        stats.nonfinite, stats.checked));
  }
  return absl::OkStatus();
}

double OTolerance(DType dtype) { return dtype == DType::kF32 ? 1e-5 : 1e-2; }
double LseTolerance(DType dtype) { return dtype == DType::kF32 ? 1e-4 : 1e-2; }

attnserve::v1::AttentionSpec SpecFromJson(const std::string& json) {
  absl::StatusOr<attnserve::v1::AttentionSpec> spec = ParseSpecJsonProto(json);
  if (!spec.ok()) {
    ADD_FAILURE() << "spec JSON " << json << ": " << spec.status();
    return {};
  }
  return *std::move(spec);
}

client::AttendInput AttendInputFor(const Problem& problem) {
  client::AttendInput input;
  input.q = &problem.q;
  input.k = &problem.k;
  input.v = &problem.v;
  input.spec = problem.spec;
  return input;
}

}  // namespace attnserve::testing
