// The request run and bench send: inputs from --random (seeded) or from .npy files, --spec with
// --causal on top, and the --placement hint.
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
  HostTensor q, k, v;
  v1::AttentionSpec spec;
  std::string description;  // "[B, N, Hq, D] bf16, kv_heads Hkv"
  uint64_t seed = 0;        // --seed (used when the inputs are random)
};

// .npy inputs as given on the command line (run's --q, --k, --v); nullopt: not given.
struct InputFiles {
  std::optional<std::string> q, k, v;
};

// --spec, --causal, --dtype, --random, --seed.
std::vector<FlagUse> ProblemFlags();
// --placement.
FlagUse PlacementFlag();

// The inputs from --random, or from `files` when given (null: --random is required). On failure
// `*exit_code` says whether the flags were wrong (usage) or a file could not be read (local).
absl::StatusOr<Problem> LoadProblem(const FlagSet& flags, const InputFiles* files, int* exit_code);

// --placement auto|single|data|ring (also data_parallel) -> the header's hint.
absl::StatusOr<v1::Placement> PlacementFromFlags();

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_PROBLEM_H_
