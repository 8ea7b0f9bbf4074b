#include "src/common/text.h"

#include <gtest/gtest.h>

namespace flare::common {
namespace {

TEST(DemangleTest, MangledPlainAndNull) {
  EXPECT_EQ(demangle("_ZN5flare3fooEv"), "flare::foo()");
  EXPECT_EQ(demangle("_Z4stepPfi"), "step(float*, int)");
  EXPECT_EQ(demangle("ncclAllReduce"), "ncclAllReduce");  // not mangled: unchanged
  EXPECT_EQ(demangle(""), "");
  EXPECT_EQ(demangle(nullptr), "?");
}

}  // namespace
}  // namespace flare::common
