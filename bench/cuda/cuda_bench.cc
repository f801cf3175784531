#include "bench/cuda/cuda_bench.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cuda/attnserve_row.h"
#include "bench/cuda/case_runner.h"
#include "core/util/json.h"
#include "bench/harness/run_record.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {
namespace {

double Tflops(const Result& r) {
  return r.ms_median > 0 ? r.flops / (r.ms_median * 1e-3) / 1e12 : 0;
}
double TokensPerSecond(const Result& r) {
  return r.ms_median > 0
             ? static_cast<double>(r.c.shape.batch * r.c.shape.tokens) / (r.ms_median * 1e-3)
             : 0;
}

Json RowJson(const Result& r) {
  const Case& c = r.c;
  return Json::Object()
      .Set("name", c.name)
      .Set("group", c.group)
      .Set("variant", r.variant)
      .Set("engine", r.engine)
      .Set("flash_kernel", r.engine == "cudnn" ? std::string("none") : r.kernel)
      .Set("note", r.note)
      .Set("spec", DescribeSpec(c.spec))
      .Set("dtype", std::string(DTypeName(c.dtype)))
      .Set("batch", c.shape.batch)
      .Set("tokens", c.shape.tokens)
      .Set("q_heads", c.shape.q_heads)
      .Set("kv_heads", c.shape.kv_heads)
      .Set("head_dim", c.shape.head_dim)
      .Set("causal", c.spec.causal)
      .Set("iters", r.iters)
      .Set("ms_median", r.ms_median)
      .Set("ms_min", r.ms_min)
      .Set("ms_max", r.ms_max)
      .Set("flops", r.flops)
      .Set("tflops", Tflops(r))
      .Set("tokens_per_s", TokensPerSecond(r))
      .Set("sparsity", r.sparsity)
      .Set("peak_bytes", r.peak_bytes)
      .Set("plan_bytes", r.plan_bytes)
      .Set("compile_ms", r.compile_ms)
      .Set("plan_ms", r.plan_ms)
      .Set("check", Json::Object()
                        .Set("o_rel", r.check.o_rel)
                        .Set("lse_max_abs", r.check.lse_max_abs)
                        .Set("nonfinite", r.check.nonfinite)
                        .Set("ok", r.check.ok)
                        .Set("error", r.check.error))
      .Set("error", r.error);
}

constexpr char kMarkdownHeader[] =
    "| case | variant | engine | spec | B x N x Hq/Hkv x D | ms (median) | TFLOP/s | tokens/s "
    "| sparsity | peak GiB | compile ms | check rel err | ok |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

std::string MarkdownRow(const Result& r) {
  const Case& c = r.c;
  return absl::StrFormat(
      "| %s | %s | %s | %s | %d x %d x %d/%d x %d | %.3f | %.1f | %.3g | %.4f | %.2f | %.1f | "
      "%.2e | %s |\n",
      c.name, r.variant,
      r.engine == "cudnn" || r.kernel.empty() ? r.engine : absl::StrCat(r.engine, "/", r.kernel),
      DescribeSpec(c.spec), c.shape.batch, c.shape.tokens, c.shape.q_heads, c.shape.kv_heads,
      c.shape.head_dim, r.ms_median, Tflops(r), TokensPerSecond(r), r.sparsity,
      static_cast<double>(r.peak_bytes) / (1ull << 30), r.compile_ms, r.check.o_rel,
      r.error.empty() ? (r.check.ok ? "yes" : "CHECK FAILED") : ("ERROR: " + r.error));
}

// The own row of `c`: our kernels timed at the case's size, then checked at the small size.
Result RunOwnRow(const Case& c, const CudaBenchOptions& opt, CachingAllocator& alloc,
                 cudaStream_t stream) {
  Result r;
  r.c = c;
  r.kernel = "none";  // until a launch reports one
  const absl::Status st = RunCase(c, opt, alloc, stream, r);
  if (!st.ok()) {
    r.error = st.ToString();
    cudaGetLastError();  // clear a non-sticky error so later cases can run
  }
  r.check = SmallCheck(c, alloc, stream,
                       [&](const AttentionShape& shape, const void* q, const void* k,
                           const void* v, void* o, float* lse) -> absl::Status {
                         ATTN_ASSIGN_OR_RETURN(auto plan, MakeBenchPlan(c.spec, shape, c.dtype,
                                                                        alloc, stream, opt.cuda));
                         ATTN_RETURN_IF_ERROR(RunBenchPlan(*plan, q, k, v, o, lse, stream));
                         CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
                         return absl::OkStatus();
                       });
  return r;
}

Json CudaOptionsJson(const CudaOptions& o) {
  return Json::Object()
      .Set("engine", AttentionEngineName(o.engine))
      .Set("flash_kernel", FlashKernelArchName(o.flash.arch))
      .Set("sm90_schedule", Sm90ScheduleName(o.flash.sm90_schedule))
      .Set("persistent_max_ctas", o.flash.persistent_max_ctas)
      .Set("item_order", Sm90ItemOrderName(o.flash.item_order))
      .Set("sm90_query_tile", Sm90QueryTileName(o.flash.sm90_query_tile))
      .Set("sm90_key_tile", Sm90KeyTileName(o.flash.sm90_key_tile))
      .Set("sm90_cluster", Sm90ClusterName(o.flash.sm90_cluster))
      .Set("sm90_item_deal", Sm90ItemDealName(o.flash.sm90_item_deal))
      .Set("sm90_tma", o.flash.sm90_tma);
}

}  // namespace

std::vector<std::string> CudaBenchCaseNames() {
  std::vector<std::string> names;
  for (const Case& c : AllCases()) names.push_back(c.name);
  return names;
}

absl::StatusOr<CudaBenchReport> RunCudaBench(const CudaBenchOptions& opt) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError("attnbench_cuda: no CUDA device");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(opt.device));
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CachingAllocator alloc(opt.device);
  AttnserveEngine served(opt.device, alloc);

  CudaBenchReport report;
  report.markdown = kMarkdownHeader;
  Json rows = Json::Array();
  auto emit = [&](const Result& r) {
    if (!r.check.ok) report.all_correct = false;
    Json row = RowJson(r);
    std::printf("%s\n", row.Dump().c_str());
    std::fflush(stdout);
    rows.Push(std::move(row));
    report.markdown += MarkdownRow(r);
  };
  for (const Case& c : AllCases()) {
    if (!Selected(c, opt.cases)) continue;
    std::fprintf(stderr, "[attnbench_cuda] %s ...\n", c.name.c_str());
    const Result own = RunOwnRow(c, opt, alloc, stream);
    emit(own);
    // Dense/window cases: a second row for what attnserve's CudaDevice runs (cuDNN where it can).
    if (DenseOrWindow(c.spec)) {
      std::fprintf(stderr, "[attnbench_cuda] %s (attnserve) ...\n", c.name.c_str());
      emit(RunAttnserveRow(c, own, opt, served, alloc, stream));
    }
  }
  Json json = Json::Object();
  AddRunRecord(MakeRunRecord(CudaDeviceName(opt.device)), json);
  // The requested flash kernel (--kernel, or $ATTNSERVE_FLASH_KERNEL over it); each row's
  // flash_kernel is the one that ran.
  json.Set("flash_kernel_env", FlashKernelArchName(opt.cuda.flash.arch));
  json.Set("cuda_options", CudaOptionsJson(opt.cuda));
  json.Set("cudnn", served.Describe());
  json.Set("flops_formula", "4 * B * Hq * D * admitted pairs");
  json.Set("results", std::move(rows));
  report.json = json.Dump(2) + "\n";
  served.Reset();
  alloc.EmptyCache();
  cudaStreamDestroy(stream);
  return report;
}

}  // namespace attnserve::bench
