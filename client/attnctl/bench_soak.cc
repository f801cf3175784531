#include "client/attnctl/bench_soak.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "client/attnctl/check.h"
#include "core/tensor/dtype.h"
#include "grpcpp/grpcpp.h"
#include "wire/convert.h"

namespace attnserve::attnctl {
namespace {

enum class Kind { kSilent, kSlow, kOversized, kCancelling };
constexpr Kind kKinds[] = {Kind::kSilent, Kind::kSlow, Kind::kOversized, Kind::kCancelling};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kSilent:
      return "silent";
    case Kind::kSlow:
      return "slow";
    case Kind::kOversized:
      return "oversized";
    case Kind::kCancelling:
      return "cancelling";
  }
  return "?";
}

// /proc/<pid>/status VmRSS in bytes (0 when unreadable).
int64_t ReadRss(int64_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

// O as floats.
std::vector<float> AsFloats(const HostTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  ConvertToFloat32(t.dtype(), t.data(), out.data(), out.size());
  return out;
}

// max |a - b| / max |b|.
double RelativeDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

class Driver;

// One hostile stream. The driver holds a hold (AddHold) on it from start to RemoveHold, so
// OnDone -- which records the outcome and deletes it -- cannot come while the driver looks at it;
// its own reactions only touch atomics and start its next write (oversized).
class HostileStream final : public grpc::ClientBidiReactor<v1::AttendRequest, v1::AttendResponse> {
 public:
  HostileStream(Driver* driver, Kind kind, v1::AttentionService::Stub* stub,
                const v1::AttendHeader& header, int64_t q_bytes, int64_t oversized_bytes,
                absl::Time cancel_at)
      : driver_(driver), kind_(kind), q_bytes_(q_bytes), cancel_at_(cancel_at),
        start_(absl::Now()) {
    *header_msg_.mutable_header() = header;
    if (kind == Kind::kOversized) {
      v1::TensorChunk* c = big_.mutable_chunk();
      c->set_tensor(v1::TENSOR_Q);
      c->set_offset(0);
      c->mutable_data()->assign(static_cast<size_t>(oversized_bytes), '\0');
    }
    stub->async()->Attend(&context_, this);
    AddHold();
    write_in_flight_ = true;
    StartWrite(&header_msg_);
    StartRead(&response_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      write_in_flight_ = false;
      return;
    }
    if (kind_ == Kind::kOversized && !big_sent_) {
      big_sent_ = true;
      StartWrite(&big_);
      return;
    }
    if (kind_ == Kind::kCancelling && !part_sent_) {
      // Part of Q, then the driver cancels.
      part_sent_ = true;
      v1::TensorChunk* c = part_.mutable_chunk();
      c->set_tensor(v1::TENSOR_Q);
      c->set_offset(0);
      c->mutable_data()->assign(static_cast<size_t>(std::min<int64_t>(q_bytes_ / 2, 1 << 16)), '\0');
      StartWrite(&part_);
      return;
    }
    write_in_flight_ = false;
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      StartRead(&response_);  // a hostile stream is not expected to get one; drain it anyway
      return;
    }
    ended_ = true;  // the status has arrived (or the call is gone)
  }

  void OnDone(const grpc::Status& status) override;

  // On the driver thread only.
  // Slow: the next few bytes of Q when the last write is done and they are due.
  void Drive(absl::Time now, int64_t rate) {
    if (kind_ == Kind::kCancelling && !cancelled_ && now >= cancel_at_) {
      cancelled_ = true;
      context_.TryCancel();
    }
    if (kind_ != Kind::kSlow || write_in_flight_ || ended_) return;
    const int64_t due = static_cast<int64_t>(absl::ToDoubleSeconds(now - start_) * rate);
    int64_t n = std::min(due - sent_, q_bytes_ - sent_);
    if (n <= 0) return;
    slow_.Clear();
    v1::TensorChunk* c = slow_.mutable_chunk();
    c->set_tensor(v1::TENSOR_Q);
    c->set_offset(sent_);
    c->mutable_data()->assign(static_cast<size_t>(n), '\0');
    sent_ += n;
    write_in_flight_ = true;
    StartWrite(&slow_);
  }
  bool ended() const { return ended_; }
  void Cancel() { context_.TryCancel(); }
  void Release() { RemoveHold(); }
  Kind kind() const { return kind_; }

 private:
  Driver* const driver_;
  const Kind kind_;
  const int64_t q_bytes_;
  const absl::Time cancel_at_;
  const absl::Time start_;
  grpc::ClientContext context_;
  v1::AttendRequest header_msg_, big_, part_, slow_;
  v1::AttendResponse response_;
  std::atomic<bool> write_in_flight_{false};
  std::atomic<bool> ended_{false};
  bool big_sent_ = false, part_sent_ = false, cancelled_ = false;
  int64_t sent_ = 0;
};

// Keeps each class's streams open until `stop_at`, then waits for them (cancelling what is left
// at `give_up_at`).
class Driver {
 public:
  Driver(const SoakOptions& o, const v1::AttendHeader& header, int64_t q_bytes)
      : options_(o), header_(header), q_bytes_(q_bytes) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    for (int64_t i = 0; i < std::max<int64_t>(1, o.hostile_channels); ++i) {
      // A channel argument of its own: a connection of its own, not a shared subchannel.
      args.SetInt("attnctl.soak_channel", static_cast<int>(i));
      channels_.push_back(
          grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(v1::AttentionService::NewStub(channels_.back()));
    }
  }

  void Record(Kind kind, const grpc::Status& status, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    SoakClass& c = classes_[KindName(kind)];
    const std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
    ++c.codes[code];
    c.min_seconds = total(c) == 1 ? seconds : std::min(c.min_seconds, seconds);
    c.max_seconds = std::max(c.max_seconds, seconds);
    live_[static_cast<int>(kind)]--;
  }

  // The driver loop; returns once every stream has ended.
  void Run(absl::Time stop_at, absl::Time give_up_at, const std::function<void()>& tick) {
    const int64_t want[4] = {options_.silent, options_.slow, options_.oversized,
                             options_.cancelling};
    std::mt19937 rng(1);
    size_t next_channel = 0;
    std::list<HostileStream*> streams;
    bool gave_up = false;
    for (;;) {
      const absl::Time now = absl::Now();
      if (now < stop_at) {
        for (Kind k : kKinds) {
          const int i = static_cast<int>(k);
          while (true) {
            {
              std::lock_guard<std::mutex> lock(mu_);
              if (live_[i] >= want[i]) break;
              ++live_[i];
              ++classes_[KindName(k)].started;
            }
            const absl::Time cancel_at =
                now + absl::Milliseconds(100 + static_cast<int>(rng() % 900));
            streams.push_back(new HostileStream(this, k, stubs_[next_channel].get(), header_,
                                                q_bytes_, options_.oversized_bytes, cancel_at));
            next_channel = (next_channel + 1) % stubs_.size();
          }
        }
      }
      if (now >= give_up_at && !gave_up) {
        gave_up = true;
        std::lock_guard<std::mutex> lock(mu_);
        for (HostileStream* s : streams) {
          if (!s->ended()) ++classes_[KindName(s->kind())].open_at_end;
        }
      }
      for (auto it = streams.begin(); it != streams.end();) {
        HostileStream* s = *it;
        if (gave_up && !s->ended()) s->Cancel();
        if (s->ended()) {
          s->Release();  // OnDone may run (and delete it) from here on
          it = streams.erase(it);
          continue;
        }
        s->Drive(now, options_.slow_rate);
        ++it;
      }
      if (tick) tick();
      if (now >= stop_at && streams.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (live_[0] + live_[1] + live_[2] + live_[3] == 0) break;  // every OnDone has run
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  std::map<std::string, SoakClass> classes() {
    std::lock_guard<std::mutex> lock(mu_);
    return classes_;
  }

 private:
  static int64_t total(const SoakClass& c) {
    int64_t n = 0;
    for (const auto& [code, count] : c.codes) n += count;
    return n;
  }

  const SoakOptions& options_;
  const v1::AttendHeader header_;
  const int64_t q_bytes_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::AttentionService::Stub>> stubs_;
  std::mutex mu_;
  int64_t live_[4] = {0, 0, 0, 0};
  std::map<std::string, SoakClass> classes_;
};

void HostileStream::OnDone(const grpc::Status& status) {
  driver_->Record(kind_, status, absl::ToDoubleSeconds(absl::Now() - start_));
  delete this;
}

// Normal traffic: `concurrency` threads, request i uses spec i % specs; each spec's first answer
// is the one the others must match (and, with check, is checked against the reference).
class NormalTraffic {
 public:
  NormalTraffic(client::AttnClient& client, const Problem& problem, const SoakOptions& o)
      : client_(client), problem_(problem), options_(o), firsts_(o.specs.size()) {}

  void Run(absl::Time stop_at) {
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < options_.concurrency; ++t) {
      threads.emplace_back([this, stop_at] {
        client::CallOptions call;
        call.timeout = options_.timeout;
        while (absl::Now() < stop_at) {
          const size_t i = static_cast<size_t>(next_.fetch_add(1)) % options_.specs.size();
          client::AttendInput input;
          input.q = &problem_.q;
          input.k = &problem_.k;
          input.v = &problem_.v;
          input.spec = options_.specs[i];
          input.q_offset = problem_.q_offset;
          const absl::Time begin = absl::Now();
          absl::StatusOr<client::AttendResult> r = client_.Attend(input, call);
          Record(i, std::move(r), absl::ToDoubleSeconds(absl::Now() - begin));
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }

  void Fill(SoakReport* report) {
    std::lock_guard<std::mutex> lock(mu_);
    report->normal_ok = ok_;
    report->normal_failed = failed_;
    report->normal_mismatched = mismatched_;
    report->normal_codes = codes_;
    report->first_error = first_error_;
    report->reference_rel = reference_rel_;
    std::sort(latencies_.begin(), latencies_.end());
    if (!latencies_.empty()) {
      const auto at = [&](double q) {
        return latencies_[std::min(latencies_.size() - 1,
                                   static_cast<size_t>(q * static_cast<double>(latencies_.size())))];
      };
      report->p50 = at(0.5);
      report->p99 = at(0.99);
      report->max_latency = latencies_.back();
    }
  }

 private:
  void Record(size_t spec, absl::StatusOr<client::AttendResult> r, double seconds) {
    if (!r.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++failed_;
      ++codes_[absl::StatusCodeToString(r.status().code())];
      if (first_error_.empty()) first_error_ = r.status().ToString();
      return;
    }
    std::vector<float> o = AsFloats(r->o);
    std::unique_lock<std::mutex> lock(mu_);
    ++codes_["OK"];
    latencies_.push_back(seconds);
    if (!firsts_[spec]) {
      // The first answer of this spec: the one the others are held to (kept before the lock is
      // let go, so no other answer becomes a second "first"), checked against the reference when
      // asked (outside the lock: it takes a while).
      firsts_[spec] = o;
      bool pass = true;
      if (options_.check) {
        lock.unlock();
        Problem p;
        p.q = View(problem_.q);
        p.k = View(problem_.k);
        p.v = View(problem_.v);
        p.spec = options_.specs[spec];
        p.q_offset = problem_.q_offset;
        absl::StatusOr<CheckOutcome> outcome = CheckAgainstReference(p, *r);
        lock.lock();
        pass = outcome.ok() && outcome->pass;
        reference_rel_.push_back(outcome.ok() ? outcome->o_rel : INFINITY);
        if (!pass && first_error_.empty()) {
          first_error_ = outcome.ok() ? absl::StrCat("spec ", spec, ": O differs from the "
                                                     "reference by ", outcome->o_rel)
                                      : outcome.status().ToString();
        }
      }
      if (pass) {
        ++ok_;
      } else {
        ++mismatched_;
      }
      return;
    }
    const double tolerance = options_.tolerance > 0 ? options_.tolerance : 1e-3;
    const double rel = RelativeDiff(o, *firsts_[spec]);
    if (rel <= tolerance) {
      ++ok_;
    } else {
      ++mismatched_;
      if (first_error_.empty()) {
        first_error_ = absl::StrCat("spec ", spec, ": an answer differs from the first by ", rel);
      }
    }
  }

  static HostTensor View(const HostTensor& t) {
    return *HostTensor::Wrap(t.dtype(), t.dims(), const_cast<std::byte*>(t.data()), t.nbytes(),
                             nullptr);
  }

  client::AttnClient& client_;
  const Problem& problem_;
  const SoakOptions& options_;
  std::atomic<int64_t> next_{0};
  std::mutex mu_;
  std::vector<std::optional<std::vector<float>>> firsts_;
  std::vector<double> reference_rel_;
  std::vector<double> latencies_;
  std::map<std::string, int64_t> codes_;
  std::string first_error_;
  int64_t ok_ = 0, failed_ = 0, mismatched_ = 0;
};

}  // namespace

SoakReport RunSoak(client::AttnClient& client, const Problem& problem, const SoakOptions& o) {
  SoakReport report;
  v1::AttendHeader header;
  header.set_request_id("soak-hostile");
  header.set_dtype(DTypeToProto(problem.q.dtype()));
  header.set_batch(problem.q.dim(0));
  header.set_tokens(problem.q.dim(1));
  header.set_q_heads(problem.q.dim(2));
  header.set_kv_heads(problem.k.dim(2));
  header.set_head_dim(problem.q.dim(3));
  if (problem.k.dim(1) != problem.q.dim(1)) header.set_kv_tokens(problem.k.dim(1));
  if (problem.q_offset) header.set_q_offset(*problem.q_offset);
  *header.mutable_spec() = o.specs.front();

  std::atomic<int64_t> peak{0};
  const auto sample = [&] {
    if (o.server_pid <= 0) return;
    const int64_t rss = ReadRss(o.server_pid);
    int64_t p = peak.load();
    while (rss > p && !peak.compare_exchange_weak(p, rss)) {
    }
  };
  if (o.server_pid > 0) report.rss_start = ReadRss(o.server_pid);
  sample();

  const absl::Time start = absl::Now();
  const absl::Time stop_at = start + o.duration;
  Driver driver(o, header, static_cast<int64_t>(problem.q.nbytes()));
  NormalTraffic normal(client, problem, o);
  std::thread normal_thread([&] { normal.Run(stop_at); });
  absl::Time last_sample = absl::InfinitePast();
  driver.Run(stop_at, stop_at + o.grace, [&] {
    if (absl::Now() - last_sample >= absl::Milliseconds(100)) {
      last_sample = absl::Now();
      sample();
    }
  });
  normal_thread.join();
  report.elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  // Let the server free and trim; sample the peak on the way.
  const absl::Time settle_end = absl::Now() + o.settle;
  while (absl::Now() < settle_end) {
    sample();
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (o.server_pid > 0) report.rss_end = ReadRss(o.server_pid);
  report.rss_peak = peak.load();
  normal.Fill(&report);
  report.classes = driver.classes();
  return report;
}

Json SoakReportJson(const SoakReport& r) {
  Json normal = Json::Object();
  Json codes = Json::Object();
  for (const auto& [code, n] : r.normal_codes) codes.Set(code, n);
  normal.Set("ok", r.normal_ok)
      .Set("failed", r.normal_failed)
      .Set("mismatched", r.normal_mismatched)
      .Set("codes", std::move(codes))
      .Set("p50_s", r.p50)
      .Set("p99_s", r.p99)
      .Set("max_s", r.max_latency)
      .Set("reference_rel", Json::ArrayOf(r.reference_rel))
      .Set("first_error", r.first_error);
  Json classes = Json::Object();
  for (const auto& [name, c] : r.classes) {
    Json cc = Json::Object();
    for (const auto& [code, n] : c.codes) cc.Set(code, n);
    Json one = Json::Object();
    one.Set("started", c.started)
        .Set("codes", std::move(cc))
        .Set("open_at_end", c.open_at_end)
        .Set("min_s", c.min_seconds)
        .Set("max_s", c.max_seconds);
    classes.Set(name, std::move(one));
  }
  Json rss = Json::Object();
  rss.Set("start", r.rss_start).Set("peak", r.rss_peak).Set("end", r.rss_end);
  Json doc = Json::Object();
  doc.Set("elapsed_s", r.elapsed)
      .Set("normal", std::move(normal))
      .Set("hostile", std::move(classes))
      .Set("server_rss_bytes", std::move(rss));
  return doc;
}

std::string SoakReportText(const SoakReport& r) {
  std::string out = absl::StrFormat(
      "soak       %.1f s\nnormal     %d ok, %d failed, %d mismatched; p50 %.3f s, p99 %.3f s, "
      "max %.3f s\n",
      r.elapsed, r.normal_ok, r.normal_failed, r.normal_mismatched, r.p50, r.p99, r.max_latency);
  if (!r.first_error.empty()) absl::StrAppend(&out, "first error ", r.first_error, "\n");
  for (const auto& [name, c] : r.classes) {
    std::string codes;
    for (const auto& [code, n] : c.codes) absl::StrAppend(&codes, " ", code, "=", n);
    absl::StrAppend(&out, absl::StrFormat("%-10s %d started,%s; open at end %d; ended after "
                                          "%.1f..%.1f s\n",
                                          name, c.started, codes, c.open_at_end, c.min_seconds,
                                          c.max_seconds));
  }
  if (r.rss_start > 0) {
    absl::StrAppend(&out, absl::StrFormat("server RSS start %.1f MiB, peak %.1f MiB, end %.1f MiB\n",
                                          r.rss_start / 1048576.0, r.rss_peak / 1048576.0,
                                          r.rss_end / 1048576.0));
  }
  return out;
}

}  // namespace attnserve::attnctl
