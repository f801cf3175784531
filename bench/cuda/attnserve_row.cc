#include "bench/cuda/attnserve_row.h"

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/engine_table.h"
#include "core/util/status_macros.h"
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve::bench {

bool DenseOrWindow(const AttentionSpec& spec) {
  return std::holds_alternative<DenseSpec>(spec.pattern) ||
         std::holds_alternative<WindowSpec>(spec.pattern);
}

#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
struct AttnserveEngine::State {
  int device = 0;
  std::string model;  // cudaDeviceProp::name, what the engine table is keyed by
  CachingAllocator* alloc = nullptr;
  std::unique_ptr<CudnnSdpa> sdpa;
  absl::Status status;  // why sdpa could not be created

  // The engine to time `c` on, or null with `why` set when attnserve would run flash_fwd.
  CudnnSdpa* For(const Case& c, std::string* why) {
    const absl::StatusOr<bool> meant = CudnnSdpaSupports(c.spec, c.shape, c.dtype);
    if (!meant.ok() || !*meant || !CudaSupportsHeadDim(c.shape.head_dim)) {
      *why = "outside the cuDNN engine's cases";
      return nullptr;
    }
    if (sdpa == nullptr && status.ok()) {
      CudnnSdpa::Options options;
      options.device = device;
      options.workspace.allocate = [this](size_t bytes) -> absl::StatusOr<void*> {
        return alloc->Allocate(bytes);
      };
      options.workspace.free = [this](void* ptr) { alloc->Free(ptr); };
      absl::StatusOr<std::unique_ptr<CudnnSdpa>> made = CudnnSdpa::Create(options);
      if (made.ok()) {
        sdpa = *std::move(made);
      } else {
        status = made.status();
      }
    }
    if (sdpa == nullptr) {
      *why = absl::StrCat("cuDNN unavailable: ", status.ToString());
      return nullptr;
    }
    const absl::StatusOr<bool> has = sdpa->Supports(c.spec, c.shape, c.dtype);
    if (!has.ok() || !*has) {
      *why = has.ok() ? "cuDNN has no engine for the case" : has.status().ToString();
      return nullptr;
    }
    return sdpa.get();
  }
};

AttnserveEngine::AttnserveEngine(int device, CachingAllocator& alloc)
    : state_(std::make_unique<State>()) {
  state_->device = device;
  state_->alloc = &alloc;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) state_->model = prop.name;
}

std::string AttnserveEngine::Describe() const {
  if (state_->sdpa != nullptr) {
    return absl::StrCat(state_->sdpa->backend_version(), " from ", state_->sdpa->library());
  }
  return state_->status.ok() ? "not loaded" : state_->status.ToString();
}

void AttnserveEngine::Reset() { state_->sdpa.reset(); }

namespace {

// The cuDNN row: timed as our kernels are, the FLOPs of our plan (the same exact pair count).
Result RunCudnnRow(const Case& c, const Result& own, const CudaBenchOptions& opt, CudnnSdpa& sdpa,
                   CachingAllocator& alloc, cudaStream_t stream) {
  Result a;
  a.c = c;
  a.variant = "attnserve";
  a.engine = "cudnn";
  alloc.EmptyCache();
  alloc.ResetPeak();
  a.flops = own.flops;
  a.sparsity = own.sparsity;
  if (a.flops <= 0 && std::holds_alternative<DenseSpec>(c.spec.pattern)) {  // own run failed
    const double n = static_cast<double>(c.shape.tokens);
    a.flops = 4.0 * static_cast<double>(c.shape.batch * c.shape.q_heads * c.shape.head_dim) *
              (c.spec.causal ? n * (n + 1) / 2 : n * n);
  }
  const absl::Status st = TimeLaunches(
      [&](const void* q, const void* k, const void* v, void* o, float* lse) {
        return sdpa.Forward(c.spec, c.shape, c.dtype, q, k, v, o, lse, stream);
      },
      c, opt, alloc, stream, a);
  if (!st.ok()) {
    a.error = st.ToString();
    cudaGetLastError();
  }
  a.check = SmallCheck(c, alloc, stream,
                       [&](const AttentionShape& shape, const void* q, const void* k,
                           const void* v, void* o, float* lse) -> absl::Status {
                         ATTN_RETURN_IF_ERROR(
                             sdpa.Forward(c.spec, shape, c.dtype, q, k, v, o, lse, stream));
                         CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
                         return absl::OkStatus();
                       });
  return a;
}

}  // namespace

Result RunAttnserveRow(const Case& c, const Result& own, const CudaBenchOptions& opt,
                       AttnserveEngine& served, CachingAllocator& alloc, cudaStream_t stream) {
  std::string why;
  // Auto mode consults the built-in engine table first, as CudaDevice::ChooseEngine does: a case
  // measured faster on our kernel on this GPU model stays on it (the server's --engine-table
  // file, when one is given, is not known here).
  std::optional<EngineTableDecision> measured;
  if (opt.cuda.engine == AttentionEngine::kAuto) {
    measured = BuiltinEngineTable()->Lookup(served.state_->model, PatternName(c.spec.pattern),
                                            c.spec.causal, c.dtype, c.shape.head_dim,
                                            c.shape.tokens);
  }
  if (opt.cuda.engine == AttentionEngine::kOwn) {
    why = "engine own (ATTNSERVE_ATTENTION_ENGINE)";
  } else if (measured.has_value() && measured->engine == EngineTableChoice::kOwn) {
    why = "engine table: " + measured->reason;
  } else if (CudnnSdpa* sdpa = served.state_->For(c, &why); sdpa != nullptr) {
    return RunCudnnRow(c, own, opt, *sdpa, alloc, stream);
  }
  Result a = own;
  a.variant = "attnserve";
  a.engine = "flash_fwd";
  a.note = why;
  return a;
}

#else  // no cuDNN path in this build: attnserve runs our kernels on every case

struct AttnserveEngine::State {};

AttnserveEngine::AttnserveEngine(int device, CachingAllocator& alloc) {}

std::string AttnserveEngine::Describe() const { return "not built (no cudnn_frontend headers)"; }

void AttnserveEngine::Reset() {}

Result RunAttnserveRow(const Case& c, const Result& own, const CudaBenchOptions& opt,
                       AttnserveEngine& served, CachingAllocator& alloc, cudaStream_t stream) {
  Result a = own;
  a.variant = "attnserve";
  a.engine = "flash_fwd";
  a.note = "build without the cuDNN path";
  return a;
}

#endif  // ATTNSERVE_HAVE_CUDNN_FRONTEND

AttnserveEngine::~AttnserveEngine() = default;

}  // namespace attnserve::bench
