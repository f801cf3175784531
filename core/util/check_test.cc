// ATTN_DCHECK_OK: a failed precondition aborts with the status message where the checks are on,
// and a passing one (or, where they are off, any) costs nothing observable.
#define ATTNSERVE_DCHECK_ALWAYS_ON 1
#include "core/util/check.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

int calls = 0;
absl::Status Counted(absl::Status s) {
  ++calls;
  return s;
}

TEST(DcheckTest, PassingPreconditionContinues) {
  calls = 0;
  ATTN_DCHECK_OK(Counted(absl::OkStatus()));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ATTN_DCHECK_IS_ON, 1);
}

TEST(DcheckDeathTest, FailedPreconditionAbortsWithTheMessage) {
  EXPECT_DEATH(ATTN_DCHECK_OK(absl::InvalidArgumentError("spec.window.size: must be >= 1")),
               "precondition failed: .*spec.window.size: must be >= 1");
}

}  // namespace
}  // namespace attnserve
