#include "server/auth/principals.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/transport.h"

namespace attnserve::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-0123456789abcdef";

TEST(ParseTokenFile, EntriesWithLimitsCommentsAndBlankLines) {
  absl::StatusOr<std::vector<PrincipalEntry>> e = ParseTokenFile(absl::StrCat(
      "# principals\n\n", "alice ", kAliceToken,
      " max_request_bytes=1000 max_concurrent_streams=2 max_resident_bytes=5000  # note\n", "bob\t",
      kBobToken, "\r\n"));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 2u);
  EXPECT_EQ((*e)[0].name, "alice");
  EXPECT_EQ((*e)[0].token, kAliceToken);
  EXPECT_EQ((*e)[0].limits.max_request_bytes, 1000);
  EXPECT_EQ((*e)[0].limits.max_concurrent_streams, 2);
  EXPECT_EQ((*e)[0].limits.max_resident_bytes, 5000);
  EXPECT_EQ((*e)[1].name, "bob");
  EXPECT_EQ((*e)[1].limits.max_request_bytes, 0);
}

TEST(ParseTokenFile, ErrorsNameTheLineAndNeverTheToken) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"alice\n", "line 1: expected NAME TOKEN"},
      {absl::StrCat("al/ice ", kAliceToken), "line 1: name must be"},
      {"alice short", "line 1: the token of 'alice' must be 16 to 512"},
      {absl::StrCat("alice ", kAliceToken, " max_request_bytes=-1"), "non-negative integer"},
      {absl::StrCat("alice ", kAliceToken, " max_bytes=1"), "unknown limit 'max_bytes'"},
      {absl::StrCat("alice ", kAliceToken, "\nalice ", kBobToken), "line 2: duplicate name"},
      {absl::StrCat("alice ", kAliceToken, "\nbob ", kAliceToken),
       "line 2: duplicate token (also on line 1)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<PrincipalEntry>> e = ParseTokenFile(c.text);
    ASSERT_FALSE(e.ok()) << c.text;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(e.status().message()), HasSubstr(c.message)) << c.text;
    EXPECT_THAT(std::string(e.status().message()), Not(HasSubstr(kAliceToken)));
  }
}

std::unique_ptr<Authenticator> TwoPrincipals(PrincipalLimits alice_limits = {}) {
  std::vector<PrincipalEntry> entries = {{"alice", kAliceToken, alice_limits},
                                         {"bob", kBobToken, {}}};
  absl::StatusOr<std::unique_ptr<Authenticator>> a = Authenticator::FromEntries(entries);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : nullptr;
}

TEST(Authenticator, OpenServerMakesEveryCallerAnonymous) {
  std::unique_ptr<Authenticator> open = Authenticator::Open();
  EXPECT_FALSE(open->enabled());
  absl::StatusOr<std::shared_ptr<Principal>> p = open->Authenticate(std::nullopt);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->name(), "");
  EXPECT_TRUE(open->Authenticate("Bearer whatever").ok());
}

TEST(Authenticator, BearerTokensPickTheirPrincipal) {
  std::unique_ptr<Authenticator> a = TwoPrincipals();
  ASSERT_NE(a, nullptr);
  absl::StatusOr<std::shared_ptr<Principal>> alice =
      a->Authenticate(absl::StrCat("Bearer ", kAliceToken));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ((*alice)->name(), "alice");
  absl::StatusOr<std::shared_ptr<Principal>> bob =
      a->Authenticate(absl::StrCat("bearer  ", kBobToken, " "));
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ((*bob)->name(), "bob");
}

TEST(Authenticator, MissingMalformedAndWrongTokensAreUnauthenticated) {
  std::unique_ptr<Authenticator> a = TwoPrincipals();
  ASSERT_NE(a, nullptr);
  for (const std::optional<absl::string_view> value : std::vector<std::optional<absl::string_view>>{
           std::nullopt, "", "Basic YWxpY2U6eA==", kAliceToken, "Bearer ",
           "Bearer alice-token-0123456789abcdeX", "Bearer alice-token-0123456789abcde"}) {
    absl::StatusOr<std::shared_ptr<Principal>> p = a->Authenticate(value);
    ASSERT_FALSE(p.ok()) << value.value_or("(none)");
    EXPECT_EQ(p.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(std::string(p.status().message()), Not(HasSubstr("alice")));
    EXPECT_THAT(std::string(p.status().message()), Not(HasSubstr("bob")));
  }
}

TEST(Principal, StreamsAreCountedAndGivenBack) {
  std::unique_ptr<Authenticator> a = TwoPrincipals({.max_concurrent_streams = 2});
  ASSERT_NE(a, nullptr);
  std::shared_ptr<Principal> alice = *a->Authenticate(absl::StrCat("Bearer ", kAliceToken));
  {
    absl::StatusOr<StreamSlot> one = alice->AcquireStream();
    absl::StatusOr<StreamSlot> two = alice->AcquireStream();
    ASSERT_TRUE(one.ok() && two.ok());
    absl::StatusOr<StreamSlot> three = alice->AcquireStream();
    ASSERT_FALSE(three.ok());
    EXPECT_EQ(three.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(three.status().message()),
                HasSubstr("principal 'alice': 2 streams in progress, its limit "
                          "max_concurrent_streams=2"));
    EXPECT_EQ(alice->streams(), 2);
  }
  EXPECT_EQ(alice->streams(), 0);
  EXPECT_TRUE(alice->AcquireStream().ok());
}

TEST(Principal, RequestAndResidentLimitsNameTheLimit) {
  Principal p("alice", {.max_request_bytes = 100, .max_resident_bytes = 1000});
  EXPECT_TRUE(p.CheckRequestBytes(100, "q").ok());
  absl::Status s = p.CheckRequestBytes(101, "q");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("its limit max_request_bytes=100"));
  EXPECT_TRUE(p.CheckResident(600, 400, "create").ok());
  s = p.CheckResident(600, 401, "create");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("its limit max_resident_bytes=1000"));
  Principal unlimited("bob");
  EXPECT_TRUE(unlimited.CheckRequestBytes(int64_t{1} << 62, "q").ok());
  EXPECT_TRUE(unlimited.CheckResident(int64_t{1} << 62, int64_t{1} << 62, "c").ok());
}

TEST(Authenticator, ReloadKeepsPrincipalsAndTheOldTokensOnError) {
  const std::string path = ::testing::TempDir() + "/tokens.txt";
  const auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write(absl::StrCat("alice ", kAliceToken, " max_concurrent_streams=1\n"));
  absl::StatusOr<std::unique_ptr<Authenticator>> a = Authenticator::FromFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  std::shared_ptr<Principal> alice = *(*a)->Authenticate(absl::StrCat("Bearer ", kAliceToken));
  absl::StatusOr<StreamSlot> slot = alice->AcquireStream();
  ASSERT_TRUE(slot.ok());

  write(absl::StrCat("alice ", kAliceToken, " max_concurrent_streams=2\nbob ", kBobToken, "\n"));
  ASSERT_TRUE((*a)->Reload().ok());
  EXPECT_EQ((*a)->size(), 2u);
  std::shared_ptr<Principal> again = *(*a)->Authenticate(absl::StrCat("Bearer ", kAliceToken));
  EXPECT_EQ(again.get(), alice.get());  // the stream in progress stays counted
  EXPECT_EQ(again->streams(), 1);
  EXPECT_EQ(again->limits().max_concurrent_streams, 2);
  EXPECT_TRUE((*a)->Authenticate(absl::StrCat("Bearer ", kBobToken)).ok());

  write("broken\n");
  absl::Status s = (*a)->Reload();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("line 1"));
  EXPECT_TRUE((*a)->Authenticate(absl::StrCat("Bearer ", kBobToken)).ok());  // old set in force

  write(absl::StrCat("bob ", kBobToken, "\n"));
  ASSERT_TRUE((*a)->Reload().ok());
  EXPECT_EQ((*a)->Authenticate(absl::StrCat("Bearer ", kAliceToken)).status().code(),
            absl::StatusCode::kUnauthenticated);
  std::remove(path.c_str());
}

TEST(Authenticator, AnEmptyFileIsRefused) {
  const std::string path = ::testing::TempDir() + "/empty_tokens.txt";
  std::ofstream(path) << "# nobody\n";
  absl::StatusOr<std::unique_ptr<Authenticator>> a = Authenticator::FromFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("no principal"));
  EXPECT_EQ(Authenticator::FromFile(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(Transport, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:0"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:9464"));
  EXPECT_TRUE(IsLoopbackAddress("unix:/tmp/attnserve.sock"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.1.2.3:50051"));
}

TEST(Transport, CredentialFlagsAreChecked) {
  ServerTlsOptions o;
  EXPECT_TRUE(MakeServerCredentials(o).ok());  // plaintext
  o.client_ca_file = "/nonexistent/ca.pem";
  EXPECT_THAT(std::string(MakeServerCredentials(o).status().message()),
              HasSubstr("--tls-client-ca: needs --tls-cert and --tls-key"));
  o = {};
  o.cert_file = "/nonexistent/cert.pem";
  EXPECT_THAT(std::string(MakeServerCredentials(o).status().message()),
              HasSubstr("give both or neither"));
  o.key_file = "/nonexistent/key.pem";
  EXPECT_THAT(std::string(MakeServerCredentials(o).status().message()),
              HasSubstr("--tls-cert=/nonexistent/cert.pem: cannot read it"));
}

}  // namespace
}  // namespace attnserve::auth
