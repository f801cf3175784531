// .npy (format 1.0/2.0) read and write for HostTensor.
//
// Little-endian, C order only. f32 is '<f4', f16 is '<f2'. bf16 has no numpy dtype: it is written
// as '<u2' (the raw bfloat16 bit patterns) and read back as bf16 when the caller asks for bf16;
// a '<u2' file read without a dtype hint is an error rather than a guess. Also accepted on read:
// '|V2' (ml_dtypes' bfloat16 as numpy stores it), read as bf16.
#ifndef ATTNSERVE_CORE_TENSOR_NPY_H_
#define ATTNSERVE_CORE_TENSOR_NPY_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// Reads a .npy file. `want` says how to read '<u2'/'|V2' (must be kBF16) and, when set, must match
// the file's dtype otherwise. Errors name the file and what is wrong with it.
absl::StatusOr<HostTensor> ReadNpy(const std::string& path, std::optional<DType> want = std::nullopt,
                                   MemoryTracker* tracker = nullptr);
absl::Status WriteNpy(const std::string& path, const HostTensor& t);

// The same on in-memory bytes (used by tests and by clients that receive .npy over other means).
absl::StatusOr<HostTensor> ParseNpy(std::string_view bytes, std::optional<DType> want,
                                    MemoryTracker* tracker = nullptr);
std::string SerializeNpy(const HostTensor& t);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_TENSOR_NPY_H_
