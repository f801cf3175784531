// Plain gRPC helpers shared by the context benches (attnbench_context, attnbench_sharded): seeded
// bf16 inputs, chunked uploads, one AppendContext and one Attend timed end to end. They speak
// the wire contract through the generated stub only, as any caller would.
#ifndef ATTNSERVE_BENCH_E2E_CONTEXT_CLIENT_H_
#define ATTNSERVE_BENCH_E2E_CONTEXT_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/attnserve.grpc.pb.h"

namespace attnserve {
namespace bench {

// Bytes per upload chunk: 4 MiB (the wire default) less room for the message's own fields.
inline constexpr int64_t kContextChunkBytes = (int64_t{4} << 20) - (int64_t{64} << 10);

// `elems` bf16 values uniform in [-1, 1), seeded (the same seed gives the same bytes).
std::string RandomBf16(int64_t elems, uint64_t seed);

// absl::Status of a gRPC status, the message prefixed with `what`.
absl::Status FromGrpc(const grpc::Status& s, const std::string& what);

// One AppendContext of `rows` rows (K and V in the context's layout, bf16).
absl::Status AppendRows(v1::AttentionService::Stub& stub, const std::string& name, int64_t rows,
                        const std::string& k, const std::string& v);

// Timings of one Attend: the client's wall time and the server's figures from the response.
struct CallFigures {
  double wall_s = 0, kernel_s = 0, compute_s = 0, receive_s = 0, queue_s = 0;
  std::vector<std::string> devices;  // the devices that ran it
};

// One Attend: header, Q (and K, V when non-null, i.e. not against a context), then the response
// drained. When `o` / `lse` are non-null, the O and LSE bytes the server streamed land there.
absl::StatusOr<CallFigures> TimedAttend(v1::AttentionService::Stub& stub, const v1::AttendHeader& h,
                                        const std::string& q, const std::string* k,
                                        const std::string* v, std::string* o = nullptr,
                                        std::string* lse = nullptr);

double Median(std::vector<double> v);

}  // namespace bench
}  // namespace attnserve

#endif  // ATTNSERVE_BENCH_E2E_CONTEXT_CLIENT_H_
