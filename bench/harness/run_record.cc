#include "bench/harness/run_record.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/harness/flags.h"

namespace attnserve::bench {
namespace {

std::string GitHead() {
  FILE* p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
  if (p == nullptr) return "";
  char buf[64] = {0};
  const bool got = std::fgets(buf, sizeof(buf), p) != nullptr;
  pclose(p);
  std::string s = got ? std::string(buf) : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

std::string BenchCommit(std::string_view override) {
  if (!override.empty()) return std::string(override);
  if (const char* env = std::getenv("ATTNSERVE_COMMIT"); env != nullptr && *env != '\0') {
    return env;
  }
  if (std::string head = GitHead(); !head.empty()) return head;
#ifdef ATTNSERVE_GIT_COMMIT
  if (std::string_view(ATTNSERVE_GIT_COMMIT).size() > 0) return ATTNSERVE_GIT_COMMIT;
#endif
  return "unknown";
}

RunRecord MakeRunRecord(std::string device, std::string_view commit_override) {
  RunRecord r;
  r.device = std::move(device);
  r.date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  r.commit = BenchCommit(commit_override);
  r.command = BenchCommandLine();
  return r;
}

void AddRunRecord(const RunRecord& record, Json& json) {
  json.Set("device", record.device);
  json.Set("date", record.date);
  json.Set("commit", record.commit);
  json.Set("command", record.command);
}

absl::Status WriteJsonOut(const std::string& path, const Json& json) {
  const absl::Status written = WriteJsonFile(path, json);
  if (!written.ok()) return absl::InternalError(absl::StrCat("--json-out: ", written.message()));
  std::printf("  wrote %s\n", path.c_str());
  return absl::OkStatus();
}

}  // namespace attnserve::bench
