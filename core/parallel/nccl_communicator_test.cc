// NCCL communicator on real GPUs (labels multigpu, gpu). Skips cleanly without enough GPUs.
#include "core/parallel/nccl_communicator.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// Runs fn(rank, comm) on one thread per GPU with a fresh group; returns each rank's status.
template <typename Fn>
std::vector<absl::Status> OnEveryRank(int P, Fn fn) {
  auto group = NcclGroup::Create(P);
  if (!group.ok()) return std::vector<absl::Status>(P, group.status());
  std::vector<absl::Status> status(P);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      cudaStream_t stream;
      cudaStreamCreate(&stream);
      NcclCommunicator::Options o;
      o.group = *group;
      o.rank = r;
      o.cuda_device = r;
      o.compute_stream = stream;
      o.init_timeout = absl::Seconds(60);
      auto comm = NcclCommunicator::Create(o);
      if (!comm.ok()) {
        status[r] = comm.status();
      } else {
        status[r] = fn(r, **comm, stream);
      }
      comm = absl::CancelledError("destroyed");  // destroy on the owning thread
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

TEST(NcclCommunicatorTest, RingRotatesDeviceBuffers) {
  const int P = GpuCount();
  if (P < 2) GTEST_SKIP() << "needs >= 2 GPUs, found " << P;
  constexpr int kWords = 1 << 20;
  auto status = OnEveryRank(P, [&](int r, NcclCommunicator& c, cudaStream_t s) -> absl::Status {
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
    std::vector<int32_t> host(kWords);
    std::iota(host.begin(), host.end(), r * kWords);
    int32_t *cur, *next;
    cudaMalloc(&cur, kWords * 4);
    cudaMalloc(&next, kWords * 4);
    cudaMemcpyAsync(cur, host.data(), kWords * 4, cudaMemcpyHostToDevice, s);
    absl::Status st;
    for (int t = 0; t + 1 < P && st.ok(); ++t) {
      auto pending =
          c.StartSendRecv(cur, kWords * 4, (r + 1) % P, next, kWords * 4, (r - 1 + P) % P);
      if (!pending.ok()) {
        st = pending.status();
        break;
      }
      WaitOptions w;
      w.timeout = absl::Seconds(30);
      st = c.Wait(*std::move(pending), w);
      std::swap(cur, next);
      cudaMemcpyAsync(host.data(), cur, kWords * 4, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      const int src = (r - t - 1 + 2 * P) % P;
      if (st.ok() && (host[0] != src * kWords || host[kWords - 1] != src * kWords + kWords - 1)) {
        st = absl::InternalError("wrong data");
      }
    }
    if (st.ok()) {
      EXPECT_EQ(c.bytes_sent(), int64_t{4} * kWords * (P - 1));
      EXPECT_EQ(c.bytes_received(), int64_t{4} * kWords * (P - 1));
    }
    cudaFree(cur);
    cudaFree(next);
    return st;
  });
  for (int r = 0; r < P; ++r) EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
}

TEST(NcclCommunicatorTest, MissingSenderTimesOutInsteadOfHanging) {
  const int P = GpuCount();
  if (P < 2) GTEST_SKIP() << "needs >= 2 GPUs, found " << P;
  const absl::Time start = absl::Now();
  auto status = OnEveryRank(2, [&](int r, NcclCommunicator& c, cudaStream_t) -> absl::Status {
    if (r != 0) {
      // Rank 1 never sends; it polls until rank 0's failure aborts the group.
      WaitOptions w;
      w.timeout = absl::Seconds(1);
      while (absl::Now() - start < absl::Seconds(60)) {
        auto idle = c.StartSendRecv(nullptr, 0, kNoPeer, nullptr, 0, kNoPeer);
        if (!idle.ok()) return idle.status();
        if (absl::Status s = c.Wait(*std::move(idle), w); !s.ok()) return s;
        absl::SleepFor(absl::Milliseconds(5));
      }
      return absl::OkStatus();
    }
    void* buf;
    cudaMalloc(&buf, 64);
    auto pending = c.StartSendRecv(nullptr, 0, kNoPeer, buf, 64, 1);
    if (!pending.ok()) return pending.status();
    WaitOptions w;
    w.timeout = absl::Milliseconds(200);
    absl::Status s = c.Wait(*std::move(pending), w);
    cudaFree(buf);
    return s;
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kDeadlineExceeded) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kDeadlineExceeded) << status[1];  // the abort
  // Init, a 200 ms timeout and the aborts: far below the 60 s rank 1 would wait otherwise.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

}  // namespace
}  // namespace attnserve
