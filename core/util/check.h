// Assertions for what an outer layer has already validated.
//
// A request's spec and shape are validated once, where they enter the engine (the RPC edge,
// or a public library entry point such as CpuAttention); the layers behind it (devices, plans,
// strategies, the pattern compiler) state their precondition with ATTN_DCHECK_OK instead of
// validating again. In debug builds (or with ATTNSERVE_DCHECK_ALWAYS_ON defined) a failed
// precondition aborts with the status message and the call site; in release builds the
// expression is not evaluated.
#ifndef ATTNSERVE_CORE_UTIL_CHECK_H_
#define ATTNSERVE_CORE_UTIL_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

namespace attnserve::check_internal {

[[noreturn]] inline void DcheckFailed(const char* expr, const absl::Status& status,
                                      const char* file, int line) {
  std::fprintf(stderr, "%s:%d: precondition failed: %s: %s\n", file, line, expr,
               std::string(status.message()).c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace attnserve::check_internal

#if !defined(NDEBUG) || defined(ATTNSERVE_DCHECK_ALWAYS_ON)
#define ATTN_DCHECK_IS_ON 1
#define ATTN_DCHECK_OK(expr)                                                           \
  do {                                                                                 \
    const ::absl::Status attn_dcheck_status_ = (expr);                                 \
    if (!attn_dcheck_status_.ok()) {                                                   \
      ::attnserve::check_internal::DcheckFailed(#expr, attn_dcheck_status_, __FILE__,  \
                                                __LINE__);                             \
    }                                                                                  \
  } while (0)
#else
#define ATTN_DCHECK_IS_ON 0
// Not evaluated, but still compiled, so the expression cannot rot.
#define ATTN_DCHECK_OK(expr)  \
  do {                        \
    if (false) (void)(expr);  \
  } while (0)
#endif

#endif  // ATTNSERVE_CORE_UTIL_CHECK_H_
