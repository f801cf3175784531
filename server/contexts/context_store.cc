// The one ContextStore: a map of names to entries under one mutex (lookups, row counts, budget),
// plus a mutex per context that serialises its appends, whose copies run outside the store's
// mutex.
#include "server/contexts/context_store.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/spec/attention_spec.h"
#include "core/util/log_safe.h"
#include "core/util/status_macros.h"
#include "server/contexts/shard_layout.h"

namespace attnserve {
namespace {

// Remembered names of contexts that went away, for a NOT_FOUND that says why.
constexpr size_t kMaxTombstones = 1024;

// The map key of `owner`'s context `name`: each owner has its own namespace. Owners and names hold
// no NUL, so the key is unambiguous; the anonymous owner "" keys by the name alone.
std::string Key(const std::string& owner, const std::string& name) {
  return owner.empty() ? name : absl::StrCat(owner, absl::string_view("\0", 1), name);
}

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

// Bytes of the store's budget in use per device, shared with every Storage so that memory
// released after the store forgot a context (a request still held it) is given back.
struct Budget {
  explicit Budget(size_t devices) : used(devices) {}
  std::vector<std::atomic<int64_t>> used;
};

// K and V of one context at one size. Destroyed when neither the entry nor any view holds it.
struct Storage {
  std::shared_ptr<Budget> budget;
  size_t device_index = 0;
  int64_t reserved_tokens = 0;
  int64_t bytes = 0;  // K + V
  std::unique_ptr<ResidentMemory> k, v;
  ~Storage() { budget->used[device_index].fetch_sub(bytes); }
};

// One shard: the context's rows [start, start + storage->reserved_tokens) on storage->device_index.
struct Shard {
  int64_t start = 0;
  std::shared_ptr<Storage> storage;
  int64_t end() const { return start + storage->reserved_tokens; }
};

struct Entry {
  ContextConfig config;
  std::string owner;
  std::mutex append_mu;  // one append at a time
  // Guarded by the store's mutex.
  std::vector<Shard> shards;  // in row order, without gaps
  int64_t tokens = 0;
  absl::Time last_used;
  int64_t attends = 0;
  std::shared_ptr<std::atomic<int64_t>> in_use = std::make_shared<std::atomic<int64_t>>(0);
};

class ContextStoreImpl final : public ContextStore {
 public:
  ContextStoreImpl(const ContextStoreOptions& options, std::vector<Device*> devices)
      : options_(options),
        devices_(std::move(devices)),
        budget_(std::make_shared<Budget>(devices_.size())) {
    if (options_.sweep_interval > absl::ZeroDuration()) {
      sweeper_ = std::thread([this] { SweepLoop(); });
    }
  }

  ~ContextStoreImpl() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (sweeper_.joinable()) sweeper_.join();
  }

  absl::StatusOr<ContextInfo> CreateContext(const std::string& owner,
                                            const ContextConfig& in) override {
    ATTN_RETURN_IF_ERROR(CheckName(in.name));
    ATTN_RETURN_IF_ERROR(CheckConfig(in));
    ContextConfig config = in;
    if (config.ttl <= absl::ZeroDuration()) config.ttl = options_.default_ttl;
    std::vector<ShardRows> layout;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (entries_.count(Key(owner, in.name)) > 0) {
        return absl::AlreadyExistsError(absl::StrCat("name: context '", in.name, "' exists"));
      }
      if (static_cast<int>(entries_.size()) >= options_.max_contexts) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "contexts: ", entries_.size(), " held, the server's limit (--max-contexts)"));
      }
    }
    if (config.capacity_tokens > 0) {
      ATTN_ASSIGN_OR_RETURN(layout, PlanFixedShards(Room(), RowBytes(config) * 2,
                                                    config.capacity_tokens, config.shards));
    } else {
      layout.push_back(ShardRows{LeastUsedDevice(), options_.initial_tokens});
    }
    auto entry = std::make_shared<Entry>();
    int64_t start = 0;
    for (const ShardRows& r : layout) {
      ATTN_ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage, NewStorage(config, r.device, r.rows));
      entry->shards.push_back(Shard{start, std::move(storage)});
      start += r.rows;
    }
    entry->config = config;
    entry->owner = owner;
    entry->last_used = absl::Now();
    std::lock_guard<std::mutex> lock(mu_);
    if (!entries_.emplace(Key(owner, in.name), entry).second) {  // created meanwhile
      return absl::AlreadyExistsError(absl::StrCat("name: context '", in.name, "' exists"));
    }
    tombstones_.erase(Key(owner, in.name));
    return InfoLocked(*entry, absl::Now());
  }

  absl::StatusOr<ContextInfo> Append(const std::string& owner, const std::string& name,
                                     int64_t tokens, const void* k, const void* v,
                                     std::optional<int64_t> expect_tokens) override {
    if (tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat("tokens: must be >= 1, got ", tokens));
    }
    ATTN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Find(owner, name));
    std::lock_guard<std::mutex> append(e->append_mu);
    const ContextConfig& c = e->config;
    const int64_t row_bytes = RowBytes(c);
    std::vector<Shard> shards;
    int64_t held = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (Gone(*e)) return NotFound(owner, name);
      shards = e->shards;
      held = e->tokens;
    }
    if (expect_tokens.has_value() && *expect_tokens != held) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expect_tokens: context '", name, "' holds ", held, " rows, not ", *expect_tokens));
    }
    const int64_t need = held + tokens;
    if (c.capacity_tokens > 0 && need > c.capacity_tokens) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tokens: ", held, " + ", tokens, " rows exceed context '", name, "''s capacity of ",
          c.capacity_tokens));
    }
    // Growable: the last shard grows (rows copied over) or the rows spill into a new shard; the
    // new storages are dropped, and their bytes given back, if anything below fails.
    ATTN_RETURN_IF_ERROR(MakeRoom(c, held, need, shards));
    std::vector<int64_t> starts, reserved;
    for (const Shard& sh : shards) {
      starts.push_back(sh.start);
      reserved.push_back(sh.storage->reserved_tokens);
    }
    // Rows past `held` are read by no request: writing them races with nothing.
    for (const ShardPiece& p : SplitRows(starts, reserved, held, need)) {
      Storage& st = *shards[p.shard].storage;
      const auto* kb = static_cast<const std::byte*>(k) + p.first * row_bytes;
      const auto* vb = static_cast<const std::byte*>(v) + p.first * row_bytes;
      ATTN_RETURN_IF_ERROR(st.k->Write(p.local * row_bytes, kb, p.rows * row_bytes));
      ATTN_RETURN_IF_ERROR(st.v->Write(p.local * row_bytes, vb, p.rows * row_bytes));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (Gone(*e)) return NotFound(owner, name);  // deleted while the rows were copied
    e->shards = std::move(shards);
    e->tokens = need;
    e->last_used = absl::Now();
    return InfoLocked(*e, e->last_used);
  }

  absl::StatusOr<ContextView> Acquire(const std::string& owner, const std::string& name) override {
    ATTN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Find(owner, name));
    std::lock_guard<std::mutex> lock(mu_);
    if (Gone(*e)) return NotFound(owner, name);
    ContextView view;
    view.dtype = e->config.dtype;
    view.kv_heads = e->config.kv_heads;
    view.head_dim = e->config.head_dim;
    view.tokens = e->tokens;
    std::vector<std::shared_ptr<Storage>> storages;
    for (const Shard& sh : e->shards) {
      storages.push_back(sh.storage);
      const int64_t rows = ShardTokens(sh.start, sh.storage->reserved_tokens, e->tokens);
      if (rows == 0) continue;
      ContextShardView shard;
      Storage& st = *sh.storage;
      shard.device_index = st.device_index;
      shard.on_device = st.k->device_data() != nullptr;
      shard.cuda_ordinal = devices_[st.device_index]->cuda_ordinal();
      shard.start = sh.start;
      shard.tokens = rows;
      shard.k_data = shard.on_device ? st.k->device_data() : st.k->host_data();
      shard.v_data = shard.on_device ? st.v->device_data() : st.v->host_data();
      view.shards.push_back(shard);
    }
    const Storage& first = *e->shards.front().storage;
    const ContextShardView head = view.shards.empty() ? ContextShardView{} : view.shards.front();
    view.device_index = view.shards.empty() ? first.device_index : head.device_index;
    view.on_device = view.shards.empty() ? first.k->device_data() != nullptr : head.on_device;
    view.cuda_ordinal = devices_[view.device_index]->cuda_ordinal();
    view.k_data = head.k_data;
    view.v_data = head.v_data;
    // The hold: the storage of this moment, and one count of in_use while the request lives.
    struct Hold {
      Hold(std::vector<std::shared_ptr<Storage>> s, std::shared_ptr<std::atomic<int64_t>> n)
          : storages(std::move(s)), in_use(std::move(n)) {
        in_use->fetch_add(1);
      }
      ~Hold() { in_use->fetch_sub(1); }
      Hold(const Hold&) = delete;
      Hold& operator=(const Hold&) = delete;
      std::vector<std::shared_ptr<Storage>> storages;
      std::shared_ptr<std::atomic<int64_t>> in_use;
    };
    view.hold = std::make_shared<Hold>(std::move(storages), e->in_use);
    e->attends += 1;
    e->last_used = absl::Now();
    return view;
  }

  absl::StatusOr<ContextInfo> Get(const std::string& owner, const std::string& name) override {
    ATTN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Find(owner, name));
    std::lock_guard<std::mutex> lock(mu_);
    if (Gone(*e)) return NotFound(owner, name);
    return InfoLocked(*e, absl::Now());
  }

  absl::StatusOr<int64_t> Delete(const std::string& owner, const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(Key(owner, name));
    if (it == entries_.end()) return NotFoundLocked(owner, name);
    const int64_t in_use = it->second->in_use->load();
    RememberLocked(it->first, "deleted");
    entries_.erase(it);
    return in_use;
  }

  std::vector<ContextInfo> List(const std::string& owner) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ContextInfo> out;
    const absl::Time now = absl::Now();
    for (const auto& [name, e] : entries_) {
      if (e->owner == owner) out.push_back(InfoLocked(*e, now));
    }
    return out;  // std::map: sorted by name
  }

  int Sweep(absl::Time now) override {
    std::lock_guard<std::mutex> lock(mu_);
    int swept = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      const Entry& e = *it->second;
      if (e.in_use->load() == 0 && now - e.last_used > e.config.ttl) {
        RememberLocked(it->first, absl::StrCat("expired (idle for more than its ttl of ",
                                               absl::FormatDuration(e.config.ttl), ")"));
        it = entries_.erase(it);
        ++swept;
      } else {
        ++it;
      }
    }
    return swept;
  }

  void DeleteAll() override {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
  }

  ContextTotals Totals() const override {
    ContextTotals t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t.contexts = static_cast<int64_t>(entries_.size());
    }
    for (const auto& used : budget_->used) t.bytes.push_back(used.load());
    return t;
  }

 private:
  absl::Status CheckConfig(const ContextConfig& c) const {
    if (c.kv_heads < 1) {
      return absl::InvalidArgumentError(absl::StrCat("kv_heads: must be >= 1, got ", c.kv_heads));
    }
    if (c.head_dim < 1 || c.head_dim > kMaxHeadDim || !devices_.front()->HeadDimSupported(c.head_dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "head_dim: ", c.head_dim, " is not a head dim this server's backend runs"));
    }
    if (c.capacity_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("capacity_tokens: must be >= 0 (0: growable), got ", c.capacity_tokens));
    }
    if (c.shards < 0 || static_cast<size_t>(c.shards) > devices_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shards: must be in [0, ", devices_.size(), "] (0: automatic; the server has ",
          devices_.size(), " device(s)), got ", c.shards));
    }
    if (c.ttl < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("ttl_seconds: must be >= 0 (0: the server's default)");
    }
    return absl::OkStatus();
  }

  static int64_t RowBytes(const ContextConfig& c) {
    return c.kv_heads * c.head_dim * static_cast<int64_t>(DTypeSize(c.dtype));
  }

  // Bytes each device still has in its share.
  std::vector<int64_t> Room() const {
    std::vector<int64_t> room;
    for (const auto& used : budget_->used)
      room.push_back(std::max<int64_t>(0, ShareBytes() - used.load()));
    return room;
  }

  // Makes `shards` hold `need` rows (growable contexts; `held` are held now): the last shard grows
  // on its device (twice its rows, else just enough); when that device's share is full, the rows
  // it cannot take go to a new shard on the device with the most room the context does not use
  // (config.shards bounds how many), and so on.
  absl::Status MakeRoom(const ContextConfig& c, int64_t held, int64_t need,
                        std::vector<Shard>& shards) {
    const int64_t row_bytes = RowBytes(c);
    while (need > shards.back().end()) {
      Shard& last = shards.back();
      Storage& old = *last.storage;
      const int64_t local = need - last.start;
      const int64_t grown = std::max(local, 2 * old.reserved_tokens);
      absl::StatusOr<std::shared_ptr<Storage>> bigger = NewStorage(c, old.device_index, grown);
      if (!bigger.ok() && grown > local) bigger = NewStorage(c, old.device_index, local);
      if (bigger.ok()) {
        const int64_t rows = ShardTokens(last.start, old.reserved_tokens, held);
        ATTN_RETURN_IF_ERROR((*bigger)->k->CopyFrom(*old.k, rows * row_bytes));
        ATTN_RETURN_IF_ERROR((*bigger)->v->CopyFrom(*old.v, rows * row_bytes));
        last.storage = *std::move(bigger);
        return absl::OkStatus();
      }
      const bool may_spill = c.shards == 0 || static_cast<int>(shards.size()) < c.shards;
      if (!absl::IsResourceExhausted(bigger.status()) || !may_spill) return bigger.status();
      std::vector<size_t> used;
      for (const Shard& sh : shards) used.push_back(sh.storage->device_index);
      const std::vector<int64_t> room = Room();
      const std::optional<size_t> spill = SpillDevice(room, 2 * row_bytes, used);
      if (!spill) return bigger.status();
      // The rows left, at least initial_tokens when there is room; fewer (and a further spill)
      // when the device cannot take them all.
      const int64_t left = need - last.end();
      const int64_t fit = room[*spill] / (2 * row_bytes);
      const int64_t rows = std::min(fit, std::max(left, options_.initial_tokens));
      const int64_t start = last.end();
      ATTN_ASSIGN_OR_RETURN(std::shared_ptr<Storage> fresh, NewStorage(c, *spill, rows));
      shards.push_back(Shard{start, std::move(fresh)});
    }
    return absl::OkStatus();
  }

  int64_t ShareBytes() const {
    return options_.memory_budget_bytes / static_cast<int64_t>(devices_.size());
  }

  size_t LeastUsedDevice() const {
    size_t best = 0;
    for (size_t i = 1; i < devices_.size(); ++i) {
      if (budget_->used[i].load() < budget_->used[best].load()) best = i;
    }
    return best;
  }

  // Reserves the bytes of `rows` rows of K and V on `device` within its share, then allocates.
  absl::StatusOr<std::shared_ptr<Storage>> NewStorage(const ContextConfig& c, size_t device,
                                                      int64_t rows) {
    const int64_t row_bytes = c.kv_heads * c.head_dim * static_cast<int64_t>(DTypeSize(c.dtype));
    if (rows > 0 && row_bytes > (int64_t{1} << 62) / 2 / rows) {
      return absl::ResourceExhaustedError("capacity_tokens: too many rows to count in bytes");
    }
    const int64_t bytes = 2 * rows * row_bytes;
    std::atomic<int64_t>& used = budget_->used[device];
    int64_t before = used.load();
    do {
      if (before + bytes > ShareBytes()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "context memory: ", rows, " rows of K and V need ", bytes, " bytes on ",
            devices_[device]->name(), ", which holds ", before, " of its ", ShareBytes(),
            " (--context-memory-bytes over ", devices_.size(), " device(s))"));
      }
    } while (!used.compare_exchange_weak(before, before + bytes));
    auto s = std::make_shared<Storage>();  // from here its destructor gives the bytes back
    s->budget = budget_;
    s->device_index = device;
    s->reserved_tokens = rows;
    s->bytes = bytes;
    Device& d = *devices_[device];
    absl::StatusOr<std::unique_ptr<ResidentMemory>> k = d.AllocateResident(rows * row_bytes);
    if (!k.ok()) return k.status();
    absl::StatusOr<std::unique_ptr<ResidentMemory>> v = d.AllocateResident(rows * row_bytes);
    if (!v.ok()) return v.status();
    s->k = *std::move(k);
    s->v = *std::move(v);
    return s;
  }

  absl::StatusOr<std::shared_ptr<Entry>> Find(const std::string& owner, const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(Key(owner, name));
    if (it == entries_.end()) return NotFoundLocked(owner, name);
    return it->second;
  }

  // Whether `e` left the map (deleted or expired) since it was found.
  bool Gone(const Entry& e) const {
    auto it = entries_.find(Key(e.owner, e.config.name));
    return it == entries_.end() || it->second.get() != &e;
  }

  absl::Status NotFound(const std::string& owner, const std::string& name) {
    return NotFoundLocked(owner, name);
  }
  absl::Status NotFoundLocked(const std::string& owner, const std::string& name) const {
    auto it = tombstones_.find(Key(owner, name));
    return absl::NotFoundError(
        absl::StrCat("context: no context named '", SanitizeForLog(name, 128), "'",
                     it == tombstones_.end() ? "" : absl::StrCat(" (", it->second, ")")));
  }

  // `key`: Key(owner, name).
  void RememberLocked(const std::string& key, std::string why) {
    if (tombstones_.size() >= kMaxTombstones) {
      tombstones_.erase(tombstone_order_.front());
      tombstone_order_.pop_front();
    }
    if (tombstones_.insert_or_assign(key, std::move(why)).second) {
      tombstone_order_.push_back(key);
    }
  }

  ContextInfo InfoLocked(const Entry& e, absl::Time now) const {
    ContextInfo info;
    info.config = e.config;
    info.owner = e.owner;
    info.tokens = e.tokens;
    for (const Shard& sh : e.shards) {
      const Storage& st = *sh.storage;
      ContextShardInfo shard;
      shard.device = devices_[st.device_index]->name();
      shard.start = sh.start;
      shard.tokens = ShardTokens(sh.start, st.reserved_tokens, e.tokens);
      shard.reserved_tokens = st.reserved_tokens;
      shard.bytes = st.bytes;
      info.reserved_tokens += shard.reserved_tokens;
      info.bytes += shard.bytes;
      info.device =
          info.device.empty() ? shard.device : absl::StrCat(info.device, ",", shard.device);
      info.shards.push_back(std::move(shard));
    }
    info.idle_seconds = absl::ToDoubleSeconds(now - e.last_used);
    info.attends = e.attends;
    info.in_use = e.in_use->load();
    return info;
  }

  void SweepLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.sweep_interval));
      if (stopping_) break;
      lock.unlock();
      Sweep(absl::Now());
      lock.lock();
    }
  }

  const ContextStoreOptions options_;
  const std::vector<Device*> devices_;
  const std::shared_ptr<Budget> budget_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::shared_ptr<Entry>> entries_;
  std::map<std::string, std::string> tombstones_;
  std::deque<std::string> tombstone_order_;
  std::thread sweeper_;  // last: joined before the members it reads are destroyed
};

}  // namespace

absl::StatusOr<std::unique_ptr<ContextStore>> ContextStore::Create(
    const ContextStoreOptions& options, std::vector<Device*> devices) {
  if (devices.empty()) return absl::InvalidArgumentError("contexts: no device");
  if (options.memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--context-memory-bytes: must be >= 0, got ", options.memory_budget_bytes));
  }
  if (options.max_contexts < 0 || options.initial_tokens < 1) {
    return absl::InvalidArgumentError("contexts: max_contexts >= 0 and initial_tokens >= 1");
  }
  return std::unique_ptr<ContextStore>(new ContextStoreImpl(options, std::move(devices)));
}

}  // namespace attnserve
