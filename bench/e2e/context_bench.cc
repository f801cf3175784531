// attnbench_context: contexts through the service, as an inference engine uses them.
//
//   decode:  create a context of --context-tokens rows (appended in --append-rows pieces), then
//            --steps attends of each --q-lens query count (q_offset: the context's last rows),
//            timing each call end to end (Q up, O down) next to the server's kernel time from
//            the response header.
//   prefill: create an empty context, then for each --append-rows chunk append its K/V and
//            attend its queries (causal: the chunk's rows against every row so far), timing the
//            whole sequence; the same length as one dense causal Attend is timed too.
// Inputs are seeded random bf16. Prints a table; --json-out writes the figures.
//
//   attnbench_context --server HOST:PORT [--mode decode|prefill] [--context-tokens 1048576]
//       [--append-rows 65536] [--q-heads 32] [--kv-heads 8] [--head-dim 128]
//       [--q-lens 1,4,16] [--steps 20] [--json-out FILE]
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "bench/e2e/context_client.h"
#include "bench/harness/flags.h"
#include "bench/harness/run_record.h"
#include "client/client_security.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

ABSL_FLAG(std::string, server, "localhost:50051", "attnserve address");
ABSL_FLAG(std::string, mode, "decode", "decode | prefill");
ABSL_FLAG(int64_t, context_tokens, 1048576, "context rows (decode) or sequence length (prefill)");
ABSL_FLAG(int64_t, append_rows, 65536, "rows per AppendContext (and per prefill chunk)");
ABSL_FLAG(int64_t, q_heads, 32, "query heads");
ABSL_FLAG(int64_t, kv_heads, 8, "KV heads");
ABSL_FLAG(int64_t, head_dim, 128, "head dim");
ABSL_FLAG(std::vector<std::string>, q_lens, std::vector<std::string>({"1", "4", "16"}),
          "decode: query rows per step");
ABSL_FLAG(int, steps, 20, "decode: timed steps per query count (after 3 untimed)");
ABSL_FLAG(std::string, json_out, "", "write the figures here as JSON");
ABSL_FLAG(std::string, ca_cert, "", "TLS: the CA of the server's certificate (enables TLS)");
ABSL_FLAG(std::string, client_cert, "", "mutual TLS: this client's certificate (PEM)");
ABSL_FLAG(std::string, client_key, "", "mutual TLS: this client's key (PEM)");
ABSL_FLAG(std::string, token_file, "",
          "bearer token for a server with --token-file (else ATTNSERVE_TOKEN, else none)");

namespace attnserve {
namespace {

namespace v1 = ::attnserve::v1;
using bench::AppendRows;
using bench::CallFigures;
using bench::Median;
using bench::RandomBf16;

absl::Status Run() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Plaintext, or TLS (mutual with a client certificate) and a bearer token, as attnctl.
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!absl::GetFlag(FLAGS_ca_cert).empty()) {
    client::TlsFiles files{absl::GetFlag(FLAGS_ca_cert), absl::GetFlag(FLAGS_client_cert),
                           absl::GetFlag(FLAGS_client_key)};
    ATTN_ASSIGN_OR_RETURN(credentials, client::TlsCredentialsFromFiles(files, "--"));
  }
  ATTN_ASSIGN_OR_RETURN(const std::string token,
                        client::TokenFromFileOrEnv(absl::GetFlag(FLAGS_token_file)));
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!token.empty()) {
    interceptors.push_back(std::make_unique<client::BearerTokenInterceptorFactory>(token));
  }
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      absl::GetFlag(FLAGS_server), credentials, args, std::move(interceptors));
  auto stub = v1::AttentionService::NewStub(channel);
  const int64_t n = absl::GetFlag(FLAGS_context_tokens), rows = absl::GetFlag(FLAGS_append_rows);
  const int64_t hq = absl::GetFlag(FLAGS_q_heads), hkv = absl::GetFlag(FLAGS_kv_heads),
                d = absl::GetFlag(FLAGS_head_dim);
  const bool prefill = absl::GetFlag(FLAGS_mode) == "prefill";
  const std::string name = absl::StrCat("bench-", absl::ToUnixMicros(absl::Now()));
  {
    grpc::ClientContext ctx;
    v1::CreateContextRequest req;
    req.set_name(name);
    req.set_dtype(v1::DTYPE_BF16);
    req.set_kv_heads(hkv);
    req.set_head_dim(d);
    req.set_capacity_tokens(n);
    v1::CreateContextResponse resp;
    ATTN_RETURN_IF_ERROR(bench::FromGrpc(stub->CreateContext(&ctx, req, &resp), "CreateContext"));
  }
  v1::AttendHeader h;
  h.set_dtype(v1::DTYPE_BF16);
  h.set_batch(1);
  h.set_q_heads(hq);
  h.set_kv_heads(hkv);
  h.set_head_dim(d);
  h.mutable_spec()->mutable_dense();
  h.mutable_spec()->set_causal(true);
  Json out = Json::Object();
  out.Set("command", bench::BenchCommandLine()).Set("mode", absl::GetFlag(FLAGS_mode));
  const std::string k = RandomBf16(rows * hkv * d, 2), v = RandomBf16(rows * hkv * d, 3);
  if (!prefill) {
    const absl::Time t0 = absl::Now();
    for (int64_t at = 0; at < n; at += rows)
      ATTN_RETURN_IF_ERROR(AppendRows(*stub, name, rows, k, v));
    const double append_s = absl::ToDoubleSeconds(absl::Now() - t0);
    std::printf("context %s: %lld rows appended in %.2f s\n", name.c_str(),
                static_cast<long long>(n), append_s);
    Json steps = Json::Array();
    for (const std::string& ql : absl::GetFlag(FLAGS_q_lens)) {
      const int64_t nq = std::stoll(ql);
      const std::string q = RandomBf16(nq * hq * d, 1);
      v1::AttendHeader dh = h;
      dh.set_tokens(nq);
      dh.set_context(name);
      std::vector<double> wall, kernel, compute, receive, queue;
      for (int i = 0; i < absl::GetFlag(FLAGS_steps) + 3; ++i) {
        ATTN_ASSIGN_OR_RETURN(CallFigures f, bench::TimedAttend(*stub, dh, q, nullptr, nullptr));
        if (i >= 3) {
          wall.push_back(f.wall_s);
          kernel.push_back(f.kernel_s);
          compute.push_back(f.compute_s);
          receive.push_back(f.receive_s);
          queue.push_back(f.queue_s);
        }
      }
      // Where the time above the kernel goes: the server's receive, queue and compute (compute
      // minus kernel: plan, launches and copies), and the rest (the wire both ways, the client).
      std::printf(
          "decode Nq=%lld against %lld rows: end to end %.3f ms, kernel %.3f ms, "
          "difference %.3f ms (medians of %zu; server receive %.3f, queue %.3f, compute "
          "%.3f ms)\n",
          static_cast<long long>(nq), static_cast<long long>(n), Median(wall) * 1e3,
          Median(kernel) * 1e3, (Median(wall) - Median(kernel)) * 1e3, wall.size(),
          Median(receive) * 1e3, Median(queue) * 1e3, Median(compute) * 1e3);
      steps.Push(Json::Object()
                     .Set("q_len", nq)
                     .Set("end_to_end_s", Median(wall))
                     .Set("kernel_s", Median(kernel))
                     .Set("compute_s", Median(compute))
                     .Set("receive_s", Median(receive))
                     .Set("queue_s", Median(queue))
                     .Set("end_to_end_s_all", Json::ArrayOf(wall)));
    }
    out.Set("context_tokens", n).Set("append_s", append_s).Set("decode", steps);
  } else {
    const std::string q = RandomBf16(rows * hq * d, 1);
    double kernels = 0;
    const absl::Time t0 = absl::Now();
    for (int64_t at = 0; at < n; at += rows) {
      ATTN_RETURN_IF_ERROR(AppendRows(*stub, name, rows, k, v));
      v1::AttendHeader ch = h;
      ch.set_tokens(rows);
      ch.set_context(name);
      ATTN_ASSIGN_OR_RETURN(CallFigures f, bench::TimedAttend(*stub, ch, q, nullptr, nullptr));
      kernels += f.kernel_s;
    }
    const double chunked_s = absl::ToDoubleSeconds(absl::Now() - t0);
    std::printf(
        "chunked prefill of %lld rows in %lld-row chunks: %.2f s end to end, kernels "
        "%.3f s\n",
        static_cast<long long>(n), static_cast<long long>(rows), chunked_s, kernels);
    out.Set("tokens", n)
        .Set("chunk", rows)
        .Set("chunked_s", chunked_s)
        .Set("chunked_kernel_s", kernels);
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteContextRequest req;
    req.set_name(name);
    v1::DeleteContextResponse resp;
    ATTN_RETURN_IF_ERROR(bench::FromGrpc(stub->DeleteContext(&ctx, req, &resp), "DeleteContext"));
  }
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    ATTN_RETURN_IF_ERROR(bench::WriteJsonOut(absl::GetFlag(FLAGS_json_out), out));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv, "attnbench_context: contexts through the service",
                                     "attnbench_context", &attnserve::Run);
}
