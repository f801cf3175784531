// attnbench_cuda: runs the CUDA kernel benchmark (bench/cuda_bench.h) and writes its JSON and
// markdown table.
//   attnbench_cuda [--cases=all|dense,sparse,...] [--warmup=3] [--iters=10] [--device=0]
//                  [--json=PATH] [--md=PATH] [--csr_dir=DIR] [--list]
//                  [--kernel=auto|sm80|sm90]  (sets ATTNSERVE_FLASH_KERNEL: which flash_fwd kernel
//                                              runs; rows report it as engine flash_fwd/sm80|sm90)
// Exit code: 0 when every case's correctness check passed, 1 otherwise, 2 on setup errors.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "bench/cuda_bench.h"

int main(int argc, char** argv) {
  attnserve::bench::CudaBenchOptions opt;
  std::string json_path, md_path;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) opt.command += ' ';
    opt.command += argv[i];
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* flag) -> const char* {
      const std::string f = std::string(flag) + "=";
      return absl::StartsWith(a, f) ? argv[i] + f.size() : nullptr;
    };
    if (const char* v = val("--cases")) {
      opt.cases = v;
    } else if (const char* v = val("--warmup")) {
      opt.warmup = std::atoi(v);
    } else if (const char* v = val("--iters")) {
      opt.iters = std::atoi(v);
    } else if (const char* v = val("--device")) {
      opt.device = std::atoi(v);
    } else if (const char* v = val("--json")) {
      json_path = v;
    } else if (const char* v = val("--md")) {
      md_path = v;
    } else if (const char* v = val("--kernel")) {
      const std::string k = v;
      if (k != "auto" && k != "sm80" && k != "sm90") {
        std::fprintf(stderr, "attnbench_cuda: --kernel must be auto, sm80 or sm90\n");
        return 2;
      }
      setenv("ATTNSERVE_FLASH_KERNEL", v, 1);
    } else if (const char* v = val("--csr_dir")) {
      opt.csr_dir = v;
    } else if (a == "--list") {
      for (const auto& n : attnserve::bench::CudaBenchCaseNames()) std::printf("%s\n", n.c_str());
      return 0;
    } else {
      std::fprintf(stderr, "attnbench_cuda: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto report = attnserve::bench::RunCudaBench(opt);
  if (!report.ok()) {
    std::fprintf(stderr, "attnbench_cuda: %s\n", report.status().ToString().c_str());
    return 2;
  }
  if (!json_path.empty()) std::ofstream(json_path) << report->json;
  if (!md_path.empty()) std::ofstream(md_path) << report->markdown;
  std::printf("\n%s", report->markdown.c_str());
  return report->all_correct ? 0 : 1;
}
