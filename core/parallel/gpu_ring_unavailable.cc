// The GPU ring in builds without CUDA and NCCL: the caches hold nothing, and a ring placement on
// such a build fails at set-up with UNIMPLEMENTED (the planner never picks it: there is no GPU).
#include "absl/status/status.h"
#include "core/parallel/gpu_ring.h"
#include "core/parallel/group_run.h"

namespace attnserve {

class NcclGroups {};
class WorkerComms {};

void NcclGroupsDeleter::operator()(NcclGroups* groups) const { delete groups; }
void WorkerCommsDeleter::operator()(WorkerComms* comms) const { delete comms; }
std::unique_ptr<NcclGroups, NcclGroupsDeleter> MakeNcclGroups() {
  return std::unique_ptr<NcclGroups, NcclGroupsDeleter>(new NcclGroups());
}
std::unique_ptr<WorkerComms, WorkerCommsDeleter> MakeWorkerComms() {
  return std::unique_ptr<WorkerComms, WorkerCommsDeleter>(new WorkerComms());
}

namespace {

class UnavailableGpuRing final : public GroupStrategy {
 public:
  absl::Status SetUp() override {
    return absl::UnimplementedError(
        "ring placement on this backend needs CUDA and NCCL (this attnserve has no GPU ring)");
  }
  absl::Status RunRank(int, Device&, WorkerComms*, RankFigures&) override {
    return absl::InternalError("GPU ring: rank started without its set-up");
  }
  absl::Status Collect(GroupResult&) override {
    return absl::InternalError("GPU ring: this build has no GPU ring");
  }
};

}  // namespace

std::unique_ptr<GroupStrategy> MakeGpuRingStrategy(AttentionRequest&, std::vector<Device*>,
                                                   const GroupEnv&) {
  return std::make_unique<UnavailableGpuRing>();
}

}  // namespace attnserve
