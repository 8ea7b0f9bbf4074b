#include "src/common/rank_list.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "src/common/config.h"
#include "src/common/testing/warning_capture.h"

namespace flare::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Captures config warnings. Each test uses its own variable names: warnings are once per
// (variable, value) per process.
class RankListTest : public ::testing::Test {
 protected:
  std::vector<std::string> lines() const { return capture_.lines(); }

 private:
  testing::WarningCapture capture_;
};

std::vector<int> ranksOf(std::string_view text) {
  std::string error;
  auto set = parseRankSet("--ranks", text, &error);
  EXPECT_TRUE(set.has_value()) << error;
  return set ? set->ranks() : std::vector<int>{};
}

std::string errorOf(std::string_view text) {
  std::string error;
  EXPECT_FALSE(parseRankSet("FLARE_TEST_RANKS", text, &error).has_value()) << text;
  return error;
}

TEST(RankSetTest, AcceptsRanksRangesAndTheirUnion) {
  EXPECT_THAT(ranksOf("3"), ElementsAre(3));
  EXPECT_THAT(ranksOf("0,2,4-7"), ElementsAre(0, 2, 4, 5, 6, 7));
  EXPECT_THAT(ranksOf(" 7 , 1 - 2 ,0"), ElementsAre(0, 1, 2, 7));  // whitespace, any order
  EXPECT_THAT(ranksOf("0-3,2,3-4"), ElementsAre(0, 1, 2, 3, 4));   // overlaps merge
  EXPECT_THAT(ranksOf("5-5"), ElementsAre(5));
  EXPECT_EQ(ranksOf("1048575").back(), kMaxRank);
}

TEST(RankSetTest, StarAndAllMeanEveryRank) {
  for (const char* text : {"*", "all", " ALL ", "All"}) {
    auto set = parseRankSet("--ranks", text, nullptr);
    ASSERT_TRUE(set.has_value()) << text;
    EXPECT_TRUE(set->all());
    EXPECT_TRUE(set->contains(0));
    EXPECT_TRUE(set->contains(kMaxRank));
    EXPECT_FALSE(set->contains(-1));
    EXPECT_EQ(set->toString(), "*");
  }
}

TEST(RankSetTest, RejectsMalformedListsNamingTheVariable) {
  for (const char* text : {"", " ", "0,,2", "0,", ",0", "7-4", "-1", "+1", "1.0", "0x2", "a", "1-",
                           "-", "1-2-3", "0,*", "all,1", "1048576", "0-1048576", "99999999999"}) {
    const std::string error = errorOf(text);
    EXPECT_THAT(error, HasSubstr("FLARE_TEST_RANKS")) << text;
  }
  EXPECT_EQ(errorOf("0,x"),
            "bad FLARE_TEST_RANKS '0,x': 'x' is not a rank N or a range A-B (a rank list is like "
            "0,2,4-7, or * for every rank)");
  EXPECT_THAT(errorOf("7-4"), HasSubstr(": '7-4' is not a rank"));
  EXPECT_THAT(errorOf("0,,2"), HasSubstr(": '' is not a rank"));
  EXPECT_THAT(errorOf(" "), HasSubstr("bad FLARE_TEST_RANKS ' ': the list is empty"));
}

TEST(RankSetTest, ContainsCountAndCanonicalSpelling) {
  auto set = parseRankSet("--ranks", "9,0-2,4,3", nullptr);
  ASSERT_TRUE(set.has_value());
  EXPECT_EQ(set->toString(), "0-4,9");
  EXPECT_EQ(set->count(), 6u);
  EXPECT_TRUE(set->contains(3));
  EXPECT_FALSE(set->contains(5));
  EXPECT_FALSE(set->contains(-1));
  EXPECT_THAT(set->ranges(), ElementsAre(std::make_pair(0, 4), std::make_pair(9, 9)));
  // The canonical spelling parses back to the same set.
  auto again = parseRankSet("--ranks", set->toString(), nullptr);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->ranks(), set->ranks());
}

TEST_F(RankListTest, EnvRankSetWarnsOnceAndIgnoresABadValue) {
  unsetenv("FLARE_TEST_ENV_RANKS");
  EXPECT_FALSE(envRankSet("FLARE_TEST_ENV_RANKS").has_value());
  setenv("FLARE_TEST_ENV_RANKS", "2-3", 1);
  auto set = envRankSet("FLARE_TEST_ENV_RANKS");
  ASSERT_TRUE(set.has_value());
  EXPECT_THAT(set->ranks(), ElementsAre(2, 3));
  setenv("FLARE_TEST_ENV_RANKS", "2-x", 1);
  EXPECT_FALSE(envRankSet("FLARE_TEST_ENV_RANKS").has_value());
  EXPECT_FALSE(envRankSet("FLARE_TEST_ENV_RANKS").has_value());
  EXPECT_THAT(lines(), ElementsAre("flare: bad FLARE_TEST_ENV_RANKS '2-x': '2-x' is not a rank N "
                                   "or a range A-B (a rank list is like 0,2,4-7, or * for every "
                                   "rank); ignoring it"));
  unsetenv("FLARE_TEST_ENV_RANKS");
}

TEST_F(RankListTest, PerRankListGoodEntries) {
  auto list = parsePerRankList("FLARE_TEST_RL1", " 0:1.5, 3:0.5 ,*:2,4-6:3", 1, 1);
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].ranks.toString(), "0");
  EXPECT_THAT(list[0].fields, ElementsAre("1.5"));
  EXPECT_EQ(list[1].ranks.toString(), "3");
  EXPECT_THAT(list[1].fields, ElementsAre("0.5"));
  EXPECT_TRUE(list[2].ranks.all());
  EXPECT_THAT(list[2].fields, ElementsAre("2"));
  EXPECT_EQ(list[3].ranks.toString(), "4-6");
  EXPECT_THAT(list[3].fields, ElementsAre("3"));
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(RankListTest, PerRankListVariableFieldCounts) {
  auto list = parsePerRankList("FLARE_TEST_RL2", "1:200,2:50:10", 1, 2);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_THAT(list[0].fields, ElementsAre("200"));
  EXPECT_THAT(list[1].fields, ElementsAre("50", "10"));
  EXPECT_THAT(parsePerRankList("FLARE_TEST_RL2", "", 1, 2), IsEmpty());
  EXPECT_THAT(parsePerRankList("FLARE_TEST_RL2", " , ,", 1, 2), IsEmpty());
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(RankListTest, PerRankListBadEntriesAreSkippedWithOneWarningEach) {
  const char* value =
      "0:collective:5,x:compute:3,-1:skip:2,4:compute,5:a:b:c,6,:skip:1,2:skip:9,7-3:skip:1";
  auto list = parsePerRankList("FLARE_TEST_RL3", value, 2, 2);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].ranks.toString(), "0");
  EXPECT_THAT(list[0].fields, ElementsAre("collective", "5"));
  EXPECT_EQ(list[1].ranks.toString(), "2");
  EXPECT_THAT(list[1].fields, ElementsAre("skip", "9"));
  auto got = lines();
  ASSERT_EQ(got.size(), 7u);
  EXPECT_EQ(got[0],
            "flare: FLARE_TEST_RL3 entry 'x:compute:3' has a bad rank 'x' (expected a rank N, a "
            "range A-B or '*'); ignoring the entry");
  EXPECT_THAT(got[1], HasSubstr("entry '-1:skip:2' has a bad rank '-1'"));
  EXPECT_EQ(got[2],
            "flare: FLARE_TEST_RL3 entry '4:compute' has 1 field(s) after the rank, expected 2; "
            "ignoring the entry");
  EXPECT_THAT(got[3], HasSubstr("entry '5:a:b:c' has 3 field(s) after the rank, expected 2"));
  EXPECT_THAT(got[4], HasSubstr("entry '6' has 0 field(s)"));
  EXPECT_THAT(got[5], HasSubstr("entry ':skip:1' has a bad rank ''"));
  EXPECT_THAT(got[6], HasSubstr("entry '7-3:skip:1' has a bad rank '7-3'"));
  // Parsing the same value again says nothing new.
  EXPECT_EQ(parsePerRankList("FLARE_TEST_RL3", value, 2, 2).size(), 2u);
  EXPECT_EQ(lines().size(), 7u);
}

TEST_F(RankListTest, PerRankListFieldRangeMessage) {
  EXPECT_THAT(parsePerRankList("FLARE_TEST_RL4", "1:2:3:4", 1, 2), IsEmpty());
  EXPECT_THAT(lines(), ElementsAre("flare: FLARE_TEST_RL4 entry '1:2:3:4' has 3 field(s) after "
                                   "the rank, expected 1 to 2; ignoring the entry"));
}

TEST_F(RankListTest, EntryForRankPrefersTheNarrowestEntry) {
  auto list = parsePerRankList("FLARE_TEST_RL5", "*:1,2-5:2,3:3,3:4", 1, 1);
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(entryForRank(list, 3)->fields[0], "3");  // its own entry, the first of two
  EXPECT_EQ(entryForRank(list, 4)->fields[0], "2");  // the range
  EXPECT_EQ(entryForRank(list, 9)->fields[0], "1");  // '*'
  auto no_star = parsePerRankList("FLARE_TEST_RL5", "2-5:2", 1, 1);
  EXPECT_EQ(entryForRank(no_star, 1), nullptr);
  EXPECT_EQ(entryForRank(no_star, 5)->fields[0], "2");
  EXPECT_EQ(entryForRank({}, 0), nullptr);
}

}  // namespace
}  // namespace flare::common
