#include "bench/cuda_bench.h"

#include <cublas_v2.h>  // types only: cuBLAS is loaded with dlopen (see CublasApi)
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/tensor/tensor.h"
#include "core/util/status_macros.h"

#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve::bench {
namespace {

struct Case {
  std::string name;
  std::string group;  // dense, sparse, dilated, compile, huge
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype = DType::kBF16;
  int warmup = -1;  // -1: options.warmup
  int iters = -1;   // -1: options.iters
  bool dump_csr = false;
};

AttentionShape Shape(int64_t b, int64_t n, int64_t hq, int64_t hkv, int64_t d) {
  return AttentionShape{b, n, hq, hkv, d};
}

// Random generator keep fraction giving `sparsity` skipped at nb blocks: each row keeps the
// diagonal plus round(keep * nb) others.
double KeepFor(double sparsity, int64_t nb) {
  const double kept_per_row = (1.0 - sparsity) * static_cast<double>(nb);
  return std::max(0.0, (kept_per_row - 1.0) / static_cast<double>(nb));
}
// Local window width giving ~`sparsity`: 2W + 1 kept blocks per row.
int64_t WidthFor(double sparsity, int64_t nb) {
  const double kept_per_row = (1.0 - sparsity) * static_cast<double>(nb);
  return std::max<int64_t>(0, std::llround((kept_per_row - 1.0) / 2.0));
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  // Dense: bf16, D = 128, Hq = Hkv = 16, B * N = 16384 tokens (B = 1 at 65536).
  for (int64_t n : {4096, 16384, 65536}) {
    for (bool causal : {false, true}) {
      Case c;
      c.name = absl::StrCat("dense_n", n, causal ? "_causal" : "");
      c.group = "dense";
      c.spec.pattern = DenseSpec{};
      c.spec.causal = causal;
      c.shape = Shape(std::max<int64_t>(1, 16384 / n), n, 16, 16, 128);
      cases.push_back(c);
    }
  }
  // Block sparse at N = 65536 (block 128, 512 blocks): 90% and 99% skipped.
  {
    const int64_t n = 65536, nb = n / 128;
    for (double s : {0.90, 0.99}) {
      const std::string tag = s < 0.95 ? "s90" : "s99";
      Case c;
      c.group = "sparse";
      c.shape = Shape(1, n, 16, 16, 128);
      c.dump_csr = true;
      c.name = absl::StrCat("sparse_random_", tag);
      c.spec.pattern = BlockSparseSpec{128, RandomGen{KeepFor(s, nb), 2024}};
      cases.push_back(c);
      c.name = absl::StrCat("sparse_local_window_", tag);
      c.spec.pattern = BlockSparseSpec{128, LocalWindowGen{WidthFor(s, nb)}};
      cases.push_back(c);
    }
  }
  // Dilated (LongNet): segments [2048, 4096, 8192, 16384], rates [1, 2, 4, 8], Hq = 8.
  for (int64_t n : {65536, 1048576}) {
    Case c;
    c.name = absl::StrCat("dilated_n", n);
    c.group = "dilated";
    c.spec.pattern = DilatedSpec{{2048, 4096, 8192, 16384}, {1, 2, 4, 8}};
    c.shape = Shape(1, n, 8, 8, 128);
    if (n > 65536) c.iters = 3;
    cases.push_back(c);
  }
  // Pattern compile of 1M tokens at 99.9% skipped (and the run, which is cheap).
  {
    const int64_t n = 1048576, nb = n / 128;
    Case c;
    c.name = "compile_n1048576_s999";
    c.group = "compile";
    c.spec.pattern = BlockSparseSpec{128, RandomGen{KeepFor(0.999, nb), 77}};
    c.shape = Shape(1, n, 8, 8, 128);
    c.dump_csr = true;
    c.iters = 3;
    cases.push_back(c);
  }
  // Heavy: dense causal over 1M tokens; block sparse 99.9% at 8M tokens.
  {
    Case c;
    c.name = "huge_dense_causal_n1048576";
    c.group = "huge";
    c.spec.pattern = DenseSpec{};
    c.spec.causal = true;
    c.shape = Shape(1, 1048576, 8, 8, 128);
    c.warmup = 0;
    c.iters = 1;
    cases.push_back(c);
  }
  {
    const int64_t n = 8388608, nb = n / 128;
    Case c;
    c.name = "huge_sparse_n8388608_s999";
    c.group = "huge";
    c.spec.pattern = BlockSparseSpec{128, RandomGen{KeepFor(0.999, nb), 88}};
    c.shape = Shape(1, n, 4, 4, 128);
    c.warmup = 1;
    c.iters = 2;
    cases.push_back(c);
  }
  return cases;
}

bool Selected(const Case& c, const std::string& sel) {
  if (sel == "all") return true;
  for (absl::string_view s : absl::StrSplit(sel, ',')) {
    if (s == c.name || s == c.group) return true;
  }
  return false;
}

std::string DescribeSpec(const AttentionSpec& spec) {
  std::string s(PatternName(spec.pattern));
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    absl::StrAppend(&s, "/", std::string(GeneratorName(bs->generator)), "/b", bs->block_size);
    if (const auto* r = std::get_if<RandomGen>(&bs->generator)) {
      absl::StrAppendFormat(&s, "/keep=%.6f", r->keep);
    }
    if (const auto* w = std::get_if<LocalWindowGen>(&bs->generator)) {
      absl::StrAppend(&s, "/width=", w->width);
    }
  }
  if (const auto* d = std::get_if<DilatedSpec>(&spec.pattern)) {
    absl::StrAppend(&s, "/w=[", absl::StrJoin(d->segment_lengths, ","), "]/r=[",
                    absl::StrJoin(d->dilation_rates, ","), "]");
  }
  if (spec.causal) s += "/causal";
  return s;
}

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
struct Check {
  double o_rel = -1;
  double lse_max_abs = -1;
  int64_t nonfinite = -1;
  bool ok = false;
  std::string error;
};

// Runs one forward of the case's spec at `shape` on device pointers and synchronizes `stream`.
using SmallRun = std::function<absl::Status(const AttentionShape& shape, const void* q,
                                            const void* k, const void* v, void* o, float* lse)>;

Check SmallCheck(const Case& c, CachingAllocator& alloc, cudaStream_t stream,
                 const SmallRun& run_small) {
  Check out;
  const bool dilated = std::holds_alternative<DilatedSpec>(c.spec.pattern);
  const AttentionShape shape =
      Shape(1, 700, dilated ? 8 : 2, dilated ? 8 : 2, c.shape.head_dim);
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

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (ch == '\n') {
      o += "\\n";
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      o += ' ';
    } else {
      o += ch;
    }
  }
  return o;
}

std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  return absl::StrFormat("%.6g", x);
}

struct Result {
  Case c;
  std::string variant = "own";       // "own": our kernels; "attnserve": what the service runs
  std::string engine = "flash_fwd";  // the kernels timed: "flash_fwd" or "cudnn"
  std::string kernel;                // flash_fwd kernel that ran: "sm80" / "sm90" ("none": none)
  std::string note;                  // why an attnserve row is not on cuDNN
  std::string error;
  double compile_ms = 0;
  double plan_ms = 0;
  double ms_median = 0, ms_min = 0, ms_max = 0;
  int iters = 0;
  double flops = 0, sparsity = 0;
  int64_t peak_bytes = 0;
  int64_t plan_bytes = 0;
  Check check;
};

using Launch =
    std::function<absl::Status(const void* q, const void* k, const void* v, void* o, float* lse)>;
absl::Status TimeLaunches(const Launch& launch, const Case& c, const CudaBenchOptions& opt,
                          CachingAllocator& alloc, cudaStream_t stream, Result& r);

absl::Status RunCase(const Case& c, const CudaBenchOptions& opt, CachingAllocator& alloc,
                     cudaStream_t stream, Result& r) {
  alloc.EmptyCache();
  alloc.ResetPeak();
  // Compile on the host (timed), then plan (upload).
  CompiledPattern compiled;
  const CompiledPattern* compiled_ptr = nullptr;
  const bool dense = std::holds_alternative<DenseSpec>(c.spec.pattern);
  if (!dense) {
    const auto t0 = std::chrono::steady_clock::now();
    ATTN_ASSIGN_OR_RETURN(compiled, CompilePattern(c.spec, c.shape.tokens, c.shape.q_heads));
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
  ATTN_ASSIGN_OR_RETURN(auto plan, CudaAttentionPlan::Create(c.spec, c.shape, c.dtype, alloc,
                                                             stream, compiled_ptr));
  r.plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  compiled = CompiledPattern{};  // host CSR no longer needed
  r.flops = plan->flops();
  r.sparsity = plan->sparsity();
  r.plan_bytes = plan->plan_bytes();
  return TimeLaunches([&](const void* q, const void* k, const void* v, void* o,
                          float* lse) { return plan->Run(q, k, v, o, lse, stream); },
                      c, opt, alloc, stream, r);
}

// Allocates and fills the case's inputs on the device, then times `launch` with CUDA events:
// warm-up runs, then the median (min, max) of the timed runs; records the allocator's peak.
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
  cudaEvent_t e0, e1;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
  std::vector<double> ms;
  absl::Status st;
  for (int i = 0; i < iters && st.ok(); ++i) {
    cudaEventRecord(e0, stream);
    st = launch(q.get(), k.get(), v.get(), o.get(), lse.as<float>());
    cudaEventRecord(e1, stream);
    const cudaError_t err = cudaEventSynchronize(e1);
    if (err != cudaSuccess) st = CudaErrorToStatus(err, "cudaEventSynchronize", __FILE__, __LINE__);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
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

std::string DeviceName(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown";
  return prop.name;
}

std::string NowUtc() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// cuBLAS, for the GEMM yardstick only, resolved at run time so that attnbench needs neither a
// link-time cuBLAS nor one in its bundle (the GPU host's toolkit or PyTorch brings one).
struct CublasApi {
  using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
  using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
  using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm_ex = nullptr;

  static absl::StatusOr<CublasApi> Load() {
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                             "/usr/local/cuda/lib64/libcublas.so.13",
                             "/usr/local/cuda/lib64/libcublas.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) return absl::UnavailableError("libcublas not found (dlopen)");
    CublasApi api;
    api.create = reinterpret_cast<CreateFn>(dlsym(lib, "cublasCreate_v2"));
    api.destroy = reinterpret_cast<DestroyFn>(dlsym(lib, "cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    api.gemm_ex = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
    if (!api.create || !api.destroy || !api.set_stream || !api.gemm_ex) {
      return absl::UnavailableError("libcublas lacks cublasCreate_v2/cublasGemmEx");
    }
    return api;
  }
};

class CudaBenchBackend final : public BenchBackend {
 public:
  explicit CudaBenchBackend(int device) : device_(device), alloc_(device) {}
  ~CudaBenchBackend() override {
    plan_.reset();
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  absl::Status Init() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }

  std::string device() const override {
    return absl::StrCat("cuda:", device_, ": ", DeviceName(device_));
  }

  absl::Status Prepare(const AttentionSpec& spec, const CompiledPattern& compiled,
                       const HostTensor& q, const HostTensor& k, const HostTensor& v) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    shape_ = AttentionShape{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
    dtype_ = q.dtype();
    plan_.reset();
    ATTN_ASSIGN_OR_RETURN(plan_,
                          CudaAttentionPlan::Create(spec, shape_, dtype_, alloc_, stream_, &compiled));
    ATTN_ASSIGN_OR_RETURN(q_, DeviceBuffer::Create(alloc_, q.nbytes()));
    ATTN_ASSIGN_OR_RETURN(k_, DeviceBuffer::Create(alloc_, k.nbytes()));
    ATTN_ASSIGN_OR_RETURN(v_, DeviceBuffer::Create(alloc_, v.nbytes()));
    ATTN_ASSIGN_OR_RETURN(out_.o, HostTensor::Create(dtype_, {shape_.batch, shape_.tokens,
                                                              shape_.q_heads, shape_.head_dim}));
    ATTN_ASSIGN_OR_RETURN(out_.lse, HostTensor::Create(DType::kF32, {shape_.batch, shape_.q_heads,
                                                                     shape_.tokens}));
    ATTN_ASSIGN_OR_RETURN(o_, DeviceBuffer::Create(alloc_, out_.o.nbytes()));
    ATTN_ASSIGN_OR_RETURN(lse_, DeviceBuffer::Create(alloc_, out_.lse.nbytes()));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(q_.get(), q.data(), q.nbytes(), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(k_.get(), k.data(), k.nbytes(), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(v_.get(), v.data(), v.nbytes(), cudaMemcpyHostToDevice));
    // Poisoned, so an element the kernels skip shows up in attnbench's check.
    CUDA_RETURN_IF_ERROR(cudaMemset(o_.get(), 0xFF, out_.o.nbytes()));
    CUDA_RETURN_IF_ERROR(cudaMemset(lse_.get(), 0xFF, out_.lse.nbytes()));
    return absl::OkStatus();
  }

  absl::Status Run() override {
    if (plan_ == nullptr) return absl::FailedPreconditionError("Run before Prepare");
    ATTN_RETURN_IF_ERROR(
        plan_->Run(q_.get(), k_.get(), v_.get(), o_.get(), lse_.as<float>(), stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<const AttentionOutputs*> Outputs() override {
    if (plan_ == nullptr) return absl::FailedPreconditionError("Outputs before Prepare");
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(out_.o.data(), o_.get(), out_.o.nbytes(), cudaMemcpyDeviceToHost));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(out_.lse.data(), lse_.get(), out_.lse.nbytes(), cudaMemcpyDeviceToHost));
    return &out_;
  }

  absl::StatusOr<double> MeasureGemmGflops() override {
    constexpr int kN = 8192;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Create(alloc_, size_t{kN} * kN * 2));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(alloc_, size_t{kN} * kN * 2));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer c, DeviceBuffer::Create(alloc_, size_t{kN} * kN * 2));
    CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, a.get(), int64_t{kN} * kN, 11, -1, 1, stream_));
    CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, b.get(), int64_t{kN} * kN, 12, -1, 1, stream_));
    ATTN_ASSIGN_OR_RETURN(const CublasApi api, CublasApi::Load());
    cublasHandle_t h;
    if (api.create(&h) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate");
    api.set_stream(h, stream_);
    const float alpha = 1.f, beta = 0.f;
    auto gemm = [&]() {
      return api.gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &alpha, a.get(), CUDA_R_16BF,
                          kN, b.get(), CUDA_R_16BF, kN, &beta, c.get(), CUDA_R_16BF, kN,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; ++i) st = gemm();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    constexpr int kIters = 10;
    cudaEventRecord(e0, stream_);
    for (int i = 0; i < kIters && st == CUBLAS_STATUS_SUCCESS; ++i) st = gemm();
    cudaEventRecord(e1, stream_);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    api.destroy(h);
    if (st != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasGemmEx failed");
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return 2.0 * kN * kN * kN * kIters / (ms * 1e-3) / 1e9;
  }

 private:
  const int device_;
  cudaStream_t stream_ = nullptr;
  CachingAllocator alloc_;
  std::unique_ptr<CudaAttentionPlan> plan_;
  AttentionShape shape_;
  DType dtype_ = DType::kBF16;
  DeviceBuffer q_, k_, v_, o_, lse_;
  AttentionOutputs out_;
};

bool DenseOrWindow(const AttentionSpec& spec) {
  return std::holds_alternative<DenseSpec>(spec.pattern) ||
         std::holds_alternative<WindowSpec>(spec.pattern);
}

// The cuDNN engine as attnserve's CudaDevice holds it (one per device, workspace from the
// device's caching allocator on its one stream), created on first use, and the same choice
// CudaDevice makes in its default (auto) mode: cuDNN when the case is in CudnnSdpaSupports, our
// kernels support the head dim too, and the loaded cuDNN has an engine for it.
class AttnserveEngine {
 public:
  AttnserveEngine(int device, CachingAllocator& alloc) : device_(device), alloc_(alloc) {}

#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  // The engine to time `c` on, or null with `why` set when attnserve would run flash_fwd.
  CudnnSdpa* For(const Case& c, std::string* why) {
    const absl::StatusOr<bool> meant = CudnnSdpaSupports(c.spec, c.shape, c.dtype);
    if (!meant.ok() || !*meant || !CudaSupportsHeadDim(c.shape.head_dim)) {
      *why = "outside the cuDNN engine's cases";
      return nullptr;
    }
    if (sdpa_ == nullptr && status_.ok()) {
      CudnnSdpa::Options options;
      options.device = device_;
      options.workspace.allocate = [this](size_t bytes) -> absl::StatusOr<void*> {
        return alloc_.Allocate(bytes);
      };
      options.workspace.free = [this](void* ptr) { alloc_.Free(ptr); };
      absl::StatusOr<std::unique_ptr<CudnnSdpa>> made = CudnnSdpa::Create(options);
      if (made.ok()) {
        sdpa_ = *std::move(made);
      } else {
        status_ = made.status();
      }
    }
    if (sdpa_ == nullptr) {
      *why = absl::StrCat("cuDNN unavailable: ", status_.ToString());
      return nullptr;
    }
    const absl::StatusOr<bool> has = sdpa_->Supports(c.spec, c.shape, c.dtype);
    if (!has.ok() || !*has) {
      *why = has.ok() ? "cuDNN has no engine for the case" : has.status().ToString();
      return nullptr;
    }
    return sdpa_.get();
  }
  std::string Describe() const {
    if (sdpa_ != nullptr) {
      return absl::StrCat(sdpa_->backend_version(), " from ", sdpa_->library());
    }
    return status_.ok() ? "not loaded" : status_.ToString();
  }
  void Reset() { sdpa_.reset(); }
#else
  std::string Describe() const { return "not built (no cudnn_frontend headers)"; }
  void Reset() {}
#endif

 private:
  const int device_;
  CachingAllocator& alloc_;
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  std::unique_ptr<CudnnSdpa> sdpa_;
  absl::Status status_;  // why sdpa_ could not be created
#endif
};

// The "attnserve" row of a dense/window case: cuDNN timed the same way as our kernels (same
// inputs, warm-up, median), checked at the small size; or, where attnserve would run our kernels,
// the own row again with the reason in `note`.
Result RunAttnserveRow(const Case& c, const Result& own, const CudaBenchOptions& opt,
                       AttnserveEngine& served, CachingAllocator& alloc, cudaStream_t stream) {
  Result a;
  std::string why = "build without the cuDNN path";
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  CudnnSdpa* sdpa = served.For(c, &why);
  if (sdpa != nullptr) {
    a.c = c;
    a.variant = "attnserve";
    a.engine = "cudnn";
    alloc.EmptyCache();
    alloc.ResetPeak();
    a.flops = own.flops;  // the same exact pair count
    a.sparsity = own.sparsity;
    if (a.flops <= 0 && std::holds_alternative<DenseSpec>(c.spec.pattern)) {  // own run failed
      const double n = static_cast<double>(c.shape.tokens);
      a.flops = 4.0 * static_cast<double>(c.shape.batch * c.shape.q_heads * c.shape.head_dim) *
                (c.spec.causal ? n * (n + 1) / 2 : n * n);
    }
    const absl::Status st = TimeLaunches(
        [&](const void* q, const void* k, const void* v, void* o, float* lse) {
          return sdpa->Forward(c.spec, c.shape, c.dtype, q, k, v, o, lse, stream);
        },
        c, opt, alloc, stream, a);
    if (!st.ok()) {
      a.error = st.ToString();
      cudaGetLastError();
    }
    a.check = SmallCheck(
        c, alloc, stream,
        [&](const AttentionShape& shape, const void* q, const void* k, const void* v, void* o,
            float* lse) -> absl::Status {
          ATTN_RETURN_IF_ERROR(sdpa->Forward(c.spec, shape, c.dtype, q, k, v, o, lse, stream));
          CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
          return absl::OkStatus();
        });
    return a;
  }
#else
  (void)served;
  (void)opt;
  (void)alloc;
  (void)stream;
#endif
  a = own;
  a.variant = "attnserve";
  a.engine = "flash_fwd";
  a.note = why;
  return a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BenchBackend>> MakeCudaBenchBackend(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError("--backend cuda: no CUDA device");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("--device: ", device, " out of range [0, ", count, ")"));
  }
  auto backend = std::make_unique<CudaBenchBackend>(device);
  ATTN_RETURN_IF_ERROR(backend->Init());
  return backend;
}

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
  const std::string device = DeviceName(opt.device);
  const char* commit = std::getenv("ATTNSERVE_COMMIT");
  AttnserveEngine served(opt.device, alloc);

  CudaBenchReport report;
  std::vector<std::string> rows;
  std::string md =
      "| case | variant | engine | spec | B x N x Hq/Hkv x D | ms (median) | TFLOP/s | tokens/s "
      "| sparsity | peak GiB | compile ms | check rel err | ok |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto emit = [&](const Result& r) {
    const Case& c = r.c;
    if (!r.check.ok) report.all_correct = false;
    const double tflops = r.ms_median > 0 ? r.flops / (r.ms_median * 1e-3) / 1e12 : 0;
    const double tokens_per_s =
        r.ms_median > 0 ? static_cast<double>(c.shape.batch * c.shape.tokens) /
                              (r.ms_median * 1e-3)
                        : 0;
    std::string row = absl::StrCat(
        "{\"name\": \"", c.name, "\", \"group\": \"", c.group, "\", \"variant\": \"", r.variant,
        "\", \"engine\": \"", r.engine, "\", \"flash_kernel\": \"",
        r.engine == "cudnn" ? std::string("none") : r.kernel, "\", \"note\": \"",
        JsonEscape(r.note), "\", \"spec\": \"",
        JsonEscape(DescribeSpec(c.spec)), "\", \"dtype\": \"", std::string(DTypeName(c.dtype)),
        "\", \"batch\": ", c.shape.batch, ", \"tokens\": ", c.shape.tokens,
        ", \"q_heads\": ", c.shape.q_heads, ", \"kv_heads\": ", c.shape.kv_heads,
        ", \"head_dim\": ", c.shape.head_dim, ", \"causal\": ", c.spec.causal ? "true" : "false",
        ", \"iters\": ", r.iters, ", \"ms_median\": ", Num(r.ms_median),
        ", \"ms_min\": ", Num(r.ms_min), ", \"ms_max\": ", Num(r.ms_max),
        ", \"flops\": ", Num(r.flops), ", \"tflops\": ", Num(tflops),
        ", \"tokens_per_s\": ", Num(tokens_per_s), ", \"sparsity\": ", Num(r.sparsity),
        ", \"peak_bytes\": ", r.peak_bytes, ", \"plan_bytes\": ", r.plan_bytes,
        ", \"compile_ms\": ", Num(r.compile_ms), ", \"plan_ms\": ", Num(r.plan_ms),
        ", \"check\": {\"o_rel\": ", Num(r.check.o_rel),
        ", \"lse_max_abs\": ", Num(r.check.lse_max_abs), ", \"nonfinite\": ", r.check.nonfinite,
        ", \"ok\": ", r.check.ok ? "true" : "false", ", \"error\": \"", JsonEscape(r.check.error),
        "\"}, \"error\": \"", JsonEscape(r.error), "\"}");
    std::printf("%s\n", row.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(row));
    absl::StrAppendFormat(
        &md,
        "| %s | %s | %s | %s | %d x %d x %d/%d x %d | %.3f | %.1f | %.3g | %.4f | %.2f | %.1f | "
        "%.2e | %s |\n",
        c.name, r.variant,
        r.engine == "cudnn" || r.kernel.empty() ? r.engine : absl::StrCat(r.engine, "/", r.kernel),
        DescribeSpec(c.spec), c.shape.batch, c.shape.tokens,
        c.shape.q_heads, c.shape.kv_heads, c.shape.head_dim, r.ms_median, tflops, tokens_per_s,
        r.sparsity, static_cast<double>(r.peak_bytes) / (1ull << 30), r.compile_ms, r.check.o_rel,
        r.error.empty() ? (r.check.ok ? "yes" : "CHECK FAILED") : ("ERROR: " + r.error));
  };

  for (const Case& c : AllCases()) {
    if (!Selected(c, opt.cases)) continue;
    Result r;
    r.c = c;
    std::fprintf(stderr, "[attnbench_cuda] %s ...\n", c.name.c_str());
    SetLastFlashKernelName("none");
    const absl::Status st = RunCase(c, opt, alloc, stream, r);
    r.kernel = LastFlashKernelName();  // the timed launches' kernel (before the check's runs)
    if (!st.ok()) {
      r.error = st.ToString();
      cudaGetLastError();  // clear a non-sticky error so later cases can run
    }
    r.check = SmallCheck(c, alloc, stream,
                         [&](const AttentionShape& shape, const void* q, const void* k,
                             const void* v, void* o, float* lse) -> absl::Status {
                           ATTN_ASSIGN_OR_RETURN(
                               auto plan,
                               CudaAttentionPlan::Create(c.spec, shape, c.dtype, alloc, stream));
                           ATTN_RETURN_IF_ERROR(plan->Run(q, k, v, o, lse, stream));
                           CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
                           return absl::OkStatus();
                         });
    emit(r);
    // Dense/window cases: a second row for what attnserve's CudaDevice runs (cuDNN where it can).
    if (DenseOrWindow(c.spec)) {
      std::fprintf(stderr, "[attnbench_cuda] %s (attnserve) ...\n", c.name.c_str());
      emit(RunAttnserveRow(c, r, opt, served, alloc, stream));
    }
  }
  served.Reset();
  alloc.EmptyCache();
  cudaStreamDestroy(stream);
  report.json = absl::StrCat("{\"device\": \"", JsonEscape(device), "\", \"date\": \"", NowUtc(),
                             "\", \"commit\": \"", commit ? JsonEscape(commit) : "unknown",
                             "\", \"command\": \"", JsonEscape(opt.command),
                             "\", \"flash_kernel_env\": \"",
                             JsonEscape(std::getenv("ATTNSERVE_FLASH_KERNEL") != nullptr
                                            ? std::getenv("ATTNSERVE_FLASH_KERNEL")
                                            : "auto"),
                             "\", \"cudnn\": \"",
                             JsonEscape(served.Describe()),
                             "\", \"flops_formula\": \"4 * B * Hq * D * admitted pairs\", "
                             "\"results\": [\n  ",
                             absl::StrJoin(rows, ",\n  "), "\n]}\n");
  report.markdown = md;
  return report;
}

}  // namespace attnserve::bench
