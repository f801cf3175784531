// The one translation unit that includes cudnn_frontend (a large header-only library: keeping it
// here keeps every other file's compile time unchanged): graph keys and builds, the graph cache
// and the CudnnSdpa engine. Loading libcudnn is cudnn_library.cc's, the shape-only answers and
// helpers cudnn_sdpa_support.cc's. Compiled as plain C++.
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"

#include <cuda_runtime.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/cudnn_sdpa/cudnn_sdpa_internal.h"
#include "core/util/status_macros.h"

#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
namespace cudnn_frontend {
// cudnn_frontend's dynamic-loading mode resolves every cuDNN call with dlsym on this handle; it is
// set once by Cudnn() before any frontend call.
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace attnserve {
namespace {

namespace fe = cudnn_frontend;

// Variant-pack uids of the graph's user tensors.
constexpr int64_t kUidQ = 1;
constexpr int64_t kUidK = 2;
constexpr int64_t kUidV = 3;
constexpr int64_t kUidO = 4;
constexpr int64_t kUidStats = 5;

const char* FeCodeName(fe::error_code_t code) {
  switch (code) {
    case fe::error_code_t::OK:
      return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
      return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
      return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME:
      return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK:
      return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
      return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
      return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED:
      return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
      return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT:
      return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED:
      return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED:
      return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE:
      return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR:
      return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE:
      return "INVALID_VALUE";
    case fe::error_code_t::NVRTC_COMPILATION_FAILED:
      return "NVRTC_COMPILATION_FAILED";
  }
  return "UNKNOWN";
}

// A cudnn_frontend error -> absl::Status. "No engine for this graph" codes become UNIMPLEMENTED
// (callers fall back to their own kernels); the rest INVALID_ARGUMENT / UNAVAILABLE / INTERNAL.
absl::Status FeErrorToStatus(fe::error_t err, const char* step, const char* file, int line) {
  if (err.is_good()) return absl::OkStatus();
  const fe::error_code_t code = err.get_code();
  std::string msg = absl::StrCat(file, ":", line, ": cudnn_frontend ", step, ": ", FeCodeName(code),
                                 ": ", err.get_message());
  switch (code) {
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT:
    case fe::error_code_t::NVRTC_COMPILATION_FAILED:
      return absl::UnimplementedError(msg);
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
    case fe::error_code_t::INVALID_TENSOR_NAME:
    case fe::error_code_t::INVALID_VARIANT_PACK:
    case fe::error_code_t::INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    case fe::error_code_t::INVALID_CUDA_DEVICE:
    case fe::error_code_t::HANDLE_ERROR:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

#define FE_RETURN_IF_ERROR(expr, step)                                           \
  do {                                                                           \
    ::cudnn_frontend::error_t attn_fe_err_ = (expr);                             \
    if (attn_fe_err_.is_bad()) {                                                 \
      return FeErrorToStatus(std::move(attn_fe_err_), step, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

absl::Status CudnnStatusToStatus(cudnnStatus_t st, const char* what, const char* file, int line) {
  if (st == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(file, ":", line, ": ", what, ": ",
                                 fe::detail::get_error_string(st), " (", static_cast<int>(st), ")");
  if (st == CUDNN_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

#define CUDNN_RETURN_IF_ERROR(expr)                                          \
  do {                                                                       \
    const cudnnStatus_t attn_cudnn_st_ = (expr);                             \
    if (attn_cudnn_st_ != CUDNN_STATUS_SUCCESS) {                            \
      return CudnnStatusToStatus(attn_cudnn_st_, #expr, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)

// Runs `fn` (returning absl::Status or StatusOr) and turns any exception cudnn_frontend throws
// (dynamic loading throws std::runtime_error for missing symbols) into INTERNAL with file:line.
template <typename Fn>
auto NoThrow(const char* what, const char* file, int line, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(file, ":", line, ": ", what, " threw: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(file, ":", line, ": ", what, " threw"));
  }
}

// ---- loading libcudnn ----------------------------------------------------------------------


// Loaded once per process, never unloaded (graphs and handles refer into it until exit).
const CudnnLibrary& Cudnn() {
  static const CudnnLibrary* const lib = [] {
    auto* loaded = new CudnnLibrary(LoadCudnnLibrary());
#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
    fe::cudnn_dlhandle = loaded->handle;
#endif
    return loaded;
  }();
  return *lib;
}

// ---- graphs --------------------------------------------------------------------------------

// Everything a built graph depends on. window < 0: no window (dense or plain causal).
// kv_tokens / *_batch_stride 0: the plain case (s_kv == s_q, contiguous [B, N, H, D] tensors).
struct GraphKey {
  int64_t batch = 0;
  int64_t tokens = 0;  // s_q
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kBF16;
  bool causal = false;
  int64_t window = -1;
  uint32_t scale_bits = 0;  // the f32 scale's bits (exact match)
  int64_t kv_tokens = 0;        // s_kv; 0: tokens
  int64_t q_batch_stride = 0;   // elements; 0: tokens * q_heads * head_dim
  int64_t kv_batch_stride = 0;  // elements; 0: s_kv * kv_heads * head_dim
  auto operator<=>(const GraphKey&) const = default;

  int64_t s_kv() const { return kv_tokens > 0 ? kv_tokens : tokens; }
};

GraphKey MakeKey(const AttentionSpec& spec, const AttentionShape& shape, DType dtype) {
  GraphKey k;
  k.batch = shape.batch;
  k.tokens = shape.tokens;
  k.q_heads = shape.q_heads;
  k.kv_heads = shape.kv_heads;
  k.head_dim = shape.head_dim;
  k.dtype = dtype;
  k.causal = spec.causal;
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) {
    // A window reaching every key changes nothing: plan it as dense / causal.
    if (w->size < shape.tokens - 1) k.window = w->size;
  }
  const float scale = EffectiveScale(spec, shape.head_dim);
  std::memcpy(&k.scale_bits, &scale, sizeof(scale));
  return k;
}

GraphKey MakePieceKey(const CudnnSdpaPiece& piece) {
  GraphKey k;
  k.batch = piece.batch;
  k.tokens = piece.q_tokens;
  k.kv_tokens = piece.kv_tokens;
  k.q_heads = piece.q_heads;
  k.kv_heads = piece.kv_heads;
  k.head_dim = piece.head_dim;
  k.dtype = piece.dtype;
  k.causal = piece.causal;
  k.q_batch_stride = piece.q_batch_stride;
  k.kv_batch_stride = piece.kv_batch_stride;
  std::memcpy(&k.scale_bits, &piece.scale, sizeof(piece.scale));
  return k;
}

float KeyScale(const GraphKey& k) {
  float s;
  std::memcpy(&s, &k.scale_bits, sizeof(s));
  return s;
}

std::string KeyString(const GraphKey& k) {
  return absl::StrCat(
      "[B=", k.batch, ", N=", k.tokens,
      k.kv_tokens > 0 ? absl::StrCat(", N_kv=", k.kv_tokens) : std::string(),
      ", Hq=", k.q_heads, ", Hkv=", k.kv_heads,
      ", D=", k.head_dim, "] ", std::string(DTypeName(k.dtype)), k.causal ? " causal" : "",
      k.window >= 0 ? absl::StrCat(" window=", k.window) : "", " scale=", KeyScale(k));
}

// [B, N, H, D] row-major (rows heads * D apart, batches `batch_stride` apart; 0: N * H * D) seen
// as cuDNN's [B, H, N, D].
std::vector<int64_t> BshdStrides(const GraphKey& k, int64_t tokens, int64_t heads,
                                 int64_t batch_stride = 0) {
  return {batch_stride > 0 ? batch_stride : tokens * heads * k.head_dim, k.head_dim,
          heads * k.head_dim, 1};
}

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// `kernel_cache` non-null: a dynamic-shape graph whose compiled kernels are shared (through the
// cache) with every other graph of the same structure, whatever its B, N and H.
absl::StatusOr<BuiltGraph> BuildGraph(cudnnHandle_t handle, const GraphKey& k,
                                      const std::shared_ptr<fe::KernelCache>& kernel_cache) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (kernel_cache != nullptr) g->set_dynamic_shape_enabled(true).set_kernel_cache(kernel_cache);
  g->set_name("attnserve_sdpa_fwd")
      .set_io_data_type(k.dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);

  using fe::graph::Tensor_attributes;
  auto q = g->tensor(Tensor_attributes()
                         .set_name("Q")
                         .set_uid(kUidQ)
                         .set_dim({k.batch, k.q_heads, k.tokens, k.head_dim})
                         .set_stride(BshdStrides(k, k.tokens, k.q_heads, k.q_batch_stride)));
  auto kt = g->tensor(Tensor_attributes()
                          .set_name("K")
                          .set_uid(kUidK)
                          .set_dim({k.batch, k.kv_heads, k.s_kv(), k.head_dim})
                          .set_stride(BshdStrides(k, k.s_kv(), k.kv_heads, k.kv_batch_stride)));
  auto v = g->tensor(Tensor_attributes()
                         .set_name("V")
                         .set_uid(kUidV)
                         .set_dim({k.batch, k.kv_heads, k.s_kv(), k.head_dim})
                         .set_stride(BshdStrides(k, k.s_kv(), k.kv_heads, k.kv_batch_stride)));

  fe::graph::SDPA_attributes attr;
  attr.set_name("sdpa").set_generate_stats(true).set_attn_scale(KeyScale(k));
  // Keep j <= i + right and j > i - left (top-left diagonal: query row i and key row i share a
  // global position; true for whole sequences and for a ring's diagonal pieces).
  if (k.causal || k.window >= 0) attr.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT);
  if (k.causal) attr.set_diagonal_band_right_bound(0);
  if (k.window >= 0) {
    attr.set_diagonal_band_left_bound(static_cast<int>(k.window + 1));
    if (!k.causal) attr.set_diagonal_band_right_bound(static_cast<int>(k.window));
  }
  auto [o, stats] = g->sdpa(q, kt, v, attr);
  o->set_output(true)
      .set_uid(kUidO)
      .set_dim({k.batch, k.q_heads, k.tokens, k.head_dim})
      .set_stride(BshdStrides(k, k.tokens, k.q_heads));
  // Stats [B, Hq, N, 1] packed == our LSE [B, Hq, N].
  stats->set_output(true)
      .set_uid(kUidStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({k.batch, k.q_heads, k.tokens, 1})
      .set_stride({k.q_heads * k.tokens, k.tokens, 1, 1});

  FE_RETURN_IF_ERROR(g->validate(), "validate");
  FE_RETURN_IF_ERROR(g->build_operation_graph(handle), "build_operation_graph");
  FE_RETURN_IF_ERROR(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                     "create_execution_plans");
  FE_RETURN_IF_ERROR(g->check_support(), "check_support");
  FE_RETURN_IF_ERROR(g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  BuiltGraph built;
  FE_RETURN_IF_ERROR(g->get_workspace_size(built.workspace_bytes), "get_workspace_size");
  built.graph = std::move(g);
  return built;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace


// ---- CudnnSdpa -------------------------------------------------------------------------------

struct CudnnSdpa::Impl {
  struct Entry {
    GraphKey key;
    std::shared_ptr<fe::graph::Graph> graph;  // null: not supported, `status` says why
    absl::Status status;
    int64_t workspace_bytes = 0;
  };

  int device = 0;
  int max_entries = 64;
  CudnnWorkspaceAllocator workspace;
  cudnnHandle_t handle = nullptr;
  // Shared by all graphs when dynamic shapes are on (Options::share_kernels_across_shapes).
  std::shared_ptr<fe::KernelCache> kernel_cache;
  int64_t version = 0;
  std::string library;

  mutable std::mutex mu;
  std::list<Entry> lru;  // front: most recently used
  std::map<GraphKey, std::list<Entry>::iterator> index;
  CacheStats stats;

  ~Impl() {
    cudaSetDevice(device);
    // Graphs first: their plans refer to the handle.
    index.clear();
    lru.clear();
    kernel_cache.reset();
    if (handle != nullptr) {
      try {
        (void)fe::detail::destroy_handle(handle);
      } catch (...) {
      }
    }
  }

  // The cached entry for `key`, building it on a miss. Requires mu. An unsupported case is an
  // entry with a null graph (cached too, so repeated queries cost nothing).
  absl::StatusOr<Entry*> Get(const GraphKey& key) {
    if (auto it = index.find(key); it != index.end()) {
      lru.splice(lru.begin(), lru, it->second);
      ++stats.hits;
      return &*it->second;
    }
    ++stats.builds;
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<BuiltGraph> built = NoThrow(
        "cudnn_frontend graph build", __FILE__, __LINE__,
        [&]() -> absl::StatusOr<BuiltGraph> { return BuildGraph(handle, key, kernel_cache); });
    if (kernel_cache != nullptr && !built.ok()) {
      // Not every case has a dynamic-shape engine: try the shape-specialised graph.
      built =
          NoThrow("cudnn_frontend graph build", __FILE__, __LINE__,
                  [&]() -> absl::StatusOr<BuiltGraph> { return BuildGraph(handle, key, nullptr); });
    }
    stats.build_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Entry e;
    e.key = key;
    if (built.ok()) {
      e.graph = std::move(built->graph);
      e.workspace_bytes = built->workspace_bytes;
    } else if (absl::IsUnimplemented(built.status())) {
      e.status =
          absl::UnimplementedError(absl::StrCat("cuDNN ", version, " has no SDPA engine for ",
                                                KeyString(key), ": ", built.status().message()));
    } else {
      // Other failures (CUDA errors, out of memory) are not cached: they may pass next time.
      return absl::Status(built.status().code(),
                          absl::StrCat(KeyString(key), ": ", built.status().message()));
    }
    lru.push_front(std::move(e));
    index[key] = lru.begin();
    while (static_cast<int>(lru.size()) > max_entries) {
      index.erase(lru.back().key);
      lru.pop_back();
      ++stats.evictions;
    }
    return &lru.front();
  }

  absl::Status Forward(const AttentionSpec& spec, const AttentionShape& shape, DType dtype,
                       const void* q, const void* k, const void* v, void* o, float* lse,
                       cudaStream_t stream) {
    ATTN_ASSIGN_OR_RETURN(const bool covered, CudnnSdpaSupports(spec, shape, dtype));
    if (!covered) {
      return absl::UnimplementedError(absl::StrCat(
          "cudnn_sdpa: ", std::string(PatternName(spec.pattern)), spec.causal ? " causal" : "",
          " [B=", shape.batch, ", N=", shape.tokens, ", Hq=", shape.q_heads,
          ", Hkv=", shape.kv_heads, ", D=", shape.head_dim, "] ", std::string(DTypeName(dtype)),
          " is not covered (dense/window, bf16/f16, D % 8 == 0 and <= 256, N >= 2)"));
    }
    return Execute(MakeKey(spec, shape, dtype), q, k, v, o, lse, stream);
  }

  absl::Status ForwardPiece(const CudnnSdpaPiece& piece, const void* q, const void* k,
                            const void* v, void* o, float* lse, cudaStream_t stream) {
    ATTN_RETURN_IF_ERROR(CheckCudnnPieceCovered(piece));
    return Execute(MakePieceKey(piece), q, k, v, o, lse, stream);
  }

  absl::Status Execute(const GraphKey& key, const void* q, const void* k, const void* v, void* o,
                       float* lse, cudaStream_t stream) {
    const std::pair<const char*, const void*> ptrs[] = {
        {"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse}};
    for (const auto& [name, p] : ptrs) {
      if (p == nullptr || !Aligned16(p)) {
        return absl::InvalidArgumentError(
            absl::StrCat("cudnn_sdpa: ", name, ": expected a 16-byte aligned device pointer"));
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    ATTN_ASSIGN_OR_RETURN(Entry * e, Get(key));
    if (e->graph == nullptr) return e->status;

    void* ws = nullptr;
    if (e->workspace_bytes > 0) {
      const size_t bytes = static_cast<size_t>(e->workspace_bytes);
      if (workspace.allocate) {
        ATTN_ASSIGN_OR_RETURN(ws, workspace.allocate(bytes));
      } else {
        CUDA_RETURN_IF_ERROR(cudaMallocAsync(&ws, bytes, stream));
      }
    }
    absl::Status st = NoThrow("cudnn_frontend execute", __FILE__, __LINE__, [&]() -> absl::Status {
      CUDNN_RETURN_IF_ERROR(fe::detail::set_stream(handle, stream));
      std::unordered_map<int64_t, void*> pack = {{kUidQ, const_cast<void*>(q)},
                                                 {kUidK, const_cast<void*>(k)},
                                                 {kUidV, const_cast<void*>(v)},
                                                 {kUidO, o},
                                                 {kUidStats, lse}};
      FE_RETURN_IF_ERROR(e->graph->execute(handle, pack, ws), "execute");
      return absl::OkStatus();
    });
    if (ws != nullptr) {
      if (workspace.allocate) {
        if (workspace.free) workspace.free(ws);
      } else {
        const cudaError_t err = cudaFreeAsync(ws, stream);
        if (st.ok() && err != cudaSuccess) {
          st = CudaErrorToStatus(err, "cudaFreeAsync(ws, stream)", __FILE__, __LINE__);
        }
      }
    }
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat(KeyString(key), ": ", st.message()));
    }
    // Launch errors of the kernels themselves.
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
};

CudnnSdpa::CudnnSdpa(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnSdpa::~CudnnSdpa() = default;

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::Create(const Options& options) {
  if (options.max_cached_graphs < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cudnn_sdpa: max_cached_graphs: expected >= 1, got ", options.max_cached_graphs));
  }
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cudnn_sdpa: device: expected 0..", count - 1, ", got ", options.device));
  }
  const CudnnLibrary& lib = Cudnn();
  if (lib.handle == nullptr) return absl::UnavailableError(absl::StrCat("cudnn_sdpa: ", lib.error));

  auto impl = std::make_unique<Impl>();
  impl->device = options.device;
  impl->max_entries = options.max_cached_graphs;
  impl->workspace = options.workspace;
  impl->library = lib.path;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  absl::Status st = NoThrow("cudnnCreate", __FILE__, __LINE__, [&]() -> absl::Status {
    impl->version = static_cast<int64_t>(fe::detail::get_backend_version());
    if (impl->version < 90000) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuDNN ", impl->version, " at ", lib.path, ": need 9.x"));
    }
    CUDNN_RETURN_IF_ERROR(fe::detail::create_handle(&impl->handle));
    // Dynamic shapes and kernel caches need cuDNN >= 9.4.
    if (options.share_kernels_across_shapes && impl->version >= 90400) {
      impl->kernel_cache = std::make_shared<fe::KernelCache>();
    }
    return absl::OkStatus();
  });
  if (!st.ok()) {
    impl->handle = nullptr;
    return absl::UnavailableError(absl::StrCat("cudnn_sdpa: ", lib.path, ": ", st.message()));
  }
  return std::unique_ptr<CudnnSdpa>(new CudnnSdpa(std::move(impl)));
}

absl::StatusOr<bool> CudnnSdpa::Supports(const AttentionSpec& spec, const AttentionShape& shape,
                                         DType dtype) {
  ATTN_ASSIGN_OR_RETURN(const bool covered, CudnnSdpaSupports(spec, shape, dtype));
  if (!covered) return false;
  std::lock_guard<std::mutex> lock(impl_->mu);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  ATTN_ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(MakeKey(spec, shape, dtype)));
  return e->graph != nullptr;
}

absl::Status CudnnSdpa::Forward(const AttentionSpec& spec, const AttentionShape& shape, DType dtype,
                                const void* q, const void* k, const void* v, void* o, float* lse,
                                cudaStream_t stream) {
  return impl_->Forward(spec, shape, dtype, q, k, v, o, lse, stream);
}

absl::Status CudnnSdpa::ForwardPiece(const CudnnSdpaPiece& piece, const void* q, const void* k,
                                     const void* v, void* o, float* lse, cudaStream_t stream) {
  return impl_->ForwardPiece(piece, q, k, v, o, lse, stream);
}

absl::StatusOr<int64_t> CudnnSdpa::WorkspaceBytes(const AttentionSpec& spec,
                                                  const AttentionShape& shape, DType dtype) {
  ATTN_ASSIGN_OR_RETURN(const bool covered, CudnnSdpaSupports(spec, shape, dtype));
  if (!covered) return absl::UnimplementedError("cudnn_sdpa: case not covered");
  std::lock_guard<std::mutex> lock(impl_->mu);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  ATTN_ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(MakeKey(spec, shape, dtype)));
  if (e->graph == nullptr) return e->status;
  return e->workspace_bytes;
}

int CudnnSdpa::device() const { return impl_->device; }
int64_t CudnnSdpa::backend_version() const { return impl_->version; }
const std::string& CudnnSdpa::library() const { return impl_->library; }

CudnnSdpa::CacheStats CudnnSdpa::cache_stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  CacheStats s = impl_->stats;
  s.entries = static_cast<int64_t>(impl_->lru.size());
  return s;
}

}  // namespace attnserve
