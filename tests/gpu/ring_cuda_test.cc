// The CUDA ring (core/parallel/ring_cuda) against the float64 reference and the single-GPU plan:
// dense, window and block_sparse, causal (zigzag) and not, N not divisible by P or the block.
// - the ring's pieces (ring_cuda_plan.h) launched on one GPU over the full tensors, accumulating
//   into one f32 O/LSE: checks the kernel's seqlen_k / global-position masks / accumulate
//   epilogue without NCCL (needs 1 GPU);
// - RingAttentionCuda over devices {0, 1} with NCCL (needs 2 GPUs; that part skips otherwise).
// Outputs are poisoned before every run so unwritten elements show.
#include "core/parallel/ring_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/host_copy.h"
#include "core/cuda/pinned_host_pool.h"
#include "core/parallel/nccl_communicator.h"
#include "core/parallel/ring_cuda_plan.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "core/util/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::ShapeString;
using ::attnserve::testing::UploadTensor;
using ::attnserve::testing::UploadVector;

constexpr double kOTol = 1e-2;    // bf16: max |o - ref| / max |ref|
constexpr double kLseTol = 2e-3;  // as tests/gpu/cuda_attention_test.cc for bf16

struct Case {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const AttentionShape mha{1, 1000, 4, 4, 128};  // N not divisible by P or by the block
  const AttentionShape gqa{2, 777, 4, 2, 64};    // batch 2, GQA, ragged
  const AttentionShape big{1, 2200, 2, 2, 128};  // several blocks per chunk
  // Each pattern non-causal then causal, so that a run cut short still covers both.
  auto both = [&](const std::string& name, const AttentionSpec& plain, const AttentionSpec& causal,
                  const AttentionShape& shape) {
    cases.push_back({name, plain, shape});
    cases.push_back({name + "_causal", causal, shape});
  };
  both("dense", testing::DenseCase(false), testing::DenseCase(true), mha);
  both("window100", testing::WindowCase(100, false), testing::WindowCase(100, true), mha);
  both("sparse_local64", testing::SparseCase(64, LocalWindowGen{2}, false),
       testing::SparseCase(64, LocalWindowGen{2}, true), mha);
  both("dense_gqa", testing::DenseCase(false), testing::DenseCase(true), gqa);
  both("window300_gqa", testing::WindowCase(300, false), testing::WindowCase(300, true), gqa);
  both("sparse_global64_gqa", testing::SparseCase(64, GlobalLocalGen{1, 1}, false),
       testing::SparseCase(64, GlobalLocalGen{1, 1}, true), gqa);
  both("dense_big", testing::DenseCase(false), testing::DenseCase(true), big);
  both("sparse_strided128", testing::SparseCase(128, StridedGen{3, 1}, false),
       testing::SparseCase(128, StridedGen{3, 1}, true), big);
  return cases;
}

struct Outputs {
  HostTensor o;
  HostTensor lse;
};

absl::StatusOr<Outputs> MakeOutputs(const AttentionShape& s) {
  Outputs out;
  ATTN_ASSIGN_OR_RETURN(
      out.o, HostTensor::Create(DType::kBF16, {s.batch, s.tokens, s.q_heads, s.head_dim}));
  ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens}));
  out.o.FillBytes(0xFF);
  out.lse.FillBytes(0xFF);
  return out;
}

// The single-GPU plan (CudaAttentionPlan on device 0, poisoned outputs): what the ring must
// reproduce.
void RunSingleGpu(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                  Outputs& out) {
  auto run = ::attnserve::testing::RunPlanOnGpu(c.spec, q, k, v);
  ASSERT_TRUE(run.ok()) << run.status();
  out.o = std::move(run->o);
  out.lse = std::move(run->lse);
}

// Every piece of a `ranks`-rank ring plan, launched on device 0 against the full tensors (rows
// addressed by global position), all accumulating into one f32 O / LSE.
void RunPiecesOnOneGpu(const Case& c, int ranks, const HostTensor& q, const HostTensor& k,
                       const HostTensor& v, Outputs& out, const RingCudaPlanOptions& po = {}) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto plan = PlanRingCuda(c.spec, c.shape.tokens, ranks, po);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const AttentionShape& s = c.shape;
  const int64_t nq = s.batch * s.tokens * s.q_heads * s.head_dim;
  CachingAllocator alloc(0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto dq = UploadTensor(alloc, q);
    auto dk = UploadTensor(alloc, k);
    auto dv = UploadTensor(alloc, v);
    auto dacc = DeviceBuffer::Create(alloc, nq * 4);
    auto dout = DeviceBuffer::Create(alloc, out.o.nbytes());
    auto dlse = DeviceBuffer::Create(alloc, out.lse.nbytes());
    ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dacc.ok() && dout.ok() && dlse.ok());
    ASSERT_EQ(cudaMemset(dout->get(), 0xFF, out.o.nbytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(dacc->get(), 0, nq * 4), cudaSuccess);
    ASSERT_EQ(LaunchFillFloat(dlse->as<float>(), -INFINITY, out.lse.numel(), stream), cudaSuccess);
    std::vector<DeviceBuffer> keep;  // the pieces' CSRs, alive until the stream is synchronized
    int64_t launches = 0;
    for (int p = 0; p < ranks; ++p) {
      for (const RingStep& step : plan->steps[p]) {
        for (RingPiece piece : step.pieces) {
          piece.q_row = piece.q.begin;  // full tensors: local row = global position
          piece.k_row = piece.k.begin;
          RingPieceOperands ops;
          ops.q = dq->get();
          ops.k = dk->get();
          ops.v = dv->get();
          ops.o_acc = dacc->as<float>();
          ops.lse = dlse->as<float>();
          ops.q_tokens = ops.kv_tokens = s.tokens;
          ops.shape = s;
          ops.dtype = DType::kBF16;
          ops.scale = EffectiveScale(c.spec, s.head_dim);
          ops.block_size = plan->block_size;
          if (piece.kind == RingPieceKind::kLayout) {
            const RectLayout& l = piece.layout;
            std::vector<uint8_t> mask(l.mask.size());
            for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint8_t>(l.mask[i]);
            auto rp = UploadVector(alloc, l.row_ptr);
            auto ci = UploadVector(alloc, l.col_idx);
            auto mk = UploadVector(alloc, mask);
            ASSERT_TRUE(rp.ok() && ci.ok() && mk.ok());
            ops.row_ptr = rp->as<int64_t>();
            ops.col_idx = ci->as<int32_t>();
            ops.block_mask = mk->as<uint8_t>();
            keep.push_back(std::move(*rp));
            keep.push_back(std::move(*ci));
            keep.push_back(std::move(*mk));
          }
          const absl::Status st = LaunchRingPiece(piece, ops, stream);
          ASSERT_TRUE(st.ok()) << st;
          ++launches;
        }
      }
    }
    EXPECT_GT(launches, 0);
    ASSERT_EQ(LaunchConvert(DType::kF32, dacc->get(), DType::kBF16, dout->get(), nq, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out.o.data(), dout->get(), out.o.nbytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out.lse.data(), dlse->get(), out.lse.nbytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  cudaStreamDestroy(stream);
}

// |a - b| figures of two bf16 outputs (the ring against the single-GPU plan): both round the same
// f32 math, so they differ by the merge order (f32) plus one bf16 rounding.
void ExpectClose(const Outputs& a, const Outputs& b, const char* what) {
  std::vector<float> oa(a.o.numel()), ob(b.o.numel());
  a.o.ToFloat32(oa.data());
  b.o.ToFloat32(ob.data());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < oa.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(oa[i] - ob[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(ob[i])));
  }
  EXPECT_LE(max_diff, kOTol * std::max(max_ref, 1e-30)) << what << ": O differs by " << max_diff;
  const float* la = a.lse.data_as<float>();
  const float* lb = b.lse.data_as<float>();
  double lse_diff = 0;
  for (int64_t i = 0; i < a.lse.numel(); ++i) {
    if (std::isinf(lb[i])) {
      EXPECT_EQ(la[i], lb[i]) << what << ": LSE " << i;
      continue;
    }
    lse_diff = std::max(lse_diff, static_cast<double>(std::fabs(la[i] - lb[i])));
  }
  EXPECT_LE(lse_diff, kLseTol) << what << ": LSE differs";
}

void ExpectMatchesReference(const ReferenceResult& ref, const Outputs& out, const char* what) {
  const ErrorStats e = CompareToReference(ref, out.o, &out.lse);
  EXPECT_EQ(e.nonfinite, 0) << what << ": unwritten or non-finite outputs";
  EXPECT_LE(e.o_rel, kOTol) << what << ": o max abs err " << e.o_max_abs << " / max|ref| "
                            << e.o_ref_max_abs;
  EXPECT_LE(e.lse_max_abs, kLseTol) << what << ": lse max abs err";
}

class RingCudaTest : public ::testing::TestWithParam<Case> {};

// One reference per case (the float64 reference dominates the test's time), then: the ring's
// pieces emulated on one GPU for 2 and 3 ranks, and (with 2 GPUs) the NCCL ring over {0, 1}.
TEST_P(RingCudaTest, MatchesReferenceAndSingleGpu) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat(c.name, " ", ShapeString(c.shape, DType::kBF16), " seed=", seed));
  std::printf("[ case ] %s seed=%llu\n", c.name.c_str(), static_cast<unsigned long long>(seed));
  auto in = MakeRandomInputs(c.shape, DType::kBF16, seed);
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto single = MakeOutputs(c.shape);
  ASSERT_TRUE(single.ok());
  RunSingleGpu(c, in.q, in.k, in.v, *single);
  if (HasFatalFailure()) return;
  ExpectMatchesReference(*ref, *single, "single GPU vs reference");
  for (int ranks : {2, 3}) {
    // (1, 1) and the lean schedule's smaller pieces (same pairs, cut finer).
    for (int chunks : {1, 4}) {
      SCOPED_TRACE(absl::StrCat("emulated ranks=", ranks, " qc=c=", chunks));
      RingCudaPlanOptions po;
      po.q_chunks = po.kv_pieces = chunks;
      auto out = MakeOutputs(c.shape);
      ASSERT_TRUE(out.ok());
      RunPiecesOnOneGpu(c, ranks, in.q, in.k, in.v, *out, po);
      if (HasFatalFailure()) return;
      ExpectMatchesReference(*ref, *out, "pieces vs reference");
      ExpectClose(*out, *single, "pieces vs single GPU");
    }
  }

  if (CudaDeviceCount() < 2) {
    std::printf("[ skip ] 2-GPU ring: found %d GPU(s)\n", CudaDeviceCount());
    return;
  }
  std::vector<RingCudaRankStats> stats;
  auto ring = RingAttentionCuda(c.spec, in.q, in.k, in.v, {0, 1}, {}, &stats);
  ASSERT_TRUE(ring.ok()) << ring.status();
  Outputs out{std::move(ring->o), std::move(ring->lse)};
  ExpectMatchesReference(*ref, out, "ring vs reference");
  ExpectClose(out, *single, "ring vs single GPU");
  // Each rank sent its own K/V shard once and received the other's.
  ASSERT_EQ(stats.size(), 2u);
  auto plan = PlanRingCuda(c.spec, c.shape.tokens, 2);
  ASSERT_TRUE(plan.ok());
  const int64_t row_bytes = 2 * c.shape.batch * c.shape.kv_heads * c.shape.head_dim * 2;
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(stats[p].steps, 2);
    EXPECT_EQ(stats[p].bytes_sent, plan->shard_tokens[p] * row_bytes) << "rank " << p;
    EXPECT_EQ(stats[p].bytes_received, plan->shard_tokens[1 - p] * row_bytes) << "rank " << p;
  }
  std::printf("[ ring ] %s: 2 GPUs ok, NCCL bytes sent %lld / %lld\n", c.name.c_str(),
              static_cast<long long>(stats[0].bytes_sent),
              static_cast<long long>(stats[1].bytes_sent));
}

INSTANTIATE_TEST_SUITE_P(All, RingCudaTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(RingCudaHostApiTest, F32InputsAndDilatedTooLong) {
  SKIP_WITHOUT_GPUS(2);
  const AttentionShape shape{1, 515, 2, 2, 64};
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  auto in = MakeRandomInputs(shape, DType::kF32, seed);
  const AttentionSpec spec = testing::DenseCase(true);
  auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok());
  auto ring = RingAttentionCuda(spec, in.q, in.k, in.v, {0, 1});
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->o.dtype(), DType::kF32);
  const ErrorStats e = CompareToReference(*ref, ring->o, &ring->lse);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LE(e.o_rel, kOTol);
  EXPECT_LE(e.lse_max_abs, 3e-2);  // f32 inputs are rounded to bf16 first

  // Segments longer than a shard could be: the ring reports it cannot place the spec.
  AttentionSpec too_long;
  too_long.pattern = DilatedSpec{{1024}, {1}};
  auto d = RingAttentionCuda(too_long, in.q, in.k, in.v, {0, 1});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented) << d.status();
}

// Dilated specs run shard-locally (segments cut on lcm(segment lengths) never cross GPUs).
TEST(RingCudaHostApiTest, DilatedRunsShardLocal) {
  SKIP_WITHOUT_GPUS(2);
  const AttentionShape shape{1, 1000, 4, 2, 64};
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  for (bool causal : {false, true}) {
    AttentionSpec spec;
    spec.pattern = DilatedSpec{{64, 128}, {1, 2}};  // lcm 128: 8 units, ragged last segment
    spec.causal = causal;
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    auto ring = RingAttentionCuda(spec, in.q, in.k, in.v, {0, 1});
    ASSERT_TRUE(ring.ok()) << ring.status();
    Outputs out{std::move(ring->o), std::move(ring->lse)};
    ExpectMatchesReference(*ref, out, causal ? "dilated causal" : "dilated");
  }
}

// The ring on page-locked inputs ((1, 1), lean, shard-local dilated) and on pageable ones (staged
// through page-locked blocks): no rank copies from or to pageable memory; results still match.
TEST(RingCudaHostApiTest, NoPageableCopies) {
  SKIP_WITHOUT_GPUS(2);
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  auto in = MakeRandomInputs({2, 1000, 4, 2, 64}, DType::kBF16, seed);
  std::vector<HostTensor> locked;  // page-locked copies of q, k, v
  for (const HostTensor* t : {&in.q, &in.k, &in.v}) {
    auto p = HostTensor::Create(t->dtype(), t->dims(), nullptr, &ProcessPinnedHostPool());
    ASSERT_TRUE(p.ok() && IsPageLocked(p->data())) << p.status();
    std::memcpy(p->data(), t->data(), t->nbytes());
    locked.push_back(*std::move(p));
  }
  AttentionSpec dilated;
  dilated.pattern = DilatedSpec{{64, 128}, {1, 2}};
  const AttentionSpec dense = testing::DenseCase(true);
  auto ref = ReferenceAttention(dense, in.q, in.k, in.v);
  auto dilated_ref = ReferenceAttention(dilated, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok() && dilated_ref.ok());
  for (int i = 0; i < 4; ++i) {  // (1, 1), lean (2, 2), dilated, pageable inputs
    SCOPED_TRACE(absl::StrCat("run ", i));
    HostCopyCounters counters;
    RingCudaOptions options;
    options.copy_counters = &counters;
    options.plan.q_chunks = options.plan.kv_pieces = i == 1 ? 2 : 1;
    const bool pin = i != 3;
    auto ring = RingAttentionCuda(i == 2 ? dilated : dense, pin ? locked[0] : in.q,
                                  pin ? locked[1] : in.k, pin ? locked[2] : in.v, {0, 1}, options);
    ASSERT_TRUE(ring.ok()) << ring.status();
    Outputs out{std::move(ring->o), std::move(ring->lse)};
    ExpectMatchesReference(i == 2 ? *dilated_ref : *ref, out, "ring copies");
    EXPECT_GE(counters.h2d_bytes.load(), static_cast<int64_t>(in.q.nbytes() + 2 * in.k.nbytes()));
    EXPECT_GE(counters.d2h_bytes.load(), static_cast<int64_t>(out.o.nbytes() + out.lse.nbytes()));
    EXPECT_EQ(counters.pageable_bytes.load(), 0);
  }
}

// ---- Lean schedule (q_chunks / kv_pieces > 1) and the per-rank RingCudaRun API ------------------

// The lean ring over {0, 1} with forced (qc, c) against the reference; NCCL bytes: every tick sends
// one piece, so each rank sends the ring's whole K/V qc times.
TEST(RingCudaLeanTest, ForcedChunksMatchReference) {
  SKIP_WITHOUT_GPUS(2);
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const AttentionShape shape{2, 1000, 4, 2, 128};
  auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  struct Named {
    const char* name;
    AttentionSpec spec;
  };
  const std::vector<Named> specs = {
      {"dense", testing::DenseCase(false)},
      {"dense_causal", testing::DenseCase(true)},
      {"window100_causal", testing::WindowCase(100, true)},
      {"sparse_local64", testing::SparseCase(64, LocalWindowGen{2}, false)},
      {"sparse_local64_causal", testing::SparseCase(64, LocalWindowGen{2}, true)},
  };
  for (const Named& n : specs) {
    auto ref = ReferenceAttention(n.spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (int chunks : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(n.name, " qc=c=", chunks));
      RingCudaOptions options;
      options.plan.q_chunks = options.plan.kv_pieces = chunks;
      std::vector<RingCudaRankStats> stats;
      auto ring = RingAttentionCuda(n.spec, in.q, in.k, in.v, {0, 1}, options, &stats);
      ASSERT_TRUE(ring.ok()) << ring.status();
      Outputs out{std::move(ring->o), std::move(ring->lse)};
      ExpectMatchesReference(*ref, out, "lean ring vs reference");
      ASSERT_EQ(stats.size(), 2u);
      RingCudaPlanOptions po;
      po.q_chunks = po.kv_pieces = chunks;
      auto plan = PlanRingCuda(n.spec, shape.tokens, 2, po);
      ASSERT_TRUE(plan.ok());
      const int64_t row_bytes = 2 * shape.batch * shape.kv_heads * shape.head_dim * 2;
      for (int p = 0; p < 2; ++p) {
        EXPECT_EQ(stats[p].q_chunks, chunks);
        EXPECT_EQ(stats[p].kv_pieces, chunks);
        EXPECT_EQ(stats[p].steps, chunks * 2 * chunks);
        EXPECT_EQ(stats[p].bytes_sent, chunks * shape.tokens * row_bytes) << "rank " << p;
        EXPECT_EQ(stats[p].bytes_received, chunks * shape.tokens * row_bytes) << "rank " << p;
      }
    }
  }
}

// Rank p of a 2-rank ring on a thread of its own with a communicator, allocator and stream that
// the test owns (as the service's per-device workers do), reused over several runs.
struct Worker {
  int device = 0;
  std::unique_ptr<NcclCommunicator> comm;
  std::unique_ptr<CachingAllocator> alloc;
  cudaStream_t stream = nullptr;
};

TEST(RingCudaRunTest, PerRankApiOnOwnThreads) {
  SKIP_WITHOUT_GPUS(2);
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const AttentionShape shape{1, 1536, 4, 4, 128};
  auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  const AttentionSpec spec = testing::DenseCase(true);
  auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ForceNcclNvlsOff();
  auto group = NcclGroup::Create(2);
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<Worker> workers(2);
  std::vector<absl::Status> status(2);
  auto on_workers = [&](const std::function<absl::Status(int, Worker&)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        status[r] = fn(r, workers[r]);
        if (!status[r].ok()) (*group)->Abort(status[r]);
      });
    }
    for (std::thread& t : threads) t.join();
  };
  on_workers([&](int r, Worker& w) -> absl::Status {
    w.device = r;
    if (cudaSetDevice(r) != cudaSuccess) return absl::InternalError("cudaSetDevice");
    NcclCommunicator::Options o;
    o.group = *group;
    o.rank = r;
    o.cuda_device = r;
    ATTN_ASSIGN_OR_RETURN(w.comm, NcclCommunicator::Create(o));
    w.alloc = std::make_unique<CachingAllocator>(r);
    if (cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking) != cudaSuccess) {
      return absl::InternalError("stream");
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << " " << status[1];
  // (1, 1) with every resource borrowed; a budget below (1, 1) (the plan picks a lean schedule);
  // and a private allocator and stream.
  auto p11 = PlanRingCuda(spec, shape, DType::kBF16, 2);
  ASSERT_TRUE(p11.ok());
  const int64_t need11 = std::max(EstimateRingRankBytes(*p11, 0, shape, DType::kBF16),
                                  EstimateRingRankBytes(*p11, 1, shape, DType::kBF16));
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(absl::StrCat("mode ", mode));
    RingCudaOptions options;
    if (mode == 1) options.plan.device_memory_budget = need11 - 1;
    auto run = RingCudaRun::Create(spec, in.q, in.k, in.v, {0, 1}, options);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ((*run)->ranks(), 2);
    std::vector<int64_t> estimate(2);
    for (int r = 0; r < 2; ++r) {
      estimate[r] = (*run)->EstimateRankBytes(r);
      EXPECT_GT(estimate[r], 0);
      if (mode == 1) {
        EXPECT_LT(estimate[r], need11);
      }
    }
    on_workers([&](int r, Worker& w) -> absl::Status {
      if (mode == 2) return (*run)->RunRank(r, *w.comm);
      w.alloc->EmptyCache();
      w.alloc->ResetPeak();
      return (*run)->RunRank(r, *w.comm, w.alloc.get(), w.stream);
    });
    ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << " " << status[1];
    const std::vector<RingCudaRankStats> stats = (*run)->stats();
    ASSERT_EQ(stats.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(stats[r].device, r);
      EXPECT_EQ(stats[r].estimated_device_bytes, estimate[r]);
      if (mode == 0) {
        EXPECT_EQ(stats[r].q_chunks * stats[r].kv_pieces, 1);
      }
      if (mode == 1) {
        EXPECT_GT(stats[r].q_chunks * stats[r].kv_pieces, 1);
      }
      if (mode != 2) {
        // A fresh borrowed allocator holds exactly the rank's buffers at peak.
        EXPECT_EQ(stats[r].peak_device_bytes, estimate[r]) << "rank " << r;
      }
    }
    auto outs = (*run)->TakeOutputs();
    ASSERT_TRUE(outs.ok()) << outs.status();
    Outputs out{std::move(outs->o), std::move(outs->lse)};
    ExpectMatchesReference(*ref, out, "RingCudaRun vs reference");
    EXPECT_FALSE((*run)->TakeOutputs().ok());
  }
  on_workers([&](int r, Worker& w) -> absl::Status {
    cudaSetDevice(w.device);
    cudaStreamSynchronize(w.stream);
    w.comm.reset();
    w.alloc.reset();
    cudaStreamDestroy(w.stream);
    return absl::OkStatus();
  });
}

// A lean RingCudaRank run twice without reloading K/V: Run restores the home pieces, so both runs
// give the same bits.
TEST(RingCudaRunTest, LeanRankRepeatsWithoutReload) {
  SKIP_WITHOUT_GPUS(2);
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const AttentionShape shape{1, 1100, 2, 2, 64};
  auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  const AttentionSpec spec = testing::DenseCase(true);
  RingCudaPlanOptions po;
  po.q_chunks = 2;
  po.kv_pieces = 4;
  auto plan = PlanRingCuda(spec, shape.tokens, 2, po);
  ASSERT_TRUE(plan.ok());
  ForceNcclNvlsOff();
  auto group = NcclGroup::Create(2);
  ASSERT_TRUE(group.ok());
  std::vector<absl::Status> status(2);
  std::vector<std::vector<uint16_t>> first(2), second(2);
  const int64_t hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  auto rank_fn = [&](int r) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        auto rank, RingCudaRank::Create(*plan, shape, DType::kBF16, EffectiveScale(spec, d), r, r,
                                        *group, {}));
    const int64_t nl = rank->shard_tokens();
    std::vector<uint16_t> qs, ks, vs;
    auto gather = [&](const HostTensor& t, int64_t heads, std::vector<uint16_t>& dst) {
      const uint16_t* src = static_cast<const uint16_t*>(static_cast<const void*>(t.data()));
      for (const TokenRange& rg : rank->ranges()) {
        dst.insert(dst.end(), src + rg.begin * heads * d, src + rg.end * heads * d);
      }
    };
    gather(in.q, hq, qs);
    gather(in.k, hkv, ks);
    gather(in.v, hkv, vs);
    if (cudaMemcpy(rank->q(), qs.data(), qs.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
      return absl::InternalError("q upload");
    }
    ATTN_RETURN_IF_ERROR(rank->SetKv(ks.data(), vs.data()));
    EXPECT_TRUE(rank->lean());
    EXPECT_EQ(rank->k(), nullptr);
    for (auto* out : {&first[r], &second[r]}) {
      ATTN_RETURN_IF_ERROR(rank->Run());
      if (cudaStreamSynchronize(rank->stream()) != cudaSuccess) return absl::InternalError("sync");
      out->resize(nl * hq * d);
      if (cudaMemcpy(out->data(), rank->o(), out->size() * 2, cudaMemcpyDeviceToHost) !=
          cudaSuccess) {
        return absl::InternalError("o download");
      }
    }
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      status[r] = rank_fn(r);
      if (!status[r].ok()) (*group)->Abort(status[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << " " << status[1];
  for (int r = 0; r < 2; ++r) EXPECT_EQ(first[r], second[r]) << "rank " << r;
}

// The allocator's hard limit (what the longest-causal bench and the budgeted plans rely on).
TEST(CachingAllocatorLimitTest, RefusesPastTheLimit) {
  SKIP_WITHOUT_GPU();
  CachingAllocator a(0);
  a.set_limit(1 << 20);
  auto p1 = a.Allocate(512 << 10);
  ASSERT_TRUE(p1.ok()) << p1.status();
  auto p2 = a.Allocate(768 << 10);
  EXPECT_EQ(p2.status().code(), absl::StatusCode::kResourceExhausted) << p2.status();
  a.Free(*p1);
  auto p3 = a.Allocate(768 << 10);  // fits once the first is back (a cached block may serve it)
  ASSERT_TRUE(p3.ok()) << p3.status();
  EXPECT_LE(a.Stats().peak_bytes, 1 << 20);
  a.Free(*p3);
  a.set_limit(0);
  auto p4 = a.Allocate(4 << 20);
  ASSERT_TRUE(p4.ok()) << p4.status();
  a.Free(*p4);
}

}  // namespace
}  // namespace attnserve
