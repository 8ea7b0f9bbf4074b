#include "src/engine/diagnosis/detectors.h"

#include <gtest/gtest.h>

namespace flare::engine {
namespace {

TEST(Wasserstein1, HandComputedCases) {
  EXPECT_DOUBLE_EQ(wasserstein1({0}, {5}), 5);                  // two point masses
  EXPECT_DOUBLE_EQ(wasserstein1({1, 2, 3}, {11, 12, 13}), 10);  // a shift
  EXPECT_DOUBLE_EQ(wasserstein1({0, 1}, {0, 1}), 0);
  // {0, 0, 3} vs {0, 3, 3}: the CDFs differ by 1/3 on [0, 3).
  EXPECT_NEAR(wasserstein1({0, 0, 3}, {0, 3, 3}), 1.0, 1e-12);
}

TEST(TukeyUpperFence, HandComputed) {
  // Quartiles of 1..8 with linear interpolation: Q1 = 2.75, Q3 = 6.25, IQR = 3.5.
  EXPECT_DOUBLE_EQ(tukeyUpperFence({1, 2, 3, 4, 5, 6, 7, 8}, 1.5), 6.25 + 1.5 * 3.5);
}

TEST(BusBandwidthFactor, NcclTestsDefinitions) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_REDUCE, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_GATHER, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_BROADCAST, 4), 1.0);
}

}  // namespace
}  // namespace flare::engine
