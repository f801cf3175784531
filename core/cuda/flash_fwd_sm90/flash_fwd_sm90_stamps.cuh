// Per-tile clock stamps of the persistent kernel's consumer warpgroups, for studying the
// ping-pong cadence (which warpgroup waits for which, and for what). A developer's build only:
// compiled in with -DATTNSERVE_SM90_STAMPS=1 (bench/sm90_stamps.sh says how to build and run such
// an attnbench_cuda); in every other build `Stamps` is empty and its calls compile to nothing.
//
// What is recorded: for the first kStampCtas CTAs of a launch, thread 0 of each consumer
// warpgroup writes clock64() at the StampPoints of each of its first kStampTiles tiles, plus
// the tile's index in its item. After a launch of the non-cluster kernel (of at least
// ATTNSERVE_SM90_STAMPS_MIN_ITEMS items), the launcher copies the table to the file named by
// ATTNSERVE_SM90_STAMPS_OUT (overwritten by each such launch: the last one stays).
// bench/sm90_stamps.py reads it.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_STAMPS_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_STAMPS_CUH_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#ifndef ATTNSERVE_SM90_STAMPS
#define ATTNSERVE_SM90_STAMPS 0
#endif

namespace attnserve {
namespace flash_sm90 {

// The points of a tile (consume_tile in _consumer.cuh), in order.
enum StampPoint : int {
  kStampStart = 0,     // the tile's start, before the K wait
  kStampKLanded = 1,   // K(e) landed
  kStampTurn = 2,      // the ping-pong barrier passed: this warpgroup's turn to issue
  kStampVLanded = 3,   // V(e-1) landed (in the window at 128-key tiles, before the turn at 176;
                       // 0: none pending)
  kStampIssued = 4,    // S(e) and P(e-1) V(e-1) issued, the other warpgroup released
  kStampScores = 5,    // S(e) complete
  kStampPv = 6,        // P(e-1) V(e-1) complete (after the row maxima)
  kStampEnd = 7,       // P(e) packed: the tile's end
  kStampEpilogue = 8,  // tile 0 only: the previous item's epilogue starts (after P(0) packed)
  kStampStored = 9,    // tile 0 only: its O and LSE stores issued
};
// Words per tile: the points and one for the tile's index in its item and the item's count.
constexpr int kStampWords = 11;
constexpr int kStampCtas = 8;
constexpr int kStampTiles = 4096;
constexpr int kStampWgs = 2;

#if ATTNSERVE_SM90_STAMPS && defined(__CUDACC__)
static __device__ unsigned long long g_sm90_stamps[kStampCtas][kStampWgs][kStampTiles]
                                                  [kStampWords];
#endif

#if ATTNSERVE_SM90_STAMPS && defined(__CUDACC__)
// Host side, around a launch on `stream` of `items` work items: only launches of at least
// ATTNSERVE_SM90_STAMPS_MIN_ITEMS items (default 1024) are recorded, so that the small launches
// a run makes besides the measured ones (checks, other layouts) do not overwrite the table.
// Before: zero the table; after: copy it to ATTNSERVE_SM90_STAMPS_OUT (a header of five int32:
// magic 0x53544d50, CTAs, warpgroups, tiles, words; then the table).
// The output path when a launch of `items` items is recorded, else null.
static const char* StampsPath(long long items) {
  const char* path = std::getenv("ATTNSERVE_SM90_STAMPS_OUT");
  const char* min = std::getenv("ATTNSERVE_SM90_STAMPS_MIN_ITEMS");
  return items >= (min != nullptr ? std::atoll(min) : 1024) ? path : nullptr;
}
static void StampsBeforeLaunch(cudaStream_t stream, long long items) {
  void* table = nullptr;
  if (StampsPath(items) != nullptr &&
      cudaGetSymbolAddress(&table, g_sm90_stamps) == cudaSuccess) {
    (void)cudaMemsetAsync(table, 0, sizeof(g_sm90_stamps), stream);
  }
}
static void StampsAfterLaunch(cudaStream_t stream, long long items) {
  const char* path = StampsPath(items);
  if (path == nullptr || cudaStreamSynchronize(stream) != cudaSuccess) return;
  std::vector<unsigned long long> host(sizeof(g_sm90_stamps) / sizeof(unsigned long long));
  if (cudaMemcpyFromSymbol(host.data(), g_sm90_stamps, sizeof(g_sm90_stamps)) != cudaSuccess) {
    return;
  }
  if (std::FILE* f = std::fopen(path, "wb")) {
    const int32_t head[5] = {0x53544d50, kStampCtas, kStampWgs, kStampTiles, kStampWords};
    std::fwrite(head, sizeof(head), 1, f);
    std::fwrite(host.data(), sizeof(unsigned long long), host.size(), f);
    std::fclose(f);
  }
}
#endif

#if ATTNSERVE_SM90_STAMPS && defined(__CUDA_ARCH__)
struct Stamps {
  unsigned long long* row = nullptr;  // this warpgroup's table (null: not recorded)
  int tile = 0;                       // tiles so far
  __device__ __forceinline__ explicit Stamps(int wg) {
    if (blockIdx.x < kStampCtas && wg < kStampWgs && threadIdx.x % 128 == 0) {
      row = &g_sm90_stamps[blockIdx.x][wg][0][0];
    }
  }
  __device__ __forceinline__ void At(int point) const {
    if (row != nullptr && tile < kStampTiles) {
      row[tile * kStampWords + point] = clock64();
    }
  }
  // kStampEnd, and the tile's place in its item.
  __device__ __forceinline__ void EndTile(int e, int count) {
    At(kStampEnd);
    if (row != nullptr && tile < kStampTiles) {
      row[tile * kStampWords + kStampWords - 1] =
          (static_cast<unsigned long long>(count) << 32) | static_cast<unsigned>(e);
    }
    ++tile;
  }
};
#else
struct Stamps {
  __device__ __forceinline__ explicit Stamps(int) {}
  __device__ __forceinline__ void At(int) const {}
  __device__ __forceinline__ void EndTile(int, int) {}
};
#endif

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_STAMPS_CUH_
