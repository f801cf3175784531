// Builds without CUDA and NCCL: a context-parallel attend on GPUs merges its partials on the host
// (each GPU still reads its rows in place through Device::RunWithDeviceIo).
#include <utility>
#include <vector>

#include "core/parallel/context_parallel.h"

namespace attnserve {

std::unique_ptr<GroupStrategy> MakeContextParallelGpuStrategy(AttentionRequest& request,
                                                              std::vector<Device*> devices,
                                                              const GroupEnv& env) {
  (void)env;
  return MakeContextParallelHostStrategy(request, static_cast<int>(devices.size()));
}

}  // namespace attnserve
