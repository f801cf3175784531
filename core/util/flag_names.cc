#include "core/util/flag_names.h"

#include <algorithm>

namespace attnserve {

std::string FlagArgWithUnderscores(absl::string_view arg) {
  std::string out(arg);
  if (out.size() < 3 || out.compare(0, 2, "--") != 0) return out;
  const size_t end = std::min(out.find('='), out.size());
  std::replace(out.begin() + 2, out.begin() + end, '-', '_');
  return out;
}

UnderscoredArgv::UnderscoredArgv(int argc, char** argv) {
  bool positional = false;
  for (int i = 0; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") positional = true;
    args_.push_back(i == 0 || positional ? std::string(arg) : FlagArgWithUnderscores(arg));
  }
  for (std::string& a : args_) pointers_.push_back(a.data());
  pointers_.push_back(nullptr);
}

}  // namespace attnserve
