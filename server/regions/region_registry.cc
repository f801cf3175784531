// The one RegionRegistry: a map of names to entries under one mutex. Mapping (shm_open + mmap +
// page-locking, or cudaIpcOpenMemHandle) runs outside the mutex, under a reserved name, so a slow
// registration of a large region does not hold up requests taking leases.
#include "server/regions/region_registry.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/log_safe.h"

namespace attnserve {
namespace {

// Mapped regions by kind: shared by the registry and every region's deleter, so a lease released
// after the registry is gone still counts down safely.
struct MappedCounters {
  std::array<std::atomic<int64_t>, kNumRegionKinds> regions{};
  std::array<std::atomic<int64_t>, kNumRegionKinds> bytes{};
};

struct Entry {
  std::string owner;
  bool pending = true;           // reserved while being opened
  bool closing = false;          // unregistered; mapped until the last lease goes
  std::shared_ptr<Region> held;  // the registry's hold (null once closing)
  std::weak_ptr<Region> mapped;  // alive while mapped
  std::atomic<int64_t> leases{0};
};

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: must be 1 to 128 characters, got ", name.size()));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("name: '", SanitizeForLog(name, 128),
                       "' may only hold letters, digits, '_', '.' and '-'"));
    }
  }
  return absl::OkStatus();
}

// The map key of `owner`'s region `name`: each owner has its own namespace. Owners and names hold
// no NUL, so the key is unambiguous; the anonymous owner "" keys by the name alone.
std::string Key(const std::string& owner, const std::string& name) {
  return owner.empty() ? name : absl::StrCat(owner, absl::string_view("\0", 1), name);
}

class RegistryImpl final : public RegionRegistry {
 public:
  explicit RegistryImpl(const RegionRegistryOptions& options)
      : options_(options), counters_(std::make_shared<MappedCounters>()) {}
  ~RegistryImpl() override { ReleaseAll(); }

  absl::StatusOr<RegionInfo> RegisterSystem(const std::string& owner, const std::string& name,
                                            const std::string& shm_key, int64_t offset,
                                            int64_t bytes) override {
    return Register(owner, name, [&] {
      return OpenSystemRegion(name, shm_key, offset, bytes, options_.host_memory);
    });
  }

  absl::StatusOr<RegionInfo> RegisterCudaIpc(const std::string& owner, const std::string& name,
                                             const std::string& handle, int device,
                                             int64_t bytes) override {
    return Register(owner, name, [&] { return OpenCudaIpcRegion(name, handle, device, bytes); });
  }

  absl::StatusOr<UnregisterOutcome> Unregister(const std::string& owner,
                                               const std::string& name) override {
    std::shared_ptr<Region> dropped;  // unmapped after the mutex is released, when unused
    UnregisterOutcome out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      SweepLocked();
      auto it = entries_.find(Key(owner, name));
      if (it == entries_.end() || it->second->pending) {
        return absl::NotFoundError(
            absl::StrCat("name: no region named '", SanitizeForLog(name, 128), "'"));
      }
      Entry& e = *it->second;
      if (e.closing) {
        return absl::FailedPreconditionError(
            absl::StrCat("name: region ", name, " is already being unregistered"));
      }
      e.closing = true;
      dropped = std::move(e.held);
      out.leases = e.leases.load();
      out.in_use = out.leases > 0;
      if (!out.in_use) entries_.erase(it);
    }
    return out;
  }

  std::vector<RegionInfo> List(const std::string& owner) override {
    std::lock_guard<std::mutex> lock(mu_);
    SweepLocked();
    std::vector<RegionInfo> out;
    for (const auto& [name, e] : entries_) {
      std::shared_ptr<Region> region = e->mapped.lock();
      if (e->pending || region == nullptr || e->owner != owner) continue;
      out.push_back(InfoOf(*e, *region));
    }
    return out;
  }

  absl::StatusOr<RegionLease> Acquire(const std::string& owner, const std::string& name) override {
    std::shared_ptr<Entry> entry;
    std::shared_ptr<Region> region;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = entries_.find(Key(owner, name));
      if (it == entries_.end() || it->second->pending) {
        return absl::NotFoundError(
            absl::StrCat("no region named '", SanitizeForLog(name, 128), "'"));
      }
      if (it->second->closing && it->second->mapped.expired()) {
        return absl::NotFoundError(
            absl::StrCat("no region named '", SanitizeForLog(name, 128), "'"));
      }
      if (it->second->closing) {
        return absl::FailedPreconditionError(
            absl::StrCat("region ", name, " is being unregistered"));
      }
      entry = it->second;
      region = entry->held;
      entry->leases.fetch_add(1);
    }
    if (absl::Status s = region->CheckUsable(); !s.ok()) {
      entry->leases.fetch_sub(1);
      return s;
    }
    Region* raw = region.get();
    return RegionLease(raw, [entry, region](Region*) mutable {
      entry->leases.fetch_sub(1);
      region.reset();  // the last holder unmaps here
    });
  }

  RegionTotals Totals() const override {
    RegionTotals t;
    for (int k = 0; k < kNumRegionKinds; ++k) {
      t.regions[k] = counters_->regions[k].load();
      t.bytes[k] = counters_->bytes[k].load();
    }
    return t;
  }

  void ReleaseAll() override {
    std::vector<std::shared_ptr<Region>> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [name, e] : entries_) {
      e->closing = true;
      if (e->held) dropped.push_back(std::move(e->held));
    }
    entries_.clear();
    // `dropped` goes before the lock: regions without leases are unmapped here.
  }

 private:
  template <typename Open>
  absl::StatusOr<RegionInfo> Register(const std::string& owner, const std::string& name,
                                      Open open) {
    if (absl::Status s = CheckName(name); !s.ok()) return s;
    auto entry = std::make_shared<Entry>();
    entry->owner = owner;
    {
      std::lock_guard<std::mutex> lock(mu_);
      SweepLocked();
      if (auto it = entries_.find(Key(owner, name)); it != entries_.end()) {
        return absl::AlreadyExistsError(absl::StrCat(
            "name: a region named '", name, "' is already registered",
            it->second->closing ? " (it is being unregistered; requests in flight still use it)"
                                : ""));
      }
      if (static_cast<int>(entries_.size()) >= options_.max_regions) {
        return absl::ResourceExhaustedError(
            absl::StrCat("name: ", entries_.size(), " regions are registered, the limit (",
                         "--max-regions=", options_.max_regions, ")"));
      }
      entries_[Key(owner, name)] = entry;  // reserved
    }
    absl::StatusOr<std::unique_ptr<Region>> opened = open();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(Key(owner, name));
    const bool still_reserved = it != entries_.end() && it->second == entry;
    if (!opened.ok() || !still_reserved) {
      if (still_reserved) entries_.erase(it);
      if (!opened.ok()) return opened.status();
      return absl::UnavailableError("the server is releasing its regions");
    }
    const int kind = static_cast<int>((*opened)->kind());
    const int64_t bytes = (*opened)->bytes();
    counters_->regions[kind].fetch_add(1);
    counters_->bytes[kind].fetch_add(bytes);
    std::shared_ptr<MappedCounters> counters = counters_;
    entry->held = std::shared_ptr<Region>(opened->release(), [counters, kind, bytes](Region* r) {
      delete r;  // unmaps
      counters->regions[kind].fetch_sub(1);
      counters->bytes[kind].fetch_sub(bytes);
    });
    entry->mapped = entry->held;
    entry->pending = false;
    return InfoOf(*entry, *entry->held);
  }

  // Forgets closing entries whose memory is gone (their last lease was released).
  void SweepLocked() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second->closing && it->second->mapped.expired()) {
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }

  static RegionInfo InfoOf(const Entry& e, const Region& region) {
    RegionInfo info;
    info.name = region.name();
    info.owner = e.owner;
    info.kind = region.kind();
    info.bytes = region.bytes();
    info.leases = e.leases.load();
    info.closing = e.closing;
    region.Describe(&info);
    return info;
  }

  const RegionRegistryOptions options_;
  std::shared_ptr<MappedCounters> counters_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;
};

}  // namespace

std::string_view RegionKindName(RegionKind kind) {
  return kind == RegionKind::kCudaIpc ? "cuda_ipc" : "system";
}

std::unique_ptr<RegionRegistry> MakeRegionRegistry(const RegionRegistryOptions& options) {
  return std::make_unique<RegistryImpl>(options);
}

}  // namespace attnserve
