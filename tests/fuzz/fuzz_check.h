// FUZZ_CHECK: the property checks of the fuzz targets. A failed check prints what was expected
// and aborts, which libFuzzer reports as a crash with the input that caused it.
#ifndef ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
#define ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

#define FUZZ_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   ::absl::StrCat("", ##__VA_ARGS__).c_str());                             \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

#endif  // ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
