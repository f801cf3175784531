// Early-return helpers for absl::Status / absl::StatusOr.
#ifndef ATTNSERVE_CORE_UTIL_STATUS_MACROS_H_
#define ATTNSERVE_CORE_UTIL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ATTN_CONCAT_INNER_(a, b) a##b
#define ATTN_CONCAT_(a, b) ATTN_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define ATTN_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::absl::Status attn_status_ = (expr);          \
    if (!attn_status_.ok()) return attn_status_;   \
  } while (0)

#define ATTN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

// `lhs = value of rexpr` or return its error. `lhs` may be a declaration ("auto x").
#define ATTN_ASSIGN_OR_RETURN(lhs, rexpr) \
  ATTN_ASSIGN_OR_RETURN_IMPL_(ATTN_CONCAT_(attn_statusor_, __LINE__), lhs, rexpr)

#endif  // ATTNSERVE_CORE_UTIL_STATUS_MACROS_H_
