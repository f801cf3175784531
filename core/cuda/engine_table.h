// The measured engine table: for a GPU model and a case (pattern, causal, dtype class, head dim,
// tokens), how long our kernel and cuDNN took, so that CudaDevice's auto mode runs each dense or
// window request on the engine that was faster there instead of assuming cuDNN always is. Plain
// host code (no CUDA): the server parses --engine-table files with it, and its test runs without
// a GPU.
//
// The table is CSV text, one measured case a row (bench/engine_table.py writes the rows from
// attnbench_cuda's JSON results):
//
//   gpu,dtype,head_dim,causal,pattern,tokens,own_ms,cudnn_ms,source
//   NVIDIA H200,bf16,128,false,dense,16384,3.84467,3.50125,bench/results/<run>
//
// gpu is the model as cudaDeviceProp::name reports it; dtype bf16 or f16 (f32 requests run in
// bf16, so they use the bf16 rows); causal true/false (or 1/0); pattern dense or window; tokens
// the N of a square request (Nq = Nkv); own_ms and cudnn_ms the median times of the two engines
// on that case; source where the numbers came from. Fields are not quoted (none may hold a
// comma); blank lines and lines starting with '#' are skipped.
#ifndef ATTNSERVE_CORE_CUDA_ENGINE_TABLE_H_
#define ATTNSERVE_CORE_CUDA_ENGINE_TABLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor/dtype.h"

namespace attnserve {

// The header line every table starts with.
inline constexpr std::string_view kEngineTableHeader =
    "gpu,dtype,head_dim,causal,pattern,tokens,own_ms,cudnn_ms,source";

// Our kernel must take at most this fraction of cuDNN's time to be chosen: run-to-run noise on
// the same GPU is a few percent, and a 1% "win" should not flip a case back and forth between
// tables measured on different days.
inline constexpr double kEngineTableOwnMargin = 0.97;

struct EngineTableRow {
  std::string gpu;
  DType dtype = DType::kBF16;  // kBF16 or kF16
  int64_t head_dim = 0;
  bool causal = false;
  std::string pattern;  // "dense" or "window"
  int64_t tokens = 0;
  double own_ms = 0;
  double cudnn_ms = 0;
  std::string source;
};

enum class EngineTableChoice { kOwn, kCudnn };

struct EngineTableDecision {
  EngineTableChoice engine = EngineTableChoice::kCudnn;
  EngineTableRow row;  // the row the choice was made from
  // One line for the log: "measured on NVIDIA H200 (N=16384): own 3.84 ms, cudnn 3.50 ms
  // (bench/results/...)".
  std::string reason;
};

class EngineTable {
 public:
  EngineTable() = default;  // empty: Lookup never decides

  // INVALID_ARGUMENT naming `origin` (a path, or "built-in"), the line and the column for a
  // missing or wrong header, a row without 9 fields, a value out of its domain, or a row whose
  // case (everything but the times and source) repeats an earlier row's.
  static absl::StatusOr<EngineTable> Parse(std::string_view csv,
                                           std::string_view origin = "engine table");
  // The file's text, parsed with the path as origin; NOT_FOUND / PERMISSION_DENIED (etc.) naming
  // the path when it cannot be read.
  static absl::StatusOr<EngineTable> ReadFile(const std::string& path);

  // The decision for a square request of `tokens` tokens on a `model` GPU, from the rows of the
  // same model, pattern, causal flag, dtype class (f32 looks up bf16) and head dim: the row whose
  // tokens is nearest in log scale (a tie goes to the larger N), and our kernel only where it
  // took at most kEngineTableOwnMargin of cuDNN's time. nullopt when no row matches (the caller
  // keeps cuDNN where it runs).
  std::optional<EngineTableDecision> Lookup(std::string_view model, std::string_view pattern,
                                            bool causal, DType dtype, int64_t head_dim,
                                            int64_t tokens) const;

  const std::vector<EngineTableRow>& rows() const { return rows_; }

 private:
  std::vector<EngineTableRow> rows_;
};

// The table compiled in: the rows measured in bench/results (see engine_table.cc), as CSV text.
std::string_view BuiltinEngineTableCsv();
// That table, parsed once. It is parsed by engine_table_test as well; were it ever malformed, this
// logs the error to stderr and returns an empty table (auto mode then behaves as without one).
std::shared_ptr<const EngineTable> BuiltinEngineTable();

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_ENGINE_TABLE_H_
