// attnbench_cuda's cases: dense / block-sparse / dilated shapes on one GPU, in run order from
// light to heavy, grouped so that --cases can name a group ("dense", "dense_d64", "sparse",
// "sparse_l2", "sparse_b64", "dilated", "compile", "huge") or single cases.
#ifndef ATTNSERVE_BENCH_CUDA_CASES_H_
#define ATTNSERVE_BENCH_CUDA_CASES_H_

#include <string>
#include <vector>

#include "core/cuda/cuda_options.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/dtype.h"

namespace attnserve::bench {

// One attnbench_cuda run: which cases, how each is timed, and the CUDA choices (attnbench_cuda's
// flags, see cuda_bench_main.cc).
struct CudaBenchOptions {
  int device = 0;
  // Comma-separated case names or group names ("dense", "dense_d64", "sparse", "sparse_l2",
  // "sparse_b64", "dilated", "compile", "huge");
  // "all" runs everything, in order from light to heavy.
  std::string cases = "all";
  int warmup = 3;       // untimed runs per case
  int iters = 10;       // timed runs per case (median reported)
  std::string csr_dir;  // when set, block-sparse layouts are dumped here as .npy
  CudaOptions cuda;     // flash kernel and engine choices, made once in main
};

struct Case {
  std::string name;
  std::string group;  // dense, dense_d64, sparse, dilated, compile, huge
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype = DType::kBF16;
  int warmup = -1;        // -1: the run's --warmup
  int iters = -1;         // -1: the run's --iters
  bool dump_csr = false;  // the layout goes to --csr_dir (compare_torch.py builds its BlockMask)
};

std::vector<Case> AllCases();

// `selection`: "all", or a comma list of case names and group names.
bool Selected(const Case& c, const std::string& selection);

// "block_sparse/random/b128/keep=0.098000/causal": the spec as the result rows name it.
std::string DescribeSpec(const AttentionSpec& spec);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_CASES_H_
