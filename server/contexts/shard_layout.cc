#include "server/contexts/shard_layout.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

// Device indices, most room first (ties: the lowest index).
std::vector<size_t> ByRoom(const std::vector<int64_t>& room) {
  std::vector<size_t> order(room.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return room[a] > room[b]; });
  return order;
}

// The even split of `capacity` over the first n devices of `order`, or nullopt when a shard does
// not fit its device.
std::optional<std::vector<ShardRows>> EvenSplit(const std::vector<int64_t>& room,
                                                const std::vector<size_t>& order, int64_t row_bytes,
                                                int64_t capacity, size_t n) {
  std::vector<size_t> devices(order.begin(), order.begin() + static_cast<ptrdiff_t>(n));
  std::sort(devices.begin(), devices.end());
  std::vector<ShardRows> out;
  const int64_t per = capacity / static_cast<int64_t>(n);
  const int64_t extra = capacity % static_cast<int64_t>(n);
  for (size_t s = 0; s < n; ++s) {
    const int64_t rows = per + (static_cast<int64_t>(s) < extra ? 1 : 0);
    if (rows > room[devices[s]] / row_bytes) return std::nullopt;
    out.push_back(ShardRows{devices[s], rows});
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ShardRows>> PlanFixedShards(const std::vector<int64_t>& room,
                                                       int64_t row_bytes, int64_t capacity,
                                                       int shards) {
  if (room.empty() || row_bytes < 1 || capacity < 1) {
    return absl::InvalidArgumentError("contexts: no device, row or capacity to place");
  }
  if (shards < 0 || static_cast<size_t>(shards) > room.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shards: must be in [0, ", room.size(),
                                                   "] (0: automatic; the server has ", room.size(),
                                                   " device(s)), got ", shards));
  }
  if (static_cast<int64_t>(shards) > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shards: ", shards, " shards need at least as many rows, capacity_tokens is ", capacity));
  }
  const std::vector<size_t> order = ByRoom(room);
  const size_t first = shards > 0 ? static_cast<size_t>(shards) : 1;
  const size_t last = shards > 0 ? static_cast<size_t>(shards)
                                 : std::min(room.size(), static_cast<size_t>(capacity));
  for (size_t n = first; n <= last; ++n) {
    if (auto split = EvenSplit(room, order, row_bytes, capacity, n)) return *std::move(split);
  }
  const int64_t need = ((capacity + static_cast<int64_t>(last) - 1) / static_cast<int64_t>(last));
  return absl::ResourceExhaustedError(absl::StrCat(
      "context memory: ", capacity, " rows of K and V (", row_bytes, " bytes each) split over ",
      last, " device(s) need ", need * row_bytes, " bytes on each, and the device with the ",
      last == 1 ? "most" : absl::StrCat(last, "th most"), " room has ", room[order[last - 1]],
      " bytes left of its share of --context-memory-bytes"));
}

std::optional<size_t> SpillDevice(const std::vector<int64_t>& room, int64_t row_bytes,
                                  const std::vector<size_t>& used) {
  for (size_t d : ByRoom(room)) {
    if (std::find(used.begin(), used.end(), d) != used.end()) continue;
    if (room[d] >= row_bytes) return d;
    return std::nullopt;  // the rest have less room still
  }
  return std::nullopt;
}

std::vector<ShardPiece> SplitRows(const std::vector<int64_t>& starts,
                                  const std::vector<int64_t>& reserved, int64_t begin,
                                  int64_t end) {
  std::vector<ShardPiece> out;
  for (size_t s = 0; s < starts.size() && s < reserved.size(); ++s) {
    const int64_t lo = std::max(begin, starts[s]);
    const int64_t hi = std::min(end, starts[s] + reserved[s]);
    if (lo < hi) out.push_back(ShardPiece{s, lo - starts[s], lo - begin, hi - lo});
  }
  return out;
}

}  // namespace attnserve
