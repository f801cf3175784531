#include "core/parallel/data_parallel.h"

#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// Byte address of row (b, pos, head) of a [B, N, H, D] tensor.
std::byte* RowPtr(const HostTensor& t, int64_t b, int64_t pos, int64_t head) {
  const int64_t n = t.dim(1), h = t.dim(2), d = t.dim(3);
  return const_cast<std::byte*>(t.data()) +
         static_cast<size_t>(((b * n + pos) * h + head) * d) * DTypeSize(t.dtype());
}

// The geometry of a split over one request: units per batch item, heads per unit, row bytes.
struct ShareGeometry {
  int64_t c, g, blocks, n, d;
  size_t q_row, kv_row;
  ShareGeometry(const DataParallelSplit& split, const HostTensor& q, const HostTensor& k) {
    c = split.kv_heads_per_unit;
    g = q.dim(2) / k.dim(2);
    blocks = k.dim(2) / c;
    n = q.dim(1);
    d = q.dim(3);
    const size_t esize = DTypeSize(q.dtype());
    q_row = static_cast<size_t>(c * g * d) * esize;
    kv_row = static_cast<size_t>(c * d) * esize;
  }
};

}  // namespace

DataParallelSplit SplitDataParallel(const AttentionSpec& spec, const AttentionShape& shape,
                                    int devices) {
  DataParallelSplit split;
  const int64_t g = shape.q_heads / std::max<int64_t>(1, shape.kv_heads);
  int64_t c = 1;
  if (const auto* d = std::get_if<DilatedSpec>(&spec.pattern)) {
    c = shape.kv_heads;
    for (int64_t cand = 1; cand <= shape.kv_heads; ++cand) {
      if (shape.kv_heads % cand != 0) continue;
      bool ok = true;
      for (int64_t r : d->dilation_rates) ok = ok && r > 0 && (cand * g) % r == 0;
      if (ok) {
        c = cand;
        break;
      }
    }
  }
  split.kv_heads_per_unit = c;
  split.units = shape.batch * (shape.kv_heads / c);
  if (devices >= 1) {
    for (std::vector<TokenRange>& r :
         SplitSequence(split.units, devices, SplitKind::kContiguous, 1)) {
      split.per_device.push_back(r.front());
    }
  }
  return split;
}

absl::StatusOr<DataParallelShare> GatherShare(const DataParallelSplit& split, TokenRange units,
                                              const HostTensor& q, const HostTensor& k,
                                              const HostTensor& v, MemoryTracker* tracker,
                                              HostMemory* memory) {
  // A share copies the same token rows of q, k and v.
  if (k.dim(1) != q.dim(1)) {
    return absl::UnimplementedError(absl::StrCat("data parallel: not yet for Nq != Nkv (q ",
                                                 q.DebugString(), ", k ", k.DebugString(), ")"));
  }
  const ShareGeometry s(split, q, k);
  const int64_t U = units.size();
  DataParallelShare share;
  ATTN_ASSIGN_OR_RETURN(share.q,
                        HostTensor::Create(q.dtype(), {U, s.n, s.c * s.g, s.d}, tracker, memory));
  ATTN_ASSIGN_OR_RETURN(share.k,
                        HostTensor::Create(q.dtype(), {U, s.n, s.c, s.d}, tracker, memory));
  ATTN_ASSIGN_OR_RETURN(share.v,
                        HostTensor::Create(q.dtype(), {U, s.n, s.c, s.d}, tracker, memory));
  for (int64_t u = 0; u < U; ++u) {
    const int64_t b = (units.begin + u) / s.blocks;
    const int64_t kv0 = (units.begin + u) % s.blocks * s.c;
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t row = u * s.n + n;
      std::memcpy(share.q.data() + row * s.q_row, RowPtr(q, b, n, kv0 * s.g), s.q_row);
      std::memcpy(share.k.data() + row * s.kv_row, RowPtr(k, b, n, kv0), s.kv_row);
      std::memcpy(share.v.data() + row * s.kv_row, RowPtr(v, b, n, kv0), s.kv_row);
    }
  }
  return share;
}

absl::Status ScatterShare(TokenRange units, const AttentionOutputs& part, HostTensor& o,
                          HostTensor& lse) {
  const int64_t q_heads = o.dim(2), n_tok = o.dim(1), d = o.dim(3);
  const int64_t U = units.size();
  if (part.o.dtype() != o.dtype() || part.o.dims().size() != 4 || part.o.dim(0) != U ||
      part.o.dim(1) != n_tok || part.o.dim(3) != d ||
      part.lse.dims() != std::vector<int64_t>{U, part.o.dim(2), n_tok}) {
    return absl::InternalError(absl::StrCat("data parallel: a share returned O ",
                                            part.o.DebugString(), " and LSE ",
                                            part.lse.DebugString()));
  }
  const int64_t cg = part.o.dim(2);  // c * g query heads per unit
  const int64_t blocks = q_heads / cg;
  const size_t q_row = static_cast<size_t>(cg * d) * DTypeSize(o.dtype());
  for (int64_t u = 0; u < U; ++u) {
    const int64_t b = (units.begin + u) / blocks;
    const int64_t h0 = (units.begin + u) % blocks * cg;
    for (int64_t n = 0; n < n_tok; ++n) {
      std::memcpy(RowPtr(o, b, n, h0), part.o.data() + (u * n_tok + n) * q_row, q_row);
    }
    for (int64_t h = 0; h < cg; ++h) {
      std::memcpy(lse.data_as<float>() + (b * q_heads + h0 + h) * n_tok,
                  part.lse.data_as<float>() + (u * cg + h) * n_tok, n_tok * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionOutputs> DataParallelAttention(const AttentionSpec& spec,
                                                       const HostTensor& q, const HostTensor& k,
                                                       const HostTensor& v, int devices,
                                                       const DeviceAttentionFn& fn,
                                                       MemoryTracker* tracker) {
  if (devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data parallel: devices must be >= 1, got ", devices));
  }
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  ATTN_DCHECK_OK(ValidateSpec(spec, s));  // validated where the request entered
  if (!IsSquare(spec, s)) {
    return absl::UnimplementedError(absl::StrCat(
        "data parallel: not yet for Nq != Nkv, a query offset or packed sequences (", s.tokens,
        " queries at offset ", spec.q_offset, " against ", s.kv_len(), " keys",
        IsPacked(spec) ? ", packed" : "", "); run it on one device"));
  }
  const DataParallelSplit split = SplitDataParallel(spec, s, devices);
  ATTN_ASSIGN_OR_RETURN(HostTensor o, HostTensor::Create(q.dtype(), q.dims(), tracker));
  ATTN_ASSIGN_OR_RETURN(HostTensor lse,
                        HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens}, tracker));
  std::vector<absl::Status> status(devices);
  std::vector<std::thread> workers;
  for (int dev = 0; dev < devices; ++dev) {
    const TokenRange units = split.per_device[dev];
    if (units.size() == 0) continue;
    workers.emplace_back([&, dev, units] {
      status[dev] = [&]() -> absl::Status {
        ATTN_ASSIGN_OR_RETURN(DataParallelShare share,
                              GatherShare(split, units, q, k, v, tracker, /*memory=*/nullptr));
        ATTN_ASSIGN_OR_RETURN(AttentionOutputs part, fn(dev, spec, share.q, share.k, share.v));
        return ScatterShare(units, part, o, lse);
      }();
    });
  }
  for (std::thread& w : workers) w.join();
  for (const absl::Status& st : status) ATTN_RETURN_IF_ERROR(st);
  return AttentionOutputs{std::move(o), std::move(lse)};
}

}  // namespace attnserve
