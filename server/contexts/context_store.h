// Contexts: K and V the server keeps on a device between requests, so that a decode step sends a
// few query rows instead of the whole context (CreateContext / AppendContext / Attend with
// header.context / DeleteContext).
//
// Ownership: the store holds each context's entry; its K and V live in a Storage (two
// ResidentMemory blocks of `reserved` rows, taken from the device and counted in its memory
// figures). A request takes a ContextView: a shared_ptr on the Storage of that moment and the row
// count, so an append that grows the context (a new Storage, rows copied on the device) or a delete
// never frees memory a request still reads; the bytes go back to the budget when the last holder
// lets go. Appends to one context are serialised and commit at once (the row count moves only after
// every byte is on the device), so a request sees all of an append or none of it.
//
// Sharding: a context larger than one device's share (or created with shards > 1) is split by
// sequence: shard s holds rows [start_s, start_s + reserved_s) on its own device, and the shards
// fill in order (shard_layout.h). A fixed capacity is split evenly when the context is created; a
// growable context grows its last shard and, when that device's share is full, spills into the
// device with the most room that it does not use yet. An attend against it runs on every shard's
// device at once (context-parallel, core/parallel/context_parallel.h).
//
// Limits: the K + V bytes of every context together stay within memory_budget_bytes (RESOURCE_
// EXHAUSTED past it; each device gets an equal share). A
// context idle for longer than its time-to-live is deleted by the sweeper, never while a request
// holds it. Every method takes `owner` (the caller's principal, server/auth/; "" for every caller
// without a token file). Each owner has its own namespace of names: another owner's context is
// NOT_FOUND, and two owners may each create a context of the same name.
#ifndef ATTNSERVE_SERVER_CONTEXTS_CONTEXT_STORE_H_
#define ATTNSERVE_SERVER_CONTEXTS_CONTEXT_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/engine/device.h"
#include "core/tensor/dtype.h"

namespace attnserve {

struct ContextStoreOptions {
  // K + V bytes of every context together; split evenly over the devices.
  int64_t memory_budget_bytes = int64_t{1} << 30;
  absl::Duration default_ttl = absl::Minutes(10);
  int max_contexts = 1024;
  // Rows a growable context reserves first; it then doubles as rows arrive.
  int64_t initial_tokens = 4096;
  // How often the sweeper looks for expired contexts (0: no sweeper thread; Sweep by hand).
  absl::Duration sweep_interval = absl::Seconds(1);
};

struct ContextConfig {
  std::string name;
  DType dtype = DType::kBF16;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t capacity_tokens = 0;  // 0: growable
  // Devices to split the rows over: 0 automatic (one device when it fits, else the fewest that
  // do; a growable one spills into any), 1 one device only, n an even split of the capacity over
  // n devices (growable: at most n).
  int shards = 0;
  absl::Duration ttl = absl::ZeroDuration();  // 0: the store's default
};

// One shard of a context: rows [start, start + reserved_tokens) on `device`, `tokens` of them held.
struct ContextShardInfo {
  std::string device;
  int64_t start = 0;
  int64_t tokens = 0;
  int64_t reserved_tokens = 0;
  int64_t bytes = 0;
};

struct ContextInfo {
  ContextConfig config;  // ttl resolved
  std::string owner;
  int64_t tokens = 0;
  int64_t reserved_tokens = 0;
  int64_t bytes = 0;   // K + V bytes held for it now (every shard)
  std::string device;  // the shards' devices, comma-separated in shard order
  std::vector<ContextShardInfo> shards;
  double idle_seconds = 0;
  int64_t attends = 0;
  int64_t in_use = 0;
};

// The rows of one shard a request reads: context rows [start, start + tokens), at k_data / v_data
// ([tokens, kv_heads, head_dim] each) on device `device_index`.
struct ContextShardView {
  size_t device_index = 0;
  bool on_device = false;
  int cuda_ordinal = -1;
  int64_t start = 0;
  int64_t tokens = 0;
  std::byte* k_data = nullptr;
  std::byte* v_data = nullptr;
};

// What one request reads: rows [0, tokens) of K and V, each [tokens, kv_heads, head_dim] row-major
// in `dtype`, at k_data / v_data: host memory on a CPU device, the GPU's memory on a CUDA device
// (on_device). A sharded context lists its shards that hold rows in `shards` (in row order); the
// top-level device and data fields are then the first shard's. `hold` keeps the memory alive and
// counts the request as a user of the context.
struct ContextView {
  size_t device_index = 0;
  bool on_device = false;
  int cuda_ordinal = -1;  // on_device: the GPU
  DType dtype = DType::kBF16;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t tokens = 0;
  std::byte* k_data = nullptr;
  std::byte* v_data = nullptr;
  std::vector<ContextShardView> shards;  // >= 1 entries once the context has rows
  std::shared_ptr<const void> hold;

  bool sharded() const { return shards.size() > 1; }
};

// Per-device figures for the metrics.
struct ContextTotals {
  int64_t contexts = 0;
  std::vector<int64_t> bytes;  // by device index: K + V bytes held (deleted-but-in-use included)
};

class ContextStore {
 public:
  // `devices` (the server's, by pool index) must outlive the store and every view.
  static absl::StatusOr<std::unique_ptr<ContextStore>> Create(const ContextStoreOptions& options,
                                                              std::vector<Device*> devices);
  virtual ~ContextStore() = default;

  // INVALID_ARGUMENT naming the field (name, dtype, kv_heads, head_dim, capacity_tokens,
  // ttl_seconds); ALREADY_EXISTS; RESOURCE_EXHAUSTED (max_contexts, the budget, the device).
  virtual absl::StatusOr<ContextInfo> CreateContext(const std::string& owner,
                                                    const ContextConfig& config) = 0;
  // Appends `tokens` rows: `k` and `v` point at [tokens, kv_heads, head_dim] in the context's
  // dtype (host memory; page-locked for full-speed copies to a GPU). NOT_FOUND (unknown, deleted
  // or expired: the message says which when the store remembers), FAILED_PRECONDITION when
  // expect_tokens is set and differs from the rows held at commit, RESOURCE_EXHAUSTED past the
  // capacity or the budget.
  virtual absl::StatusOr<ContextInfo> Append(const std::string& owner, const std::string& name,
                                             int64_t tokens, const void* k, const void* v,
                                             std::optional<int64_t> expect_tokens) = 0;
  // A view for one request (NOT_FOUND as Append); refreshes the idle clock.
  virtual absl::StatusOr<ContextView> Acquire(const std::string& owner,
                                              const std::string& name) = 0;
  virtual absl::StatusOr<ContextInfo> Get(const std::string& owner, const std::string& name) = 0;
  // Gone for new requests at once; returns the requests holding it now.
  virtual absl::StatusOr<int64_t> Delete(const std::string& owner, const std::string& name) = 0;
  virtual std::vector<ContextInfo> List(const std::string& owner) = 0;
  // Deletes the contexts idle past their time-to-live that no request holds; returns how many.
  virtual int Sweep(absl::Time now) = 0;
  // Drops every context (server shutdown; views in flight keep their memory until they end).
  virtual void DeleteAll() = 0;
  virtual ContextTotals Totals() const = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_CONTEXTS_CONTEXT_STORE_H_
