// Bearer-token authentication and per-principal limits.
//
// A token file names the principals (callers) and their limits, one a line:
//
//   # NAME  TOKEN      limits (each optional; 0 or absent: none)
//   alice   3f1c0e...  max_request_bytes=1073741824 max_concurrent_streams=4
//   batch   9ab2d4...  max_resident_bytes=8589934592
//
// Fields are separated by spaces or tabs; `#` starts a comment; names are [A-Za-z0-9_.@-]{1,64};
// tokens are 16 to 512 printable characters without spaces (a token's bytes are compared, not
// decoded). The service asks the Authenticator for the caller of every RPC (the `authorization:
// Bearer <token>` metadata) and the Principal it returns for the caller's limits. Without a token
// file every caller is the anonymous principal "" with no limits of its own.
//
// Why the tokens are compared through SHA-256 digests: the presented token is hashed once and its
// 32-byte digest compared with every principal's digest in constant time and without stopping at
// a match, so neither the time taken nor the error says which tokens exist, or how long they are.
#ifndef ATTNSERVE_SERVER_AUTH_PRINCIPALS_H_
#define ATTNSERVE_SERVER_AUTH_PRINCIPALS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::auth {

// 0 means no limit of the principal's own (the server's flags still apply).
struct PrincipalLimits {
  int64_t max_request_bytes = 0;       // Q + K + V bytes of one Attend; K + V of one append
  int64_t max_concurrent_streams = 0;  // Attend and AppendContext calls in progress at once
  int64_t max_resident_bytes = 0;      // bytes of its contexts and shared-memory regions
};

struct PrincipalEntry {
  std::string name;
  std::string token;
  PrincipalLimits limits;
};

// The token file's text -> its entries. Errors name the line and the rule ("line 3: duplicate
// token (also on line 1)").
absl::StatusOr<std::vector<PrincipalEntry>> ParseTokenFile(absl::string_view text);

class Principal;

// One stream of a principal in progress; the slot is given back when this is destroyed.
class StreamSlot {
 public:
  StreamSlot() = default;
  explicit StreamSlot(std::shared_ptr<Principal> principal) : principal_(std::move(principal)) {}
  StreamSlot(StreamSlot&& other) noexcept = default;
  StreamSlot& operator=(StreamSlot&& other) noexcept;
  ~StreamSlot();

 private:
  void Release();
  std::shared_ptr<Principal> principal_;
};

// A caller: its name (the owner of its contexts and regions) and its limits. Shared by every call
// of that principal; a token file reload updates the limits of the same object, so the streams in
// progress stay counted.
class Principal : public std::enable_shared_from_this<Principal> {
 public:
  explicit Principal(std::string name, PrincipalLimits limits = {})
      : name_(std::move(name)), limits_(limits) {}

  const std::string& name() const { return name_; }
  PrincipalLimits limits() const;
  void set_limits(const PrincipalLimits& limits);

  // One more stream, or RESOURCE_EXHAUSTED naming max_concurrent_streams.
  absl::StatusOr<StreamSlot> AcquireStream();
  int64_t streams() const { return streams_.load(); }
  // RESOURCE_EXHAUSTED naming max_request_bytes when `bytes` is above it; `what` says what the
  // bytes are ("q, k and v of the request").
  absl::Status CheckRequestBytes(int64_t bytes, absl::string_view what) const;
  // RESOURCE_EXHAUSTED naming max_resident_bytes when `held + adding` is above it.
  absl::Status CheckResident(int64_t held, int64_t adding, absl::string_view what) const;
  // Held around "check the resident bytes, then create": two calls of one principal cannot both
  // pass the check on the same room.
  std::mutex& resident_mu() { return resident_mu_; }

 private:
  friend class StreamSlot;
  std::string Label() const;

  const std::string name_;
  mutable std::mutex mu_;
  PrincipalLimits limits_;
  std::atomic<int64_t> streams_{0};
  std::mutex resident_mu_;
};

class Authenticator {
 public:
  // No tokens: every caller is the anonymous principal with no limits; Authenticate never fails.
  static std::unique_ptr<Authenticator> Open();
  // Reads the token file (which must name at least one principal).
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::string& path);
  // From parsed entries (tests).
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromEntries(
      std::vector<PrincipalEntry> entries);

  // Re-reads the file given to FromFile. On an error the tokens in force stay as they were.
  // Principals that stay keep their object (streams in progress stay counted); calls in
  // progress of a removed principal finish, its new calls are refused.
  absl::Status Reload();

  bool enabled() const { return enabled_; }
  const std::string& path() const { return path_; }
  size_t size() const;

  // The caller from the values of its `authorization` metadata (none: nullopt). UNAUTHENTICATED
  // when tokens are configured and the value is missing, not "Bearer <token>", or no principal's
  // token; the message never says which tokens exist.
  absl::StatusOr<std::shared_ptr<Principal>> Authenticate(
      std::optional<absl::string_view> authorization) const;

 private:
  using Digest = std::array<unsigned char, 32>;
  struct Entry {
    Digest digest;
    std::shared_ptr<Principal> principal;
  };
  Authenticator() = default;
  absl::Status Install(std::vector<PrincipalEntry> entries);

  bool enabled_ = false;
  std::string path_;
  std::shared_ptr<Principal> anonymous_ = std::make_shared<Principal>("");
  mutable std::mutex mu_;
  std::vector<Entry> entries_;                                 // under mu_
  std::map<std::string, std::shared_ptr<Principal>> by_name_;  // under mu_
};

}  // namespace attnserve::auth

#endif  // ATTNSERVE_SERVER_AUTH_PRINCIPALS_H_
