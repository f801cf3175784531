// attnbench_cuda: runs the CUDA kernel benchmark (bench/cuda/cuda_bench.h) and writes its JSON and
// markdown table.
//   attnbench_cuda [--cases=all|dense,sparse,...] [--warmup=3] [--iters=10] [--device=0]
//                  [--json=PATH] [--md=PATH] [--csr_dir=DIR] [--list]
//                  [--kernel=auto|sm80|sm90] [--sm90-schedule=persistent|v3]
//                  [--sm90_tma] [--sm90_query_tile=auto|128|192] [--sm90_key_tile=auto|128|176]
//                  [--sm90_cluster=auto|1|2] [--sm90_item_deal=auto|static|dynamic]
// --kernel and --sm90-schedule pick the flash kernel; the environment (ATTNSERVE_FLASH_KERNEL,
// ATTNSERVE_SM90_VARIANT, ATTNSERVE_SM90_V3_MAX_CTAS, ATTNSERVE_SM90_V3_ORDER,
// ATTNSERVE_ATTENTION_ENGINE) overrides them, read once at start; rows report the kernel that ran
// (flash_kernel: sm80, sm90 (single tile), sm90v3 (persistent), decode, decode_sm90).
// Exit code: 0 when every case's correctness check passed, 1 otherwise, 2 on setup errors.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "bench/cuda/cuda_bench.h"
#include "bench/harness/flags.h"

ABSL_FLAG(std::string, cases, "all", "comma list of case or group names, or all");
ABSL_FLAG(int, warmup, 3, "untimed runs per case");
ABSL_FLAG(int, iters, 10, "timed runs per case (the median is reported)");
ABSL_FLAG(int, device, 0, "CUDA ordinal");
ABSL_FLAG(std::string, json, "", "write the results as JSON to this file");
ABSL_FLAG(std::string, md, "", "write the markdown table to this file");
ABSL_FLAG(std::string, csr_dir, "", "dump the block-sparse layouts here (.npy) for compare_torch.py");
ABSL_FLAG(bool, list, false, "print the case names and exit");
ABSL_FLAG(std::string, kernel, "auto", "flash kernel: auto|sm80|sm90");
ABSL_FLAG(std::string, sm90_schedule, "",
          "Hopper kernel schedule: persistent (or v3; the only one); empty: the default");
ABSL_FLAG(bool, sm90_tma, true,
          "persistent Hopper schedule: load K and V by TMA where the tensors allow it (false: "
          "cp.async)");
ABSL_FLAG(std::string, sm90_query_tile, "auto",
          "persistent Hopper schedule at D = 64, dense / causal: query rows per work item, "
          "auto (the default: 192) | 128 | 192");
ABSL_FLAG(std::string, sm90_key_tile, "auto",
          "persistent Hopper schedule at D = 128, dense / causal: keys per K/V tile, "
          "auto (176 from 16384 keys on) | 128 | 176");
ABSL_FLAG(std::string, sm90_cluster, "auto",
          "persistent Hopper schedule, dense / causal with 176-key tiles: CTAs per cluster "
          "sharing K/V loads, auto (2) | 1 | 2");

ABSL_FLAG(std::string, sm90_item_deal, "auto",
          "persistent Hopper schedule, CSR layouts: how work items reach the CTAs, auto "
          "(dynamic) | static | dynamic");

namespace attnserve::bench {
namespace {

int Main() {
  if (absl::GetFlag(FLAGS_list)) {
    for (const std::string& n : CudaBenchCaseNames()) std::printf("%s\n", n.c_str());
    return 0;
  }
  CudaBenchOptions opt;
  opt.cases = absl::GetFlag(FLAGS_cases);
  opt.warmup = absl::GetFlag(FLAGS_warmup);
  opt.iters = absl::GetFlag(FLAGS_iters);
  opt.device = absl::GetFlag(FLAGS_device);
  opt.csr_dir = absl::GetFlag(FLAGS_csr_dir);
  absl::StatusOr<CudaOptions> cuda =
      BenchCudaOptions(absl::GetFlag(FLAGS_kernel), absl::GetFlag(FLAGS_sm90_schedule));
  if (!cuda.ok()) {
    std::fprintf(stderr, "attnbench_cuda: %s\n", cuda.status().ToString().c_str());
    return 2;
  }
  opt.cuda = *cuda;
  // A kernel option's flag into `out`; false (after saying why) where it does not parse.
  auto parse_into = [](auto parsed, auto& out) {
    if (!parsed.ok()) {
      std::fprintf(stderr, "attnbench_cuda: %s\n", parsed.status().ToString().c_str());
      return false;
    }
    out = *parsed;
    return true;
  };
  if (!parse_into(ParseSm90QueryTile(absl::GetFlag(FLAGS_sm90_query_tile), "--sm90_query_tile"),
                  opt.cuda.flash.sm90_query_tile) ||
      !parse_into(ParseSm90KeyTile(absl::GetFlag(FLAGS_sm90_key_tile), "--sm90_key_tile"),
                  opt.cuda.flash.sm90_key_tile) ||
      !parse_into(ParseSm90Cluster(absl::GetFlag(FLAGS_sm90_cluster), "--sm90_cluster"),
                  opt.cuda.flash.sm90_cluster) ||
      !parse_into(ParseSm90ItemDeal(absl::GetFlag(FLAGS_sm90_item_deal), "--sm90_item_deal"),
                  opt.cuda.flash.sm90_item_deal)) {
    return 2;
  }
  opt.cuda.flash.sm90_tma = absl::GetFlag(FLAGS_sm90_tma);
  absl::StatusOr<CudaBenchReport> report = RunCudaBench(opt);
  if (!report.ok()) {
    std::fprintf(stderr, "attnbench_cuda: %s\n", report.status().ToString().c_str());
    return 2;
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << report->json;
  }
  if (const std::string path = absl::GetFlag(FLAGS_md); !path.empty()) {
    std::ofstream(path) << report->markdown;
  }
  std::printf("\n%s", report->markdown.c_str());
  return report->all_correct ? 0 : 1;
}

}  // namespace
}  // namespace attnserve::bench

int main(int argc, char** argv) {
  const absl::Status parsed = attnserve::bench::ParseBenchFlags(
      argc, argv,
      "attnbench_cuda [--cases=all|dense,sparse,...] [--kernel=auto|sm80|sm90] [--json=PATH] "
      "[--md=PATH] ...\nThe CUDA kernel cases, timed and checked; see bench/cuda/cuda_bench.h.");
  if (!parsed.ok()) {
    std::fprintf(stderr, "attnbench_cuda: %s\n", parsed.ToString().c_str());
    return 2;
  }
  return attnserve::bench::Main();
}
