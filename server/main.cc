// attnserve: the attention service. See server/README.md for the flags and their behaviour.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/cuda/cuda_options.h"
#include "core/cuda/engine_table.h"
#include "core/util/flag_names.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "server/auth/principals.h"
#include "server/auth/transport.h"
#include "server/device_pool.h"
#include "server/grpc/service.h"
#include "server/metrics.h"
#include "server/request_log.h"
#include "server/scheduler.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051",
          "gRPC address host:port; port 0 binds a free port (printed, and written to --port-file)");
ABSL_FLAG(std::string, port_file, "", "write the bound gRPC port to this file once serving");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9464",
          "Prometheus /metrics address host:port (port 0: a free port); empty disables it");
ABSL_FLAG(std::string, metrics_port_file, "",
          "write the bound metrics port to this file once serving");
ABSL_FLAG(std::string, backend, "auto", "auto|cpu|cuda (auto: cuda when a GPU is present)");
ABSL_FLAG(std::string, devices, "", "comma list of device indices to use (default: all)");
ABSL_FLAG(int, cpu_workers, 1, "CPU backend: number of CPU devices (one worker thread each)");
ABSL_FLAG(int, cpu_threads, 0, "CPU backend: compute threads per CPU device (0: cores / workers)");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{8} << 30, "largest Q + K + V bytes of one request");
ABSL_FLAG(int, max_queue, 64, "requests that may wait for a device; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_regions, 64,
          "shared-memory regions (RegisterRegion) registered at once; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, context_memory_bytes, 0,
          "K and V bytes the contexts (CreateContext) may hold together, split evenly over the "
          "devices (0: half of the devices' memory); more get RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, context_ttl, absl::Minutes(10),
          "how long a context may stay idle (no append, no attend) before the server deletes it, "
          "unless its CreateContext set ttl_seconds");
ABSL_FLAG(int, max_contexts, 1024, "contexts held at once; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "bytes one device may hold for a running request (0: the device's free memory)");
// 4 MiB - 64 KiB: a response message is the chunk payload plus a few bytes of framing, and gRPC
// clients with default settings reject messages over 4 MiB; this leaves room for the framing.
ABSL_FLAG(int64_t, chunk_bytes, (int64_t{4} << 20) - (int64_t{64} << 10),
          "default response chunk size in bytes (4 MiB - 64 KiB: fits gRPC's default 4 MiB "
          "client receive limit with the message framing)");
ABSL_FLAG(int64_t, max_chunk_bytes, int64_t{64} << 20, "largest accepted request chunk in bytes");
// Limits against clients that hold streams open or memory up (server/README.md "Limits and
// timeouts").
ABSL_FLAG(absl::Duration, stream_idle_timeout, absl::Seconds(60),
          "end an Attend/AppendContext stream that sends nothing for this long while uploading "
          "(or owes its half-close) with DEADLINE_EXCEEDED (0: never)");
ABSL_FLAG(int64_t, min_upload_rate, 16384,
          "after --min-upload-grace, end an upload whose average rate since the call started is "
          "below this many bytes/s with DEADLINE_EXCEEDED (0: off)");
ABSL_FLAG(absl::Duration, min_upload_grace, absl::Seconds(30),
          "how long an upload may run before --min-upload-rate applies");
ABSL_FLAG(int64_t, max_upload_bytes, 0,
          "request-buffer bytes (Q/K/V, staged context rows) all calls in progress may hold "
          "together; a header that does not fit gets RESOURCE_EXHAUSTED (0: half of the host's "
          "memory)");
ABSL_FLAG(int64_t, grpc_memory_quota_bytes, 0,
          "gRPC's resource quota: bytes its transports may buffer for all connections together; "
          "past it gRPC cancels streams (RESOURCE_EXHAUSTED) until it is back under. Bounds what "
          "an oversized message costs before it is refused (0: 16 x (--max-chunk-bytes + 1 MiB), at "
          "least 1 GiB)");
ABSL_FLAG(int64_t, max_spec_entries, int64_t{1} << 22,
          "entries an Attend header's spec lists and cu_seqlens may hold together (CSR row_ptr + "
          "col_idx, ...); more get RESOURCE_EXHAUSTED before the spec is converted");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "on SIGTERM/SIGINT, how long calls in progress may take to finish");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|critical|off");
ABSL_FLAG(std::string, log_format, "text",
          "text (spdlog's [time] [level] message lines) | json (one JSON object per line: time, "
          "level, message and, on request lines, the request's fields)");
ABSL_FLAG(std::string, attention_engine, "auto",
          "CUDA backend: engine for dense/window specs: auto (cuDNN where it can run the case, "
          "else our kernels) | own (our kernels only) | cudnn (cuDNN, no fallback)");
ABSL_FLAG(std::string, engine_table, "",
          "CUDA backend: CSV of our kernel's and cuDNN's measured times per GPU model and case "
          "(bench/engine_table.py writes it); --attention-engine auto runs a case on our kernels "
          "where they were at least 3% faster. Empty: the built-in table");
ABSL_FLAG(std::string, flash_kernel, "auto",
          "CUDA backend: our flash kernel: auto (Hopper wgmma kernel on 9.x GPUs, else sm80) | "
          "sm80 | sm90");
ABSL_FLAG(int64_t, pinned_host_cap_bytes, 0,
          "CUDA backend: page-locked host memory the server may hold for request buffers and "
          "staging (0: half of the host's memory); past it buffers are pageable (slower)");
ABSL_FLAG(std::string, sm90_schedule, "persistent",
          "CUDA backend: the Hopper kernel's schedule: persistent (a grid of one or two CTAs per "
          "SM walking the work items; the only one left, kept for command lines that name it)");
ABSL_FLAG(int, lanes_per_gpu, 2,
          "CUDA backend: requests one GPU runs at once, each on its own stream so that one's "
          "copies overlap another's kernels (1: one at a time)");
// Security (server/auth/; README.md "Security").
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC port; with --tls-key turns TLS on (re-read every "
          "--tls-reload-interval)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(60),
          "how often the TLS key, certificate and client CA files are checked for changes");
ABSL_FLAG(std::string, token_file, "",
          "principals and their bearer tokens and limits, one a line: NAME TOKEN "
          "[max_request_bytes=N] [max_concurrent_streams=N] [max_resident_bytes=N]; every "
          "AttentionService call then needs 'authorization: Bearer <token>'; SIGHUP re-reads it");
ABSL_FLAG(bool, auth_discovery, false,
          "with --token-file: Describe and reflection need a token too (reflection is gated on a "
          "TLS port and turned off on a plaintext one); health stays open");
ABSL_FLAG(bool, metrics_loopback_only, false,
          "serve /metrics on 127.0.0.1 only (the port of --metrics-listen)");

namespace attnserve {
namespace {

// Writes `port` to `path` through a temporary file and a rename, so a reader never sees a
// partial number.
absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// "127.0.0.1:0" + 41234 -> "127.0.0.1:41234".
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return absl::StrCat(address, ":", port);
  return absl::StrCat(address.substr(0, colon), ":", port);
}

// The CUDA backend's choices from the flags, then the environment's overrides (read once, here:
// ATTNSERVE_ATTENTION_ENGINE, ATTNSERVE_FLASH_KERNEL, ATTNSERVE_SM90_VARIANT, ...; for A/B runs).
absl::StatusOr<CudaOptions> CudaOptionsFromFlags() {
  CudaOptions options;
  absl::StatusOr<AttentionEngine> engine =
      ParseAttentionEngine(absl::GetFlag(FLAGS_attention_engine), "--attention-engine");
  if (!engine.ok()) return engine.status();
  options.engine = *engine;
  // A table that does not parse stops the start: serving with another table than the one asked
  // for would silently change which engine runs.
  if (const std::string path = absl::GetFlag(FLAGS_engine_table); !path.empty()) {
    absl::StatusOr<EngineTable> table = EngineTable::ReadFile(path);
    if (!table.ok()) {
      return absl::Status(table.status().code(),
                          absl::StrCat("--engine-table: ", table.status().message()));
    }
    options.engine_table = std::make_shared<const EngineTable>(*std::move(table));
  }
  absl::StatusOr<FlashKernelArch> arch =
      ParseFlashKernelArch(absl::GetFlag(FLAGS_flash_kernel), "--flash-kernel");
  if (!arch.ok()) return arch.status();
  options.flash.arch = *arch;
  absl::StatusOr<Sm90Schedule> schedule =
      ParseSm90Schedule(absl::GetFlag(FLAGS_sm90_schedule), "--sm90-schedule");
  if (!schedule.ok()) return schedule.status();
  options.flash.sm90_schedule = *schedule;
  options.pinned_host_cap_bytes = absl::GetFlag(FLAGS_pinned_host_cap_bytes);
  options.lanes = absl::GetFlag(FLAGS_lanes_per_gpu);
  if (options.lanes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lanes-per-gpu: must be >= 1, got ", options.lanes));
  }
  return CudaOptionsFromEnv(options);
}

// The security flags, checked: the gRPC port's credentials, the principals (null: no token
// file) and whether reflection is served.
struct SecuritySetup {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<auth::Authenticator> authenticator;
  bool tls = false;
  bool mutual_tls = false;
  bool reflection = true;
};

absl::StatusOr<SecuritySetup> SecurityFromFlags() {
  SecuritySetup out;
  auth::ServerTlsOptions tls;
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  tls.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      auth::MakeServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  out.credentials = *credentials;
  out.tls = tls.enabled();
  out.mutual_tls = tls.mutual();
  if (absl::GetFlag(FLAGS_auth_discovery) && absl::GetFlag(FLAGS_token_file).empty()) {
    return absl::InvalidArgumentError(
        "--auth-discovery: needs --token-file (the tokens to ask for)");
  }
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    absl::StatusOr<std::unique_ptr<auth::Authenticator>> a =
        auth::Authenticator::FromFile(absl::GetFlag(FLAGS_token_file));
    if (!a.ok()) return a.status();
    out.authenticator = *std::move(a);
    spdlog::info("attnserve: {} principal(s) from --token-file={}", out.authenticator->size(),
                 out.authenticator->path());
  }
  if (out.authenticator != nullptr && absl::GetFlag(FLAGS_auth_discovery)) {
    if (out.tls) {
      // gRPC runs auth metadata processors on secure ports only.
      out.credentials->SetAuthMetadataProcessor(
          std::make_shared<auth::ReflectionGate>(out.authenticator.get()));
    } else {
      out.reflection = false;
      spdlog::warn(
          "attnserve: --auth-discovery on a plaintext port: reflection is off (it can be gated "
          "on a TLS port only)");
    }
  }
  return out;
}

int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return 0;
  return port;
}

// What the defaults expose, said once at start-up: a port others can reach without TLS, or that
// anyone can use (no client certificates, no tokens), is a warning.
void LogExposure(const std::string& grpc_address, const std::string& metrics_address,
                 const SecuritySetup& s) {
  const bool authenticated = s.mutual_tls || s.authenticator != nullptr;
  if (!auth::IsLoopbackAddress(grpc_address) && (!s.tls || !authenticated)) {
    const char* what =
        !s.tls && !authenticated ? "without TLS and without tokens: anyone who can reach the port "
                                   "can use every RPC"
        : !s.tls                 ? "without TLS: tokens and tensors cross the network in the clear"
                 : "without client certificates or tokens: anyone who can reach the port can use "
                   "every RPC";
    spdlog::warn(
        "attnserve: gRPC on {} (not loopback) {}; see README.md \"Security\" (--tls-cert, "
        "--tls-key, --tls-client-ca, --token-file)",
        grpc_address, what);
  }
  if (!metrics_address.empty() && !auth::IsLoopbackAddress(metrics_address)) {
    spdlog::info(
        "attnserve: /metrics on {} is open to anyone who can reach it (no auth; counters and "
        "device memory only, no request data); --metrics-loopback-only keeps it on this host",
        metrics_address);
  }
}

void ReloadTokens(auth::Authenticator* authenticator) {
  if (authenticator == nullptr) {
    spdlog::info("attnserve: SIGHUP: no --token-file to re-read");
    return;
  }
  if (absl::Status s = authenticator->Reload(); !s.ok()) {
    spdlog::error("attnserve: SIGHUP: {}; the tokens in force stay", std::string(s.message()));
    return;
  }
  spdlog::info("attnserve: SIGHUP: {} principal(s) from {}", authenticator->size(),
               authenticator->path());
}

// Blocks until SIGTERM or SIGINT (returned); a SIGHUP meanwhile re-reads the token file.
int WaitForStopSignal(const sigset_t& signals, auth::Authenticator* authenticator) {
  int sig = 0;
  for (;;) {
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig != SIGHUP) return sig;
    ReloadTokens(authenticator);
  }
}

// Waits for the calls in progress, up to --drain-timeout; a second SIGTERM/SIGINT cuts the wait
// short.
void DrainCalls(AttentionServiceImpl& service, const sigset_t& signals,
                auth::Authenticator* authenticator) {
  const absl::Time drain_deadline = absl::Now() + absl::GetFlag(FLAGS_drain_timeout);
  bool idle = false;
  for (;;) {
    idle = service.WaitForIdle(std::min(drain_deadline, absl::Now() + absl::Milliseconds(100)));
    if (idle || absl::Now() >= drain_deadline) break;
    const timespec zero{0, 0};
    const int more = sigtimedwait(&signals, nullptr, &zero);
    if (more == SIGHUP) ReloadTokens(authenticator);
    if (more > 0 && more != SIGHUP) {
      spdlog::warn("attnserve: second signal, stopping now");
      break;
    }
  }
  if (!idle) {
    spdlog::warn("attnserve: {} call(s) still in progress; cancelling them",
                 service.active_calls());
  }
}

// --help, -h and --helpshort: the usage message and this file's flags, spelled with dashes as
// users type them, with defaults and descriptions (absl's own help lists them with underscores).
bool HelpAsked(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpshort" ||
        arg == "-helpshort") {
      return true;
    }
  }
  return false;
}

void PrintHelp() {
  std::printf(
      "Usage: %s\n\nFlags:\n%s"
      "  --flagfile=FILE[,FILE]\n"
      "      read flags from files, one a line (--name=value, dashes or underscores; # comments)\n"
      "  --version\n"
      "      print the version and the build type\n"
      "  --helpfull\n"
      "      every flag, the libraries' too (in absl's underscore spelling)\n",
      std::string(absl::ProgramUsageMessage()).c_str(), DashedFlagsHelp("server/main.cc").c_str());
}

int Fail(const absl::Status& status) {
  spdlog::critical("attnserve: {}", status.ToString());
  std::fprintf(stderr, "attnserve: %s\n", std::string(status.message()).c_str());
  return 1;
}

// The limits against clients that hold streams or memory (server/README.md "Limits and
// timeouts"), and the process's malloc setting that goes with them.
void HostileLimitsFromFlags(ServiceOptions* o) {
  o->streams.idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  o->streams.min_upload_rate = absl::GetFlag(FLAGS_min_upload_rate);
  o->streams.min_upload_grace = absl::GetFlag(FLAGS_min_upload_grace);
  o->limits.max_spec_entries = absl::GetFlag(FLAGS_max_spec_entries);
  o->max_upload_bytes = absl::GetFlag(FLAGS_max_upload_bytes);
  if (o->max_upload_bytes == 0) {
    o->max_upload_bytes =
        static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 2;
  }
  // A fixed mmap threshold: glibc's default slides up to the largest block freed so far (32 MiB
  // at most), after which gRPC's and protobuf's multi-MiB message buffers come from malloc's
  // arenas and stay resident once freed. Fixed at 1 MiB they are mappings of their own, unmapped
  // on free (docs/DESIGN.md "Hostile streams and memory").
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
}

// gRPC 1.51 buffers a message whole before checking it against the max receive size (its
// deframer opens the flow-control window to the length prefix); the resource quota is what bounds
// the transports' buffers, so an oversized message is cut off at the quota, not at its length
// (docs/DESIGN.md "Hostile streams and memory").
absl::Status SetGrpcMemoryQuota(grpc::ServerBuilder* builder, int64_t max_message) {
  const int64_t flag = absl::GetFlag(FLAGS_grpc_memory_quota_bytes);
  if (flag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-memory-quota-bytes: must be >= 0, got ", flag));
  }
  grpc::ResourceQuota quota("attnserve");
  quota.Resize(static_cast<size_t>(
      flag > 0 ? flag : std::max<int64_t>(16 * max_message, int64_t{1} << 30)));
  builder->SetResourceQuota(quota);
  return absl::OkStatus();
}

int Main() {
  // SIGTERM/SIGINT are taken with sigwait by this thread only: block them before any other
  // thread starts so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // re-reads --token-file
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const spdlog::level::level_enum level = spdlog::level::from_str(absl::GetFlag(FLAGS_log_level));
  if (level == spdlog::level::off && absl::GetFlag(FLAGS_log_level) != "off") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--log-level: unknown level \"", absl::GetFlag(FLAGS_log_level), "\"")));
  }
  spdlog::set_level(level);
  absl::StatusOr<LogFormat> log_format = ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!log_format.ok()) return Fail(log_format.status());
  SetLogFormat(*log_format);

  DevicePoolOptions pool_options;
  absl::StatusOr<BackendChoice> backend = ParseBackendChoice(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) return Fail(backend.status());
  pool_options.backend = *backend;
  if (!absl::GetFlag(FLAGS_devices).empty()) {
    absl::StatusOr<std::vector<int>> devices = ParseDeviceList(absl::GetFlag(FLAGS_devices));
    if (!devices.ok()) return Fail(devices.status());
    pool_options.devices = *devices;
  }
  pool_options.cpu_workers = absl::GetFlag(FLAGS_cpu_workers);
  pool_options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  absl::StatusOr<CudaOptions> cuda = CudaOptionsFromFlags();
  if (!cuda.ok()) return Fail(cuda.status());
  pool_options.cuda = *cuda;
  absl::StatusOr<std::unique_ptr<DevicePool>> pool = DevicePool::Create(pool_options);
  if (!pool.ok()) return Fail(pool.status());

  MetricsOptions metrics_options;
  metrics_options.listen = absl::GetFlag(FLAGS_metrics_listen);
  if (absl::GetFlag(FLAGS_metrics_loopback_only) && !metrics_options.listen.empty()) {
    metrics_options.listen = WithPort("127.0.0.1:0", PortOf(metrics_options.listen));
  }
  absl::StatusOr<SecuritySetup> security = SecurityFromFlags();
  if (!security.ok()) return Fail(security.status());
  metrics_options.host_memory = &(*pool)->device(0).host_memory();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create(metrics_options, (*pool)->devices());
  if (!metrics.ok()) return Fail(metrics.status());

  SchedulerOptions scheduler_options;
  scheduler_options.max_queue = absl::GetFlag(FLAGS_max_queue);
  scheduler_options.cuda = pool_options.cuda;
  if (absl::GetFlag(FLAGS_max_inflight_bytes) != 0) {
    scheduler_options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  }
  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Scheduler::Create(scheduler_options, pool->get(), metrics->get(), MakeMultiDevicePlanner());
  if (!scheduler.ok()) return Fail(scheduler.status());

  ServiceOptions service_options;
  service_options.limits.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  service_options.limits.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  service_options.limits.default_response_chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  service_options.max_queue = absl::GetFlag(FLAGS_max_queue);
  service_options.max_regions = absl::GetFlag(FLAGS_max_regions);
  service_options.contexts.memory_budget_bytes = absl::GetFlag(FLAGS_context_memory_bytes);
  service_options.contexts.default_ttl = absl::GetFlag(FLAGS_context_ttl);
  service_options.contexts.max_contexts = absl::GetFlag(FLAGS_max_contexts);
  HostileLimitsFromFlags(&service_options);
  service_options.authenticator = security->authenticator.get();
  service_options.describe_needs_token =
      security->authenticator != nullptr && absl::GetFlag(FLAGS_auth_discovery);
  absl::StatusOr<std::unique_ptr<AttentionServiceImpl>> service =
      AttentionServiceImpl::Create(service_options, pool->get(), scheduler->get(), metrics->get());
  if (!service.ok()) return Fail(service.status());

  grpc::EnableDefaultHealthCheckService(true);
  if (security->reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would start and share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const std::string listen = absl::GetFlag(FLAGS_listen);
  int port = 0;
  builder.AddListeningPort(listen, security->credentials, &port);
  // A chunk message is its payload plus a few bytes of framing.
  const int64_t max_message = absl::GetFlag(FLAGS_max_chunk_bytes) + (int64_t{1} << 20);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(max_message, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(
      static_cast<int>(std::min<int64_t>(max_message, std::numeric_limits<int>::max())));
  if (absl::Status s = SetGrpcMemoryQuota(&builder, max_message); !s.ok()) return Fail(s);
  builder.RegisterService(service->get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(absl::UnavailableError(absl::StrCat("--listen=", listen, ": cannot listen")));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(true);

  const std::string bound = WithPort(listen, port);
  std::printf("attnserve: listening on %s\n", bound.c_str());
  if ((*metrics)->port()) {
    std::printf("attnserve: metrics on http://%s/metrics\n",
                WithPort(metrics_options.listen, *(*metrics)->port()).c_str());
  }
  std::fflush(stdout);
  LogExposure(bound,
              (*metrics)->port() ? WithPort(metrics_options.listen, *(*metrics)->port()) : "",
              *security);
  spdlog::info("attnserve {} serving on {} with backend {} ({} device(s): {})", ATTNSERVE_VERSION,
               bound, BackendName((*pool)->backend()), (*pool)->size(), (*pool)->device(0).name());
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    if (absl::Status s = WritePortFile(absl::GetFlag(FLAGS_port_file), port); !s.ok()) {
      server->Shutdown();
      return Fail(s);
    }
  }
  if (!absl::GetFlag(FLAGS_metrics_port_file).empty() && (*metrics)->port()) {
    if (absl::Status s = WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), *(*metrics)->port());
        !s.ok()) {
      server->Shutdown();
      return Fail(s);
    }
  }

  const int sig = WaitForStopSignal(signals, security->authenticator.get());
  spdlog::info("attnserve: signal {}: draining (up to {})", sig,
               absl::FormatDuration(absl::GetFlag(FLAGS_drain_timeout)));
  (*service)->StartDrain();
  if (health != nullptr) health->SetServingStatus(false);
  DrainCalls(**service, signals, security->authenticator.get());
  // Cancels whatever is left (their reactors see OnCancel, their jobs stop at the next poll).
  (*service)->MarkStopping();
  server->Shutdown(std::chrono::system_clock::now());
  (*scheduler)->Shutdown();
  (*service)->ReleaseRegions();
  (*service)->ReleaseContexts();
  server.reset();
  metrics->reset();
  spdlog::info("attnserve: stopped");
  return 0;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "attnserve --listen=0.0.0.0:50051 --metrics-listen=0.0.0.0:9464 --backend=auto\n"
      "The attention service (gRPC attnserve.v1.AttentionService). Flags may be spelled with "
      "dashes (--metrics-listen) or underscores (--metrics_listen). See README.md.");
  // absl's --helpshort/--helppackage list this file's flags (its default matches only files named
  // after the program); --version prints the version and the build type.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] {
    return std::string("attnserve " ATTNSERVE_VERSION " (") + ATTNSERVE_BUILD_TYPE + " build)\n";
  };
  absl::SetFlagsUsageConfig(usage);
  if (attnserve::HelpAsked(argc, argv)) {
    attnserve::PrintHelp();
    return 0;
  }
  // Flags are spelled with dashes (--metrics-listen); absl names them with underscores.
  attnserve::UnderscoredArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  return attnserve::Main();
}
