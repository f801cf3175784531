#include "core/cuda/run_io.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cuda/pinned_host_pool.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

std::string DimsString(const std::vector<int64_t>& dims, DType dtype) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "] ", std::string(DTypeName(dtype)));
}

absl::Status CheckView(const DeviceTensorView& t, int ordinal, const std::vector<int64_t>& dims,
                       DType dtype, const char* what) {
  if (t.cuda_ordinal != ordinal) {
    return absl::InternalError(absl::StrCat(what, ": a view on cuda:", t.cuda_ordinal,
                                            " reached a run on cuda:", ordinal));
  }
  if (t.dims != dims || t.dtype != dtype) {
    return absl::InternalError(absl::StrCat(what, ": view ", DimsString(t.dims, t.dtype),
                                            " for a tensor ", DimsString(dims, dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostTensor> HostView(HostTensor& t, const std::vector<int64_t>& dims, DType dtype,
                                    const char* what) {
  if (t.dims() != dims || t.dtype() != dtype) {
    return absl::InternalError(absl::StrCat(what, ": destination ", t.DebugString(),
                                            " for a tensor ", DimsString(dims, dtype)));
  }
  return HostTensor::Wrap(dtype, dims, t.data(), t.nbytes(), nullptr);
}

}  // namespace

int64_t CudaRunIo::host_copy_bytes() const {
  int64_t bytes = static_cast<int64_t>(host_out.o.nbytes() + host_out.lse.nbytes());
  for (const HostTensor* t : host_in) {
    if (t != nullptr) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

absl::StatusOr<CudaRunIo> ResolveCudaRunIo(int ordinal, const AttentionShape& s, DType dtype,
                                           const HostTensor& host_q, const HostTensor& host_k,
                                           const HostTensor& host_v, const DeviceIo* io,
                                           AttentionOutputs* into) {
  CudaRunIo r;
  r.shape = s;
  r.dtype = dtype;
  const std::vector<int64_t> q_dims = {s.batch, s.tokens, s.q_heads, s.head_dim};
  const std::vector<int64_t> kv_dims = {s.batch, s.kv_len(), s.kv_heads, s.head_dim};
  const std::vector<int64_t> lse_dims = {s.batch, s.q_heads, s.tokens};
  static const DeviceTensorView kNone;
  const DeviceTensorView* views[3] = {io ? &io->q : &kNone, io ? &io->k : &kNone,
                                      io ? &io->v : &kNone};
  const HostTensor* hosts[3] = {&host_q, &host_k, &host_v};
  static const char* const kNames[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const std::vector<int64_t>& dims = i == 0 ? q_dims : kv_dims;
    if (!views[i]->empty()) {
      ATTN_RETURN_IF_ERROR(CheckView(*views[i], ordinal, dims, dtype, kNames[i]));
      r.device_in[i] = views[i]->data;
    } else if (!hosts[i]->empty()) {
      if (hosts[i]->dims() != dims || hosts[i]->dtype() != dtype) {
        return absl::InternalError(absl::StrCat(kNames[i], ": host tensor ",
                                                hosts[i]->DebugString(), " for a tensor ",
                                                DimsString(dims, dtype)));
      }
      r.host_in[i] = hosts[i];
    } else {
      return absl::InternalError(absl::StrCat(kNames[i], ": no input (neither host bytes nor a "
                                              "device view)"));
    }
  }

  const bool o_in_place = io != nullptr && !io->o.empty();
  const bool lse_in_place = io != nullptr && !io->lse.empty();
  if (o_in_place) {
    ATTN_RETURN_IF_ERROR(CheckView(io->o, ordinal, q_dims, dtype, "o"));
    r.o_device = io->o.data;
  } else if (into != nullptr && !into->o.empty()) {
    ATTN_ASSIGN_OR_RETURN(r.host_out.o, HostView(into->o, q_dims, dtype, "o"));
  } else {
    ATTN_ASSIGN_OR_RETURN(r.host_out.o,
                          HostTensor::Create(dtype, q_dims, nullptr, &ProcessPinnedHostPool()));
  }
  if (lse_in_place) {
    ATTN_RETURN_IF_ERROR(CheckView(io->lse, ordinal, lse_dims, DType::kF32, "lse"));
    r.lse_device = reinterpret_cast<float*>(io->lse.data);
  } else if (into != nullptr && !into->lse.empty()) {
    ATTN_ASSIGN_OR_RETURN(r.host_out.lse, HostView(into->lse, lse_dims, DType::kF32, "lse"));
  } else if (!o_in_place) {
    // Returned with O (the response carries both; a caller that named host memory for O only
    // gets LSE back as a buffer of its own, as from Run).
    ATTN_ASSIGN_OR_RETURN(r.host_out.lse, HostTensor::Create(DType::kF32, lse_dims, nullptr,
                                                             &ProcessPinnedHostPool()));
  }
  return r;
}

}  // namespace attnserve
