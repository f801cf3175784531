// attnbench_decode: decode steps on one GPU at the kernel level. For each context length and
// query count, Q [1, Nq, Hq, D] at the context's last positions (dense causal, bottom-right)
// against K/V [1, N, Hkv, D] resident on the GPU, through CudaAttentionPlan as the service runs
// it: the split-KV decode kernels (core/cuda/flash_decode), and for comparison the prefill
// kernels on the same request (DecodeKernel::kFlashFwd). A decode step reads the whole context
// once, so its floor is the memory: the run also times device-to-device copies of the same K/V
// bytes, and reports the bandwidth time = context bytes / (copy bandwidth counting the bytes read
// and written), and each kernel's ratio to it. Every case also checks the decode output against
// the prefill kernels' (max |diff| / max |O|, non-finite elements).
//
//   attnbench_decode [--device 0] [--context-tokens 131072,1048576] [--q-lens 1,4,16]
//                    [--q-heads 32] [--kv-heads 8] [--head-dim 128] [--iters 20] [--json-out FILE]
// Exit code: 0 on success, 1 on any error or mismatch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/harness/compare.h"
#include "bench/harness/flags.h"
#include "bench/harness/run_record.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/tensor/dtype.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

ABSL_FLAG(int, device, 0, "CUDA ordinal");
ABSL_FLAG(std::string, context_tokens, "131072,1048576", "context lengths (comma list)");
ABSL_FLAG(std::string, q_lens, "1,4,16", "query rows per decode step (comma list)");
ABSL_FLAG(int64_t, q_heads, 32, "query heads");
ABSL_FLAG(int64_t, kv_heads, 8, "KV heads");
ABSL_FLAG(int64_t, head_dim, 128, "head dim");
ABSL_FLAG(std::string, splits_sweep, "",
          "also time the decode kernel at these forced key-split counts (comma list; tuning)");
ABSL_FLAG(int, iters, 20, "timed runs of each case (the median is reported)");
ABSL_FLAG(std::string, json_out, "", "write the figures here as JSON");

namespace attnserve {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": positive integers, got '", part, "'"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty"));
  return out;
}

// Median seconds of `iters` runs of fn on `stream`, each timed by events (one warmup first).
template <typename Fn>
absl::StatusOr<double> TimeIt(int iters, cudaStream_t stream, Fn&& fn) {
  cudaEvent_t e0, e1;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
  std::vector<double> s;
  absl::Status st;
  for (int it = 0; it < iters + 1 && st.ok(); ++it) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(e0, stream));
    st = fn();
    CUDA_RETURN_IF_ERROR(cudaEventRecord(e1, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e0, e1));
    if (it > 0) s.push_back(ms / 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  ATTN_RETURN_IF_ERROR(st);
  return Median(s);
}

// Median seconds of the decode step on the mma.sync decode kernel (FlashKernelArch::kSm80).
absl::StatusOr<double> TimeMmaSyncDecode(const AttentionSpec& spec, const AttentionShape& shape,
                                         CachingAllocator& alloc, cudaStream_t stream, int iters,
                                         const void* q, const void* k, const void* v, void* o,
                                         float* lse) {
  CudaAttentionPlan::Options options;
  options.kernel.arch = FlashKernelArch::kSm80;
  ATTN_ASSIGN_OR_RETURN(auto plan, CudaAttentionPlan::Create(spec, shape, DType::kBF16, alloc,
                                                             stream, nullptr, options));
  return TimeIt(iters, stream, [&] { return plan->Run(q, k, v, o, lse, stream); });
}

absl::Status Run() {
  ATTN_ASSIGN_OR_RETURN(const std::vector<int64_t> contexts,
                        ParseList(absl::GetFlag(FLAGS_context_tokens), "context-tokens"));
  ATTN_ASSIGN_OR_RETURN(const std::vector<int64_t> q_lens,
                        ParseList(absl::GetFlag(FLAGS_q_lens), "q-lens"));
  const int64_t hq = absl::GetFlag(FLAGS_q_heads), hkv = absl::GetFlag(FLAGS_kv_heads),
                d = absl::GetFlag(FLAGS_head_dim);
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  if (hkv < 1 || hq % hkv != 0) {
    return absl::InvalidArgumentError("--q-heads must be a multiple of --kv-heads");
  }
  const int device = absl::GetFlag(FLAGS_device);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CachingAllocator alloc(device);
  const DType dt = DType::kBF16;
  const int64_t max_q = *std::max_element(q_lens.begin(), q_lens.end());

  Json cases = Json::Array();
  bool all_ok = true;
  for (const int64_t n : contexts) {
    const int64_t kv_bytes = n * hkv * d * 2;  // K (and V) of the context
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::Create(alloc, kv_bytes));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::Create(alloc, kv_bytes));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::Create(alloc, max_q * hq * d * 2));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer o1, DeviceBuffer::Create(alloc, max_q * hq * d * 2));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer o2, DeviceBuffer::Create(alloc, max_q * hq * d * 2));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Create(alloc, max_q * hq * 4));
    CUDA_RETURN_IF_ERROR(LaunchFillUniform(dt, q.get(), max_q * hq * d, 11, -2.f, 2.f, stream));
    CUDA_RETURN_IF_ERROR(LaunchFillUniform(dt, k.get(), n * hkv * d, 12, -2.f, 2.f, stream));
    CUDA_RETURN_IF_ERROR(LaunchFillUniform(dt, v.get(), n * hkv * d, 13, -1.f, 1.f, stream));

    // The memory floor: K and V copied device to device (read and write), same bytes.
    double copy_s;
    {
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::Create(alloc, kv_bytes));
      ATTN_ASSIGN_OR_RETURN(
          copy_s, TimeIt(iters, stream, [&]() -> absl::Status {
            CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scratch.get(), k.get(), kv_bytes,
                                                 cudaMemcpyDeviceToDevice, stream));
            CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scratch.get(), v.get(), kv_bytes,
                                                 cudaMemcpyDeviceToDevice, stream));
            return absl::OkStatus();
          }));
    }
    const double context_bytes = 2.0 * static_cast<double>(kv_bytes);
    const double bandwidth = 2.0 * context_bytes / copy_s;  // bytes read + written per second
    const double bw_time = context_bytes / bandwidth;
    std::printf(
        "context %lld tokens (Hq %lld, Hkv %lld, D %lld, bf16, %.3f GB of K/V) on %s:\n"
        "  copy bandwidth %.0f GB/s (read + write): bandwidth time %.3f ms\n",
        static_cast<long long>(n), static_cast<long long>(hq), static_cast<long long>(hkv),
        static_cast<long long>(d), context_bytes / 1e9, prop.name, bandwidth / 1e9, bw_time * 1e3);

    for (const int64_t nq : q_lens) {
      AttentionSpec spec;
      spec.causal = true;
      spec.q_offset = n - nq;
      AttentionShape shape{1, nq, hq, hkv, d};
      shape.kv_tokens = n;
      CudaAttentionPlan::Options split_opts, flash_opts;
      flash_opts.kernel.decode = DecodeKernel::kFlashFwd;
      ATTN_ASSIGN_OR_RETURN(auto split, CudaAttentionPlan::Create(spec, shape, dt, alloc, stream,
                                                                  nullptr, split_opts));
      ATTN_ASSIGN_OR_RETURN(auto flash, CudaAttentionPlan::Create(spec, shape, dt, alloc, stream,
                                                                  nullptr, flash_opts));
      FlashKernel ran = FlashKernel::kSm80;
      ATTN_ASSIGN_OR_RETURN(const double split_s, TimeIt(iters, stream, [&] {
                              return split->Run(q.get(), k.get(), v.get(), o1.get(),
                                                lse.as<float>(), stream, nullptr, &ran);
                            }));
      // Where the automatic choice ran the wgmma kernel: the mma.sync kernel on the same step too.
      double sm80_s = 0;
      if (ran == FlashKernel::kSplitKvDecodeSm90) {
        ATTN_ASSIGN_OR_RETURN(sm80_s, TimeMmaSyncDecode(spec, shape, alloc, stream, iters, q.get(),
                                                        k.get(), v.get(), o2.get(), lse.as<float>()));
        std::printf("    Nq %lld, the mma.sync decode kernel: %.3f ms (%.2fx the bandwidth time)\n",
                    static_cast<long long>(nq), sm80_s * 1e3, sm80_s / bw_time);
      }
      Json sweep = Json::Array();
      if (!absl::GetFlag(FLAGS_splits_sweep).empty()) {
        ATTN_ASSIGN_OR_RETURN(const std::vector<int64_t> counts,
                              ParseList(absl::GetFlag(FLAGS_splits_sweep), "splits-sweep"));
        for (const int64_t count : counts) {
          CudaAttentionPlan::Options forced;
          forced.kernel.decode_splits = static_cast<int>(count);
          ATTN_ASSIGN_OR_RETURN(auto plan, CudaAttentionPlan::Create(spec, shape, dt, alloc, stream,
                                                                     nullptr, forced));
          ATTN_ASSIGN_OR_RETURN(const double t, TimeIt(iters, stream, [&] {
                                  return plan->Run(q.get(), k.get(), v.get(), o1.get(),
                                                   lse.as<float>(), stream);
                                }));
          std::printf("    Nq %lld, %lld splits: %.3f ms\n", static_cast<long long>(nq),
                      static_cast<long long>(count), t * 1e3);
          sweep.Push(Json::Object().Set("splits", count).Set("kernel_ms", t * 1e3));
        }
      }
      FlashKernel flash_ran = FlashKernel::kSm80;
      ATTN_ASSIGN_OR_RETURN(const double flash_s, TimeIt(std::min(iters, 5), stream, [&] {
                              return flash->Run(q.get(), k.get(), v.get(), o2.get(),
                                                lse.as<float>(), stream, nullptr, &flash_ran);
                            }));
      // The decode O against the prefill kernels' O.
      std::vector<uint16_t> a(nq * hq * d), b(nq * hq * d);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(a.data(), o1.get(), a.size() * 2, cudaMemcpyDeviceToHost));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(b.data(), o2.get(), b.size() * 2, cudaMemcpyDeviceToHost));
      const bench::Bf16Agreement agree = bench::CompareBf16(a, b);
      const double rel = agree.max_rel_diff;
      const int64_t nonfinite = agree.nonfinite;
      const bool ok = nonfinite == 0 && rel <= 2e-2;
      all_ok = all_ok && ok;
      std::printf(
          "  Nq %-3lld %s %.3f ms (%.0f GB/s, %.2fx the bandwidth time)   %s %.3f ms "
          "(%.1fx slower)   O check: %.2g %s\n",
          static_cast<long long>(nq), std::string(FlashKernelName(ran)).c_str(), split_s * 1e3,
          context_bytes / split_s / 1e9, split_s / bw_time,
          std::string(FlashKernelName(flash_ran)).c_str(), flash_s * 1e3, flash_s / split_s, rel,
          ok ? "PASS" : "FAIL");
      Json c = Json::Object();
      c.Set("context_tokens", n)
          .Set("q_len", nq)
          .Set("context_bytes", context_bytes)
          .Set("copy_bandwidth_gbps", bandwidth / 1e9)
          .Set("bandwidth_time_ms", bw_time * 1e3)
          .Set("kernel", std::string(FlashKernelName(ran)))
          .Set("kernel_ms", split_s * 1e3)
          .Set("kernel_over_bandwidth", split_s / bw_time)
          .Set("decode_sm80_kernel_ms", sm80_s * 1e3)
          .Set("prefill_kernel", std::string(FlashKernelName(flash_ran)))
          .Set("prefill_kernel_ms", flash_s * 1e3)
          .Set("o_max_rel_diff_vs_prefill", rel)
          .Set("o_nonfinite", nonfinite)
          .Set("check", ok ? "PASS" : "FAIL")
          .Set("splits_sweep", std::move(sweep));
      cases.Push(std::move(c));
    }
  }
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    Json j = Json::Object();
    bench::AddRunRecord(bench::MakeRunRecord(prop.name), j);
    j.Set("q_heads", hq).Set("kv_heads", hkv).Set("head_dim", d).Set("dtype", "bf16");
    j.Set("cases", std::move(cases));
    ATTN_RETURN_IF_ERROR(bench::WriteJsonOut(absl::GetFlag(FLAGS_json_out), j));
  }
  if (!all_ok) return absl::InternalError("a decode output does not match the prefill kernels");
  return absl::OkStatus();
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv,
                                     "attnbench_decode: split-KV decode vs the memory floor",
                                     "attnbench_decode", &attnserve::Run);
}
