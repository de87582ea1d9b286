#include "core/labels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(Labels, ParseAndPrintInKeyOrder) {
  absl::StatusOr<Labels> labels =
      ParseLabels("role=inference,node.kubernetes.io/pool=gpu-a,empty=");
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(labels->size(), 3u);
  EXPECT_EQ(labels->at("role"), "inference");
  EXPECT_EQ(labels->at("empty"), "");
  EXPECT_EQ(LabelsString(*labels),
            "empty=,node.kubernetes.io/pool=gpu-a,role=inference");
  EXPECT_TRUE(ParseLabels("")->empty());
}

TEST(Labels, RefuseMalformedTextNamingIt) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"role", "'role' is not KEY=VALUE"},
      {"role=a,role=b", "label 'role' is given twice"},
      {"=x", "label key '' must be 1 to 63"},
      {"-a=x", "starting with a letter or digit"},
      {"a b=x", "may hold only letters"},
      {"a=x y", "the value of label 'a' may hold only"},
      {"a=b/c", "the value of label 'a' may hold only"},
      {"a,b=c", "'a' is not KEY=VALUE"},
      {"a=1,", "'' is not KEY=VALUE"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Labels> labels = ParseLabels(c.text);
    ASSERT_FALSE(labels.ok()) << c.text;
    EXPECT_THAT(labels.status().message(), HasSubstr(c.says)) << c.text;
  }
  EXPECT_FALSE(ParseLabels(std::string(64, 'k') + "=v").ok());
  EXPECT_FALSE(ParseLabels("k=" + std::string(64, 'v')).ok());
  std::string many;
  for (int i = 0; i < 33; ++i)
    absl::StrAppend(&many, i ? "," : "", "k", i, "=v");
  EXPECT_THAT(ParseLabels(many).status().message(), HasSubstr("at most 32"));
}

TEST(LabelSelector, AllOrEveryPairMustMatch) {
  const Labels inference = {{"role", "inference"}, {"zone", "a"}};
  const Labels trainer = {{"role", "trainer"}, {"zone", "a"}};
  absl::StatusOr<LabelSelector> all = ParseLabelSelector("all");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->Matches(inference));
  EXPECT_TRUE(all->Matches({}));
  EXPECT_EQ(all->ToString(), "all");

  absl::StatusOr<LabelSelector> both =
      ParseLabelSelector("zone=a,role=inference");
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(both->Matches(inference));
  EXPECT_FALSE(both->Matches(trainer));
  EXPECT_FALSE(both->Matches({{"role", "inference"}}));
  EXPECT_EQ(both->ToString(), "role=inference,zone=a");

  EXPECT_THAT(ParseLabelSelector("").status().message(),
              HasSubstr("empty selector"));
  EXPECT_THAT(ParseLabelSelector("role").status().message(),
              HasSubstr("selector 'role': 'role' is not KEY=VALUE"));
}

}  // namespace
}  // namespace tessera
