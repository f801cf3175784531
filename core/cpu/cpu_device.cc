#include "core/cpu/cpu_device.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/cpu/cpu_backend.h"
#include "core/spec/pattern_compiler.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"
#include "core/util/thread_pool.h"

namespace attnserve {
namespace {

// Reads "Key:   123 kB" from /proc/meminfo, in bytes; nullopt when absent.
std::optional<int64_t> MemInfoBytes(absl::string_view key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, key) || !absl::ConsumePrefix(&rest, ":")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    rest = absl::StripAsciiWhitespace(rest);
    int64_t kib = 0;
    if (absl::SimpleAtoi(rest, &kib)) return kib * 1024;
  }
  return std::nullopt;
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "model name")) continue;
    const size_t colon = rest.find(':');
    if (colon == absl::string_view::npos) continue;
    return std::string(absl::StripAsciiWhitespace(rest.substr(colon + 1)));
  }
  return "cpu";
}

// Saturating sum of products, for estimates of absurd shapes (those are rejected elsewhere, but an
// estimate must never wrap around to a small number).
int64_t Saturate(absl::int128 v) {
  const absl::int128 max = std::numeric_limits<int64_t>::max();
  return v > max ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}

// Admitted (query, key) pairs per (batch, head) of a compiled pattern, summed over heads, and the
// fraction of (query block, key block) pairs skipped. For dilated specs the pairs are counted per
// branch segment and the sparsity is the token-pair fraction skipped (the branches do not share
// one block grid).
struct PatternFigures {
  double pairs_all_heads = 0;  // sum over q heads of admitted pairs (one batch element)
  double sparsity = 0;
};

PatternFigures Figures(const AttentionSpec& spec, const CompiledPattern& compiled,
                       const AttentionShape& shape) {
  PatternFigures f;
  if (!compiled.dilated) {
    f.pairs_all_heads =
        static_cast<double>(compiled.layout.AdmittedPairs()) * static_cast<double>(shape.q_heads);
    f.sparsity = compiled.layout.sparsity();
    return f;
  }
  double pairs = 0;
  for (const DilatedBranch& branch : compiled.dilated->branches) {
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      if (branch.groups.empty()) break;
      const DilatedGroup& group =
          branch.groups[static_cast<size_t>(h % static_cast<int64_t>(branch.groups.size()))];
      for (size_t t = 0; t + 1 < group.seg_start.size(); ++t) {
        const double len = static_cast<double>(group.seg_start[t + 1] - group.seg_start[t]);
        pairs += spec.causal ? len * (len + 1) / 2 : len * len;
      }
    }
  }
  f.pairs_all_heads = pairs;
  const double n = static_cast<double>(shape.tokens);
  const double full = n * n * static_cast<double>(shape.q_heads);
  f.sparsity = full > 0 ? std::clamp(1.0 - pairs / full, 0.0, 1.0) : 0.0;
  return f;
}

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, int threads)
      : index_(index),
        pool_(threads),
        model_(CpuModelName()),
        total_bytes_(MemInfoBytes("MemTotal").value_or(0)) {}

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string name() const override { return absl::StrCat("cpu:", index_); }
  std::string uuid() const override { return absl::StrCat("cpu-", index_); }
  std::string model() const override { return model_; }
  bool HeadDimSupported(int64_t head_dim) const override {
    return CpuSupportsHeadDim(head_dim);
  }

  DeviceStats Stats() const override {
    DeviceStats s;
    s.memory_used_bytes = tracker_.in_use_bytes();
    s.memory_reserved_bytes = s.memory_used_bytes;
    s.memory_peak_bytes = tracker_.peak_bytes();
    s.memory_total_bytes = total_bytes_;
    s.memory_free_bytes = MemInfoBytes("MemAvailable").value_or(0);
    return s;
  }

  HostMemory& host_memory() override { return host_memory_; }

  // Inputs (q, k, v in their dtype, held while the run is on this device), outputs (O in the
  // dtype, LSE f32) and workspaces: f32 copies of q, k and v and an f32 O accumulator with its
  // row statistics. Dilated specs also hold one f32 partial (O and LSE) per branch being merged,
  // gathered f32 copies of q/k/v, and O(N) gather plans per head offset.
  int64_t EstimateBytes(const AttentionSpec& spec, const AttentionShape& shape,
                        DType dtype) const override {
    const absl::int128 elem = DTypeSize(dtype);
    const absl::int128 tokens = absl::int128(shape.batch) * shape.tokens;
    const absl::int128 q = tokens * shape.q_heads * shape.head_dim;
    const absl::int128 kv = absl::int128(shape.batch) * shape.kv_len() * shape.kv_heads *
                            shape.head_dim;
    const absl::int128 rows = tokens * shape.q_heads;  // LSE entries
    absl::int128 bytes = (q + 2 * kv) * elem;          // inputs
    bytes += q * elem + rows * 4;                      // outputs
    bytes += (q + 2 * kv) * 4;                         // f32 copies of the inputs
    bytes += q * 4 + rows * 8;                         // f32 O accumulator, running max and sum
    if (const auto* dilated = std::get_if<DilatedSpec>(&spec.pattern)) {
      bytes += q * 4 + rows * 4;  // one branch partial being merged
      bytes += (q + 2 * kv) * 4;  // gathered copies
      const absl::int128 branches = dilated->segment_lengths.size();
      bytes += branches * std::min<int64_t>(shape.q_heads, 64) * shape.tokens * 8 * 2;
    }
    bytes += 1 << 20;  // layouts (O(blocks + kept blocks)) and per-thread tile scratch
    return Saturate(bytes);
  }

  absl::StatusOr<AttentionOutputs> Run(const AttentionSpec& spec, const HostTensor& q,
                                       const HostTensor& k, const HostTensor& v,
                                       const RunControl& control, RunInfo* info) override {
    const absl::Time start = absl::Now();
    if (control.cancel != nullptr && control.cancel->load()) {
      return absl::CancelledError("cancelled before the run started");
    }
    if (start >= control.deadline) {
      return absl::DeadlineExceededError("deadline passed before the run started");
    }
    ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
    ATTN_DCHECK_OK(ValidateSpec(spec, shape));  // validated where the request entered

    // The inputs are host buffers this device reads for the whole run: charge them here so the
    // device's memory figure covers everything the run holds.
    const int64_t input_bytes = static_cast<int64_t>(q.nbytes() + k.nbytes() + v.nbytes());
    tracker_.Allocate(input_bytes);
    struct Release {
      MemoryTracker* tracker;
      int64_t bytes;
      ~Release() { tracker->Free(bytes); }
    } release{&tracker_, input_bytes};

    CpuRunOptions options;
    options.pool = &pool_;
    options.tracker = &tracker_;
    options.cancel = control.cancel;
    PatternFigures figures;
    absl::StatusOr<AttentionOutputs> out;
    if (IsSquare(spec, shape)) {
      ATTN_ASSIGN_OR_RETURN(CompiledPattern compiled, CompileValidatedPattern(
                                                          spec, shape.tokens, shape.q_heads,
                                                          options.compile));
      figures = Figures(spec, compiled, shape);
      out = CpuAttentionCompiled(spec, compiled, q, k, v, options);
    } else {
      // A query offset, Nq != Nkv or packed sequences: one rectangular problem per sequence.
      CpuRectFigures rect;
      out = CpuAttentionRect(spec, q, k, v, options, &rect);
      figures.pairs_all_heads = rect.admitted_pairs / static_cast<double>(shape.batch);
      figures.sparsity = rect.possible_pairs > 0
                             ? std::clamp(1.0 - rect.admitted_pairs / rect.possible_pairs, 0.0, 1.0)
                             : 0.0;
    }
    const absl::Time end = absl::Now();
    if (!out.ok() && absl::IsCancelled(out.status()) && end >= control.deadline) {
      return absl::DeadlineExceededError("deadline passed while running");
    }
    if (info != nullptr) {
      info->compute_seconds = absl::ToDoubleSeconds(end - start);
      info->kernel_seconds = info->compute_seconds;  // no copies: the run is the kernel
      info->flops = 4.0 * static_cast<double>(shape.batch) * static_cast<double>(shape.head_dim) *
                    figures.pairs_all_heads;
      info->sparsity = figures.sparsity;
    }
    return out;
  }

  // Host memory charged to this device's tracker while it lives.
  absl::StatusOr<std::unique_ptr<ResidentMemory>> AllocateResident(int64_t bytes) override {
    class HostResident final : public ResidentMemory {
     public:
      HostResident(int64_t bytes, HostTensor t) : ResidentMemory(bytes), t_(std::move(t)) {}
      absl::Status Write(int64_t offset, const void* src, int64_t n) override {
        std::memcpy(t_.data() + offset, src, static_cast<size_t>(n));
        return absl::OkStatus();
      }
      absl::Status CopyFrom(ResidentMemory& from, int64_t n) override {
        if (from.host_data() == nullptr) {
          return absl::InvalidArgumentError("CopyFrom: the source is not host memory");
        }
        std::memcpy(t_.data(), from.host_data(), static_cast<size_t>(n));
        return absl::OkStatus();
      }
      std::byte* host_data() override { return t_.data(); }

     private:
      HostTensor t_;
    };
    // A tensor of 4-byte words covering `bytes`, charged to the tracker by the tensor itself.
    absl::StatusOr<HostTensor> t = HostTensor::Create(
        DType::kF32, {std::max<int64_t>((bytes + 3) / 4, 1)}, &tracker_, &host_memory_);
    if (!t.ok()) return t.status();
    return std::unique_ptr<ResidentMemory>(new HostResident(bytes, *std::move(t)));
  }

  absl::Status RunTask(int64_t bytes, const DeviceTask& task) override {
    tracker_.Allocate(bytes);
    struct Release {
      MemoryTracker* tracker;
      int64_t bytes;
      ~Release() { tracker->Free(bytes); }
    } release{&tracker_, bytes};
    DeviceContext ctx;
    ctx.kind = BackendKind::kCpu;
    ctx.name = name();
    ctx.pool = &pool_;
    ctx.host_memory = &host_memory_;
    return task(ctx);
  }

 private:
  const int index_;
  ThreadPool pool_;
  MemoryTracker tracker_;
  PlainHostMemory host_memory_;
  const std::string model_;
  const int64_t total_bytes_;
};

}  // namespace

std::unique_ptr<Device> MakeCpuDevice(int index, int threads) {
  return std::make_unique<CpuDevice>(index, threads);
}

}  // namespace attnserve
