#include "server/auth/principals.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnserve::auth {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 512;

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '@' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidToken(absl::string_view token) {
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) return false;
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

std::array<unsigned char, 32> Sha256(absl::string_view data) {
  std::array<unsigned char, 32> out;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data());
  return out;
}

absl::Status SetLimit(absl::string_view key, int64_t value, PrincipalLimits* limits) {
  if (key == "max_request_bytes") {
    limits->max_request_bytes = value;
  } else if (key == "max_concurrent_streams") {
    limits->max_concurrent_streams = value;
  } else if (key == "max_resident_bytes") {
    limits->max_resident_bytes = value;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown limit '", key,
                     "' (known: max_request_bytes, max_concurrent_streams, max_resident_bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PrincipalEntry>> ParseTokenFile(absl::string_view text) {
  std::vector<PrincipalEntry> entries;
  std::map<std::string, int> names;
  std::map<std::string, int> tokens;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat("line ", line_no, ": ");
    if (fields.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected NAME TOKEN [limit=value ...]"));
    }
    PrincipalEntry e;
    e.name = std::string(fields[0]);
    e.token = std::string(fields[1]);
    if (!ValidName(e.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "name must be 1 to 64 of [A-Za-z0-9_.@-]"));
    }
    // The token itself is never echoed: the file's errors may end up in logs.
    if (!ValidToken(e.token)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the token of '", e.name, "' must be ",
                                                     kMinTokenBytes, " to ", kMaxTokenBytes,
                                                     " printable characters without spaces"));
    }
    for (size_t i = 2; i < fields.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(fields[i], absl::MaxSplits('=', 1));
      int64_t value = 0;
      if (!absl::SimpleAtoi(kv.second, &value) || value < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "'", fields[i], "': expected limit=N with N a non-negative integer"));
      }
      if (absl::Status s = SetLimit(kv.first, value, &e.limits); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
      }
    }
    if (auto [it, fresh] = names.emplace(e.name, line_no); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "duplicate name '", e.name, "' (also on line ", it->second, ")"));
    }
    if (auto [it, fresh] = tokens.emplace(e.token, line_no); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "duplicate token (also on line ", it->second, ")"));
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

StreamSlot& StreamSlot::operator=(StreamSlot&& other) noexcept {
  if (this != &other) {
    Release();
    principal_ = std::move(other.principal_);
  }
  return *this;
}

StreamSlot::~StreamSlot() { Release(); }

void StreamSlot::Release() {
  if (principal_ != nullptr) principal_->streams_.fetch_sub(1);
  principal_.reset();
}

PrincipalLimits Principal::limits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limits_;
}

void Principal::set_limits(const PrincipalLimits& limits) {
  std::lock_guard<std::mutex> lock(mu_);
  limits_ = limits;
}

std::string Principal::Label() const { return absl::StrCat("principal '", name_, "': "); }

absl::StatusOr<StreamSlot> Principal::AcquireStream() {
  const int64_t limit = limits().max_concurrent_streams;
  const int64_t before = streams_.fetch_add(1);
  if (limit > 0 && before >= limit) {
    streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        Label(), before, " streams in progress, its limit max_concurrent_streams=", limit,
        " (token file)"));
  }
  return StreamSlot(shared_from_this());
}

absl::Status Principal::CheckRequestBytes(int64_t bytes, absl::string_view what) const {
  const int64_t limit = limits().max_request_bytes;
  if (limit > 0 && bytes > limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Label(), what, ": ", bytes,
                     " bytes, above its limit max_request_bytes=", limit, " (token file)"));
  }
  return absl::OkStatus();
}

absl::Status Principal::CheckResident(int64_t held, int64_t adding, absl::string_view what) const {
  const int64_t limit = limits().max_resident_bytes;
  if (limit > 0 && adding > 0 && (adding > limit || held > limit - adding)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Label(), what, ": ", adding, " bytes on top of the ", held,
                     " its contexts and regions hold, above its limit max_resident_bytes=", limit,
                     " (token file)"));
  }
  return absl::OkStatus();
}

std::unique_ptr<Authenticator> Authenticator::Open() {
  return std::unique_ptr<Authenticator>(new Authenticator());
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromEntries(
    std::vector<PrincipalEntry> entries) {
  std::unique_ptr<Authenticator> a(new Authenticator());
  a->enabled_ = true;
  if (absl::Status s = a->Install(std::move(entries)); !s.ok()) return s;
  return a;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::string& path) {
  std::unique_ptr<Authenticator> a(new Authenticator());
  a->enabled_ = true;
  a->path_ = path;
  if (absl::Status s = a->Reload(); !s.ok()) return s;
  return a;
}

absl::Status Authenticator::Reload() {
  if (path_.empty()) return absl::FailedPreconditionError("no token file to reload");
  std::ifstream in(path_);
  if (!in) return absl::NotFoundError(absl::StrCat("--token-file=", path_, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<PrincipalEntry>> entries = ParseTokenFile(text.str());
  if (!entries.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token-file=", path_, ": ", entries.status().message()));
  }
  if (absl::Status s = Install(*std::move(entries)); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--token-file=", path_, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status Authenticator::Install(std::vector<PrincipalEntry> entries) {
  if (entries.empty()) return absl::InvalidArgumentError("no principal (NAME TOKEN lines)");
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> fresh;
  std::map<std::string, std::shared_ptr<Principal>> by_name;
  for (PrincipalEntry& e : entries) {
    std::shared_ptr<Principal> p;
    if (auto it = by_name_.find(e.name); it != by_name_.end()) {
      p = it->second;
      p->set_limits(e.limits);
    } else {
      p = std::make_shared<Principal>(e.name, e.limits);
    }
    fresh.push_back(Entry{Sha256(e.token), p});
    by_name.emplace(e.name, std::move(p));
    // Best effort: do not keep the plain token around longer than needed.
    OPENSSL_cleanse(e.token.data(), e.token.size());
  }
  entries_ = std::move(fresh);
  by_name_ = std::move(by_name);
  return absl::OkStatus();
}

size_t Authenticator::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

absl::StatusOr<std::shared_ptr<Principal>> Authenticator::Authenticate(
    std::optional<absl::string_view> authorization) const {
  if (!enabled_) return anonymous_;
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "authorization: missing; send the metadata 'authorization: Bearer <token>'");
  }
  absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  // The scheme is case-insensitive (RFC 7235).
  if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError("authorization: expected 'Bearer <token>'");
  }
  const Digest digest = Sha256(absl::StripLeadingAsciiWhitespace(value.substr(7)));
  std::shared_ptr<Principal> found;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_) {
    // Every entry is compared, match or not: the time does not depend on which one matches.
    const bool equal = CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0;
    if (equal) found = e.principal;
  }
  if (found == nullptr) return absl::UnauthenticatedError("authorization: invalid token");
  return found;
}

}  // namespace attnserve::auth
