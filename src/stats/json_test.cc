#include "src/stats/json.h"

#include <gtest/gtest.h>

#include <cmath>

namespace flare::stats::json {
namespace {

TEST(Json, ParsesDocuments) {
  std::string error;
  const auto v = parse(R"( {"op":"w1","a":[1, -2.5e3, 0.125],"b":[],"x":{"y":[true,false,null]},
                            "s":"a\"b\\c\u00e9\ud83d\ude00"} )",
                       &error);
  ASSERT_TRUE(v) << error;
  EXPECT_EQ(v->get("op")->string, "w1");
  ASSERT_EQ(v->get("a")->array.size(), 3u);
  EXPECT_EQ(v->get("a")->array[1].number, -2500);
  EXPECT_EQ(v->get("a")->array[2].number, 0.125);
  EXPECT_TRUE(v->get("b")->array.empty());
  EXPECT_TRUE(v->get("x")->get("y")->array[0].boolean);
  EXPECT_EQ(v->get("x")->get("y")->array[2].type, Value::Type::kNull);
  EXPECT_EQ(v->get("s")->string, "a\"b\\c\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v->get("missing"), nullptr);
}

TEST(Json, RejectsBadInputWithAnOffset) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01x", "\"abc", "[1] 2", "{\"a\":tru}",
                          "\"\\ud800\"", "-", "1.", "1e", "\"\\x\""}) {
    std::string error;
    EXPECT_FALSE(parse(bad, &error)) << bad;
    EXPECT_NE(error.find("offset"), std::string::npos) << bad;
  }
  std::string deep(100, '[');
  EXPECT_FALSE(parse(deep));
}

TEST(Json, WritesNumbersAndStrings) {
  EXPECT_EQ(number(0.1), "0.1");
  EXPECT_EQ(number(1e300), "1e+300");
  EXPECT_EQ(number(NAN), "null");
  EXPECT_EQ(std::stod(number(1.0 / 3)), 1.0 / 3);
  EXPECT_EQ(quote("a\"b\n\x01"), "\"a\\\"b\\n\\u0001\"");
}

}  // namespace
}  // namespace flare::stats::json
