#include "core/auth.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr char kTokens[] =
    "# principals\n"
    "alice admin 0123456789abcdef0123\n"
    "bob   read  fedcba9876543210fedc   # comment\n"
    "\n"
    "w0 worker aaaaaaaaaaaaaaaaaaaa\n"
    "tessera-worker-* worker bbbbbbbbbbbbbbbbbbbb\n";

TEST(RolesTest, UserRolesNestAndWorkerStandsApart) {
  EXPECT_TRUE(RoleCovers(Role::kAdmin, Role::kWrite));
  EXPECT_TRUE(RoleCovers(Role::kWrite, Role::kRead));
  EXPECT_FALSE(RoleCovers(Role::kRead, Role::kWrite));
  EXPECT_FALSE(RoleCovers(Role::kWrite, Role::kAdmin));
  EXPECT_FALSE(RoleCovers(Role::kAdmin, Role::kWorker));
  EXPECT_FALSE(RoleCovers(Role::kWorker, Role::kRead));
  EXPECT_TRUE(RoleCovers(Role::kWorker, Role::kWorker));
}

TEST(RolesTest, TableFollowsTheContract) {
  EXPECT_EQ(*RequiredRole("/tessera.v1.Coordinator/GetTensor"), Role::kRead);
  EXPECT_EQ(*RequiredRole("/tessera.v1.Coordinator/CreateTensor"),
            Role::kWrite);
  EXPECT_EQ(*RequiredRole("/tessera.v1.Coordinator/RegisterWorker"),
            Role::kWorker);
  EXPECT_EQ(RequiredRole("/tessera.v1.Coordinator/Nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(ParseRole("root").ok());
}

TEST(TokenTableTest, AuthenticatesBySecret) {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(kTokens);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 4u);
  std::optional<Principal> alice =
      table->Authenticate("0123456789abcdef0123");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kAdmin);
  EXPECT_EQ(table->Authenticate("fedcba9876543210fedc")->role, Role::kRead);
  EXPECT_FALSE(table->Authenticate("0123456789abcdef012").has_value());
  EXPECT_FALSE(table->Authenticate("").has_value());
}

TEST(TokenTableTest, RejectsBadFilesWithoutQuotingSecrets) {
  for (const char* text :
       {"alice admin\n", "alice root 0123456789abcdef0123\n",
        "alice admin short\n", "",
        "a read 0123456789abcdef0123\na write 1123456789abcdef0123\n",
        "a read 0123456789abcdef0123\nb write 0123456789abcdef0123\n"}) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(text);
    EXPECT_FALSE(table.ok()) << text;
    EXPECT_EQ(table.status().message().find("0123456789abcdef"),
              std::string::npos)
        << table.status();
  }
}

TEST(TokenTableTest, LoadRefusesAFileOthersCanRead) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/tokens";
  std::ofstream(path) << kTokens;
  chmod(path.c_str(), 0644);
  absl::StatusOr<TokenTable> table = TokenTable::Load(path);
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("permissions"), std::string::npos);
  chmod(path.c_str(), 0600);
  EXPECT_TRUE(TokenTable::Load(path).ok());
}

TEST(TokenFileTest, ReadsTheSecretTrimmed) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/token";
  std::ofstream(path) << "  s3cret-value\n";
  EXPECT_EQ(*ReadTokenFile(path), "s3cret-value");
  std::ofstream(path) << "two words\n";
  EXPECT_FALSE(ReadTokenFile(path).ok());
  EXPECT_FALSE(ReadTokenFile(path + ".missing").ok());
}

TEST(WorkerBindingTest, ExactOrPrefixPattern) {
  EXPECT_TRUE(PrincipalMayBeWorker("w0", "w0"));
  EXPECT_FALSE(PrincipalMayBeWorker("w0", "w1"));
  EXPECT_FALSE(PrincipalMayBeWorker("w0", "w00"));
  EXPECT_TRUE(PrincipalMayBeWorker("tessera-worker-*", "tessera-worker-3"));
  EXPECT_FALSE(PrincipalMayBeWorker("tessera-worker-*", "tessera-worker-"));
  EXPECT_FALSE(PrincipalMayBeWorker("tessera-worker-*", "other-3"));
}

TEST(TokenTable, APrincipalsNameIsBoundedAsTheOwnerOfItsTensors) {
  const std::string name(kMaxPrincipalBytes + 1, 'p');
  absl::StatusOr<TokenTable> table =
      TokenTable::Parse(name + " write 0123456789abcdefXYZ\n");
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("at most 1024 characters"),
            std::string::npos)
      << table.status();
  EXPECT_TRUE(TokenTable::Parse(std::string(kMaxPrincipalBytes, 'p') +
                                " write 0123456789abcdefXYZ\n")
                  .ok());
}

}  // namespace
}  // namespace tessera
