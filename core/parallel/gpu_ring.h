// The GPU ring's long-lived state, kept between requests: the NCCL group of each ordered GPU
// device set (shared by the scheduler's workers) and each worker's cached communicators.
//
// NcclGroups: one group (unique id + generation) per ordered set of CUDA ordinals. The first ring
// over a set makes its group; later rings over the same set get the same group and generation
// while it is healthy, so every worker reuses the communicator it cached for that generation. Once
// a run aborted it (failure, cancel, timeout, a peer that never joined), the next ring over the set
// gets a fresh group with a new generation, and each worker drops its old communicator and joins
// the new one. A run takes its group once, at set-up, so all its ranks use the same generation.
//
// WorkerComms: one worker's NCCL communicators by device set, created on that worker's thread
// (bound to its GPU, on its stream), reused by later rings over the same set and generation, and
// destroyed on the same thread. Only that worker touches it.
//
// In builds without CUDA and NCCL both exist but hold nothing (gpu_ring_unavailable.cc), and the GPU
// ring strategy's set-up answers UNIMPLEMENTED.
#ifndef ATTNSERVE_CORE_PARALLEL_GPU_RING_H_
#define ATTNSERVE_CORE_PARALLEL_GPU_RING_H_

#include <memory>

namespace attnserve {

class NcclGroups;
class WorkerComms;

struct NcclGroupsDeleter {
  void operator()(NcclGroups* groups) const;
};
struct WorkerCommsDeleter {
  void operator()(WorkerComms* comms) const;
};

std::unique_ptr<NcclGroups, NcclGroupsDeleter> MakeNcclGroups();
// Destroy it on the worker thread that used it (it holds that worker's communicators).
std::unique_ptr<WorkerComms, WorkerCommsDeleter> MakeWorkerComms();

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_GPU_RING_H_
