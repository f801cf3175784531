// The request run and bench send: inputs from --random (seeded) or from .npy files, --spec with
// --causal on top, the inference-shape flags (--q-len, --kv-len, --q-offset) and the --placement
// hint.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_PROBLEM_H_
#define ATTNSERVE_CLIENT_ATTNCTL_PROBLEM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attnserve.pb.h"
#include "client/attnctl/flag_parser.h"
#include "core/tensor/tensor.h"

namespace attnserve::attnctl {

struct Problem {
  HostTensor q, k, v;  // q [B, Nq, Hq, D]; k, v [B, Nkv, Hkv, D] (Nkv may differ from Nq)
  v1::AttentionSpec spec;
  // Position of query row 0 among the keys (--q-offset); unset: the server's default, 0.
  std::optional<int64_t> q_offset;
  std::string description;  // "[B, N, Hq, D] bf16, kv_heads Hkv[, kv_tokens Nkv][, q_offset P]"
  uint64_t seed = 0;        // --seed (used when the inputs are random)
};

// .npy inputs as given on the command line (run's --q, --k, --v); nullopt: not given.
struct InputFiles {
  std::optional<std::string> q, k, v;
};

// --spec, --causal, --dtype, --random, --seed.
std::vector<FlagUse> ProblemFlags();
// --q-len, --kv-len (with --random: Q's and K/V's token counts instead of N), --q-offset.
std::vector<FlagUse> ShapeFlags();
// --placement.
FlagUse PlacementFlag();

// The inputs from --random, or from `files` when given (null: --random is required). On failure
// `*exit_code` says whether the flags were wrong (usage) or a file could not be read (local).
absl::StatusOr<Problem> LoadProblem(const FlagSet& flags, const InputFiles* files, int* exit_code);

// --placement auto|single|data|ring (also data_parallel) -> the header's hint.
absl::StatusOr<v1::Placement> PlacementFromFlags();

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_PROBLEM_H_
