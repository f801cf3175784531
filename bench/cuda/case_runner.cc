#include "bench/cuda/case_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/cuda/plan_launch.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_status.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/tensor/tensor.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {
namespace {

// Minimal .npy (v1.0) writer for 1-D int arrays.
template <typename T>
absl::Status WriteNpy1D(const std::string& path, const std::vector<T>& v, const char* descr) {
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (",
                                    v.size(), ",), }");
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) return absl::UnavailableError(absl::StrCat(path, ": cannot open for writing"));
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), 8);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&hlen), 2);
  f.write(header.data(), header.size());
  f.write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  if (!f) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

// The small-size check of a case's spec: same spec, D, dtype; N = 700 (ragged at 64 and 128).

}  // namespace

SmallCheckResult SmallCheck(const Case& c, CachingAllocator& alloc, cudaStream_t stream,
                 const SmallRun& run_small) {
  SmallCheckResult out;
  const bool dilated = std::holds_alternative<DilatedSpec>(c.spec.pattern);
  const AttentionShape shape =
      AttentionShape{1, 700, dilated ? 8 : 2, dilated ? 8 : 2, c.shape.head_dim};
  auto run = [&]() -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(HostTensor q, HostTensor::Create(c.dtype, {1, 700, shape.q_heads,
                                                                     shape.head_dim}));
    ATTN_ASSIGN_OR_RETURN(HostTensor k, HostTensor::Create(c.dtype, {1, 700, shape.kv_heads,
                                                                     shape.head_dim}));
    ATTN_ASSIGN_OR_RETURN(HostTensor v, HostTensor::Create(c.dtype, {1, 700, shape.kv_heads,
                                                                     shape.head_dim}));
    const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now()
                                                    .time_since_epoch()
                                                    .count());
    FillUniform(q, seed);
    FillUniform(k, seed + 1);
    FillUniform(v, seed + 2);
    ATTN_ASSIGN_OR_RETURN(ReferenceResult ref, ReferenceAttention(c.spec, q, k, v));
    ATTN_ASSIGN_OR_RETURN(HostTensor o, HostTensor::Create(c.dtype, {1, 700, shape.q_heads,
                                                                     shape.head_dim}));
    ATTN_ASSIGN_OR_RETURN(HostTensor lse, HostTensor::Create(DType::kF32, {1, shape.q_heads, 700}));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dq, DeviceBuffer::Create(alloc, q.nbytes()));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dk, DeviceBuffer::Create(alloc, k.nbytes()));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dv, DeviceBuffer::Create(alloc, v.nbytes()));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer d_o, DeviceBuffer::Create(alloc, o.nbytes()));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dl, DeviceBuffer::Create(alloc, lse.nbytes()));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(dq.get(), q.data(), q.nbytes(), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(dk.get(), k.data(), k.nbytes(), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(dv.get(), v.data(), v.nbytes(), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemset(d_o.get(), 0xFF, o.nbytes()));  // poison
    CUDA_RETURN_IF_ERROR(cudaMemset(dl.get(), 0xFF, lse.nbytes()));
    ATTN_RETURN_IF_ERROR(run_small(shape, dq.get(), dk.get(), dv.get(), d_o.get(), dl.as<float>()));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(o.data(), d_o.get(), o.nbytes(), cudaMemcpyDeviceToHost));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(lse.data(), dl.get(), lse.nbytes(), cudaMemcpyDeviceToHost));
    const ErrorStats e = CompareToReference(ref, o, &lse);
    out.o_rel = e.o_rel;
    out.lse_max_abs = e.lse_max_abs;
    out.nonfinite = e.nonfinite;
    const double tol = c.dtype == DType::kF16 ? 5e-3 : 1e-2;
    out.ok = e.nonfinite == 0 && e.o_rel <= tol && e.lse_max_abs <= 2e-3;
    return absl::OkStatus();
  };
  const absl::Status st = run();
  if (!st.ok()) {
    out.ok = false;
    out.error = st.ToString();
  }
  return out;
}

absl::Status RunCase(const Case& c, const CudaBenchOptions& opt, CachingAllocator& alloc,
                     cudaStream_t stream, Result& r) {
  // The bench's edge: the case is validated once; the compiler and the plan assert it.
  ATTN_RETURN_IF_ERROR(ValidateShape(c.shape));
  ATTN_RETURN_IF_ERROR(ValidateSpec(c.spec, c.shape));
  alloc.EmptyCache();
  alloc.ResetPeak();
  // Compile on the host (timed), then plan (upload).
  CompiledPattern compiled;
  const CompiledPattern* compiled_ptr = nullptr;
  const bool dense = std::holds_alternative<DenseSpec>(c.spec.pattern);
  if (!dense) {
    const auto t0 = std::chrono::steady_clock::now();
    ATTN_ASSIGN_OR_RETURN(compiled, CompileValidatedPattern(c.spec, c.shape.tokens, c.shape.q_heads));
    r.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count();
    compiled_ptr = &compiled;
    if (c.dump_csr && !opt.csr_dir.empty()) {
      std::vector<int64_t> row_ptr = compiled.layout.row_ptr;
      std::vector<int32_t> col_idx = compiled.layout.col_idx;
      ATTN_RETURN_IF_ERROR(
          WriteNpy1D(absl::StrCat(opt.csr_dir, "/", c.name, "_row_ptr.npy"), row_ptr, "<i8"));
      ATTN_RETURN_IF_ERROR(
          WriteNpy1D(absl::StrCat(opt.csr_dir, "/", c.name, "_col_idx.npy"), col_idx, "<i4"));
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  ATTN_ASSIGN_OR_RETURN(auto plan, MakeBenchPlan(c.spec, c.shape, c.dtype, alloc, stream,
                                                 opt.cuda, compiled_ptr));
  r.plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  compiled = CompiledPattern{};  // host CSR no longer needed
  r.flops = plan->flops();
  r.sparsity = plan->sparsity();
  r.plan_bytes = plan->plan_bytes();
  return TimeLaunches(
      [&](const void* q, const void* k, const void* v, void* o, float* lse) {
        return RunBenchPlan(*plan, q, k, v, o, lse, stream, &r.kernel);
      },
      c, opt, alloc, stream, r);
}

absl::Status TimeLaunches(const Launch& launch, const Case& c, const CudaBenchOptions& opt,
                          CachingAllocator& alloc, cudaStream_t stream, Result& r) {
  const int64_t b = c.shape.batch, n = c.shape.tokens, hq = c.shape.q_heads,
                hkv = c.shape.kv_heads, d = c.shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(c.dtype));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::Create(alloc, b * n * hq * d * es));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::Create(alloc, b * n * hkv * d * es));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::Create(alloc, b * n * hkv * d * es));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer o, DeviceBuffer::Create(alloc, b * n * hq * d * es));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Create(alloc, b * hq * n * 4));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(c.dtype, q.get(), b * n * hq * d, 1, -1.f, 1.f, stream));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(c.dtype, k.get(), b * n * hkv * d, 2, -1.f, 1.f, stream));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(c.dtype, v.get(), b * n * hkv * d, 3, -1.f, 1.f, stream));

  const int warmup = c.warmup >= 0 ? c.warmup : opt.warmup;
  const int iters = c.iters >= 0 ? c.iters : opt.iters;
  for (int i = 0; i < warmup; ++i) {
    ATTN_RETURN_IF_ERROR(launch(q.get(), k.get(), v.get(), o.get(), lse.as<float>()));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  // The calls are queued back to back, each between its own pair of events, and synchronized
  // once at the end: the GPU time of a call with the queue kept full, so the host's per-call
  // work (plan lookup, tensor maps, launch) overlaps the previous call as it does in a serving
  // loop. bench/compare_torch.py times the other engines the same way (--timing=events).
  std::vector<cudaEvent_t> starts(static_cast<size_t>(std::max(iters, 0)), nullptr);
  std::vector<cudaEvent_t> stops(starts.size(), nullptr);
  absl::Status st;
  for (size_t i = 0; i < starts.size() && st.ok(); ++i) {
    if (cudaEventCreate(&starts[i]) != cudaSuccess || cudaEventCreate(&stops[i]) != cudaSuccess) {
      st = absl::ResourceExhaustedError("cudaEventCreate failed");
    }
  }
  int issued = 0;
  for (int i = 0; i < iters && st.ok(); ++i, ++issued) {
    cudaEventRecord(starts[i], stream);
    st = launch(q.get(), k.get(), v.get(), o.get(), lse.as<float>());
    cudaEventRecord(stops[i], stream);
  }
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (st.ok() && err != cudaSuccess) {
    st = CudaErrorToStatus(err, "cudaStreamSynchronize", __FILE__, __LINE__);
  }
  std::vector<double> ms;
  for (int i = 0; i < issued && st.ok(); ++i) {
    float t = 0;
    if (cudaEventElapsedTime(&t, starts[i], stops[i]) == cudaSuccess) ms.push_back(t);
  }
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i] != nullptr) cudaEventDestroy(starts[i]);
    if (stops[i] != nullptr) cudaEventDestroy(stops[i]);
  }
  ATTN_RETURN_IF_ERROR(st);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  r.iters = static_cast<int>(ms.size());
  if (!ms.empty()) {
    r.ms_median = ms.size() % 2 ? ms[ms.size() / 2]
                                : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    r.ms_min = ms.front();
    r.ms_max = ms.back();
  }
  r.peak_bytes = alloc.Stats().peak_bytes;
  return absl::OkStatus();
}

std::string CudaDeviceName(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown";
  return prop.name;
}

}  // namespace attnserve::bench
