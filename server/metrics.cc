#include "server/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"
#include "wire/status.h"

namespace attnserve {
namespace {

// Seconds, from 1 ms to about 9 minutes (x2 per bucket): tiny requests to 1M-token CPU runs.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 0.001; s < 600; s *= 2) b.push_back(s);
  return b;
}

}  // namespace

// Registered with the exposer before the registry: refreshes the device gauges so that the
// registry's collection right after it reads current values. Contributes no families itself.
class Metrics::ScrapeHook : public prometheus::Collectable {
 public:
  explicit ScrapeHook(Metrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    metrics_->Refresh();
    return {};
  }

 private:
  Metrics* metrics_;
};

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {}

Metrics::~Metrics() {
  // Stop serving before the series go away.
  exposer_.reset();
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsOptions& options,
                                                         std::vector<const Device*> devices) {
  std::unique_ptr<Metrics> m(new Metrics());
  prometheus::Registry& r = *m->registry_;

  auto& used = prometheus::BuildGauge()
                   .Name("attnserve_device_memory_used_bytes")
                   .Help(
                       "Bytes in use by attnserve's buffers on the device (CPU: the device's "
                       "tracker: running request's inputs, outputs, workspaces)")
                   .Register(r);
  auto& total = prometheus::BuildGauge()
                    .Name("attnserve_device_memory_total_bytes")
                    .Help("Device memory capacity (CPU: host MemTotal)")
                    .Register(r);
  auto& reserved = prometheus::BuildGauge()
                       .Name("attnserve_device_memory_reserved_bytes")
                       .Help("Bytes held by the device's caching allocator (CPU: same as used)")
                       .Register(r);
  auto& peak = prometheus::BuildGauge()
                   .Name("attnserve_device_memory_peak_bytes")
                   .Help("Peak of used bytes since start")
                   .Register(r);
  auto& tokens = prometheus::BuildCounter()
                     .Name("attnserve_device_tokens_total")
                     .Help("Query tokens (batch * tokens) computed on the device")
                     .Register(r);
  auto& flops = prometheus::BuildCounter()
                    .Name("attnserve_device_flops_total")
                    .Help("Attention FLOPs (4 * B * Hq * D * admitted pairs) on the device")
                    .Register(r);
  auto& busy = prometheus::BuildCounter()
                   .Name("attnserve_device_busy_seconds_total")
                   .Help("Seconds the device spent running requests")
                   .Register(r);
  auto& nccl = prometheus::BuildCounter()
                   .Name("attnserve_nccl_bytes_total")
                   .Help("Bytes moved by the device over NCCL (CPU backend: in-process ring transfers)")
                   .Register(r);
  auto& nccl_comms = prometheus::BuildCounter()
                         .Name("attnserve_nccl_communicators_created_total")
                         .Help("NCCL communicators created on the device for GPU rings (cached and "
                               "reused by later rings over the same devices)")
                         .Register(r);
  m->imbalance_ = &prometheus::BuildGauge()
                       .Name("attnserve_device_memory_imbalance_ratio")
                       .Help("Snapshot: (max - min) / max of used bytes over the devices")
                       .Register(r)
                       .Add({});
  auto& copies = prometheus::BuildCounter()
                    .Name("attnserve_device_copy_bytes_total")
                    .Help("Bytes copied between host memory and the device (direction h2d, d2h)")
                    .Register(r);
  auto& pageable = prometheus::BuildCounter()
                       .Name("attnserve_device_pageable_copy_bytes_total")
                       .Help("Of attnserve_device_copy_bytes_total, bytes copied from or to "
                             "pageable host memory (slow; none is expected)")
                       .Register(r);
  for (const Device* d : devices) {
    const std::string name = d->name();
    const std::string uuid = d->uuid();
    DeviceSeries s;
    s.device = d;
    s.used = &used.Add({{"device", name}, {"uuid", uuid}});
    s.total = &total.Add({{"device", name}, {"uuid", uuid}});
    s.reserved = &reserved.Add({{"device", name}});
    s.peak = &peak.Add({{"device", name}});
    s.tokens = &tokens.Add({{"device", name}});
    s.flops = &flops.Add({{"device", name}});
    s.busy = &busy.Add({{"device", name}});
    s.nccl_send = &nccl.Add({{"device", name}, {"direction", "send"}});
    s.nccl_recv = &nccl.Add({{"device", name}, {"direction", "recv"}});
    s.nccl_comms = &nccl_comms.Add({{"device", name}});
    s.copy_h2d = &copies.Add({{"device", name}, {"direction", "h2d"}});
    s.copy_d2h = &copies.Add({{"device", name}, {"direction", "d2h"}});
    s.copy_pageable = &pageable.Add({{"device", name}});
    m->devices_.push_back(s);
  }

  auto& requests = prometheus::BuildCounter()
                       .Name("attnserve_requests_total")
                       .Help("Finished Attend calls by gRPC status code")
                       .Register(r);
  for (int c = 0; c < static_cast<int>(m->requests_.size()); ++c) {
    m->requests_[c] = &requests.Add({{"code", GrpcCodeName(static_cast<grpc::StatusCode>(c))}});
  }
  m->request_duration_ = &prometheus::BuildHistogram()
                              .Name("attnserve_request_duration_seconds")
                              .Help("Attend calls, first message to final status")
                              .Register(r)
                              .Add({}, SecondsBuckets());
  m->queue_wait_ = &prometheus::BuildHistogram()
                        .Name("attnserve_queue_wait_seconds")
                        .Help("Time from a complete request to its admission on a device")
                        .Register(r)
                        .Add({}, SecondsBuckets());
  m->queue_length_ = &prometheus::BuildGauge()
                          .Name("attnserve_queue_length")
                          .Help("Requests waiting for a device")
                          .Register(r)
                          .Add({});
  m->inflight_ = &prometheus::BuildGauge()
                      .Name("attnserve_inflight_requests")
                      .Help("Attend calls in progress (uploading, queued, running or sending)")
                      .Register(r)
                      .Add({});
  m->received_bytes_ = &prometheus::BuildCounter()
                            .Name("attnserve_received_bytes_total")
                            .Help("Tensor payload bytes received (Q, K, V chunks)")
                            .Register(r)
                            .Add({});
  m->sent_bytes_ = &prometheus::BuildCounter()
                        .Name("attnserve_sent_bytes_total")
                        .Help("Tensor payload bytes sent (O, LSE chunks)")
                        .Register(r)
                        .Add({});

  m->nccl_groups_created_ = &prometheus::BuildCounter()
                                 .Name("attnserve_nccl_groups_created_total")
                                 .Help("NCCL groups (unique ids) made for GPU rings: one per "
                                       "device set, again after a group aborted")
                                 .Register(r)
                                 .Add({});

  m->AddDataPathSeries(r, options);
  m->AddContextSeries(r);
  m->hook_ = std::make_shared<ScrapeHook>(m.get());
  if (!options.listen.empty()) {
    // civetweb reports a failed bind by throwing; keep that exception inside this function.
    try {
      m->exposer_ = std::make_unique<prometheus::Exposer>(options.listen, /*num_threads=*/2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("--metrics-listen=", options.listen, ": cannot listen (", e.what(), ")"));
    }
    m->exposer_->RegisterCollectable(m->hook_);
    m->exposer_->RegisterCollectable(m->registry_);
    const std::vector<int> ports = m->exposer_->GetListeningPorts();
    if (!ports.empty()) m->port_ = ports.front();
  }
  return m;
}

// The request stage histograms and the host memory series.
void Metrics::AddDataPathSeries(prometheus::Registry& r, const MetricsOptions& options) {
  auto& stages = prometheus::BuildHistogram()
                     .Name("attnserve_request_stage_seconds")
                     .Help("Where successful Attend calls spent their time: receive, queue, "
                           "compute (copy and kernel are parts of it), send")
                     .Register(r);
  const char* stage_names[] = {"receive", "queue", "compute", "copy", "kernel", "send"};
  for (size_t i = 0; i < stages_.size(); ++i) {
    stages_[i] = &stages.Add({{"stage", stage_names[i]}}, SecondsBuckets());
  }
  auto& host = prometheus::BuildGauge()
                   .Name("attnserve_host_page_locked_bytes")
                   .Help("Page-locked host memory held for request buffers and staging (state "
                         "in_use, cached) and caller regions registered for copies (registered)")
                   .Register(r);
  host_memory_ = options.host_memory;
  host_in_use_ = &host.Add({{"state", "in_use"}});
  host_cached_ = &host.Add({{"state", "cached"}});
  host_registered_ = &host.Add({{"state", "registered"}});
  host_cap_ = &prometheus::BuildGauge()
                      .Name("attnserve_host_page_locked_cap_bytes")
                      .Help("Cap of the page-locked host memory pool (--pinned-host-cap-bytes)")
                      .Register(r)
                      .Add({});
  host_fallback_ = &prometheus::BuildCounter()
                           .Name("attnserve_host_pageable_fallback_bytes_total")
                           .Help("Bytes handed out as pageable memory because the page-locked "
                                 "pool was at its cap")
                           .Register(r)
                           .Add({});
  auto& regions = prometheus::BuildGauge()
                      .Name("attnserve_regions")
                      .Help("Shared-memory regions mapped (registered, or unregistered but still "
                            "used by requests in flight), by kind (system, cuda_ipc)")
                      .Register(r);
  auto& region_bytes = prometheus::BuildGauge()
                           .Name("attnserve_region_bytes")
                           .Help("Bytes of the mapped shared-memory regions, by kind")
                           .Register(r);
  for (int k = 0; k < kNumRegionKinds; ++k) {
    const std::string kind(RegionKindName(static_cast<RegionKind>(k)));
    regions_[k] = &regions.Add({{"kind", kind}});
    region_bytes_[k] = &region_bytes.Add({{"kind", kind}});
  }
}

void Metrics::AddContextSeries(prometheus::Registry& r) {
  auto& bytes = prometheus::BuildGauge()
                    .Name("attnserve_context_bytes")
                    .Help("K and V bytes of the contexts kept on the device (deleted ones still "
                          "used by requests in flight included)")
                    .Register(r);
  for (DeviceSeries& s : devices_) s.context_bytes = &bytes.Add({{"device", s.device->name()}});
  contexts_ = &prometheus::BuildGauge()
                   .Name("attnserve_contexts")
                   .Help("Contexts the server keeps (CreateContext, not yet deleted or expired)")
                   .Register(r)
                   .Add({});
  request_buffer_bytes_ =
      &prometheus::BuildGauge()
           .Name("attnserve_request_buffer_bytes")
           .Help("Q/K/V request buffers and staged context rows held by calls in progress")
           .Register(r)
           .Add({});
  resident_bytes_ = &prometheus::BuildGauge()
                         .Name("attnserve_process_resident_bytes")
                         .Help("Resident set size of the server process (/proc/self/statm)")
                         .Register(r)
                         .Add({});
}

void Metrics::SetRequestBufferSource(std::function<int64_t()> source) {
  std::lock_guard<std::mutex> lock(refresh_mu_);
  request_buffer_source_ = std::move(source);
}

void Metrics::SetContextSource(std::function<ContextTotals()> source) {
  std::lock_guard<std::mutex> lock(refresh_mu_);
  context_source_ = std::move(source);
}

void Metrics::SetRegionSource(std::function<RegionTotals()> source) {
  std::lock_guard<std::mutex> lock(refresh_mu_);
  region_source_ = std::move(source);
}

void Metrics::RecordRun(size_t device, double tokens, double flops, double busy_seconds) {
  if (device >= devices_.size()) return;
  DeviceSeries& s = devices_[device];
  s.tokens->Increment(tokens);
  s.flops->Increment(flops);
  s.busy->Increment(busy_seconds);
}

void Metrics::RecordCommBytes(size_t device, int64_t sent, int64_t received) {
  if (device >= devices_.size()) return;
  DeviceSeries& s = devices_[device];
  if (sent > 0) s.nccl_send->Increment(static_cast<double>(sent));
  if (received > 0) s.nccl_recv->Increment(static_cast<double>(received));
}

void Metrics::AddNcclCommCreated(size_t device) {
  if (device >= devices_.size()) return;
  devices_[device].nccl_comms->Increment();
}

void Metrics::RecordRequest(grpc::StatusCode code, double seconds) {
  int c = static_cast<int>(code);
  if (c < 0 || c >= static_cast<int>(requests_.size())) c = grpc::StatusCode::UNKNOWN;
  requests_[c]->Increment();
  request_duration_->Observe(seconds);
}

void Metrics::RecordStages(const StageSeconds& s) {
  const double v[] = {s.receive, s.queue, s.compute, s.copy, s.kernel, s.send};
  for (size_t i = 0; i < stages_.size(); ++i) stages_[i]->Observe(v[i]);
}

namespace {

// Adds the growth of a monotonic figure to a counter.
void AddGrowth(prometheus::Counter* c, int64_t now, int64_t& last) {
  if (now > last) c->Increment(static_cast<double>(now - last));
  last = std::max(last, now);
}

}  // namespace

void Metrics::Refresh() {
  std::lock_guard<std::mutex> lock(refresh_mu_);
  int64_t max_used = 0;
  int64_t min_used = 0;
  bool first = true;
  for (DeviceSeries& s : devices_) {
    const DeviceStats stats = s.device->Stats();
    s.used->Set(static_cast<double>(stats.memory_used_bytes));
    s.total->Set(static_cast<double>(stats.memory_total_bytes));
    s.reserved->Set(static_cast<double>(stats.memory_reserved_bytes));
    s.peak->Set(static_cast<double>(stats.memory_peak_bytes));
    AddGrowth(s.copy_h2d, stats.copy_h2d_bytes, s.last.copy_h2d_bytes);
    AddGrowth(s.copy_d2h, stats.copy_d2h_bytes, s.last.copy_d2h_bytes);
    AddGrowth(s.copy_pageable, stats.pageable_copy_bytes, s.last.pageable_copy_bytes);
    max_used = first ? stats.memory_used_bytes : std::max(max_used, stats.memory_used_bytes);
    min_used = first ? stats.memory_used_bytes : std::min(min_used, stats.memory_used_bytes);
    first = false;
  }
  imbalance_->Set(max_used > 0
                      ? static_cast<double>(max_used - min_used) / static_cast<double>(max_used)
                      : 0.0);
  if (host_memory_ != nullptr) {
    const HostMemoryStats h = host_memory_->stats();
    host_in_use_->Set(static_cast<double>(h.in_use_bytes));
    host_cached_->Set(static_cast<double>(h.cached_bytes));
    host_registered_->Set(static_cast<double>(h.registered_bytes));
    host_cap_->Set(static_cast<double>(h.cap_bytes));
    AddGrowth(host_fallback_, h.fallback_bytes, last_fallback_);
  }
  if (region_source_) {
    const RegionTotals t = region_source_();
    for (int k = 0; k < kNumRegionKinds; ++k) {
      regions_[k]->Set(static_cast<double>(t.regions[k]));
      region_bytes_[k]->Set(static_cast<double>(t.bytes[k]));
    }
  }
  if (request_buffer_source_) {
    request_buffer_bytes_->Set(static_cast<double>(request_buffer_source_()));
  }
  {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    resident_bytes_->Set(static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)));
  }
  if (context_source_) {
    const ContextTotals t = context_source_();
    contexts_->Set(static_cast<double>(t.contexts));
    for (size_t i = 0; i < devices_.size() && i < t.bytes.size(); ++i) {
      devices_[i].context_bytes->Set(static_cast<double>(t.bytes[i]));
    }
  }
}

std::string Metrics::RenderText() {
  Refresh();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace attnserve
