// How a context's rows lie over the devices: shard s holds the context's rows
// [start_s, start_s + reserved_s) on one device, the shards follow each other without gaps
// (start_{s+1} = start_s + reserved_s), and appended rows fill them in order. Pure functions over
// the devices' free bytes, so the store's choices are tested without memory.
#ifndef ATTNSERVE_SERVER_CONTEXTS_SHARD_LAYOUT_H_
#define ATTNSERVE_SERVER_CONTEXTS_SHARD_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace attnserve {

// One shard to create: `rows` rows reserved on device `device` (an index into the store's
// devices).
struct ShardRows {
  size_t device = 0;
  int64_t rows = 0;
};

// Where a fixed-capacity context of `capacity` rows (`row_bytes` bytes of K + V each) goes, given
// the bytes each device still has in its share (`room`, by device index). `shards` 0: one device
// when one has room for all of it, else the fewest devices (most room first) over which an even
// split fits; n >= 1: an even split over the n devices with the most room (INVALID_ARGUMENT when
// there are fewer). The capacity is split evenly (the first capacity % n shards take one row
// more); the shards are in ascending device order. RESOURCE_EXHAUSTED when no split fits.
absl::StatusOr<std::vector<ShardRows>> PlanFixedShards(const std::vector<int64_t>& room,
                                                       int64_t row_bytes, int64_t capacity,
                                                       int shards);

// The device a growable context spills into when its last shard's device is full: the one with the
// most room among those it does not use yet (ties: the lowest index), if it has room for a row.
std::optional<size_t> SpillDevice(const std::vector<int64_t>& room, int64_t row_bytes,
                                  const std::vector<size_t>& used);

// Rows of the context (of `tokens`) that shard [start, start + reserved) holds.
inline int64_t ShardTokens(int64_t start, int64_t reserved, int64_t tokens) {
  if (tokens <= start) return 0;
  return tokens - start < reserved ? tokens - start : reserved;
}

// The part of the context's rows [begin, end) that lands in one shard: `rows` rows from row
// `first` of what is appended (0 = row `begin`) to the shard's row `local`.
struct ShardPiece {
  size_t shard = 0;
  int64_t local = 0;
  int64_t first = 0;
  int64_t rows = 0;
};

// The pieces of rows [begin, end) over the shards starting at `starts` with `reserved` rows each
// (in order, without gaps); rows past the last shard's end are not covered.
std::vector<ShardPiece> SplitRows(const std::vector<int64_t>& starts,
                                  const std::vector<int64_t>& reserved, int64_t begin, int64_t end);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_CONTEXTS_SHARD_LAYOUT_H_
