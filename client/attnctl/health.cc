// attnctl health: grpc.health.v1.Health/Check; exit 0 when SERVING.
#include <cstdio>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/attnctl/common.h"

ABSL_FLAG(std::string, service, "", "the service to ask about (\"\": the whole server)");

namespace attnserve::attnctl {
namespace {

int HealthMain(const FlagSet& flags) {
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags);
  if (!timeout.ok()) return UsageError("health", timeout.status());
  absl::StatusOr<std::unique_ptr<client::AttnClient>> client = ClientFromFlags();
  if (!client.ok()) return UsageError("health", client.status());
  client::CallOptions call;
  call.timeout = *timeout;
  const std::string service = absl::GetFlag(FLAGS_service);
  const std::string& target = (*client)->options().target;
  absl::StatusOr<client::ServingStatus> status = (*client)->HealthCheck(call, service);
  if (!status.ok()) {
    return Report(absl::StrCat("health check of ", target, " failed"), status.status(),
                  RpcExitCode(status.status()));
  }
  std::printf("%s: %s\n", service.empty() ? target.c_str() : service.c_str(),
              std::string(client::ServingStatusName(*status)).c_str());
  return *status == client::ServingStatus::kServing ? kExitOk : kExitNotServing;
}

}  // namespace

Command HealthCommand() {
  std::vector<FlagUse> flags = ConnectionFlags(/*default_timeout_text=*/"5s");
  flags.push_back({"service", "NAME"});
  return Command{
      "health",
      "health --server HOST:PORT [--service NAME] [--timeout 5s] [--max-attempts N]",
      "Calls grpc.health.v1.Health/Check; exit 0 when SERVING, 4 when the server answers\n"
      "with another status.\n",
      std::move(flags),
      &HealthMain,
  };
}

}  // namespace attnserve::attnctl
