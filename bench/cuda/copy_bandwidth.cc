// attnbench_copy: the host <-> device copy ceiling of one GPU, which attnserve's staging of Q, K,
// V (up) and O, LSE (down) is compared against.
//
// Rows, each the best (and the median) of --iters timed runs after --warmup untimed ones:
//   pageable H2D / D2H   cudaMemcpyAsync from / to malloc'd memory (pages touched first), one
//                        non-blocking stream, sizes --sizes
//   pinned H2D / D2H     the same from / to cudaHostAlloc'd (page-locked) memory
//   chunked H2D / D2H    --chunked-bytes (1 GiB) moved as --chunk-bytes (4 MiB) cudaMemcpyAsync
//                        pieces through a ring of --staging-buffers (4) pinned buffers on
//                        --streams (2) streams: piece i uses buffer i % ring and stream
//                        i % streams, and waits (on the host, as a server refilling the buffer
//                        would) for piece i - ring to finish before it reuses the buffer. Shows
//                        what chunking costs against one pinned copy of the same size.
//   chunked+host H2D/D2H the staging path with the host's part: each piece is first copied by
//                        the host from a pageable buffer into its staging buffer (H2D), or from
//                        the staging buffer into a pageable one once it arrived (D2H)
// Times are CUDA events (start on the first stream, end after every stream's work); "wall" is
// the host clock around the same run (it includes the host copies of the chunked+host rows that
// finish after the last event). GB/s = bytes / seconds / 1e9.
//
//   attnbench_copy [--device 0] [--sizes 4MiB,64MiB,1GiB] [--iters 5] [--warmup 1]
//                  [--chunked-bytes 1GiB] [--chunk-bytes 4MiB] [--staging-buffers 4]
//                  [--streams 2] [--json-out FILE]
// Exit code: 0 on success, 1 on any error (no CUDA device visible included).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/cuda/open_device.h"
#include "bench/harness/flags.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/run_record.h"
#include "core/cuda/cuda_status.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

ABSL_FLAG(int, device, 0, "CUDA ordinal");
ABSL_FLAG(std::vector<std::string>, sizes, std::vector<std::string>({"4MiB", "64MiB", "1GiB"}),
          "comma list of copy sizes for the pageable and pinned rows (bytes, or with a K/M/G, "
          "KiB/MiB/GiB suffix: powers of 1024)");
ABSL_FLAG(int, iters, 5, "timed runs per row (the best is reported)");
ABSL_FLAG(int, warmup, 1, "untimed runs per row first");
ABSL_FLAG(std::string, chunked_bytes, "1GiB", "bytes of the chunked rows (0: no chunked rows)");
ABSL_FLAG(std::string, chunk_bytes, "4MiB", "bytes per piece of the chunked rows");
ABSL_FLAG(int, staging_buffers, 4, "pinned staging buffers in the chunked rows' ring");
ABSL_FLAG(int, streams, 2, "streams of the chunked rows");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace attnserve::bench {
namespace {

constexpr char kUsage[] =
    "attnbench_copy [--device 0] [--sizes 4MiB,64MiB,1GiB] [--iters 5] [--chunked-bytes 1GiB] "
    "[--chunk-bytes 4MiB] [--staging-buffers 4] [--streams 2] [--json-out FILE]\n"
    "Host <-> device copy bandwidth: pageable, pinned, and pinned in chunks through a staging "
    "ring.";

// "4MiB", "4M", "4194304" -> 4194304.
absl::StatusOr<int64_t> ParseBytes(const std::string& flag, std::string text) {
  const std::string original = text;
  text = absl::AsciiStrToLower(text);
  int64_t scale = 1;
  for (const auto& [suffix, s] : std::vector<std::pair<std::string, int64_t>>{{"kib", 1 << 10},
                                                                              {"mib", 1 << 20},
                                                                              {"gib", 1 << 30},
                                                                              {"k", 1 << 10},
                                                                              {"m", 1 << 20},
                                                                              {"g", 1 << 30}}) {
    if (text.size() > suffix.size() && text.ends_with(suffix)) {
      text.resize(text.size() - suffix.size());
      scale = s;
      break;
    }
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 0 || n > (int64_t{1} << 40) / scale) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", original, "' is not a byte count (e.g. 64MiB)"));
  }
  return n * scale;
}

struct Flags {
  int device = 0;
  std::vector<int64_t> sizes;
  int iters = 0, warmup = 0;
  int64_t chunked_bytes = 0, chunk_bytes = 0;
  int staging_buffers = 0, streams = 0;
  std::string json_out;
};

absl::StatusOr<Flags> ReadFlags() {
  Flags f;
  f.device = absl::GetFlag(FLAGS_device);
  for (const std::string& s : absl::GetFlag(FLAGS_sizes)) {
    ATTN_ASSIGN_OR_RETURN(const int64_t n, ParseBytes("sizes", s));
    if (n < 1) return absl::InvalidArgumentError("--sizes: sizes must be >= 1 byte");
    f.sizes.push_back(n);
  }
  f.iters = absl::GetFlag(FLAGS_iters);
  f.warmup = absl::GetFlag(FLAGS_warmup);
  ATTN_ASSIGN_OR_RETURN(f.chunked_bytes,
                        ParseBytes("chunked-bytes", absl::GetFlag(FLAGS_chunked_bytes)));
  ATTN_ASSIGN_OR_RETURN(f.chunk_bytes, ParseBytes("chunk-bytes", absl::GetFlag(FLAGS_chunk_bytes)));
  f.staging_buffers = absl::GetFlag(FLAGS_staging_buffers);
  f.streams = absl::GetFlag(FLAGS_streams);
  f.json_out = absl::GetFlag(FLAGS_json_out);
  if (f.iters < 1 || f.iters > 1000) return absl::InvalidArgumentError("--iters: not in [1, 1000]");
  if (f.warmup < 0 || f.warmup > 100)
    return absl::InvalidArgumentError("--warmup: not in [0, 100]");
  if (f.chunked_bytes > 0 && f.chunk_bytes < 1) {
    return absl::InvalidArgumentError("--chunk-bytes: must be >= 1");
  }
  if (f.staging_buffers < 1 || f.staging_buffers > 64) {
    return absl::InvalidArgumentError("--staging-buffers: not in [1, 64]");
  }
  if (f.streams < 1 || f.streams > 16)
    return absl::InvalidArgumentError("--streams: not in [1, 16]");
  return f;
}

// ---- owned CUDA resources (each frees what it holds; errors on free are ignored) -------------

struct HostBuffer {
  void* p = nullptr;
  bool pinned = false;
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (p == nullptr) return;
    if (pinned) {
      cudaFreeHost(p);
    } else {
      std::free(p);
    }
  }
  char* bytes() const { return static_cast<char*>(p); }
};

// Pinned: cudaHostAlloc. Pageable: malloc, every page written once, so that the first timed copy
// does not pay the page faults.
absl::Status AllocHost(HostBuffer& b, int64_t bytes, bool pinned) {
  b.pinned = pinned;
  if (pinned) {
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(&b.p, static_cast<size_t>(bytes), cudaHostAllocDefault));
  } else {
    b.p = std::malloc(static_cast<size_t>(bytes));
    if (b.p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("malloc(", bytes, ")"));
  }
  std::memset(b.p, 0x5a, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

struct DeviceBuffer {
  void* p = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p != nullptr) cudaFree(p);
  }
  char* bytes() const { return static_cast<char*>(p); }
};

struct Streams {
  std::vector<cudaStream_t> s;
  std::vector<cudaEvent_t> e;  // start, end, one per stream (joins), one per ring slot
  Streams() = default;
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  ~Streams() {
    for (cudaEvent_t ev : e) cudaEventDestroy(ev);
    for (cudaStream_t st : s) cudaStreamDestroy(st);
  }
};

absl::Status MakeStreams(Streams& out, int streams, int events) {
  for (int i = 0; i < streams; ++i) {
    cudaStream_t s = nullptr;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    out.s.push_back(s);
  }
  for (int i = 0; i < events; ++i) {
    cudaEvent_t e = nullptr;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    out.e.push_back(e);
  }
  return absl::OkStatus();
}

// ---- rows ------------------------------------------------------------------------------------

struct Row {
  std::string kind;       // pageable, pinned, chunked, chunked+host
  std::string direction;  // h2d, d2h
  int64_t bytes = 0;
  std::vector<double> event_s, wall_s;  // per timed run
  double best_gbps = 0, median_gbps = 0, best_wall_gbps = 0;
};

Row NewRow(std::string kind, bool h2d, int64_t bytes) {
  Row r;
  r.kind = std::move(kind);
  r.direction = h2d ? "h2d" : "d2h";
  r.bytes = bytes;
  return r;
}

void Summarize(Row& r) {
  const double gb = static_cast<double>(r.bytes) / 1e9;
  r.best_gbps = gb / *std::min_element(r.event_s.begin(), r.event_s.end());
  r.median_gbps = gb / Median(r.event_s);
  r.best_wall_gbps = gb / *std::min_element(r.wall_s.begin(), r.wall_s.end());
}

// Runs `one` (which enqueues a run between the start and end events) warmup + iters times.
template <typename F>
absl::Status TimeRuns(const Flags& f, Streams& st, Row& row, F one) {
  for (int i = 0; i < f.warmup + f.iters; ++i) {
    const auto w0 = Clock::now();
    CUDA_RETURN_IF_ERROR(cudaEventRecord(st.e[0], st.s[0]));
    ATTN_RETURN_IF_ERROR(one());
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(st.e[1]));
    const double wall = Seconds(w0, Clock::now());
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, st.e[0], st.e[1]));
    if (i >= f.warmup) {
      row.event_s.push_back(ms / 1e3);
      row.wall_s.push_back(wall);
    }
  }
  Summarize(row);
  return absl::OkStatus();
}

// One cudaMemcpyAsync of each size, direction and host memory kind.
absl::Status PlainRows(const Flags& f, int64_t bytes, std::vector<Row>& rows) {
  DeviceBuffer dev;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&dev.p, static_cast<size_t>(bytes)));
  Streams st;
  ATTN_RETURN_IF_ERROR(MakeStreams(st, 1, 2));
  for (const bool pinned : {false, true}) {
    HostBuffer host;
    ATTN_RETURN_IF_ERROR(AllocHost(host, bytes, pinned));
    for (const bool h2d : {true, false}) {
      Row row = NewRow(pinned ? "pinned" : "pageable", h2d, bytes);
      ATTN_RETURN_IF_ERROR(TimeRuns(f, st, row, [&]() -> absl::Status {
        CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(h2d ? dev.p : host.p, h2d ? host.p : dev.p, static_cast<size_t>(bytes),
                            h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, st.s[0]));
        CUDA_RETURN_IF_ERROR(cudaEventRecord(st.e[1], st.s[0]));
        return absl::OkStatus();
      }));
      rows.push_back(std::move(row));
    }
  }
  return absl::OkStatus();
}

// What the chunked rows share: the device buffer, the staging ring, the host's pageable side
// (for the +host rows) and the streams with their events: e[0] start, e[1] end, e[2 + s] stream
// s's end, e[2 + streams + b] ring slot b's last piece.
struct Staging {
  DeviceBuffer dev;
  std::vector<std::unique_ptr<HostBuffer>> ring;
  HostBuffer pageable;
  Streams st;
};

// One chunked run: pieces through the ring; `host` adds the host's copies (see the file comment).
absl::Status ChunkedRun(const Flags& f, Staging& sg, bool h2d, bool host) {
  const int64_t total = f.chunked_bytes, chunk = f.chunk_bytes;
  const int ring = f.staging_buffers, streams = f.streams;
  const int64_t pieces = (total + chunk - 1) / chunk;
  const auto slot_event = [&](int64_t piece) { return sg.st.e[2 + streams + piece % ring]; };
  const auto size_of = [&](int64_t piece) { return std::min(chunk, total - piece * chunk); };
  // D2H + host: piece p is in its staging buffer once its event completed; copy it out.
  const auto drain = [&](int64_t piece) -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot_event(piece)));
    if (host && !h2d) {
      std::memcpy(sg.pageable.bytes() + piece * chunk, sg.ring[piece % ring]->p,
                  static_cast<size_t>(size_of(piece)));
    }
    return absl::OkStatus();
  };
  for (int s = 1; s < streams; ++s)
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sg.st.s[s], sg.st.e[0]));
  for (int64_t p = 0; p < pieces; ++p) {
    if (p >= ring) ATTN_RETURN_IF_ERROR(drain(p - ring));  // the slot's previous piece is done
    char* staging = sg.ring[p % ring]->bytes();
    char* dev = sg.dev.bytes() + p * chunk;
    const size_t n = static_cast<size_t>(size_of(p));
    if (host && h2d) std::memcpy(staging, sg.pageable.bytes() + p * chunk, n);
    cudaStream_t s = sg.st.s[p % streams];
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h2d ? static_cast<void*>(dev) : staging,
                                         h2d ? static_cast<void*>(staging) : dev, n,
                                         h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(slot_event(p), s));
  }
  // The end event follows every stream's work; the last pieces are drained after it (wall only).
  for (int s = 1; s < streams; ++s) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(sg.st.e[2 + s], sg.st.s[s]));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sg.st.s[0], sg.st.e[2 + s]));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(sg.st.e[1], sg.st.s[0]));
  for (int64_t p = std::max<int64_t>(0, pieces - ring); p < pieces; ++p) {
    ATTN_RETURN_IF_ERROR(drain(p));
  }
  return absl::OkStatus();
}

absl::Status ChunkedRows(const Flags& f, std::vector<Row>& rows) {
  Staging sg;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&sg.dev.p, static_cast<size_t>(f.chunked_bytes)));
  for (int b = 0; b < f.staging_buffers; ++b) {
    sg.ring.push_back(std::make_unique<HostBuffer>());
    ATTN_RETURN_IF_ERROR(
        AllocHost(*sg.ring.back(), std::min(f.chunk_bytes, f.chunked_bytes), true));
  }
  ATTN_RETURN_IF_ERROR(AllocHost(sg.pageable, f.chunked_bytes, false));
  ATTN_RETURN_IF_ERROR(MakeStreams(sg.st, f.streams, 2 + f.streams + f.staging_buffers));
  for (const bool host : {false, true}) {
    for (const bool h2d : {true, false}) {
      Row row = NewRow(host ? "chunked+host" : "chunked", h2d, f.chunked_bytes);
      ATTN_RETURN_IF_ERROR(TimeRuns(f, sg.st, row, [&] { return ChunkedRun(f, sg, h2d, host); }));
      rows.push_back(std::move(row));
    }
  }
  return absl::OkStatus();
}

// ---- output ----------------------------------------------------------------------------------

std::string SizeName(int64_t bytes) {
  if (bytes % (int64_t{1} << 30) == 0) return absl::StrCat(bytes >> 30, " GiB");
  if (bytes % (int64_t{1} << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes % (int64_t{1} << 10) == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf(
      "\n| host memory | direction | bytes | best GB/s | median GB/s | best wall GB/s |\n"
      "|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %s | %.2f | %.2f | %.2f |\n", r.kind.c_str(),
                absl::AsciiStrToUpper(r.direction).c_str(), SizeName(r.bytes).c_str(), r.best_gbps,
                r.median_gbps, r.best_wall_gbps);
  }
  std::fflush(stdout);
}

Json ResultJson(const Flags& f, const std::string& device, const std::vector<Row>& rows) {
  Json j = Json::Object();
  AddRunRecord(MakeRunRecord(device), j);
  j.Set("bench", "copy_bandwidth");
  j.Set("gpu", f.device);
  j.Set("iters", f.iters);
  j.Set("warmup", f.warmup);
  j.Set("timing",
        "CUDA events around the copies on non-blocking streams (best of iters); wall: "
        "host clock around the same run; GB = 1e9 bytes");
  j.Set("chunked", Json::Object()
                       .Set("bytes", f.chunked_bytes)
                       .Set("chunk_bytes", f.chunk_bytes)
                       .Set("staging_buffers", f.staging_buffers)
                       .Set("streams", f.streams)
                       .Set("host_copy",
                            "chunked+host: memcpy pageable -> staging before each "
                            "H2D piece, staging -> pageable after each D2H piece"));
  Json out = Json::Array();
  for (const Row& r : rows) {
    out.Push(Json::Object()
                 .Set("host_memory", r.kind)
                 .Set("direction", r.direction)
                 .Set("bytes", r.bytes)
                 .Set("best_gb_per_s", r.best_gbps)
                 .Set("median_gb_per_s", r.median_gbps)
                 .Set("best_wall_gb_per_s", r.best_wall_gbps)
                 .Set("event_s", Json::ArrayOf(r.event_s))
                 .Set("wall_s", Json::ArrayOf(r.wall_s)));
  }
  j.Set("rows", std::move(out));
  return j;
}

absl::Status Main() {
  ATTN_ASSIGN_OR_RETURN(const Flags f, ReadFlags());
  ATTN_ASSIGN_OR_RETURN(const std::string device, OpenCudaDevice(f.device));
  std::printf(
      "attnbench_copy: %s\n  best of %d after %d warmup; sizes %s; chunked %s in %s "
      "pieces, %d staging buffers, %d streams\n",
      device.c_str(), f.iters, f.warmup,
      absl::StrJoin(f.sizes, ", ",
                    [](std::string* o, int64_t b) { absl::StrAppend(o, SizeName(b)); })
          .c_str(),
      SizeName(f.chunked_bytes).c_str(), SizeName(f.chunk_bytes).c_str(), f.staging_buffers,
      f.streams);
  std::fflush(stdout);
  std::vector<Row> rows;
  for (const int64_t bytes : f.sizes) ATTN_RETURN_IF_ERROR(PlainRows(f, bytes, rows));
  if (f.chunked_bytes > 0) ATTN_RETURN_IF_ERROR(ChunkedRows(f, rows));
  PrintTable(rows);
  if (!f.json_out.empty()) {
    ATTN_RETURN_IF_ERROR(WriteJsonOut(f.json_out, ResultJson(f, device, rows)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace attnserve::bench

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv, attnserve::bench::kUsage, "attnbench_copy",
                                     attnserve::bench::Main);
}
