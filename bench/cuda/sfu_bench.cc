// attnbench_sfu: the instruction rates behind the flash kernels' softmax step on one GPU (the
// exponential unit's throughput and latency, and the instructions issued next to it), in SM
// cycles per warp instruction and sub-partition (bench/cuda/sfu_pipes.h).
//
// Throughput rows run eight independent chains per warp with one, two and four warps on each of
// an SM's four sub-partitions; latency rows run one warp with 1 .. 6 dependent ex2 + add chains,
// the distance (in exponentials) between an exponential and the add that reads it. On Hopper,
// the last rows run one warpgroup's exponentials or FMAs next to a second warpgroup issuing
// wgmma (as the flash kernel's two consumer warpgroups do), with the wgmma's cycles meanwhile.
// What the rows showed on an H200: docs/BENCHMARKS.md, second session of 2026-11-29.
//
//   attnbench_sfu [--device 0] [--json-out FILE]
// Exit code: 0 on success, 1 on any error (no CUDA device visible included).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cuda/open_device.h"
#include "bench/cuda/sfu_pipes.h"
#include "bench/harness/flags.h"
#include "bench/harness/run_record.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

ABSL_FLAG(int, device, 0, "CUDA ordinal");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace attnserve::bench {
namespace {

constexpr char kUsage[] =
    "attnbench_sfu [--device 0] [--json-out FILE]\n"
    "SM cycles per warp instruction and sub-partition of the softmax step's instructions.";

absl::Status Main() {
  const int ordinal = absl::GetFlag(FLAGS_device);
  ATTN_ASSIGN_OR_RETURN(const std::string device, OpenCudaDevice(ordinal));
  std::string error;
  const std::vector<SfuRow> rows = RunSfuRows(ordinal, &error);
  if (rows.empty()) return absl::InternalError(absl::StrCat("CUDA: ", error));
  std::printf(
      "attnbench_sfu: %s\n\n| unit | warps / sub-partition | chains | cycles | next to wgmma | "
      "cycles per wgmma |\n|---|---|---|---|---|---|\n",
      device.c_str());
  for (const SfuRow& r : rows) {
    std::printf("| %s | %d | %s | %.2f | %s | %s |\n", r.name.c_str(), r.warps_per_smsp,
                r.chains == 0 ? "8 (throughput)" : std::to_string(r.chains).c_str(), r.cycles,
                r.neighbour.empty() ? "-" : r.neighbour.c_str(),
                r.neighbour.empty() ? "-" : absl::StrFormat("%.1f", r.wgmma_cycles).c_str());
  }
  std::fflush(stdout);
  const std::string path = absl::GetFlag(FLAGS_json_out);
  if (!path.empty()) {
    Json j = Json::Object();
    AddRunRecord(MakeRunRecord(device), j);
    j.Set("bench", "sfu_pipes");
    j.Set("unit", "SM cycles per unit and sub-partition (clock64, mean over one CTA per SM)");
    Json out = Json::Array();
    for (const SfuRow& r : rows) {
      out.Push(Json::Object()
                   .Set("name", r.name)
                   .Set("warps_per_smsp", r.warps_per_smsp)
                   .Set("chains", r.chains)
                   .Set("cycles", r.cycles)
                   .Set("next_to_wgmma", r.neighbour)
                   .Set("cycles_per_wgmma", r.wgmma_cycles));
    }
    j.Set("rows", std::move(out));
    ATTN_RETURN_IF_ERROR(WriteJsonOut(path, j));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace attnserve::bench

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv, attnserve::bench::kUsage, "attnbench_sfu",
                                     attnserve::bench::Main);
}
