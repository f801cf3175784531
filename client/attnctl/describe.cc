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

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

// The DescribeResponse as JSON: proto3 field names, int64 values as numbers, and the block sizes
// and head dims as ranges ({"min": 1, "max": 256}) rather than one number each.
int PrintJson(const v1::DescribeResponse& d) {
  Json limits = ProtoJson(d.limits(), /*all_primitive_fields=*/true);
  limits.Set("blockSizes", RangesJson(d.limits().block_sizes()));
  limits.Set("headDims", RangesJson(d.limits().head_dims()));
  Json json = ProtoJson(d, /*all_primitive_fields=*/true);
  json.Set("limits", std::move(limits));
  std::printf("%s\n", json.Dump(/*expand_depth=*/2).c_str());
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
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags);
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
      "DescribeResponse as JSON with proto3 field names, int64 values as numbers and the\n"
      "block sizes and head dims as ranges, [{\"min\": 1, \"max\": 256}]).\n",
      std::move(flags),
      &DescribeMain,
  };
}

}  // namespace attnserve::attnctl
