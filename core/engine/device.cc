#include "core/engine/device.h"

namespace attnserve {

std::string_view BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

}  // namespace attnserve
