// The definitions behind gpu_ring.h's NcclGroups and WorkerComms, for the GPU strategies that
// run over NCCL (the GPU ring, context-parallel attends): built only with CUDA and NCCL. See
// gpu_ring.h for what they cache and why.
#ifndef ATTNSERVE_CORE_PARALLEL_NCCL_GROUPS_H_
#define ATTNSERVE_CORE_PARALLEL_NCCL_GROUPS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/engine/device.h"
#include "core/parallel/gpu_ring.h"
#include "core/parallel/nccl_communicator.h"

namespace attnserve {

class NcclGroups {
 public:
  struct Lease {
    std::shared_ptr<NcclGroup> group;
    uint64_t generation = 0;
    bool created = false;  // this call made the group
  };
  absl::StatusOr<Lease> Acquire(const std::vector<int>& ordinals) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = groups_[ordinals];
    Lease lease;
    if (e.group == nullptr || e.group->aborted()) {
      absl::StatusOr<std::shared_ptr<NcclGroup>> group =
          NcclGroup::Create(static_cast<int>(ordinals.size()));
      if (!group.ok()) {
        groups_.erase(ordinals);
        return group.status();
      }
      e.group = *std::move(group);
      e.generation = ++next_generation_;
      lease.created = true;
    }
    lease.group = e.group;
    lease.generation = e.generation;
    return lease;
  }

 private:
  struct Entry {
    std::shared_ptr<NcclGroup> group;
    uint64_t generation = 0;
  };
  std::mutex mu_;
  std::map<std::vector<int>, Entry> groups_;  // guarded by mu_; one per device set in use
  uint64_t next_generation_ = 0;              // guarded by mu_
};

class WorkerComms {
 public:
  WorkerComms() = default;
  WorkerComms(const WorkerComms&) = delete;
  WorkerComms& operator=(const WorkerComms&) = delete;
  // At worker exit. Every worker walks its map in the same (key) order and all of them exit
  // together at shutdown, so communicators of one set are destroyed at about the same time.
  ~WorkerComms() {
    for (auto& [devices, e] : by_devices_) Retire(e);
  }

  // The communicator of `rank` for `devices` in `group` (generation `generation`): the cached one
  // when it belongs to that generation, else a new one (collective with the set's other workers,
  // bounded by init_timeout). `created` tells which. A failed creation has aborted the group.
  absl::StatusOr<NcclCommunicator*> Get(const std::vector<int>& devices,
                                        const std::shared_ptr<NcclGroup>& group,
                                        uint64_t generation, int rank, const DeviceContext& ctx,
                                        absl::Duration init_timeout, bool* created) {
    *created = false;
    // A peer of this run failed already (the cached communicator is then retired below at the
    // next ring over the set).
    if (group->aborted()) return group->abort_status();
    Entry& e = by_devices_[devices];
    if (e.comm != nullptr && (e.generation != generation || e.group->aborted())) Retire(e);
    if (e.comm == nullptr) {
      NcclCommunicator::Options options;
      options.group = group;
      options.rank = rank;
      options.cuda_device = ctx.cuda_ordinal;
      options.compute_stream = ctx.stream;
      options.init_timeout = init_timeout;
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::Create(options);
      if (!comm.ok()) {
        group->Abort(comm.status());  // peers still waiting in their init stop at once
        by_devices_.erase(devices);
        return comm.status();
      }
      e.group = group;
      e.generation = generation;
      e.comm = *std::move(comm);
      *created = true;
    }
    e.comm->set_compute_stream(ctx.stream);
    return e.comm.get();
  }

 private:
  struct Entry {
    std::shared_ptr<NcclGroup> group;
    uint64_t generation = 0;
    std::unique_ptr<NcclCommunicator> comm;
  };

  // Destroys a cached communicator on this (its owning) thread. One whose group was aborted by a
  // peer is aborted on this side first (its next NCCL entry point does that), so destroying it
  // never waits for peers that have gone.
  static void Retire(Entry& e) {
    if (e.comm != nullptr && e.group != nullptr && e.group->aborted()) {
      (void)e.comm->StartSendRecv(nullptr, 0, kNoPeer, nullptr, 0, kNoPeer);
    }
    e.comm.reset();
    e.group.reset();
    e.generation = 0;
  }

  std::map<std::vector<int>, Entry> by_devices_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_NCCL_GROUPS_H_
