// attnbench_prefill: chunked prefill on one GPU against one call. A causal sequence of --tokens
// is computed (1) as one dense causal request, and (2) as the queries of --chunk rows at a time,
// chunk i at q_offset = i * chunk against the keys [0, (i + 1) * chunk) -- what an inference
// service does while it appends its context chunk by chunk (the rect path of
// CudaAttentionPlan). Reports the time of each (plan builds included for the chunks: every chunk
// is a new request), their ratio, and the largest difference of the chunked O from the one-call
// O relative to its largest element.
//
//   attnbench_prefill [--device 0] [--tokens 1048576] [--chunk 65536] [--q-heads 8]
//                     [--kv-heads 8] [--head-dim 128] [--iters 3] [--json-out FILE]
// Exit code: 0 on success, 1 on any error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
ABSL_FLAG(int64_t, tokens, 1048576, "sequence length");
ABSL_FLAG(int64_t, chunk, 65536, "query rows per chunk");
ABSL_FLAG(int64_t, q_heads, 8, "query heads");
ABSL_FLAG(int64_t, kv_heads, 8, "KV heads");
ABSL_FLAG(int64_t, head_dim, 128, "head dim");
ABSL_FLAG(int, iters, 3, "timed runs of each (the median is reported)");
ABSL_FLAG(std::string, json_out, "", "write the figures here as JSON");

namespace attnserve {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::Status Run() {
  const int64_t n = absl::GetFlag(FLAGS_tokens), c = absl::GetFlag(FLAGS_chunk);
  const int64_t hq = absl::GetFlag(FLAGS_q_heads), hkv = absl::GetFlag(FLAGS_kv_heads),
                d = absl::GetFlag(FLAGS_head_dim);
  if (c < 1 || n % c != 0) return absl::InvalidArgumentError("--chunk must divide --tokens");
  CUDA_RETURN_IF_ERROR(cudaSetDevice(absl::GetFlag(FLAGS_device)));
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CachingAllocator alloc(absl::GetFlag(FLAGS_device));
  const DType dt = DType::kBF16;
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::Create(alloc, n * hq * d * 2));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::Create(alloc, n * hkv * d * 2));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::Create(alloc, n * hkv * d * 2));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer o1, DeviceBuffer::Create(alloc, n * hq * d * 2));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer o2, DeviceBuffer::Create(alloc, n * hq * d * 2));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer lse1, DeviceBuffer::Create(alloc, n * hq * 4));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer lse2, DeviceBuffer::Create(alloc, c * hq * 4));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(dt, q.get(), n * hq * d, 1, -2.f, 2.f, stream));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(dt, k.get(), n * hkv * d, 2, -2.f, 2.f, stream));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(dt, v.get(), n * hkv * d, 3, -1.f, 1.f, stream));
  cudaEvent_t e0, e1;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));

  AttentionSpec causal;
  causal.causal = true;
  const AttentionShape full{1, n, hq, hkv, d};
  std::vector<double> one_s, chunked_s, chunked_kernel_s;
  for (int it = 0; it < absl::GetFlag(FLAGS_iters) + 1; ++it) {  // the first is a warmup
    const absl::Time t0 = absl::Now();
    ATTN_ASSIGN_OR_RETURN(auto plan, CudaAttentionPlan::Create(causal, full, dt, alloc, stream));
    ATTN_RETURN_IF_ERROR(plan->Run(q.get(), k.get(), v.get(), o1.get(), lse1.as<float>(), stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (it > 0) one_s.push_back(absl::ToDoubleSeconds(absl::Now() - t0));

    double kernels = 0;
    const absl::Time t1 = absl::Now();
    for (int64_t i = 0; i < n / c; ++i) {
      AttentionSpec spec = causal;
      spec.q_offset = i * c;
      AttentionShape shape{1, c, hq, hkv, d};
      shape.kv_tokens = (i + 1) * c;
      ATTN_ASSIGN_OR_RETURN(auto p, CudaAttentionPlan::Create(spec, shape, dt, alloc, stream));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(e0, stream));
      ATTN_RETURN_IF_ERROR(p->Run(static_cast<char*>(q.get()) + i * c * hq * d * 2, k.get(),
                                  v.get(), static_cast<char*>(o2.get()) + i * c * hq * d * 2,
                                  lse2.as<float>(), stream));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(e1, stream));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      float ms = 0;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e0, e1));
      kernels += ms / 1e3;
    }
    if (it > 0) {
      chunked_s.push_back(absl::ToDoubleSeconds(absl::Now() - t1));
      chunked_kernel_s.push_back(kernels);
    }
  }
  // O of both, compared on the host.
  std::vector<uint16_t> a(n * hq * d), b(n * hq * d);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(a.data(), o1.get(), a.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.data(), o2.get(), b.size() * 2, cudaMemcpyDeviceToHost));
  // The chunked O against the one call's.
  const bench::Bf16Agreement agree = bench::CompareBf16(b, a);
  const int64_t nonfinite = agree.nonfinite;
  const double one = Median(one_s), chunked = Median(chunked_s);
  const double rel = agree.max_rel_diff;
  std::printf(
      "prefill %lld tokens in chunks of %lld (Hq %lld, Hkv %lld, D %lld, bf16):\n"
      "  one call %.4f s, chunked %.4f s (kernels %.4f s): ratio %.3f\n"
      "  chunked O vs one-call O: max |diff| / max |O| = %.3g, non-finite %lld\n",
      static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(hq),
      static_cast<long long>(hkv), static_cast<long long>(d), one, chunked,
      Median(chunked_kernel_s), chunked / one, rel, static_cast<long long>(nonfinite));
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    Json j = Json::Object();
    j.Set("command", bench::BenchCommandLine())
        .Set("tokens", n)
        .Set("chunk", c)
        .Set("q_heads", hq)
        .Set("kv_heads", hkv)
        .Set("head_dim", d)
        .Set("one_call_s", one)
        .Set("chunked_s", chunked)
        .Set("chunked_kernel_s", Median(chunked_kernel_s))
        .Set("ratio", chunked / one)
        .Set("o_max_rel_diff", rel)
        .Set("o_nonfinite", nonfinite);
    ATTN_RETURN_IF_ERROR(bench::WriteJsonOut(absl::GetFlag(FLAGS_json_out), j));
  }
  if (nonfinite > 0 || rel > 2e-2) {
    return absl::InternalError("chunked prefill does not match the one call");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv, "attnbench_prefill: chunked prefill vs one call",
                                     "attnbench_prefill", &attnserve::Run);
}
