// The instruction rates behind the flash kernels' softmax step, measured on one GPU: how many SM
// cycles one warp instruction of each kind costs an SM sub-partition (the unit four warp
// schedulers split an SM into), alone and in the mixes the exponential phase issues.
#ifndef ATTNSERVE_BENCH_CUDA_SFU_PIPES_H_
#define ATTNSERVE_BENCH_CUDA_SFU_PIPES_H_

#include <string>
#include <vector>

namespace attnserve::bench {

struct SfuRow {
  std::string name;      // what one unit of the row is (e.g. "ex2 + fadd"; "-": none)
  int warps_per_smsp;    // warps resident on each sub-partition while it runs
  int chains;            // independent dependency chains per warp (0: throughput rows)
  double cycles;         // SM cycles per unit and sub-partition (clock64 over the whole loop)
  // Rows with a second warpgroup issuing wgmma next to the first (sm_90 only): "SS" (both
  // operands from shared memory) or "RS" (A from registers), and the SM cycles per
  // m64n128k16 wgmma it took meanwhile (8 per commit group, waited for; 64 at the tensor pipe's
  // rate). Empty and 0 for the other rows.
  std::string neighbour;
  double wgmma_cycles = 0;
};

// Runs every row on device `device` (one CTA per SM; the wgmma rows only on compute capability
// 9.x). Returns the rows, or an empty vector with `error` set when a CUDA call failed.
std::vector<SfuRow> RunSfuRows(int device, std::string* error);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_SFU_PIPES_H_
