#include "src/records/op_kind.h"

#include <gtest/gtest.h>

namespace flare::records {
namespace {

TEST(OpKind, FlopBearingKinds) {
  EXPECT_TRUE(computesFlops(flare::v1::OP_KIND_GEMM));
  EXPECT_TRUE(computesFlops(flare::v1::OP_KIND_ATTENTION));
  EXPECT_TRUE(computesFlops(flare::v1::OP_KIND_CUSTOM));
  EXPECT_FALSE(computesFlops(flare::v1::OP_KIND_KERNEL));
  EXPECT_FALSE(computesFlops(flare::v1::OP_KIND_COLLECTIVE));
  EXPECT_FALSE(computesFlops(flare::v1::OP_KIND_MEMCPY));
}

TEST(OpKind, CollectivesIncludePointToPoint) {
  EXPECT_TRUE(isCollective(flare::v1::OP_KIND_COLLECTIVE));
  EXPECT_TRUE(isCollective(flare::v1::OP_KIND_P2P));
  EXPECT_FALSE(isCollective(flare::v1::OP_KIND_GEMM));
  EXPECT_FALSE(isCollective(flare::v1::OP_KIND_SYNC));
}

TEST(OpKind, BusBandwidthFactorIsNcclTests) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_REDUCE, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_GATHER, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_REDUCE_SCATTER, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_REDUCE_SCATTER, 8), 0.875);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_REDUCE, 4), 1.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_TO_ALL, 2), 0.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_BROADCAST, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_SEND, 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_GROUP, 4), 1.0);
  // One rank: nothing crosses a link. Unknown count: busbw = algbw.
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_REDUCE, 1), 0.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_BROADCAST, 1), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(flare::v1::COLLECTIVE_KIND_ALL_REDUCE, 0), 1.0);
}

}  // namespace
}  // namespace flare::records
