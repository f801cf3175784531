#include "client/attnctl/regions.h"

#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

ABSL_FLAG(bool, shm, false,
          "same host as the server: pass Q/K/V and O/LSE through one POSIX shared memory region "
          "instead of gRPC");
ABSL_FLAG(bool, cuda_ipc, false,
          "same host and GPU as the server: pass them through CUDA IPC device memory (attnctl "
          "built with CUDA)");
ABSL_FLAG(int64_t, cuda_device, 0, "--cuda-ipc: the CUDA device holding the buffer");

namespace attnserve::attnctl {

std::vector<FlagUse> RegionFlags() { return {{"shm", ""}, {"cuda_ipc", ""}, {"cuda_device", "N"}}; }

absl::StatusOr<RegionMode> RegionModeFromFlags() {
  const bool shm = absl::GetFlag(FLAGS_shm);
  const bool ipc = absl::GetFlag(FLAGS_cuda_ipc);
  if (shm && ipc) return absl::InvalidArgumentError("--shm and --cuda-ipc exclude each other");
  return shm ? RegionMode::kShm : ipc ? RegionMode::kCudaIpc : RegionMode::kNone;
}

absl::StatusOr<std::unique_ptr<RegionSession>> RegionSession::Start(client::AttnClient& client,
                                                                    const Problem& problem,
                                                                    RegionMode mode, int device) {
  const absl::Time start = absl::Now();
  std::unique_ptr<RegionSession> s(new RegionSession(client, problem));
  s->q_bytes_ = static_cast<int64_t>(problem.q.nbytes());
  s->kv_bytes_ = static_cast<int64_t>(problem.k.nbytes());
  s->lse_bytes_ = problem.q.dim(0) * problem.q.dim(1) * problem.q.dim(2) * 4;
  s->k_ = client::AlignRegionOffset(s->q_ + s->q_bytes_);
  s->v_ = client::AlignRegionOffset(s->k_ + s->kv_bytes_);
  s->o_ = client::AlignRegionOffset(s->v_ + s->kv_bytes_);
  s->lse_ = client::AlignRegionOffset(s->o_ + s->q_bytes_);
  s->total_ = s->lse_ + s->lse_bytes_;
  static int counter = 0;
  s->name_ = absl::StrCat("attnctl_", getpid(), "_", counter++);
  if (mode == RegionMode::kShm) {
    absl::StatusOr<std::unique_ptr<client::SharedMemoryRegion>> shm =
        client::SharedMemoryRegion::Create(s->total_);
    if (!shm.ok()) return shm.status();
    s->shm_ = *std::move(shm);
  } else {
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer = AllocateDeviceBuffer(device, s->total_);
    if (!buffer.ok()) return buffer.status();
    s->device_ = *std::move(buffer);
  }
  for (auto [offset, t] : {std::pair{s->q_, &problem.q}, std::pair{s->k_, &problem.k},
                           std::pair{s->v_, &problem.v}}) {
    if (absl::Status st = s->CopyIn(offset, t->data(), t->nbytes()); !st.ok()) return st;
  }
  // Outputs poisoned (NaN) so a slot the server never wrote fails --check.
  std::string poison(static_cast<size_t>(s->total_ - s->o_), '\xff');
  if (absl::Status st = s->CopyIn(s->o_, poison.data(), poison.size()); !st.ok()) return st;
  absl::StatusOr<v1::RegionStatus> reg =
      s->shm_ ? client.RegisterSystemRegion(s->name_, s->shm_->key(), 0, s->total_)
              : client.RegisterCudaIpcRegion(s->name_, s->device_->ipc_handle(), device,
                                             s->total_);
  if (!reg.ok()) return reg.status();
  s->registered_ = true;
  s->setup_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
  return s;
}

RegionSession::~RegionSession() {
  if (registered_) (void)client_.UnregisterRegion(name_);
}

absl::Status RegionSession::CopyIn(int64_t offset, const void* src, int64_t n) {
  if (shm_) {
    std::memcpy(shm_->data() + offset, src, static_cast<size_t>(n));
    return absl::OkStatus();
  }
  return device_->CopyIn(offset, src, n);
}

absl::Status RegionSession::CopyOut(int64_t offset, void* dst, int64_t n) const {
  if (shm_) {
    std::memcpy(dst, shm_->data() + offset, static_cast<size_t>(n));
    return absl::OkStatus();
  }
  return device_->CopyOut(offset, dst, n);
}

void RegionSession::Apply(client::AttendInput* input) const {
  input->q = input->k = input->v = nullptr;
  input->shape = AttentionShape{problem_.q.dim(0), problem_.q.dim(1), problem_.q.dim(2),
                                problem_.k.dim(2), problem_.q.dim(3), problem_.k.dim(1)};
  input->dtype = problem_.q.dtype();
  input->q_region = client::TensorRegion{name_, q_, q_bytes_};
  input->k_region = client::TensorRegion{name_, k_, kv_bytes_};
  input->v_region = client::TensorRegion{name_, v_, kv_bytes_};
  input->o_region = client::TensorRegion{name_, o_, q_bytes_};
  if (input->return_lse) {
    input->lse_region = client::TensorRegion{name_, lse_, lse_bytes_};
  } else {
    input->lse_region.reset();
  }
}

absl::Status RegionSession::ReadOutputs(client::AttendResult* result) const {
  absl::StatusOr<HostTensor> o = HostTensor::Create(problem_.q.dtype(), problem_.q.dims());
  if (!o.ok()) return o.status();
  if (absl::Status s = CopyOut(o_, o->data(), q_bytes_); !s.ok()) return s;
  result->o = *std::move(o);
  absl::StatusOr<HostTensor> lse =
      HostTensor::Create(DType::kF32, {problem_.q.dim(0), problem_.q.dim(2), problem_.q.dim(1)});
  if (!lse.ok()) return lse.status();
  if (absl::Status s = CopyOut(lse_, lse->data(), lse_bytes_); !s.ok()) return s;
  result->lse = *std::move(lse);
  return absl::OkStatus();
}

std::string RegionSession::Description() const {
  return absl::StrFormat("%s %s, region '%s' of %.1f MiB, set up in %.4f s",
                         shm_ ? "shm" : "cuda-ipc", shm_ ? shm_->key() : "device buffer", name_,
                         total_ / 1048576.0, setup_seconds_);
}

}  // namespace attnserve::attnctl
