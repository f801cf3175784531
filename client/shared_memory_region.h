// SharedMemoryRegion: a POSIX shared memory object this process creates and maps, for
// RegisterSystemRegion (same-host callers). The destructor unmaps it and unlinks its name; the
// server's mapping (if registered) stays valid until the server unregisters it.
#ifndef ATTNSERVE_CLIENT_SHARED_MEMORY_REGION_H_
#define ATTNSERVE_CLIENT_SHARED_MEMORY_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace attnserve::client {

class SharedMemoryRegion {
 public:
  // shm_open(key, O_CREAT | O_EXCL | O_RDWR, 0600), ftruncate(bytes), mmap. `key` is "/name";
  // empty: "/attnserve_<pid>_<counter>". ALREADY_EXISTS when the name is taken.
  static absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> Create(int64_t bytes,
                                                                    std::string key = "");
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& key() const { return key_; }
  int64_t bytes() const { return bytes_; }
  // Page-aligned, so any offset that is a multiple of 64 is 64-byte aligned.
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }

 private:
  SharedMemoryRegion(std::string key, std::byte* data, int64_t bytes)
      : key_(std::move(key)), data_(data), bytes_(bytes) {}
  std::string key_;
  std::byte* data_;
  int64_t bytes_;
};

// The offset of the next 64-byte aligned slot at or after `offset` (region layouts).
inline int64_t AlignRegionOffset(int64_t offset) { return (offset + 63) / 64 * 64; }

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_SHARED_MEMORY_REGION_H_
