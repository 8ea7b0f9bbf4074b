#include "src/common/text.h"

#include <gtest/gtest.h>

#include <string_view>
#include <vector>

namespace flare::common {
namespace {

TEST(DemangleTest, MangledPlainAndNull) {
  EXPECT_EQ(demangle("_ZN5flare3fooEv"), "flare::foo()");
  EXPECT_EQ(demangle("_Z4stepPfi"), "step(float*, int)");
  EXPECT_EQ(demangle("ncclAllReduce"), "ncclAllReduce");  // not mangled: unchanged
  EXPECT_EQ(demangle(""), "");
  EXPECT_EQ(demangle(nullptr), "?");
}

TEST(SplitLinesTest, LinesWithoutTheirNewline) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(splitLines("a\nbb\n\nc"), (V{"a", "bb", "", "c"}));
  EXPECT_EQ(splitLines("a\r\nb\n"), (V{"a\r", "b"}));  // a final newline ends the last line
  EXPECT_EQ(splitLines("\n"), (V{""}));
  EXPECT_TRUE(splitLines("").empty());
}

}  // namespace
}  // namespace flare::common
