// attnctl context create|append|attend|stats|list|delete: contexts, K and V the server keeps
// between requests (CreateContext, AppendContext, GetContext, ListContexts, DeleteContext; attend,
// an Attend with header.context, is in context_attend.cc). The group's command table.
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/attnctl/attend_report.h"
#include "client/attnctl/common.h"
#include "client/attnctl/context_util.h"
#include "client/attnctl/output.h"
#include "core/util/json.h"
#include "wire/convert.h"

// Shared with run and bench (problem.cc and run.cc define them).
ABSL_DECLARE_FLAG(std::string, k);
ABSL_DECLARE_FLAG(std::string, v);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, random);

ABSL_FLAG(int64_t, kv_heads, 0, "context create: K/V heads of every row (required)");
ABSL_FLAG(int64_t, head_dim, 0, "context create: head dimension D (required)");
ABSL_FLAG(int64_t, capacity, 0,
          "context create: rows reserved now; appends past them are refused (RESOURCE_EXHAUSTED). "
          "Without it the context is growable");
ABSL_FLAG(bool, growable, false,
          "context create: no fixed capacity, the server reserves as rows arrive (what a "
          "context without --capacity is)");
ABSL_FLAG(absl::Duration, ttl, absl::ZeroDuration(),
          "context create: idle time (whole seconds) after which the server deletes the context; "
          "0: the server's --context-ttl");
ABSL_FLAG(int32_t, shards, 0,
          "context create: devices to split the rows over by sequence (attends then run on all of "
          "them at once, dense and window specs only); 0: the server decides (one device when "
          "the context fits one device's share), 1: one device");
ABSL_FLAG(int64_t, expect_tokens, 0,
          "context append: refuse the append (FAILED_PRECONDITION, nothing added) unless the "
          "context holds exactly this many rows when it commits; not given: no such check");

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

std::string MiB(int64_t bytes) { return absl::StrFormat("%.2f MiB", bytes / 1048576.0); }

// A message as JSON, every field printed, int64 values as numbers (ProtoJson).
int PrintProtoJson(const google::protobuf::Message& m) {
  std::printf("%s\n", ProtoJson(m, /*all_primitive_fields=*/true).Dump(/*expand_depth=*/2).c_str());
  return kExitOk;
}

// One line, compact, for a Json report.
std::string CompactProtoJson(const google::protobuf::Message& m) {
  return ProtoJson(m, /*all_primitive_fields=*/true).Dump();
}

void PrintStatus(const v1::ContextStatus& c) {
  std::printf("context    %s on %s\n", c.name().c_str(), c.device().c_str());
  std::printf("layout     %s, kv_heads %" PRId64 ", head_dim %" PRId64 "\n",
              ShortEnumName(v1::DType_Name(c.dtype())).c_str(), c.kv_heads(), c.head_dim());
  std::printf(
      "tokens     %" PRId64 " rows, %s; %" PRId64 " rows reserved, %s of K + V\n", c.tokens(),
      c.capacity_tokens() > 0 ? absl::StrCat("capacity ", c.capacity_tokens()).c_str() : "growable",
      c.reserved_tokens(), MiB(c.bytes()).c_str());
  std::printf("ttl        %" PRId64 " s, idle %.1f s\n", c.ttl_seconds(), c.idle_seconds());
  std::printf("attends    %" PRId64 " so far, %" PRId64 " in flight\n", c.attends(), c.in_use());
}

// --- create ---

int CreateMain(const FlagSet& flags) {
  constexpr absl::string_view kCmd = "context create";
  absl::StatusOr<std::string> name = ContextName(flags);
  if (!name.ok()) return UsageError(kCmd, name.status());
  DType dtype = DType::kBF16;
  if (flags.Has("dtype")) {
    absl::StatusOr<DType> d = ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!d.ok()) {
      return UsageError(
          kCmd, absl::InvalidArgumentError(absl::StrCat("--dtype: ", d.status().message())));
    }
    dtype = *d;
  }
  if (!flags.Has("kv_heads") || !flags.Has("head_dim")) {
    return UsageError(kCmd, absl::InvalidArgumentError("--kv-heads and --head-dim are required"));
  }
  absl::StatusOr<int64_t> kv_heads = IntAtLeast(FLAGS_kv_heads, 1);
  if (!kv_heads.ok()) return UsageError(kCmd, kv_heads.status());
  absl::StatusOr<int64_t> head_dim = IntAtLeast(FLAGS_head_dim, 1);
  if (!head_dim.ok()) return UsageError(kCmd, head_dim.status());
  int64_t capacity = 0;
  if (flags.Has("capacity")) {
    if (absl::GetFlag(FLAGS_growable)) {
      return UsageError(kCmd,
                        absl::InvalidArgumentError("--capacity and --growable are exclusive"));
    }
    absl::StatusOr<int64_t> c = IntAtLeast(FLAGS_capacity, 1);
    if (!c.ok()) return UsageError(kCmd, c.status());
    capacity = *c;
  }
  const absl::Duration ttl = absl::GetFlag(FLAGS_ttl);
  if (ttl < absl::ZeroDuration() || ttl == absl::InfiniteDuration() ||
      ttl != absl::Seconds(absl::ToInt64Seconds(ttl))) {
    return UsageError(kCmd, absl::InvalidArgumentError(absl::StrCat(
                                "--ttl: expected whole seconds >= 0 such as 90s or 10m, got ",
                                absl::FormatDuration(ttl))));
  }
  const int32_t shards = absl::GetFlag(FLAGS_shards);
  if (shards < 0) {
    return UsageError(kCmd, absl::InvalidArgumentError(
                                absl::StrCat("--shards: expected a count >= 0, got ", shards)));
  }
  absl::StatusOr<ContextCall> call = StartContextCall(flags);
  if (!call.ok()) return UsageError(kCmd, call.status());
  absl::StatusOr<v1::ContextStatus> c = call->client->CreateContext(
      *name, dtype, *kv_heads, *head_dim, capacity, ttl, call->options, shards);
  if (!c.ok()) return ContextCallFailed("CreateContext", *name, c.status());
  if (absl::GetFlag(FLAGS_json)) return PrintProtoJson(*c);
  PrintStatus(*c);
  return kExitOk;
}

// --- append ---

int AppendMain(const FlagSet& flags) {
  constexpr absl::string_view kCmd = "context append";
  absl::StatusOr<std::string> name = ContextName(flags);
  if (!name.ok()) return UsageError(kCmd, name.status());
  const bool files = flags.Has("k") || flags.Has("v");
  if (files == flags.Has("random")) {
    return UsageError(kCmd, absl::InvalidArgumentError(
                                "give either --k and --v (.npy files) or --random ROWS[,SEED]"));
  }
  if (files && !(flags.Has("k") && flags.Has("v"))) {
    return UsageError(kCmd, absl::InvalidArgumentError("--k and --v go together"));
  }
  std::optional<int64_t> expect;
  if (flags.Has("expect_tokens")) {
    absl::StatusOr<int64_t> e = IntAtLeast(FLAGS_expect_tokens, 0);
    if (!e.ok()) return UsageError(kCmd, e.status());
    expect = *e;
  }
  std::optional<std::pair<int64_t, uint64_t>> random;
  if (!files) {
    auto r = CountAndSeed("random", absl::GetFlag(FLAGS_random));
    if (!r.ok()) return UsageError(kCmd, r.status());
    random = *r;
  }
  // Long appends need a long deadline: the default is run's.
  absl::StatusOr<ContextCall> call = StartContextCall(flags);
  if (!call.ok()) return UsageError(kCmd, call.status());

  // The context's dtype and row shape, to read or make rows that fit.
  absl::StatusOr<v1::ContextStatus> before = call->client->GetContext(*name, call->options);
  if (!before.ok()) return ContextCallFailed("GetContext", *name, before.status());
  absl::StatusOr<DType> dtype = DTypeFromProto(before->dtype());
  if (!dtype.ok()) return Report(kCmd, dtype.status(), kExitLocal);
  HostTensor k, v;
  std::string source;
  if (files) {
    int exit_code = kExitUsage;
    if (absl::Status s = ReadContextRows(*before, *dtype, &k, &v, &exit_code); !s.ok()) {
      return exit_code == kExitUsage ? UsageError(kCmd, s) : Report(kCmd, s, exit_code);
    }
    source = absl::StrCat(absl::GetFlag(FLAGS_k), ", ", absl::GetFlag(FLAGS_v));
  } else {
    const std::vector<int64_t> dims = {random->first, before->kv_heads(), before->head_dim()};
    absl::StatusOr<HostTensor> kr = HostTensor::Create(*dtype, dims);
    if (!kr.ok()) return Report(kCmd, kr.status(), kExitLocal);
    absl::StatusOr<HostTensor> vr = HostTensor::Create(*dtype, dims);
    if (!vr.ok()) return Report(kCmd, vr.status(), kExitLocal);
    FillUniform(*kr, random->second);
    FillUniform(*vr, random->second + 1);
    k = *std::move(kr);
    v = *std::move(vr);
    source = absl::StrCat("random, seed ", random->second);
  }
  const int64_t rows = k.rank() == 4 ? k.dim(1) : k.dim(0);
  const int64_t bytes = static_cast<int64_t>(k.nbytes() + v.nbytes());

  ProgressBar bar;
  client::CallOptions options = call->options;
  if (ProgressWanted()) options.progress = [&bar](const client::Progress& p) { bar.Update(p); };
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ContextStatus> after =
      call->client->AppendContext(*name, k, v, expect, options);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  bar.Finish();
  if (!after.ok()) return ContextCallFailed("AppendContext", *name, after.status());
  const double rows_per_s = seconds > 0 ? rows / seconds : 0;
  const double mb_per_s = seconds > 0 ? bytes / seconds / 1e6 : 0;
  if (absl::GetFlag(FLAGS_json)) {
    Json report = Json::Object();
    report.Set("context", *name)
        .Set("appended_rows", rows)
        .Set("tokens", after->tokens())
        .Set("bytes", bytes)
        .Set("seconds", seconds)
        .Set("rows_per_s", rows_per_s)
        .Set("mb_per_s", mb_per_s)
        .Set("status", Json::Raw(CompactProtoJson(*after)));
    std::printf("%s\n", report.Dump(1).c_str());
    return kExitOk;
  }
  std::printf("appended   %" PRId64 " rows (%s, %s of K + V) in %.4f s: %.0f rows/s, %.1f MB/s\n",
              rows, source.c_str(), MiB(bytes).c_str(), seconds, rows_per_s, mb_per_s);
  std::printf("context    %s now %" PRId64 " rows (%" PRId64 " reserved, %s on %s)\n",
              name->c_str(), after->tokens(), after->reserved_tokens(), MiB(after->bytes()).c_str(),
              after->device().c_str());
  return kExitOk;
}

// --- stats, list, delete ---

int StatsMain(const FlagSet& flags) {
  constexpr absl::string_view kCmd = "context stats";
  absl::StatusOr<std::string> name = ContextName(flags);
  if (!name.ok()) return UsageError(kCmd, name.status());
  absl::StatusOr<ContextCall> call = StartContextCall(flags);
  if (!call.ok()) return UsageError(kCmd, call.status());
  absl::StatusOr<v1::ContextStatus> c = call->client->GetContext(*name, call->options);
  if (!c.ok()) return ContextCallFailed("GetContext", *name, c.status());
  if (absl::GetFlag(FLAGS_json)) return PrintProtoJson(*c);
  PrintStatus(*c);
  return kExitOk;
}

int ListMain(const FlagSet& flags) {
  constexpr absl::string_view kCmd = "context list";
  absl::StatusOr<ContextCall> call = StartContextCall(flags);
  if (!call.ok()) return UsageError(kCmd, call.status());
  absl::StatusOr<v1::ListContextsResponse> list = call->client->ListContexts(call->options);
  if (!list.ok()) {
    return Report(absl::StrCat("ListContexts of ", call->client->options().target, " failed"),
                  list.status(), RpcExitCode(list.status()));
  }
  if (absl::GetFlag(FLAGS_json)) return PrintProtoJson(*list);
  if (list->contexts().empty()) {
    std::printf("no contexts\n");
    return kExitOk;
  }
  std::printf("%-24s %-6s %8s %8s %10s %10s %12s %-8s %8s %8s %6s\n", "NAME", "DTYPE", "KV_HEADS",
              "HEAD_DIM", "TOKENS", "CAPACITY", "BYTES", "DEVICE", "IDLE_S", "ATTENDS", "IN_USE");
  for (const v1::ContextStatus& c : list->contexts()) {
    std::printf("%-24s %-6s %8" PRId64 " %8" PRId64 " %10" PRId64 " %10s %12" PRId64
                " %-8s %8.1f %8" PRId64 " %6" PRId64 "\n",
                c.name().c_str(), ShortEnumName(v1::DType_Name(c.dtype())).c_str(), c.kv_heads(),
                c.head_dim(), c.tokens(),
                c.capacity_tokens() > 0 ? absl::StrCat(c.capacity_tokens()).c_str() : "growable",
                c.bytes(), c.device().c_str(), c.idle_seconds(), c.attends(), c.in_use());
  }
  return kExitOk;
}

int DeleteMain(const FlagSet& flags) {
  constexpr absl::string_view kCmd = "context delete";
  absl::StatusOr<std::string> name = ContextName(flags);
  if (!name.ok()) return UsageError(kCmd, name.status());
  absl::StatusOr<ContextCall> call = StartContextCall(flags);
  if (!call.ok()) return UsageError(kCmd, call.status());
  absl::StatusOr<v1::DeleteContextResponse> d = call->client->DeleteContext(*name, call->options);
  if (!d.ok()) return ContextCallFailed("DeleteContext", *name, d.status());
  if (absl::GetFlag(FLAGS_json)) {
    Json report = Json::Object();
    report.Set("context", *name).Set("deleted", true).Set("in_use", d->in_use());
    std::printf("%s\n", report.Dump().c_str());
    return kExitOk;
  }
  std::printf("deleted    %s%s\n", name->c_str(),
              d->in_use() > 0 ? absl::StrCat(" (", d->in_use(),
                                             " requests in flight keep its memory until they end)")
                                    .c_str()
                              : "");
  return kExitOk;
}

std::vector<FlagUse> WithConnection(absl::string_view default_timeout, std::vector<FlagUse> flags) {
  std::vector<FlagUse> all = ConnectionFlags(default_timeout);
  all.insert(all.end(), flags.begin(), flags.end());
  return all;
}

}  // namespace

std::vector<Command> ContextCommands() {
  std::vector<FlagUse> attend_flags = {{"q", "FILE"},
                                       {"random_q", "NQ[,SEED]"},
                                       {"seed", "S"},
                                       {"q_heads", "H", "--q's heads, else kv_heads"},
                                       {"q_offset", "P", "the context's last rows"},
                                       {"spec", "JSON"},
                                       {"causal", ""},
                                       {"k", "FILE"},
                                       {"v", "FILE"}};
  for (const FlagUse& use : CheckFlags()) attend_flags.push_back(use);
  for (const FlagUse& use : OutputFlags()) attend_flags.push_back(use);
  attend_flags.insert(attend_flags.end(), {{"chunk_bytes", "N"}, {"quiet", ""}});
  Command create{
      "context create",
      "context create NAME --server HOST:PORT --kv-heads H --head-dim D [--dtype bf16]\n"
      "      [--capacity ROWS | --growable] [--ttl 10m] [--shards N] [--json] [--timeout 10s]",
      "Creates an empty context: K and V rows of one dtype, kv_heads and head_dim that the\n"
      "server keeps on its devices for requests that send only Q. --capacity reserves that\n"
      "many rows at once (appends past them fail); without it the context grows as rows\n"
      "arrive. --shards N splits the rows over N devices by sequence (an attend then runs on\n"
      "all of them at once). The server deletes a context idle for longer than its --ttl.\n",
      WithConnection("10s", {{"kv_heads", "H", "-"},
                             {"head_dim", "D", "-"},
                             {"dtype", "D", "bf16"},
                             {"capacity", "ROWS", "-"},
                             {"growable", ""},
                             {"ttl", "DURATION"},
                             {"shards", "N", "0"},
                             {"json", ""}}),
      &CreateMain,
      /*operands=*/1,
  };
  Command append{
      "context append",
      "context append NAME --server HOST:PORT (--k k.npy --v v.npy | --random ROWS[,SEED])\n"
      "      [--expect-tokens N] [--json] [--chunk-bytes N] [--timeout 5m] [--quiet]",
      "Appends rows to a context, streamed in --chunk-bytes chunks: K and V from .npy files\n"
      "([T, Hkv, D] or [1, T, Hkv, D] in the context's dtype; bf16 files hold raw '<u2' bits)\n"
      "or ROWS seeded random rows. The append commits whole or not at all; --expect-tokens N\n"
      "refuses it unless the context holds exactly N rows at that moment (appending in order:\n"
      "N is the rows appended before). Prints the rows appended, the new length and the\n"
      "throughput; uploads over 64 MiB draw a progress bar when stderr is a terminal.\n",
      WithConnection("5m", {{"k", "FILE"},
                            {"v", "FILE"},
                            {"random", "ROWS[,SEED]"},
                            {"seed", "S"},
                            {"expect_tokens", "N", "-"},
                            {"json", ""},
                            {"chunk_bytes", "N"},
                            {"quiet", ""}}),
      &AppendMain,
      /*operands=*/1,
  };
  Command attend{
      "context attend",
      "context attend NAME --server HOST:PORT (--q q.npy | --random-q NQ[,SEED])\n"
      "      [--spec JSON] [--causal] [--q-heads H] [--q-offset P] [--out o.npy]\n"
      "      [--lse lse.npy] [--check --k k.npy --v v.npy [--tolerance T]] [--timeout 5m]",
      "Sends only Q ([1, Nq, Hq, D] or [Nq, Hq, D], the context's dtype; or NQ random rows\n"
      "with --q-heads heads, default the context's kv_heads) and attends to the context's\n"
      "rows. Query row i sits at --q-offset + i; by default the queries are the context's\n"
      "last rows (a decode step: --random-q 1 --causal). Prints the timings as run does.\n"
      "--check compares O and LSE with the float64 reference, which needs the context's rows:\n"
      "give them as --k and --v files (every row appended, in order, as context append took\n"
      "them); without those files --check is refused.\n",
      WithConnection("5m", std::move(attend_flags)),
      &ContextAttendMain,
      /*operands=*/1,
  };
  Command stats{
      "context stats",
      "context stats NAME --server HOST:PORT [--json] [--timeout 10s]",
      "Prints a context's rows, capacity, memory held, device, ttl, idle time and attends\n"
      "(--json: the ContextStatus in the proto3 JSON mapping).\n",
      WithConnection("10s", {{"json", ""}}),
      &StatsMain,
      /*operands=*/1,
  };
  Command list{
      "context list",
      "context list --server HOST:PORT [--json] [--timeout 10s]",
      "Lists the server's contexts, one line each (--json: ListContextsResponse).\n",
      WithConnection("10s", {{"json", ""}}),
      &ListMain,
  };
  Command del{
      "context delete",
      "context delete NAME --server HOST:PORT [--json] [--timeout 10s]",
      "Deletes a context: new requests naming it fail with NOT_FOUND at once; requests in\n"
      "flight finish on its rows and its memory goes back when the last one ends.\n",
      WithConnection("10s", {{"json", ""}}),
      &DeleteMain,
      /*operands=*/1,
  };
  std::vector<Command> commands;
  for (Command* c : {&create, &append, &attend, &stats, &list, &del}) {
    commands.push_back(std::move(*c));
  }
  return commands;
}

}  // namespace attnserve::attnctl
