#include "core/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/band_figures.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_lanes.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/engine_table.h"
#include "core/cuda/host_copy.h"
#include "core/cuda/pinned_host_pool.h"
#include "core/cuda/resident_memory.h"
#include "core/cuda/run_io.h"
#include "core/util/status_macros.h"

#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve {
namespace {

std::string UuidString(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    absl::StrAppendFormat(&s, "%02x", b[i]);
    if (i == 3 || i == 5 || i == 7 || i == 9) s += '-';
  }
  return s;
}

// ([[maybe_unused]] helpers serve the cuDNN path, compiled with ATTNSERVE_HAVE_CUDNN_FRONTEND.)
// Added to the own-kernel estimate where cuDNN may run the case: its workspace (the SDPA forward
// usually asks for none, some engines a few MiB) with room to spare. The f32 -> bf16 copies the
// cuDNN path makes are the same bytes CudaAttentionPlan::EstimateBytes already counts.
constexpr int64_t kCudnnWorkspaceMarginBytes = int64_t{64} << 20;
// Block size the sparsity of dense/window runs is reported at (CompileOptions' default, so both
// engines report the same figure).
constexpr int64_t kReportBlockSize = 128;
// Bound of the per-case engine memory (a few hundred bytes each); cleared when reached.
constexpr size_t kMaxRememberedCases = 4096;

enum class Chosen { kCudnn, kOwn };

std::string_view ChosenName(Chosen c) {
  return c == Chosen::kCudnn ? kEngineCudnn : kEngineFlashFwd;
}

bool DenseOrWindow(const AttentionSpec& spec) {
  return std::holds_alternative<DenseSpec>(spec.pattern) ||
         std::holds_alternative<WindowSpec>(spec.pattern);
}

// The dtype the kernels compute in: f32 inputs are converted to bf16 on the device first.
[[maybe_unused]] DType ComputeDType(DType dtype) {
  return dtype == DType::kF32 ? DType::kBF16 : dtype;
}

// What the engine memory is keyed by: everything a cuDNN graph depends on.
[[maybe_unused]] std::string CaseKey(const AttentionSpec& spec, const AttentionShape& s,
                                     DType dtype) {
  std::string key(std::string(PatternName(spec.pattern)));
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern))
    absl::StrAppend(&key, "(", w->size, ")");
  if (spec.causal) key += "+causal";
  if (spec.scale != 0.f) absl::StrAppendFormat(&key, " scale=%a", spec.scale);
  absl::StrAppendFormat(&key, " [B=%d, N=%d, Hq=%d, Hkv=%d, D=%d] %s", s.batch, s.tokens, s.q_heads,
                        s.kv_heads, s.head_dim, std::string(DTypeName(dtype)));
  return key;
}

// Whether `mode` sends (spec, shape, dtype) to cuDNN first, from the shapes alone (cuDNN itself is
// asked later, once per case).
bool CudnnCandidate(AttentionEngine mode, const AttentionSpec& spec, const AttentionShape& shape,
                    DType dtype) {
  // cuDNN runs square requests; the others (Nq != Nkv, offsets, packed) go to our kernels.
  if (mode == AttentionEngine::kOwn || !DenseOrWindow(spec) || !IsSquare(spec, shape)) {
    return false;
  }
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  const absl::StatusOr<bool> meant = CudnnSdpaSupports(spec, shape, ComputeDType(dtype));
  if (!meant.ok() || !*meant) return false;  // the own path reports an invalid spec or shape
#else
  if (mode == AttentionEngine::kAuto) return false;
#endif
  // auto: only where our kernels could run the case too, so that a cuDNN refusal always has a
  // fallback and the set of accepted requests does not depend on the host's libcudnn.
  return mode == AttentionEngine::kCudnn || CudaSupportsHeadDim(shape.head_dim);
}

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal,
                                                            const CudaOptions& options) {
    if (options.lanes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA lanes per GPU: must be >= 1, got ", options.lanes));
    }
    auto dev = std::unique_ptr<CudaDevice>(new CudaDevice(ordinal, options));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    cudaDeviceProp prop;
    CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
    dev->model_ = prop.name;
    dev->uuid_ = UuidString(prop.uuid);
    dev->total_bytes_ = static_cast<int64_t>(prop.totalGlobalMem);
    ATTN_RETURN_IF_ERROR(dev->lanes_.Init(options.lanes));
    return dev;
  }

  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    lanes_.Destroy();  // before the allocator the lanes' engines free into
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  std::string uuid() const override { return uuid_; }
  std::string model() const override { return model_; }
  bool HeadDimSupported(int64_t head_dim) const override { return CudaSupportsHeadDim(head_dim); }

  DeviceStats Stats() const override {
    const AllocatorStats a = alloc_.Stats();
    DeviceStats s;
    s.memory_used_bytes = a.in_use_bytes;
    s.memory_reserved_bytes = a.reserved_bytes;
    s.memory_peak_bytes = a.peak_bytes;
    s.memory_total_bytes = a.total_bytes > 0 ? a.total_bytes : total_bytes_;
    s.memory_free_bytes = a.free_bytes;
    s.copy_h2d_bytes = copies_.h2d_bytes.load(std::memory_order_relaxed);
    s.copy_d2h_bytes = copies_.d2h_bytes.load(std::memory_order_relaxed);
    s.pageable_copy_bytes = copies_.pageable_bytes.load(std::memory_order_relaxed);
    return s;
  }

  HostMemory& host_memory() override { return ProcessPinnedHostPool(); }
  absl::StatusOr<std::unique_ptr<ResidentMemory>> AllocateResident(int64_t bytes) override {
    return MakeCudaResidentMemory(ordinal_, alloc_, &copies_, bytes);
  }
  int lanes() const override { return lanes_.size(); }

  // Thread-safe (reads only the fixed engine mode): the scheduler calls it from other threads.
  int64_t EstimateBytes(const AttentionSpec& spec, const AttentionShape& shape,
                        DType dtype) const override {
    int64_t bytes = CudaAttentionPlan::EstimateBytes(spec, shape, dtype);
    if (CudnnCandidate(engine_mode_, spec, shape, dtype)) bytes += kCudnnWorkspaceMarginBytes;
    return bytes;
  }

  int cuda_ordinal() const override { return ordinal_; }

  // At most lanes() callers at once (more wait for a lane). Each run holds one lane: its stream,
  // events and cuDNN engine.
  absl::StatusOr<AttentionOutputs> Run(const AttentionSpec& spec, const HostTensor& q,
                                       const HostTensor& k, const HostTensor& v,
                                       const RunControl& control, RunInfo* info) override {
    ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
    return RunOnLane(spec, shape, q.dtype(), q, k, v, nullptr, control, info, nullptr);
  }

  // The copies back go from the GPU straight into `into` (page-locked when it is a registered
  // region), so nothing is copied on the host afterwards.
  absl::Status RunInto(const AttentionSpec& spec, const HostTensor& q, const HostTensor& k,
                       const HostTensor& v, const RunControl& control, RunInfo* info,
                       AttentionOutputs& into) override {
    ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
    return RunOnLane(spec, shape, q.dtype(), q, k, v, nullptr, control, info, &into).status();
  }

  // Inputs with a view in `io` are read where they are (no copy in); O / LSE with a view are
  // written there (no copy back).
  absl::StatusOr<AttentionOutputs> RunWithDeviceIo(
      const AttentionSpec& spec, const AttentionShape& shape, DType dtype, const HostTensor& q,
      const HostTensor& k, const HostTensor& v, const DeviceIo& io, const RunControl& control,
      RunInfo* info, AttentionOutputs* into) override {
    return RunOnLane(spec, shape, dtype, q, k, v, &io, control, info, into);
  }

  absl::StatusOr<AttentionOutputs> RunOnLane(const AttentionSpec& spec,
                                             const AttentionShape& shape, DType dtype,
                                             const HostTensor& q, const HostTensor& k,
                                             const HostTensor& v, const DeviceIo* io,
                                             const RunControl& control, RunInfo* info,
                                             AttentionOutputs* into) {
    const absl::Time start = absl::Now();
    ATTN_ASSIGN_OR_RETURN(CudaRunIo run_io,
                          ResolveCudaRunIo(ordinal_, shape, dtype, q, k, v, io, into));
    CudaLane& lane = lanes_.Acquire(/*all=*/false);
    absl::StatusOr<AttentionOutputs> out;
    {
      CudaRunHold hold;
      out = RunImpl(lane, hold, spec, run_io, control, info);
      // Whatever happened, leave the stream idle before anything this run holds is freed: the
      // allocator is shared by the lanes, and a block must be idle when another lane gets it.
      cudaStreamSynchronize(lane.stream);
      cudaGetLastError();
      lanes_.FreeDeferred(lane);
    }  // the plan (with its workspaces) and buffers go back here, on an idle stream
    lanes_.Release(lane, /*all=*/false);
    if (info != nullptr) info->compute_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }

  // Takes every lane (the scheduler runs tasks only with the whole device reserved) and runs on
  // lane 0's stream. Device memory the task takes through ctx.allocator is counted there, so
  // `host_bytes` is not charged again.
  absl::Status RunTask(int64_t host_bytes, const DeviceTask& task) override {
    (void)host_bytes;
    return RunTaskHolding(/*all=*/true, "RunTask", task);
  }

  // One lane, as Run holds: the task's stream is that lane's.
  absl::Status RunLaneTask(int64_t host_bytes, const DeviceTask& task) override {
    (void)host_bytes;
    return RunTaskHolding(/*all=*/false, "RunLaneTask", task);
  }

 private:
  CudaDevice(int ordinal, const CudaOptions& options)
      : ordinal_(ordinal),
        engine_mode_(options.engine),
        engine_table_(options.engine_table != nullptr ? options.engine_table
                                                      : BuiltinEngineTable()),
        alloc_(ordinal) {
    plan_options_.kernel = options.flash;
  }

  // `task` holding every lane (`all`; it runs on lane 0's stream) or one.
  absl::Status RunTaskHolding(bool all, const char* what, const DeviceTask& task) {
    if (!task) return absl::InvalidArgumentError(absl::StrCat(name(), ": ", what, ": empty task"));
    CudaLane& lane = lanes_.Acquire(all);
    absl::Status st = RunTaskOn(lane, task);
    lanes_.Release(lane, all);
    return st;
  }

  absl::Status RunTaskOn(CudaLane& lane, const DeviceTask& task) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    DeviceContext ctx;
    ctx.kind = BackendKind::kCuda;
    ctx.name = name();
    ctx.cuda_ordinal = ordinal_;
    ctx.allocator = &alloc_;
    ctx.stream = lane.stream;
    ctx.host_memory = &ProcessPinnedHostPool();
    ctx.copies = &copies_;
    absl::Status st = task(ctx);
    // As after Run: leave the stream idle so blocks the task freed are safe to reuse.
    const cudaError_t sync = cudaStreamSynchronize(lane.stream);
    cudaGetLastError();
    if (st.ok() && sync != cudaSuccess) {
      st = CudaErrorToStatus(sync, "cudaStreamSynchronize(device stream)", __FILE__, __LINE__);
    }
    return st;
  }

  absl::Status CheckControl(const RunControl& control) const {
    if (control.cancel != nullptr && control.cancel->load()) {
      return absl::CancelledError(absl::StrCat(name(), ": run cancelled"));
    }
    if (absl::Now() > control.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name(), ": deadline passed"));
    }
    return absl::OkStatus();
  }

  // Records the engine of a case (and logs it, once per case while remembered; two lanes asking
  // about a new case at once may both log it).
  void Remember(const std::string& key, Chosen chosen, std::string_view why) {
    {
      std::lock_guard<std::mutex> lock(remembered_mu_);
      if (remembered_.size() >= kMaxRememberedCases) remembered_.clear();
      remembered_[key] = chosen;
    }
    std::fprintf(stderr, "%s: attention engine %s for %s%s%s\n", name().c_str(),
                 std::string(ChosenName(chosen)).c_str(), key.c_str(), why.empty() ? "" : ": ",
                 std::string(why).c_str());
  }

  // Which engine runs this request. Errors only in kCudnn mode, where cuDNN cannot be replaced.
  absl::StatusOr<Chosen> ChooseEngine(CudaLane& lane, const AttentionSpec& spec,
                                      const AttentionShape& shape, DType dtype) {
    if (!CudnnCandidate(engine_mode_, spec, shape, dtype)) return Chosen::kOwn;
#ifndef ATTNSERVE_HAVE_CUDNN_FRONTEND
    // Only kCudnn mode gets here.
    (void)lane;
    return absl::UnavailableError(absl::StrCat(
        name(), ": attention engine cudnn was asked for, but this build has no cuDNN path "
        "(cudnn_frontend headers not found at configure time)"));
#else
    const std::string key = CaseKey(spec, shape, dtype);
    bool known_cudnn = false;  // another lane (or an earlier run) found cuDNN can run it
    {
      std::lock_guard<std::mutex> lock(remembered_mu_);
      if (auto it = remembered_.find(key); it != remembered_.end()) {
        if (it->second == Chosen::kOwn) return Chosen::kOwn;
        known_cudnn = true;
      }
    }
    // auto: a case the table measured faster on our kernels (on this GPU model) stays on them,
    // and cuDNN is neither loaded nor asked for it.
    if (engine_mode_ == AttentionEngine::kAuto && !known_cudnn) {
      const std::optional<EngineTableDecision> measured = engine_table_->Lookup(
          model_, PatternName(spec.pattern), spec.causal, dtype, shape.head_dim, shape.tokens);
      if (measured.has_value() && measured->engine == EngineTableChoice::kOwn) {
        Remember(key, Chosen::kOwn, measured->reason);
        return Chosen::kOwn;
      }
    }
    // Each lane has its own cuDNN engine: this lane's may not exist yet.
    absl::Status why = EnsureCudnn(lane);
    if (why.ok() && known_cudnn) return Chosen::kCudnn;
    if (why.ok()) {
      const absl::StatusOr<bool> has_engine =
          lane.cudnn->Supports(spec, shape, ComputeDType(dtype));
      if (!has_engine.ok()) {
        why = has_engine.status();
      } else if (!*has_engine) {
        why = absl::UnimplementedError(
            absl::StrCat(name(), ": the loaded cuDNN has no engine for ", key));
      }
    }
    if (!why.ok() && engine_mode_ == AttentionEngine::kCudnn) return why;
    const Chosen chosen = why.ok() ? Chosen::kCudnn : Chosen::kOwn;
    Remember(key, chosen, why.ok() ? "" : why.ToString());
    return chosen;
#endif
  }

#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  // Creates the lane's cuDNN engine on first use (on the lane's thread). A failure is kept:
  // libcudnn does not appear while the process runs.
  absl::Status EnsureCudnn(CudaLane& lane) {
    if (lane.cudnn != nullptr) return absl::OkStatus();
    if (!lane.cudnn_status.ok()) return lane.cudnn_status;
    CudnnSdpa::Options options;
    options.device = ordinal_;
    // The engine frees its workspace right after enqueueing: the block waits in the lane's
    // deferred list until Run has synchronized the lane's stream, since the allocator is shared
    // by the lanes.
    options.workspace.allocate = [this](size_t bytes) -> absl::StatusOr<void*> {
      return alloc_.Allocate(bytes);
    };
    options.workspace.free = [lane = &lane](void* ptr) { lane->deferred_frees.push_back(ptr); };
    absl::StatusOr<std::unique_ptr<CudnnSdpa>> engine = CudnnSdpa::Create(options);
    if (!engine.ok()) {
      lane.cudnn_status = absl::UnavailableError(
          absl::StrCat(name(), ": cuDNN engine unavailable: ", engine.status().ToString()));
      std::fprintf(stderr, "%s; dense/window attention runs on flash_fwd\n",
                   std::string(lane.cudnn_status.message()).c_str());
      return lane.cudnn_status;
    }
    lane.cudnn = *std::move(engine);
    std::fprintf(stderr, "%s: cuDNN %lld loaded from %s (engine mode %s, lane %d)\n",
                 name().c_str(), static_cast<long long>(lane.cudnn->backend_version()),
                 lane.cudnn->library().c_str(),
                 std::string(AttentionEngineName(engine_mode_)).c_str(), lane.index);
    return absl::OkStatus();
  }

  // Enqueues cuDNN's forward on the lane's stream (f32: through bf16 copies, like the own
  // kernels; the copies stay in `hold` until the stream is idle).
  absl::Status RunCudnn(CudaLane& lane, CudaRunHold& hold, const AttentionSpec& spec,
                        const AttentionShape& shape, DType dtype, const void* q, const void* k,
                        const void* v, void* o, float* lse) {
    if (dtype != DType::kF32) {
      return lane.cudnn->Forward(spec, shape, dtype, q, k, v, o, lse, lane.stream);
    }
    const int64_t nq = shape.batch * shape.tokens * shape.q_heads * shape.head_dim;
    const int64_t nkv = shape.batch * shape.tokens * shape.kv_heads * shape.head_dim;
    // The same bf16 copies (and sizes) as the own kernels' workspace, which EstimateBytes counts.
    const CudaWorkspaceSizes ws = CudaWorkspaceSizesFor(spec, shape, dtype);
    for (int64_t bytes : {ws.q_bf16, ws.k_bf16, ws.v_bf16, ws.o_bf16}) {
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(alloc_, bytes));
      hold.extra.push_back(std::move(b));
    }
    void* qc = hold.extra[0].get();
    void* kc = hold.extra[1].get();
    void* vc = hold.extra[2].get();
    void* oc = hold.extra[3].get();
    cudaStream_t stream = lane.stream;
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, q, DType::kBF16, qc, nq, stream));
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, k, DType::kBF16, kc, nkv, stream));
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, v, DType::kBF16, vc, nkv, stream));
    ATTN_RETURN_IF_ERROR(
        lane.cudnn->Forward(spec, shape, DType::kBF16, qc, kc, vc, oc, lse, stream));
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kBF16, oc, DType::kF32, o, nq, stream));
    return absl::OkStatus();
  }
#endif

  // The run's device buffers into `hold`: one per tensor that is not read or written in place.
  absl::Status AllocateBuffers(CudaRunHold& hold, const CudaRunIo& io) {
    DeviceBuffer* ins[3] = {&hold.q, &hold.k, &hold.v};
    for (int i = 0; i < 3; ++i) {
      if (io.host_in[i] == nullptr) continue;
      ATTN_ASSIGN_OR_RETURN(*ins[i], DeviceBuffer::Create(alloc_, io.host_in[i]->nbytes()));
    }
    const AttentionShape& s = io.shape;
    const size_t o_bytes = static_cast<size_t>(s.batch * s.tokens * s.q_heads * s.head_dim) *
                           DTypeSize(io.dtype);
    const size_t lse_bytes = static_cast<size_t>(s.batch * s.q_heads * s.tokens) * sizeof(float);
    if (io.o_device == nullptr) {
      ATTN_ASSIGN_OR_RETURN(hold.o, DeviceBuffer::Create(alloc_, o_bytes));
    }
    if (io.lse_device == nullptr) {
      ATTN_ASSIGN_OR_RETURN(hold.lse, DeviceBuffer::Create(alloc_, lse_bytes));
    }
    return absl::OkStatus();
  }

  // The plan of a run on the own kernels into `hold`.
  absl::Status CreatePlan(CudaLane& lane, CudaRunHold& hold, const AttentionSpec& spec,
                          const AttentionShape& shape, DType dtype) {
    ATTN_ASSIGN_OR_RETURN(
        hold.plan,
        CudaAttentionPlan::Create(spec, shape, dtype, alloc_, lane.stream, nullptr, plan_options_));
    return absl::OkStatus();
  }

  // The device memory a run's kernels read and write: its own buffers or the views in place.
  struct RunPointers {
    const void *q, *k, *v;
    void* o;
    float* lse;
  };
  static RunPointers PointersOf(const CudaRunHold& hold, const CudaRunIo& io) {
    auto in = [&](int i, const DeviceBuffer& b) -> const void* {
      return io.device_in[i] != nullptr ? static_cast<const void*>(io.device_in[i]) : b.get();
    };
    return RunPointers{in(0, hold.q), in(1, hold.k), in(2, hold.v),
                       io.o_device != nullptr ? static_cast<void*>(io.o_device) : hold.o.get(),
                       io.lse_device != nullptr ? io.lse_device : hold.lse.as<float>()};
  }

  // Enqueues the own kernels. Their workspaces stay with the plan, which `hold` frees only once
  // the lane's stream is idle.
  absl::Status RunOwn(CudaLane& lane, CudaRunHold& hold, const RunPointers& p,
                      const RunControl& control, FlashKernel* kernel) {
    return hold.plan->Run(p.q, p.k, p.v, p.o, p.lse, lane.stream, control.cancel, kernel);
  }

  absl::StatusOr<AttentionOutputs> RunImpl(CudaLane& lane, CudaRunHold& hold,
                                           const AttentionSpec& spec, CudaRunIo& io,
                                           const RunControl& control, RunInfo* info) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    const AttentionShape& shape = io.shape;
    const DType dtype = io.dtype;
    ATTN_RETURN_IF_ERROR(CheckControl(control));

    ATTN_ASSIGN_OR_RETURN(Chosen chosen, ChooseEngine(lane, spec, shape, dtype));
    if (chosen == Chosen::kOwn) ATTN_RETURN_IF_ERROR(CreatePlan(lane, hold, spec, shape, dtype));
    ATTN_RETURN_IF_ERROR(AllocateBuffers(hold, io));
    const RunPointers p = PointersOf(hold, io);
    cudaStream_t stream = lane.stream;
    RunEvents& events = lane.events;
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.inputs_start(), stream));
    void* dst[3] = {hold.q.get(), hold.k.get(), hold.v.get()};
    for (int i = 0; i < 3; ++i) {
      const HostTensor* t = io.host_in[i];
      if (t != nullptr) {
        ATTN_RETURN_IF_ERROR(CopyToDevice(dst[i], t->data(), t->nbytes(), stream, &copies_));
      }
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.inputs_done(), stream));
    ATTN_RETURN_IF_ERROR(CheckControl(control));

    double flops = 0, sparsity = 0;
    FlashKernel kernel = FlashKernel::kSm80;  // set by the plan's launches
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
    if (chosen == Chosen::kCudnn) {
      const absl::Status st =
          RunCudnn(lane, hold, spec, shape, dtype, p.q, p.k, p.v, p.o, p.lse);
      // UNIMPLEMENTED: cuDNN changed its mind after the graph build; INTERNAL: cuDNN failed on a
      // case our kernels can run. In auto mode both fall back (and the case stays on ours).
      const bool fall_back = engine_mode_ == AttentionEngine::kAuto &&
                             (st.code() == absl::StatusCode::kUnimplemented ||
                              st.code() == absl::StatusCode::kInternal);
      if (fall_back) {
        cudaGetLastError();
        Remember(CaseKey(spec, shape, dtype), Chosen::kOwn, st.ToString());
        chosen = Chosen::kOwn;
        ATTN_RETURN_IF_ERROR(CreatePlan(lane, hold, spec, shape, dtype));
      } else {
        ATTN_RETURN_IF_ERROR(st);
        flops = 4.0 * static_cast<double>(shape.batch * shape.q_heads * shape.head_dim) *
                BandPairs(spec, shape.tokens);
        sparsity = BandSparsity(spec, shape.tokens, kReportBlockSize);
      }
    }
#endif
    if (chosen == Chosen::kOwn) {
      ATTN_RETURN_IF_ERROR(RunOwn(lane, hold, p, control, &kernel));
      flops = hold.plan->flops();
      sparsity = hold.plan->sparsity();
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.kernels_done(), stream));
    AttentionOutputs& out = io.host_out;
    if (!out.o.empty()) {
      ATTN_RETURN_IF_ERROR(CopyToHost(out.o.data(), p.o, out.o.nbytes(), stream, &copies_));
    }
    if (!out.lse.empty()) {
      ATTN_RETURN_IF_ERROR(CopyToHost(out.lse.data(), p.lse, out.lse.nbytes(), stream, &copies_));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.outputs_done(), stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (info != nullptr) {
      events.Read(&info->copy_seconds, &info->kernel_seconds);
      info->copy_bytes = io.host_copy_bytes();
      info->flops = flops;
      info->sparsity = sparsity;
      info->engine = std::string(ChosenName(chosen));
      info->kernel = chosen == Chosen::kOwn ? std::string(FlashKernelName(kernel)) : std::string();
    }
    return std::move(out);
  }

  const int ordinal_;
  const AttentionEngine engine_mode_;
  const std::shared_ptr<const EngineTable> engine_table_;  // what kAuto consults (never null)
  CudaAttentionPlan::Options plan_options_;  // the flash kernel options of every plan
  std::string model_;
  std::string uuid_;
  int64_t total_bytes_ = 0;
  HostCopyCounters copies_;  // this device's host copies (read by Stats)
  mutable CachingAllocator alloc_;
  // The engine each case ran on first (cuDNN refusals are not retried).
  std::mutex remembered_mu_;
  std::unordered_map<std::string, Chosen> remembered_;
  CudaLanes lanes_{alloc_};  // after alloc_: destroyed before it
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeCudaDevices(
    std::vector<int> ordinals, const CudaOptions& options) {
  const int count = CudaDeviceCount();
  if (count == 0) return absl::UnavailableError("no CUDA device (or no driver) is available");
  if (ordinals.empty()) {
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  }
  if (options.pinned_host_cap_bytes > 0) {
    ProcessPinnedHostPool().set_cap_bytes(options.pinned_host_cap_bytes);
  }
  std::vector<std::unique_ptr<Device>> devices;
  for (int ordinal : ordinals) {
    if (ordinal < 0 || ordinal >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices: CUDA ordinal ", ordinal, " out of range [0, ", count, ")"));
    }
    ATTN_ASSIGN_OR_RETURN(auto dev, CudaDevice::Create(ordinal, options));
    devices.push_back(std::move(dev));
  }
  return devices;
}

}  // namespace attnserve
