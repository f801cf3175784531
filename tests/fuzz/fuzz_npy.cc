// Fuzz target: the .npy reader (core/tensor/npy.*). The first byte picks the dtype the caller
// asks for (none, f32, f16, bf16), the rest is the file. ParseNpy and ReadNpy (the same bytes
// through a file) must agree; an accepted file holds no more tensor bytes than it has data
// (no amplification), its bytes are the file's, and it survives SerializeNpy -> ParseNpy. The
// memory tracker returns to zero once the tensors are gone.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/tensor/npy.h"
#include "core/tensor/tensor.h"
#include "tests/fuzz/fuzz_check.h"

namespace attnserve {
namespace {

// A file per process (libFuzzer's -jobs/-fork workers are separate processes).
const std::string& ScratchPath() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr ? dir : "/tmp") + "/attnserve_fuzz_npy." +
           std::to_string(::getpid()) + ".npy";
  }();
  return path;
}

void CheckSame(const HostTensor& a, const HostTensor& b, const char* what) {
  FUZZ_CHECK(a.dtype() == b.dtype() && a.dims() == b.dims() && a.nbytes() == b.nbytes(), what);
  FUZZ_CHECK(a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0, what);
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size < 1) return;
  std::optional<DType> want;
  switch (data[0] % 4) {
    case 1:
      want = DType::kF32;
      break;
    case 2:
      want = DType::kF16;
      break;
    case 3:
      want = DType::kBF16;
      break;
    default:
      break;
  }
  const std::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  MemoryTracker tracker;
  {
    absl::StatusOr<HostTensor> parsed = ParseNpy(file, want, &tracker);
    // The same bytes as a file: the streaming reader must reach the same verdict.
    std::FILE* f = std::fopen(ScratchPath().c_str(), "wb");
    FUZZ_CHECK(f != nullptr && std::fwrite(file.data(), 1, file.size(), f) == file.size());
    std::fclose(f);
    absl::StatusOr<HostTensor> read = ReadNpy(ScratchPath(), want, &tracker);
    FUZZ_CHECK(parsed.ok() == read.ok(), "ParseNpy: ", parsed.status().ToString(),
               "; ReadNpy: ", read.status().ToString());
    if (!parsed.ok()) {
      FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument,
                 parsed.status().ToString());
      FUZZ_CHECK(!parsed.status().message().empty());
      return;
    }
    CheckSame(*parsed, *read, "ParseNpy and ReadNpy differ");
    FUZZ_CHECK(parsed->nbytes() <= static_cast<int64_t>(file.size()), "a ", file.size(),
               "-byte file became ", parsed->nbytes(), " tensor bytes");
    FUZZ_CHECK(std::memcmp(parsed->data(), file.data() + (file.size() - parsed->nbytes()),
                           parsed->nbytes()) == 0,
               "the tensor's bytes are not the file's data");
    FUZZ_CHECK(!want || parsed->dtype() == *want);
    // What we write we read back identically.
    const std::string again = SerializeNpy(*parsed);
    absl::StatusOr<HostTensor> round = ParseNpy(again, parsed->dtype());
    FUZZ_CHECK(round.ok(), round.status().ToString());
    FUZZ_CHECK(round->nbytes() == parsed->nbytes());
    if (!parsed->dims().empty()) CheckSame(*parsed, *round, "SerializeNpy round trip");
  }
  FUZZ_CHECK(tracker.in_use_bytes() == 0, tracker.in_use_bytes(), " tracked bytes leaked");
}

}  // namespace
}  // namespace attnserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnserve::FuzzOne(data, size);
  return 0;
}
