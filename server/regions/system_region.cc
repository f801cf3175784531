// System (POSIX shared memory) regions: shm_open + fstat + mmap, page-locked through the devices'
// HostMemory for fast device copies.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/util/log_safe.h"
#include "server/regions/region_registry.h"
#include "spdlog/spdlog.h"

namespace attnserve {
namespace {

class SystemRegion final : public Region {
 public:
  SystemRegion(std::string name, std::string shm_key, int fd, int64_t offset, int64_t bytes,
               std::byte* map_base, size_t map_len, size_t delta, HostMemory* host_memory,
               bool page_locked)
      : Region(std::move(name), RegionKind::kSystem, bytes),
        shm_key_(std::move(shm_key)),
        fd_(fd),
        offset_(offset),
        map_base_(map_base),
        map_len_(map_len),
        data_(map_base + delta),
        host_memory_(host_memory),
        page_locked_(page_locked) {}

  ~SystemRegion() override {
    if (page_locked_) host_memory_->Unregister(map_base_);
    munmap(map_base_, map_len_);
    close(fd_);
  }

  std::byte* host_data() override { return data_; }

  absl::Status CopyOut(int64_t offset, void* dst, int64_t n) override {
    std::memcpy(dst, data_ + offset, static_cast<size_t>(n));
    return absl::OkStatus();
  }
  absl::Status CopyIn(int64_t offset, const void* src, int64_t n) override {
    std::memcpy(data_ + offset, src, static_cast<size_t>(n));
    return absl::OkStatus();
  }

  // The object's creator may have shrunk it (ftruncate) since: touching pages past its end
  // raises SIGBUS, so every lease checks its size first.
  absl::Status CheckUsable() const override {
    struct stat st {};
    if (fstat(fd_, &st) != 0 || st.st_size < offset_ + bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region ", name(), ": shared memory object \"", SanitizeForLog(shm_key_, 256),
          "\" is now ", static_cast<int64_t>(st.st_size), " bytes, smaller than offset ", offset_,
          " + ", bytes(), " bytes"));
    }
    return absl::OkStatus();
  }

  void Describe(RegionInfo* info) const override {
    info->shm_key = shm_key_;
    info->offset = offset_;
    info->page_locked = page_locked_;
  }

 private:
  const std::string shm_key_;
  const int fd_;  // kept open for CheckUsable's fstat
  const int64_t offset_;
  std::byte* const map_base_;
  const size_t map_len_;
  std::byte* const data_;
  HostMemory* const host_memory_;
  const bool page_locked_;
};

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> OpenSystemRegion(const std::string& name,
                                                         const std::string& shm_key,
                                                         int64_t offset, int64_t bytes,
                                                         HostMemory* host_memory) {
  if (shm_key.size() < 2 || shm_key[0] != '/' || shm_key.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("system.shm_key: must be '/' followed by a name without '/', got \"",
                     SanitizeForLog(shm_key, 256), "\""));
  }
  if (offset < 0 || offset % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("system.offset: must be >= 0 and a multiple of 64, got ", offset));
  }
  if (bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("system.bytes: must be >= 1, got ", bytes));
  }
  const int fd = shm_open(shm_key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    return ErrnoStatus(err, absl::StrCat("system.shm_key: cannot open shared memory object \"",
                                         SanitizeForLog(shm_key, 256), "\""));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(
        err, absl::StrCat("system.shm_key: fstat of \"", SanitizeForLog(shm_key, 256), "\""));
  }
  if (st.st_size < offset || st.st_size - offset < bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "system.bytes: offset ", offset, " + ", bytes, " bytes exceeds shared memory object \"",
        SanitizeForLog(shm_key, 256), "\" of ", static_cast<int64_t>(st.st_size), " bytes"));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t map_offset = offset / page * page;
  const size_t delta = static_cast<size_t>(offset - map_offset);
  const size_t map_len = delta + static_cast<size_t>(bytes);
  void* base = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, map_offset);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("system: mmap of ", map_len, " bytes of \"",
                                         SanitizeForLog(shm_key, 256), "\""));
  }
  bool page_locked = false;
  if (host_memory != nullptr && host_memory->page_locked()) {
    if (absl::Status s = host_memory->Register(base, map_len); s.ok()) {
      page_locked = true;
    } else {
      spdlog::warn("region {}: not page-locked ({}); device copies from it will be slower", name,
                   std::string(s.message()));
    }
  }
  return std::unique_ptr<Region>(new SystemRegion(name, shm_key, fd, offset, bytes,
                                                  static_cast<std::byte*>(base), map_len, delta,
                                                  host_memory, page_locked));
}

}  // namespace attnserve
