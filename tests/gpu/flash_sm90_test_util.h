// What the two halves of flash_sm90_test (spec level: flash_sm90_test.cc; params level:
// flash_sm90_piece_test.cc) share: the skip condition, the schedules every sm90 case runs with,
// the kernel each is expected to launch, the options that force it, and the tolerances.
#ifndef ATTNSERVE_TESTS_GPU_FLASH_SM90_TEST_UTIL_H_
#define ATTNSERVE_TESTS_GPU_FLASH_SM90_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/cuda/cuda_options.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "gtest/gtest.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve::sm90_test {

// Tolerances of the existing GPU tests: max |o - ref| / max |ref|, and max |lse - ref|.
inline double OTol(DType dtype) { return dtype == DType::kF16 ? 5e-3 : 1e-2; }
inline constexpr double kLseTol = 2e-3;

// The persistent schedule's grid cap in the spec and piece cases: few CTAs, many items each (an
// odd count, so that items land on CTAs in shifting phases of the K/V ring). 0: the full grid.
inline constexpr int kPersistentTestCtas = 3;

// The schedules every sm90 case runs with: the persistent one (the only one left; the tests keep
// the loop so that a schedule added later runs every case).
inline std::vector<Sm90Schedule> TestSchedules() { return {Sm90Schedule::kPersistent}; }

// The kernel a forced-sm90 launch of `schedule` runs (at either layout block).
inline FlashKernel ExpectedSm90Kernel(Sm90Schedule schedule) {
  switch (schedule) {
    case Sm90Schedule::kPersistent:
      break;
  }
  return FlashKernel::kSm90Persistent;
}

// Options forcing the sm90 kernel with `schedule` (the persistent grid capped at `max_ctas`,
// items in `order`).
inline FlashKernelOptions ForcedSm90(Sm90Schedule schedule, int max_ctas = kPersistentTestCtas,
                                     Sm90ItemOrder order = Sm90ItemOrder::kAuto) {
  FlashKernelOptions o;
  o.arch = FlashKernelArch::kSm90;
  o.sm90_schedule = schedule;
  o.persistent_max_ctas = max_ctas;
  o.item_order = order;
  return o;
}

}  // namespace attnserve::sm90_test

// Skips where there is no GPU, the GPU is not compute capability 9.x, or the build lacks sm_90a.
#define SKIP_WITHOUT_SM90()                                                                    \
  do {                                                                                         \
    SKIP_WITHOUT_GPU();                                                                        \
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);                                                  \
    if (!::attnserve::CurrentDeviceIsSm90()) {                                                 \
      GTEST_SKIP() << "device 0 is not compute capability 9.x";                                \
    }                                                                                          \
    if (!::attnserve::FlashFwdSm90Built()) GTEST_SKIP() << "this build has no sm_90a kernels"; \
  } while (0)

#endif  // ATTNSERVE_TESTS_GPU_FLASH_SM90_TEST_UTIL_H_
