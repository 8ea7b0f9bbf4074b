#include "src/engine/diagnosis/detectors.h"

#include <gtest/gtest.h>

namespace flare::engine {
namespace {

TEST(BusBandwidthFactor, NcclTestsDefinitions) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_REDUCE, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_GATHER, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_BROADCAST, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_SEND, 2), 1.0);
}

}  // namespace
}  // namespace flare::engine
