#include "client/attnctl/context_util.h"

#include <cstring>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/attnctl/common.h"
#include "core/tensor/npy.h"

// Shared with run (run.cc and problem.cc define them).
ABSL_DECLARE_FLAG(std::string, k);
ABSL_DECLARE_FLAG(std::string, v);
ABSL_DECLARE_FLAG(int64_t, seed);

namespace attnserve::attnctl {

absl::StatusOr<ContextCall> StartContextCall(const FlagSet& flags) {
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags);
  if (!timeout.ok()) return timeout.status();
  absl::StatusOr<std::unique_ptr<client::AttnClient>> client = ClientFromFlags();
  if (!client.ok()) return client.status();
  ContextCall call;
  call.client = *std::move(client);
  call.options.timeout = *timeout;
  return call;
}

absl::StatusOr<std::string> ContextName(const FlagSet& flags) {
  if (flags.operands().empty()) return absl::InvalidArgumentError("give the context's NAME");
  return flags.operands()[0];
}

int ContextCallFailed(absl::string_view what, const std::string& name, const absl::Status& status) {
  return Report(absl::StrCat(what, " of context '", name, "' failed"), status, RpcExitCode(status));
}

absl::StatusOr<std::pair<int64_t, uint64_t>> CountAndSeed(absl::string_view flag,
                                                          const std::string& text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  int64_t n = 0;
  int64_t seed = absl::GetFlag(FLAGS_seed);
  const bool ok = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &n) && n >= 1 &&
                  (parts.size() == 1 || (absl::SimpleAtoi(parts[1], &seed) && seed >= 0));
  if (!ok || seed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag,
                     ": expected a positive count and an optional seed >= 0, e.g. 128 or 128,7; "
                     "got '",
                     text, "'"));
  }
  return std::pair<int64_t, uint64_t>{n, static_cast<uint64_t>(seed)};
}

absl::StatusOr<HostTensor> BatchOfOne(absl::string_view flag, HostTensor t,
                                      absl::string_view expected) {
  if (t.rank() == 4 && t.dim(0) == 1) return t;
  if (t.rank() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": expected ", expected, ", got ", t.DebugString()));
  }
  absl::StatusOr<HostTensor> out = HostTensor::Create(t.dtype(), {1, t.dim(0), t.dim(1), t.dim(2)});
  if (!out.ok()) return out.status();
  std::memcpy(out->data(), t.data(), t.nbytes());
  return out;
}

absl::Status ReadContextRows(const v1::ContextStatus& c, DType dtype, HostTensor* k, HostTensor* v,
                             int* exit_code) {
  const std::pair<const char*, std::string> files[] = {{"k", absl::GetFlag(FLAGS_k)},
                                                       {"v", absl::GetFlag(FLAGS_v)}};
  HostTensor* outs[] = {k, v};
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<HostTensor> t = ReadNpy(files[i].second, dtype);
    if (!t.ok()) {
      *exit_code = kExitLocal;
      return absl::Status(t.status().code(),
                          absl::StrCat("--", files[i].first, ": ", t.status().message()));
    }
    *exit_code = kExitUsage;
    absl::StatusOr<HostTensor> rows =
        BatchOfOne(files[i].first, *std::move(t), "[T, Hkv, D] or [1, T, Hkv, D]");
    if (!rows.ok()) return rows.status();
    if (rows->dim(2) != c.kv_heads() || rows->dim(3) != c.head_dim()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", files[i].first, ": ", rows->DebugString(), " does not fit context '",
                       c.name(), "' (kv_heads ", c.kv_heads(), ", head_dim ", c.head_dim(), ")"));
    }
    *outs[i] = *std::move(rows);
  }
  if (k->dims() != v->dims()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--k and --v differ: ", k->DebugString(), " and ", v->DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::attnctl
