#include "server/request_assembler.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

v1::AttendHeader Header(int64_t b, int64_t n, int64_t hq, int64_t hkv, int64_t d,
                        v1::DType dtype = v1::DTYPE_BF16) {
  v1::AttendHeader h;
  h.set_request_id("t");
  h.set_dtype(dtype);
  h.set_batch(b);
  h.set_tokens(n);
  h.set_q_heads(hq);
  h.set_kv_heads(hkv);
  h.set_head_dim(d);
  h.mutable_spec()->mutable_dense();
  return h;
}

v1::TensorChunk Chunk(v1::TensorKind kind, int64_t offset, int64_t size, char fill = 'x') {
  v1::TensorChunk c;
  c.set_tensor(kind);
  c.set_offset(offset);
  c.set_data(std::string(static_cast<size_t>(size), fill));
  return c;
}

TEST(ByteRangeSetTest, MergesTouchingRangesAndRejectsOverlaps) {
  ByteRangeSet s;
  std::pair<int64_t, int64_t> overlap;
  EXPECT_TRUE(s.Insert(10, 20, &overlap));
  EXPECT_TRUE(s.Insert(30, 40, &overlap));
  EXPECT_TRUE(s.Insert(20, 30, &overlap));  // fills the gap: one range [10, 40)
  EXPECT_EQ(s.num_ranges(), 1u);
  EXPECT_EQ(s.covered_bytes(), 30);
  EXPECT_FALSE(s.Insert(39, 41, &overlap));
  EXPECT_EQ(overlap, std::make_pair(int64_t{10}, int64_t{40}));
  EXPECT_FALSE(s.Insert(0, 11, &overlap));
  EXPECT_FALSE(s.Insert(15, 16, &overlap));
  EXPECT_TRUE(s.Insert(0, 10, &overlap));
  EXPECT_TRUE(s.Insert(40, 50, &overlap));
  EXPECT_EQ(s.num_ranges(), 1u);
  EXPECT_EQ(s.covered_bytes(), 50);
}

TEST(RequestAssemblerTest, AssemblesChunksInAnyOrder) {
  MemoryTracker tracker;
  {
    RequestAssembler a(AssemblerOptions{.tracker = &tracker});
    ASSERT_TRUE(a.AddHeader(Header(1, 16, 4, 2, 8, v1::DTYPE_F32)).ok());
    const int64_t q_bytes = 16 * 4 * 8 * 4, kv_bytes = 16 * 2 * 8 * 4;
    EXPECT_EQ(a.total_bytes(), q_bytes + 2 * kv_bytes);
    EXPECT_EQ(tracker.in_use_bytes(), q_bytes + 2 * kv_bytes);
    EXPECT_TRUE(a.AddChunk(Chunk(v1::TENSOR_Q, q_bytes / 2, q_bytes / 2, 'b')).ok());
    EXPECT_TRUE(a.AddChunk(Chunk(v1::TENSOR_V, 0, kv_bytes, 'v')).ok());
    EXPECT_TRUE(a.AddChunk(Chunk(v1::TENSOR_Q, 0, q_bytes / 2, 'a')).ok());
    EXPECT_FALSE(a.all_received());
    EXPECT_THAT(a.Complete().message(), HasSubstr("k: received 0 of 1024 bytes"));
    EXPECT_TRUE(a.AddChunk(Chunk(v1::TENSOR_K, 0, kv_bytes, 'k')).ok());
    EXPECT_TRUE(a.all_received());
    EXPECT_TRUE(a.Complete().ok());
    HostTensor q = a.TakeQ();
    EXPECT_EQ(q.dims(), (std::vector<int64_t>{1, 16, 4, 8}));
    EXPECT_EQ(static_cast<char>(q.data()[0]), 'a');
    EXPECT_EQ(static_cast<char>(q.data()[q_bytes - 1]), 'b');
  }
  EXPECT_EQ(tracker.in_use_bytes(), 0);
}

TEST(RequestAssemblerTest, RejectsOverlappingChunks) {
  RequestAssembler a(AssemblerOptions{});
  ASSERT_TRUE(a.AddHeader(Header(1, 64, 2, 2, 8)).ok());
  ASSERT_TRUE(a.AddChunk(Chunk(v1::TENSOR_K, 100, 100)).ok());
  absl::Status s = a.AddChunk(Chunk(v1::TENSOR_K, 150, 100));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("chunk for k: bytes [150, 250) overlap bytes [100, 200)"));
  // The same range of another tensor is fine.
  EXPECT_TRUE(a.AddChunk(Chunk(v1::TENSOR_V, 150, 100)).ok());
}

TEST(RequestAssemblerTest, RejectsChunkPastTheEnd) {
  RequestAssembler a(AssemblerOptions{});
  ASSERT_TRUE(a.AddHeader(Header(1, 8192, 16, 16, 128)).ok());
  absl::Status s = a.AddChunk(Chunk(v1::TENSOR_Q, 33554432 - 10, 20));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "chunk for q: bytes [33554422, 33554442) past the end of the tensor (33554432 bytes "
            "for [1, 8192, 16, 128] bf16)");
  // An offset near INT64_MAX must not wrap around.
  s = a.AddChunk(Chunk(v1::TENSOR_Q, INT64_MAX - 5, 20));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("past the end"));
  s = a.AddChunk(Chunk(v1::TENSOR_Q, -1, 20));
  EXPECT_THAT(s.message(), HasSubstr("chunk for q: offset must be >= 0"));
}

TEST(RequestAssemblerTest, ReportsMissingBytes) {
  RequestAssembler a(AssemblerOptions{});
  ASSERT_TRUE(a.AddHeader(Header(1, 1024, 8, 8, 64)).ok());  // 1048576 bytes each (bf16)
  ASSERT_TRUE(a.AddChunk(Chunk(v1::TENSOR_Q, 0, 1048576)).ok());
  ASSERT_TRUE(a.AddChunk(Chunk(v1::TENSOR_K, 0, 1048576)).ok());
  ASSERT_TRUE(a.AddChunk(Chunk(v1::TENSOR_V, 0, 524288)).ok());
  absl::Status s = a.Complete();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "v: received 524288 of 1048576 bytes");
}

TEST(RequestAssemblerTest, RejectsSecondHeaderAndChunkBeforeHeader) {
  RequestAssembler a(AssemblerOptions{});
  absl::Status s = a.AddChunk(Chunk(v1::TENSOR_Q, 0, 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "header: must be the first message");
  ASSERT_TRUE(a.AddHeader(Header(1, 4, 1, 1, 4)).ok());
  s = a.AddHeader(Header(1, 4, 1, 1, 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "header: sent twice");
  v1::AttendRequest empty;
  EXPECT_THAT(a.Add(empty).message(), HasSubstr("request.message"));
}

// The id is echoed and logged: printable ASCII of at most 128 bytes, refused (not rewritten)
// otherwise, before anything else in the header.
TEST(RequestAssemblerTest, RequestIdMustBeShortPrintableAscii) {
  for (const std::string id : {std::string(""), std::string("req-1 with spaces, \"quotes\" & =~"),
                               std::string(128, 'x')}) {
    RequestAssembler a(AssemblerOptions{});
    v1::AttendHeader h = Header(1, 4, 1, 1, 4);
    h.set_request_id(id);
    EXPECT_TRUE(a.AddHeader(h).ok()) << id;
  }
  struct Bad {
    std::string id;
    std::string message;
  };
  for (
      const Bad& bad :
      {Bad{std::string(129, 'x'),
           "header.request_id: must be at most 128 bytes of printable ASCII, got 129 bytes"},
       Bad{"evil\nline", "header.request_id: must be printable ASCII (0x20-0x7e), byte 4 is \\x0a"},
       Bad{"tab\t", "header.request_id: must be printable ASCII (0x20-0x7e), byte 3 is \\x09"},
       Bad{"del\x7f", "header.request_id: must be printable ASCII (0x20-0x7e), byte 3 is \\x7f"},
       Bad{"caf\xc3\xa9",
           "header.request_id: must be printable ASCII (0x20-0x7e), byte 3 is \\xc3"},
       Bad{std::string(1 << 20, '\n'),
           "header.request_id: must be at most 128 bytes of printable ASCII, got 1048576 bytes"}}) {
    RequestAssembler a(AssemblerOptions{});
    v1::AttendHeader h = Header(1, 4, 1, 1, 4);
    h.set_dtype(v1::DTYPE_UNSPECIFIED);  // the id is checked first
    h.set_request_id(bad.id);
    absl::Status s = a.AddHeader(h);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), bad.message);
    EXPECT_FALSE(a.has_header());
  }
}

TEST(RequestAssemblerTest, RejectsWrongTensorKindAndOversizedChunk) {
  RequestAssembler a(AssemblerOptions{.max_chunk_bytes = 16});
  ASSERT_TRUE(a.AddHeader(Header(1, 64, 1, 1, 4)).ok());
  EXPECT_THAT(a.AddChunk(Chunk(v1::TENSOR_O, 0, 4)).message(),
              HasSubstr("chunk.tensor: must be TENSOR_Q, TENSOR_K or TENSOR_V, got TENSOR_O"));
  EXPECT_THAT(a.AddChunk(Chunk(v1::TENSOR_Q, 0, 17)).message(),
              HasSubstr("above --max-chunk-bytes=16"));
}

TEST(RequestAssemblerTest, RejectsHugeHeaderWithoutAllocating) {
  MemoryTracker tracker;
  RequestAssembler a(AssemblerOptions{.tracker = &tracker});
  absl::Status s = a.AddHeader(Header(1, 1000000000000, 16, 16, 128));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("header.tokens"));
  EXPECT_THAT(s.message(), HasSubstr("--max-request-bytes=8589934592"));
  EXPECT_EQ(tracker.peak_bytes(), 0);
  EXPECT_FALSE(a.has_header());
  // Products that overflow int64 saturate instead of wrapping to something small.
  s = a.AddHeader(Header(INT64_MAX / 2, INT64_MAX / 2, 1 << 20, 1 << 20, 256));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("more than 2^63"));
  EXPECT_EQ(tracker.peak_bytes(), 0);
}

TEST(RequestAssemblerTest, ValidatesHeaderFields) {
  RequestAssembler a(AssemblerOptions{});
  v1::AttendHeader h = Header(1, 64, 4, 3, 8);
  EXPECT_THAT(a.AddHeader(h).message(), HasSubstr("header.q_heads: 4 is not a multiple"));
  h = Header(1, 0, 4, 4, 8);
  EXPECT_THAT(a.AddHeader(h).message(), HasSubstr("header.tokens: must be >= 1, got 0"));
  h = Header(1, 64, 4, 4, 8, v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(a.AddHeader(h).message(), HasSubstr("header.dtype: must be set"));
  h = Header(1, 64, 4, 4, 8);
  h.mutable_spec()->Clear();
  EXPECT_EQ(a.AddHeader(h).message(),
            "spec.pattern: one of dense, window, dilated, block_sparse must be set");
  h = Header(1, 64, 4, 4, 8);
  h.mutable_spec()->mutable_window()->set_size(-1);
  EXPECT_THAT(a.AddHeader(h).message(), HasSubstr("spec.window"));
  h = Header(1, 64, 4, 4, 8);
  h.set_response_chunk_bytes(-5);
  EXPECT_THAT(a.AddHeader(h).message(), HasSubstr("header.response_chunk_bytes"));
  EXPECT_FALSE(a.has_header());
}

// Region refs: a tensor with a ref arrives with the header (a view of the region's bytes), its
// chunks are refused, the others still stream; outputs go to the o/lse slices.
TEST(RequestAssemblerTest, RegionRefsSupplyTensors) {
  const std::string key = absl::StrCat("/attn_asm_test_", getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  close(fd);
  auto registry = MakeRegionRegistry({});
  ASSERT_TRUE(registry->RegisterSystem("", "r", key, 0, 1 << 16).ok());
  shm_unlink(key.c_str());  // the server's mapping keeps the memory
  const int64_t q_bytes = 16 * 4 * 8 * 4, kv_bytes = 16 * 2 * 8 * 4, lse_bytes = 4 * 16 * 4;
  v1::AttendHeader h = Header(1, 16, 4, 2, 8, v1::DTYPE_F32);
  h.mutable_q_region()->set_region("r");
  h.mutable_q_region()->set_bytes(q_bytes);
  h.mutable_o_region()->set_region("r");
  h.mutable_o_region()->set_offset(4096);
  h.mutable_o_region()->set_bytes(q_bytes);
  h.set_return_lse(true);
  h.mutable_lse_region()->set_region("r");
  h.mutable_lse_region()->set_offset(8192);
  h.mutable_lse_region()->set_bytes(lse_bytes);
  RequestAssembler a(AssemblerOptions{.regions = registry.get()});
  ASSERT_TRUE(a.AddHeader(h).ok());
  EXPECT_TRUE(a.outputs_in_regions());
  EXPECT_FALSE(a.all_received());
  absl::Status s = a.AddChunk(Chunk(v1::TENSOR_Q, 0, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("chunk for q: header.q_region already supplies q"));
  ASSERT_TRUE(a.AddChunk(Chunk(v1::TENSOR_K, 0, kv_bytes)).ok());
  ASSERT_TRUE(a.AddChunk(Chunk(v1::TENSOR_V, 0, kv_bytes)).ok());
  EXPECT_TRUE(a.all_received());
  HostTensor q = a.TakeQ();
  EXPECT_TRUE(q.is_view());
  auto lease = registry->Acquire("", "r");
  ASSERT_TRUE(lease.ok());
  std::memset((*lease)->host_data(), 3, 64);
  EXPECT_EQ(static_cast<uint8_t>(q.data()[0]), 3);  // the region's bytes, not a copy
  HostTensor o = *HostTensor::Create(DType::kF32, {1, 16, 4, 8});
  HostTensor lse = *HostTensor::Create(DType::kF32, {1, 4, 16});
  o.FillBytes(0x11);
  lse.FillBytes(0x22);
  ASSERT_TRUE(a.WriteOutputs(o, lse).ok());
  EXPECT_EQ(static_cast<uint8_t>((*lease)->host_data()[4096 + q_bytes - 1]), 0x11);
  EXPECT_EQ(static_cast<uint8_t>((*lease)->host_data()[8192]), 0x22);
  // Once the outputs are written the assembler's holds go (the reactor calls ReleaseHolds before
  // the response): only the test's own lease and q's view are left, and the answer stays.
  const auto leases = [&] {
    std::vector<RegionInfo> list = registry->List("");
    return list.empty() ? int64_t{-1} : list[0].leases;
  };
  const int64_t held = leases();
  a.ReleaseHolds();
  EXPECT_EQ(leases(), held - 2) << "the o and lse slices' leases";
  EXPECT_TRUE(a.outputs_in_regions());
  q = HostTensor();
  lease->reset();
  EXPECT_EQ(leases(), 0);

  // lse_region is required with o_region when return_lse, and refs need a registry.
  v1::AttendHeader no_lse = h;
  no_lse.clear_lse_region();
  RequestAssembler b(AssemblerOptions{.regions = registry.get()});
  EXPECT_THAT(b.AddHeader(no_lse).message(), HasSubstr("header.lse_region"));
  RequestAssembler c(AssemblerOptions{});
  EXPECT_EQ(c.AddHeader(h).code(), absl::StatusCode::kFailedPrecondition);

  // Outputs need bytes of their own (found by fuzz_request_assembler: lse written over o):
  // o_region over lse_region or over an input, in the same region, is refused; touching is fine.
  for (const auto& [o_offset, lse_offset, field] :
       {std::tuple<int64_t, int64_t, const char*>{8192, 8192, "header.lse_region's"},
        {8192 - 64, 8192, "header.lse_region's"},
        {0, 8192, "header.q_region's"},
        {4096 + 64, 4096, "header.o_region"}}) {
    v1::AttendHeader overlap = h;
    overlap.mutable_o_region()->set_offset(o_offset);
    overlap.mutable_lse_region()->set_offset(lse_offset);
    RequestAssembler d(AssemblerOptions{.regions = registry.get()});
    const absl::Status st = d.AddHeader(overlap);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << o_offset << " " << lse_offset;
    EXPECT_THAT(st.message(), HasSubstr("overlap"));
    EXPECT_THAT(st.message(), HasSubstr(field));
    EXPECT_FALSE(d.outputs_in_regions());
  }
  v1::AttendHeader touching = h;
  touching.mutable_lse_region()->set_offset(4096 + q_bytes);  // right after o
  RequestAssembler e(AssemblerOptions{.regions = registry.get()});
  EXPECT_TRUE(e.AddHeader(touching).ok());
}

}  // namespace
}  // namespace attnserve

namespace attnserve {
namespace {

// Keys of another length: K and V are sized by kv_tokens, the offset and packing reach the spec,
// and their rules are checked where the header arrives.
TEST(RequestAssemblerTest, KeysOfAnotherLengthAndOffsets) {
  RequestAssembler a({});
  v1::AttendHeader h = Header(1, 4, 2, 1, 8);  // bf16: q 4 rows x 2 heads x 8 = 128 bytes
  h.set_kv_tokens(100);
  h.set_q_offset(96);
  h.mutable_spec()->set_causal(true);
  ASSERT_TRUE(a.AddHeader(h).ok());
  EXPECT_EQ(a.shape().kv_len(), 100);
  EXPECT_EQ(a.spec().q_offset, 96);
  EXPECT_EQ(a.total_bytes(), 128 + 2 * 100 * 8 * 2);
  EXPECT_THAT(a.Add([] {
                v1::AttendRequest r;
                *r.mutable_chunk() = Chunk(v1::TENSOR_K, 0, 100 * 8 * 2 + 1);
                return r;
              }())
                  .message(),
              HasSubstr("past the end"));

  RequestAssembler b({});
  h.set_q_offset(101);  // past the keys
  EXPECT_THAT(b.AddHeader(h).message(), HasSubstr("q_offset"));
  h.clear_q_offset();
  h.set_kv_tokens(-1);
  EXPECT_THAT(b.AddHeader(h).message(), HasSubstr("header.kv_tokens: must be >= 0"));

  RequestAssembler c({});
  v1::AttendHeader p = Header(1, 5, 2, 2, 8);
  p.set_kv_tokens(9);
  for (int64_t x : {0, 2, 5}) p.add_cu_seqlens_q(x);
  for (int64_t x : {0, 4, 9}) p.add_cu_seqlens_k(x);
  ASSERT_TRUE(c.AddHeader(p).ok());
  EXPECT_EQ(c.spec().cu_seqlens_k.back(), 9);
  RequestAssembler d({});
  p.set_cu_seqlens_k(2, 8);  // does not end at kv_tokens
  EXPECT_THAT(d.AddHeader(p).message(), HasSubstr("cu_seqlens_k"));
}

TEST(RequestAssemblerTest, SpecListsAreBoundedBeforeTheSpecIsConverted) {
  // 1000 tokens at block 64: 16 blocks, so row_ptr has 17 entries and col_idx at most 256.
  v1::AttendHeader h = Header(1, 1000, 2, 2, 8);
  v1::Csr* csr = h.mutable_spec()->mutable_block_sparse()->mutable_csr();
  h.mutable_spec()->mutable_block_sparse()->set_block_size(64);
  for (int i = 0; i < 18; ++i) csr->add_row_ptr(0);
  RequestAssembler a({});
  absl::Status s = a.AddHeader(h);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.block_sparse.csr.row_ptr: 18 entries"));
  EXPECT_THAT(s.message(), HasSubstr("num_blocks + 1 (17)"));

  csr->clear_row_ptr();
  for (int i = 0; i < 257; ++i) csr->add_col_idx(0);
  RequestAssembler b({});
  s = b.AddHeader(h);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.block_sparse.csr.col_idx: 257 entries"));

  // Within the shape's bounds but above --max-spec-entries.
  csr->clear_col_idx();
  for (int i = 0; i < 17; ++i) csr->add_row_ptr(i);
  for (int i = 0; i < 16; ++i) csr->add_col_idx(i);
  AssemblerOptions tight;
  tight.max_spec_entries = 20;
  RequestAssembler c(tight);
  s = c.AddHeader(h);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("--max-spec-entries=20"));
  EXPECT_THAT(s.message(), HasSubstr("33 entries together"));
  tight.max_spec_entries = 33;
  RequestAssembler d(tight);
  EXPECT_TRUE(d.AddHeader(h).ok()) << d.AddHeader(h);

  // cu_seqlens: at most tokens + 1 entries.
  v1::AttendHeader p = Header(1, 3, 2, 2, 8);
  for (int i = 0; i < 5; ++i) p.add_cu_seqlens_q(0);
  RequestAssembler e({});
  EXPECT_THAT(e.AddHeader(p).message(), HasSubstr("header.cu_seqlens_q: 5 entries"));
}

TEST(RequestAssemblerTest, UploadBudgetRefusesAHeaderThatDoesNotFitAndReleases) {
  UploadBudget budget(3000, "--max-upload-bytes");
  AssemblerOptions o;
  o.upload_budget = &budget;
  // [1, 16, 2, 8] bf16: q 512 bytes, k and v 512 each.
  {
    RequestAssembler a(o);
    ASSERT_TRUE(a.AddHeader(Header(1, 16, 2, 2, 8)).ok());
    EXPECT_EQ(budget.held_bytes(), 1536);
    RequestAssembler b(o);
    absl::Status s = b.AddHeader(Header(1, 32, 2, 2, 8));  // 3072 more
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(s.message(), HasSubstr("--max-upload-bytes=3000"));
    EXPECT_EQ(budget.held_bytes(), 1536);
    a.ReleaseBuffers();
    EXPECT_EQ(budget.held_bytes(), 0);
    RequestAssembler c(o);
    ASSERT_TRUE(c.AddHeader(Header(1, 16, 2, 2, 8)).ok());
  }
  EXPECT_EQ(budget.held_bytes(), 0) << "released with the assembler";
}

TEST(RequestAssemblerTest, ContextHeadersNeedAServerThatKeepsThem) {
  RequestAssembler a({});
  v1::AttendHeader h = Header(1, 1, 2, 2, 8);
  h.set_context("ctx");
  EXPECT_EQ(a.AddHeader(h).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace attnserve
