// Metrics: the one owner of the prometheus-cpp registry and of the HTTP exposer. Every family and
// every series is built once, in Create; hot paths call the Record*/Add* methods, which touch
// pre-built series only (no label lookups).
//
// Device memory semantics: the attnserve_device_memory_* gauges are Device::Stats() of each
// device, refreshed on every scrape. For a CPU device "used" is the bytes its MemoryTracker holds:
// the Q/K/V of the request it is running, its outputs and its workspaces (request buffers still
// uploading or waiting in the queue belong to no device and are not counted there); "total" is
// the host's MemTotal; reserved == used.
#ifndef ATTNSERVE_SERVER_METRICS_H_
#define ATTNSERVE_SERVER_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/device.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/contexts/context_store.h"
#include "server/regions/region_registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace attnserve {

struct MetricsOptions {
  // host:port of the /metrics endpoint; port 0 picks a free one (see port()); empty: no endpoint
  // (the series still exist, RenderText() reads them).
  std::string listen = "0.0.0.0:9464";
  // The devices' host memory (page-locked pool on a GPU host), for the host memory series; may be
  // null. Must outlive the Metrics object.
  const HostMemory* host_memory = nullptr;
};

// Where one Attend call's time went (attnserve_request_stage_seconds{stage}).
struct StageSeconds {
  double receive = 0;  // first message to last input byte
  double queue = 0;    // waiting for admission
  double compute = 0;  // on the devices, copies included
  double copy = 0;     // host <-> device copies (part of compute)
  double kernel = 0;   // attention kernels (part of compute)
  double send = 0;     // from the result to the last response byte written
};

class Metrics {
 public:
  // `devices` must outlive the Metrics object (their Stats() are read on each scrape).
  // INTERNAL/UNAVAILABLE when the endpoint cannot listen.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const MetricsOptions& options,
                                                         std::vector<const Device*> devices);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The port the endpoint listens on, when it does.
  std::optional<int> port() const { return port_; }

  // One finished run on device `device` (index into the Create() list).
  void RecordRun(size_t device, double tokens, double flops, double busy_seconds);
  // Bytes device `device` sent / received over its communicator during one multi-device run
  // (NCCL on GPUs; the in-process ring transfers of CPU workers count here too).
  void RecordCommBytes(size_t device, int64_t sent, int64_t received);
  // One finished Attend call.
  void RecordRequest(grpc::StatusCode code, double seconds);
  // The stages of one successful Attend call.
  void RecordStages(const StageSeconds& s);
  void ObserveQueueWait(double seconds) { queue_wait_->Observe(seconds); }
  void SetQueueLength(int64_t n) { queue_length_->Set(static_cast<double>(n)); }
  void AddInflight(double delta) { inflight_->Increment(delta); }
  void AddReceivedBytes(int64_t n) { received_bytes_->Increment(static_cast<double>(n)); }
  void AddSentBytes(int64_t n) { sent_bytes_->Increment(static_cast<double>(n)); }
  // GPU rings: a new NCCL group (unique id) for a device set (the first ring over it, or the
  // rebuild after an abort), and one rank's NcclCommunicator created on device `device` (the
  // later rings over the same set reuse the cached ones, so neither moves then).
  void AddNcclGroupCreated() { nccl_groups_created_->Increment(); }
  void AddNcclCommCreated(size_t device);

  // Where the attnserve_regions / attnserve_region_bytes gauges read from on each scrape (the
  // service's region registry); null: they stay as they are. Thread-safe.
  void SetRegionSource(std::function<RegionTotals()> source);
  // Where attnserve_contexts / attnserve_context_bytes read from on each scrape (the service's
  // context store); null: they stay as they are. Thread-safe.
  void SetContextSource(std::function<ContextTotals()> source);
  // Where attnserve_request_buffer_bytes reads from on each scrape (the service's request-buffer
  // tracker); null: it stays as it is. Thread-safe. attnserve_process_resident_bytes is read from
  // /proc/self/statm on each scrape.
  void SetRequestBufferSource(std::function<int64_t()> source);

  // Copies every device's Stats() into the memory gauges and recomputes the imbalance ratio.
  // Called on each scrape; thread-safe.
  void Refresh();
  // The Prometheus text exposition of everything (after a Refresh), as /metrics serves it.
  std::string RenderText();

 private:
  struct DeviceSeries {
    const Device* device = nullptr;
    prometheus::Gauge* used = nullptr;
    prometheus::Gauge* total = nullptr;
    prometheus::Gauge* reserved = nullptr;
    prometheus::Gauge* peak = nullptr;
    prometheus::Counter* tokens = nullptr;
    prometheus::Counter* flops = nullptr;
    prometheus::Counter* busy = nullptr;
    prometheus::Counter* nccl_send = nullptr;
    prometheus::Counter* nccl_recv = nullptr;
    prometheus::Counter* nccl_comms = nullptr;
    prometheus::Counter* copy_h2d = nullptr;
    prometheus::Counter* copy_d2h = nullptr;
    prometheus::Counter* copy_pageable = nullptr;
    prometheus::Gauge* context_bytes = nullptr;
    DeviceStats last;  // counters' values at the last Refresh (the series add the difference)
  };
  class ScrapeHook;

  Metrics();
  void AddDataPathSeries(prometheus::Registry& r, const MetricsOptions& options);
  void AddContextSeries(prometheus::Registry& r);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ScrapeHook> hook_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::optional<int> port_;
  std::vector<DeviceSeries> devices_;
  prometheus::Gauge* imbalance_ = nullptr;
  std::array<prometheus::Counter*, 17> requests_{};  // by grpc::StatusCode 0..16
  prometheus::Histogram* request_duration_ = nullptr;
  prometheus::Histogram* queue_wait_ = nullptr;
  prometheus::Gauge* queue_length_ = nullptr;
  prometheus::Gauge* inflight_ = nullptr;
  prometheus::Counter* received_bytes_ = nullptr;
  prometheus::Counter* sent_bytes_ = nullptr;
  prometheus::Counter* nccl_groups_created_ = nullptr;
  std::array<prometheus::Histogram*, 6> stages_{};  // StageSeconds' fields, in order
  const HostMemory* host_memory_ = nullptr;
  prometheus::Gauge* host_in_use_ = nullptr;
  prometheus::Gauge* host_cached_ = nullptr;
  prometheus::Gauge* host_registered_ = nullptr;
  prometheus::Gauge* host_cap_ = nullptr;
  prometheus::Counter* host_fallback_ = nullptr;
  int64_t last_fallback_ = 0;
  std::function<RegionTotals()> region_source_;  // under refresh_mu_
  std::array<prometheus::Gauge*, kNumRegionKinds> regions_{};
  std::array<prometheus::Gauge*, kNumRegionKinds> region_bytes_{};
  std::function<ContextTotals()> context_source_;  // under refresh_mu_
  prometheus::Gauge* contexts_ = nullptr;
  std::function<int64_t()> request_buffer_source_;  // under refresh_mu_
  prometheus::Gauge* request_buffer_bytes_ = nullptr;
  prometheus::Gauge* resident_bytes_ = nullptr;
  std::mutex refresh_mu_;  // Refresh's differences of counters
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_METRICS_H_
