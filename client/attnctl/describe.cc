// attnctl describe: the server's devices, backends, limits and supported specs.
#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/attnctl/common.h"
#include "client/attnctl/output.h"
#include "google/protobuf/util/json_util.h"

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

int PrintJson(const v1::DescribeResponse& d) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(d, &json, options).ok()) {
    return Report("describe", absl::InternalError("could not print the response as JSON"),
                  kExitLocal);
  }
  std::printf("%s", json.c_str());
  if (json.empty() || json.back() != '\n') std::printf("\n");
  return kExitOk;
}

void PrintText(const std::string& target, const v1::DescribeResponse& d) {
  std::printf("server      %s\n", target.c_str());
  std::printf("version     %s\n", d.version().c_str());
  std::printf("backend     %s\n", d.backend().c_str());
  std::printf("devices     %d\n", d.devices_size());
  for (const v1::DeviceInfo& dev : d.devices()) {
    std::printf("  %-8s %s%s, memory %.2f GiB total, %.2f GiB free\n", dev.name().c_str(),
                dev.model().c_str(), dev.uuid().empty() ? "" : (" (" + dev.uuid() + ")").c_str(),
                dev.memory_total_bytes() / 1073741824.0, dev.memory_free_bytes() / 1073741824.0);
  }
  const v1::Limits& l = d.limits();
  std::printf("limits      max request %" PRId64 " bytes, max queue %" PRId64 ", chunk %" PRId64
              " bytes (max %" PRId64 ")\n",
              l.max_request_bytes(), l.max_queue(), l.chunk_bytes(), l.max_chunk_bytes());
  std::printf("            block sizes [%s], head dims [%s]\n",
              CompactList(l.block_sizes()).c_str(), CompactList(l.head_dims()).c_str());
  std::printf("patterns    %s\n", absl::StrJoin(d.patterns(), ", ").c_str());
  std::printf("generators  %s\n", absl::StrJoin(d.generators(), ", ").c_str());
  std::printf("dtypes      %s\n", absl::StrJoin(d.dtypes(), ", ").c_str());
  std::printf("placements  %s\n", absl::StrJoin(d.placements(), ", ").c_str());
  if (!d.notes().empty()) std::printf("notes       %s\n", d.notes().c_str());
}

int DescribeMain(const FlagSet& flags) {
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags, absl::Seconds(10));
  if (!timeout.ok()) return UsageError("describe", timeout.status());
  absl::StatusOr<std::unique_ptr<client::AttnClient>> client = ClientFromFlags();
  if (!client.ok()) return UsageError("describe", client.status());
  client::CallOptions call;
  call.timeout = *timeout;
  const std::string& target = (*client)->options().target;
  absl::StatusOr<v1::DescribeResponse> d = (*client)->Describe(call);
  if (!d.ok()) {
    return Report(absl::StrCat("Describe of ", target, " failed"), d.status(),
                  RpcExitCode(d.status()));
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*d);
  PrintText(target, *d);
  return kExitOk;
}

}  // namespace

Command DescribeCommand() {
  std::vector<FlagUse> flags = ConnectionFlags(/*default_timeout_text=*/"10s");
  flags.push_back({"json", ""});
  return Command{
      "describe",
      "describe --server HOST:PORT [--json] [--timeout 10s] [--max-attempts N]",
      "Prints the server's devices, backends, limits and supported specs (--json: the\n"
      "DescribeResponse in the proto3 JSON mapping).\n",
      std::move(flags),
      &DescribeMain,
  };
}

}  // namespace attnserve::attnctl
