// The lanes of a CudaDevice (core/cuda/cuda_device.cc): the run slots of one GPU. Each lane owns a
// non-blocking stream, the timing events of its runs and (cuDNN builds) its own cuDNN engine, so
// up to lanes() requests run at once and one's host copies overlap another's kernels (the GPU's
// H2D and D2H copy engines and its SMs work in parallel). Device::Run holds one lane for its whole
// duration; Device::RunTask holds all of them. Header-only; used by cuda_device.cc alone.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_LANES_H_
#define ATTNSERVE_CORE_CUDA_CUDA_LANES_H_

#include <cuda_runtime.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/host_copy.h"
#include "core/util/status_macros.h"

#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve {

// One lane. Only the thread holding it touches its members.
struct CudaLane {
  int index = 0;
  cudaStream_t stream = nullptr;  // non-blocking, one per lane
  RunEvents events;               // timing of a run's copies and kernels
  // Blocks the lane's cuDNN engine freed right after enqueueing (its workspace): they go back to
  // the allocator only once the lane's stream is idle (FreeDeferred), since the allocator is
  // shared by the lanes and another lane could otherwise get a block still in use.
  std::vector<void*> deferred_frees;
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  std::unique_ptr<CudnnSdpa> cudnn;  // created on first use by the lane; destroyed before alloc
  absl::Status cudnn_status;         // why cudnn could not be created (OK: not tried or fine)
#endif
};

// What one run holds on the device. Kept until the lane's stream is idle, so that a block goes
// back to the shared caching allocator only when no queued work of this lane uses it (the plan
// keeps its workspaces for as long as it lives).
struct CudaRunHold {
  std::unique_ptr<CudaAttentionPlan> plan;
  DeviceBuffer q, k, v, o, lse;
  std::vector<DeviceBuffer> extra;  // the cuDNN path's bf16 copies of f32 tensors
};

class CudaLanes {
 public:
  explicit CudaLanes(CachingAllocator& alloc) : alloc_(alloc) {}
  ~CudaLanes() { Destroy(); }
  CudaLanes(const CudaLanes&) = delete;
  CudaLanes& operator=(const CudaLanes&) = delete;

  // Creates `count` lanes on the calling thread's current device.
  absl::Status Init(int count) {
    for (int i = 0; i < count; ++i) {
      auto lane = std::make_unique<CudaLane>();
      lane->index = i;
      CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
      ATTN_RETURN_IF_ERROR(lane->events.Init());
      lanes_.push_back(std::move(lane));
    }
    // Popped from the back: lane 0 is taken first.
    for (int i = count - 1; i >= 0; --i) free_.push_back(lanes_[i].get());
    return absl::OkStatus();
  }
  // Synchronizes and destroys every lane (its cuDNN engine first). The caller has made the
  // device current. Idempotent.
  void Destroy() {
    for (auto& lane : lanes_) {
      if (lane->stream != nullptr) cudaStreamSynchronize(lane->stream);
      FreeDeferred(*lane);
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
      lane->cudnn.reset();  // before the stream it was last bound to
#endif
      if (lane->stream != nullptr) cudaStreamDestroy(lane->stream);
    }
    lanes_.clear();
    free_.clear();
  }

  int size() const { return static_cast<int>(lanes_.size()); }

  // A free lane (all = false), or every lane (all = true; lane 0 is returned), waiting until they
  // are free. Release gives back what Acquire took.
  CudaLane& Acquire(bool all) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return all ? free_.size() == lanes_.size() : !free_.empty(); });
    if (all) {
      free_.clear();
      return *lanes_.front();
    }
    CudaLane* lane = free_.back();
    free_.pop_back();
    return *lane;
  }
  void Release(CudaLane& lane, bool all) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (all) {
        for (size_t i = lanes_.size(); i-- > 0;) free_.push_back(lanes_[i].get());
      } else {
        free_.push_back(&lane);
      }
    }
    cv_.notify_all();
  }

  // Once the lane's stream is idle: its deferred blocks back to the allocator.
  void FreeDeferred(CudaLane& lane) {
    for (void* p : lane.deferred_frees) alloc_.Free(p);
    lane.deferred_frees.clear();
  }

 private:
  CachingAllocator& alloc_;
  std::vector<std::unique_ptr<CudaLane>> lanes_;  // fixed after Init
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<CudaLane*> free_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_LANES_H_
