#include "bench/ring/single_gpu.h"

#include <cstdio>
#include <map>

#include "bench/cuda/plan_launch.h"
#include "bench/harness/rank_threads.h"
#include "bench/ring/ring_bench.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve::bench {
namespace {

// One cuDNN engine per device for the scaling cases (null without the cuDNN path or libcudnn),
// kept for the whole process as the service keeps one per device.
CudnnSdpa* ScalingCudnn(int device) {
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  static std::map<int, CudnnSdpa*>* engines = new std::map<int, CudnnSdpa*>;
  auto it = engines->find(device);
  if (it != engines->end()) return it->second;
  CudnnSdpa::Options o;
  o.device = device;
  absl::StatusOr<std::unique_ptr<CudnnSdpa>> e = CudnnSdpa::Create(o);
  if (!e.ok()) {
    std::printf("cuDNN unavailable on cuda:%d: %s\n", device, e.status().ToString().c_str());
  }
  return (*engines)[device] = e.ok() ? e->release() : nullptr;
#else
  (void)device;
  return nullptr;
#endif
}

}  // namespace

SingleGpu::~SingleGpu() {
  if (stream == nullptr) return;
  cudaSetDevice(device);
  cudaStreamSynchronize(stream);
  plan.reset();
  for (DeviceBuffer* b : {&q, &k, &v, &o, &lse}) b->Reset();
  cudaStreamDestroy(stream);
}

absl::StatusOr<std::unique_ptr<SingleGpu>> MakeSingleGpu(int device, const AttentionShape& shape,
                                                         bool causal, uint64_t seed,
                                                         const CudaOptions& cuda,
                                                         SingleGpuEngine engine) {
  auto g = std::make_unique<SingleGpu>();
  g->device = device;
  g->shape = shape;
  g->causal = causal;
  if (engine == SingleGpuEngine::kCudnn) {
    g->sdpa = ScalingCudnn(device);
    if (g->sdpa == nullptr) return absl::UnavailableError("engine cudnn: no cuDNN on this host");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  g->alloc = std::make_unique<CachingAllocator>(device);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
  const int64_t nq = shape.batch * shape.tokens * shape.q_heads * shape.head_dim;
  const int64_t nkv = shape.batch * shape.tokens * shape.kv_heads * shape.head_dim;
  ATTN_ASSIGN_OR_RETURN(g->q, DeviceBuffer::Create(*g->alloc, nq * 2));
  ATTN_ASSIGN_OR_RETURN(g->k, DeviceBuffer::Create(*g->alloc, nkv * 2));
  ATTN_ASSIGN_OR_RETURN(g->v, DeviceBuffer::Create(*g->alloc, nkv * 2));
  ATTN_ASSIGN_OR_RETURN(g->o, DeviceBuffer::Create(*g->alloc, nq * 2));
  ATTN_ASSIGN_OR_RETURN(
      g->lse, DeviceBuffer::Create(*g->alloc, shape.batch * shape.q_heads * shape.tokens * 4));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, g->q.get(), nq, seed, -1.f, 1.f, g->stream));
  CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(DType::kBF16, g->k.get(), nkv, seed + 1, -1.f, 1.f, g->stream));
  CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(DType::kBF16, g->v.get(), nkv, seed + 2, -1.f, 1.f, g->stream));
  ATTN_ASSIGN_OR_RETURN(g->plan, MakeBenchPlan(DenseSpecOf(causal), shape, DType::kBF16,
                                               *g->alloc, g->stream, cuda));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g->stream));
  return g;
}

absl::StatusOr<double> RunSingleOnce(SingleGpu& g) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(g.device));
  const auto t0 = Clock::now();
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  if (g.sdpa != nullptr) {
    ATTN_RETURN_IF_ERROR(g.sdpa->Forward(DenseSpecOf(g.causal), g.shape, DType::kBF16, g.q.get(),
                                         g.k.get(), g.v.get(), g.o.get(), g.lse.as<float>(),
                                         g.stream));
  } else
#endif
  {
    ATTN_RETURN_IF_ERROR(RunBenchPlan(*g.plan, g.q.get(), g.k.get(), g.v.get(), g.o.get(),
                                      g.lse.as<float>(), g.stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  return Seconds(t0, Clock::now());
}

}  // namespace attnserve::bench
