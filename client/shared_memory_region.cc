#include "client/shared_memory_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::client {

absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> SharedMemoryRegion::Create(int64_t bytes,
                                                                               std::string key) {
  if (bytes < 1) return absl::InvalidArgumentError(absl::StrCat("bytes: must be >= 1, got ", bytes));
  if (key.empty()) {
    static std::atomic<int> counter{0};
    key = absl::StrCat("/attnserve_", getpid(), "_", counter.fetch_add(1));
  }
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("shm_open(\"", key, "\"): ", std::strerror(err));
    return err == EEXIST ? absl::AlreadyExistsError(msg) : absl::InternalError(msg);
  }
  if (ftruncate(fd, bytes) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("ftruncate(\"", key, "\", ", bytes, "): ", std::strerror(err)));
  }
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of \"", key, "\" (", bytes, " bytes): ", std::strerror(err)));
  }
  return std::unique_ptr<SharedMemoryRegion>(
      new SharedMemoryRegion(std::move(key), static_cast<std::byte*>(p), bytes));
}

SharedMemoryRegion::~SharedMemoryRegion() {
  munmap(data_, static_cast<size_t>(bytes_));
  shm_unlink(key_.c_str());
}

}  // namespace attnserve::client
