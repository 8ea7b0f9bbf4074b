// The compact collective encoding of MODE_SUMMARY: what a block stands for is exactly the records
// put in (through a real encode/decode of the batch), hostile blocks are refused.
#include "src/records/collective_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace flare::records {
namespace {

flare::v1::KernelRecord collective(uint32_t sig, uint64_t stream, uint64_t comm, uint64_t seq,
                                   int64_t issue, int64_t latency, int64_t duration) {
  flare::v1::KernelRecord r;
  r.set_signature_id(sig);
  r.set_stream_id(stream);
  r.set_device(3);
  r.set_issue_ns(issue);
  r.set_start_ns(issue + latency);
  r.set_end_ns(issue + latency + duration);
  r.set_issue_latency_ns(latency);
  r.set_bytes(1 << 24);
  auto* c = r.mutable_collective();
  c->set_comm_hash(comm);
  c->set_seq(seq);
  c->set_nranks(8);
  c->set_rank_in_comm(5);
  c->set_count(1 << 22);
  return r;
}

auto key(const flare::v1::KernelRecord& r) {
  return std::make_tuple(r.collective().comm_hash(), r.stream_id(), r.collective().seq(),
                         r.issue_ns());
}

TEST(CollectiveBlocksTest, ExpandingGivesBackExactlyTheRecordsPutIn) {
  std::mt19937_64 rng(7);
  std::vector<flare::v1::KernelRecord> in;
  int64_t t = 1'700'000'000'000'000'000;
  uint64_t seq[3] = {100, 0, 5};
  for (int i = 0; i < 300; ++i) {
    const int c = static_cast<int>(rng() % 3);
    t += static_cast<int64_t>(rng() % 2'000'000);
    // Latencies may be negative (clock-map error) and durations large.
    const int64_t latency = static_cast<int64_t>(rng() % 400'000) - 1'000;
    const int64_t duration = static_cast<int64_t>(rng() % 90'000'000);
    in.push_back(
        collective(c == 2 ? 9 : 4, c == 1 ? 0x20 : 0x10, 1000 + c, seq[c]++, t, latency, duration));
    if (c == 2) in.back().mutable_collective()->set_peer(6);  // a p2p kind: peer kept
  }
  // Out-of-order completion across streams: a record that completes before an earlier one.
  std::swap(in[10], in[11]);

  flare::v1::RecordBatch batch;
  CollectiveBlockWriter w;
  size_t estimate = 0;
  for (const auto& r : in) estimate += w.add(r, &batch);
  EXPECT_EQ(batch.kernels_size(), 0);
  EXPECT_EQ(batch.collective_blocks_size(), 3);
  EXPECT_EQ(recordCount(batch), in.size());

  size_t plain = 0;
  for (const auto& r : in) plain += r.ByteSizeLong() + 2;
  const size_t compact = batch.ByteSizeLong();
  EXPECT_LT(compact * 4, plain) << "compact " << compact << " B, as records " << plain << " B";
  EXPECT_NEAR(static_cast<double>(estimate), static_cast<double>(compact), 0.1 * compact);

  flare::v1::RecordBatch got;
  ASSERT_TRUE(got.ParseFromString(batch.SerializeAsString()));
  std::string error;
  ASSERT_EQ(expandCollectiveBlocks(&got, 1000, &error), Expand::kOk) << error;
  EXPECT_EQ(got.collective_blocks_size(), 0);
  ASSERT_EQ(got.kernels_size(), static_cast<int>(in.size()));
  std::vector<flare::v1::KernelRecord> out(got.kernels().begin(), got.kernels().end());
  auto by_key = [](const auto& a, const auto& b) { return key(a) < key(b); };
  std::sort(in.begin(), in.end(), by_key);
  std::sort(out.begin(), out.end(), by_key);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].SerializeAsString(), in[i].SerializeAsString())
        << "record " << i << ":\n"
        << out[i].DebugString() << "vs\n"
        << in[i].DebugString();
  }
}

TEST(CollectiveBlocksTest, BlocksAreKeyedByEverythingConstant) {
  flare::v1::RecordBatch batch;
  CollectiveBlockWriter w;
  auto a = collective(4, 0x10, 1, 0, 1'000'000, 10, 100);
  auto b = a;
  b.set_bytes(1 << 10);  // same signature and communicator, other size: its own block
  w.add(a, &batch);
  w.add(b, &batch);
  EXPECT_EQ(batch.collective_blocks_size(), 2);
  w.reset();  // a new batch starts new blocks
  flare::v1::RecordBatch next;
  w.add(a, &next);
  EXPECT_EQ(next.collective_blocks_size(), 1);
  EXPECT_EQ(next.collective_blocks(0).base_issue_ns(), 1'000'000);
}

TEST(CollectiveBlocksTest, HostileBlocksAreRefusedAndLeaveTheBatchAlone) {
  flare::v1::RecordBatch batch;
  CollectiveBlockWriter w;
  for (int i = 0; i < 5; ++i) w.add(collective(4, 0x10, 1, i, 1'000'000 + i, 10, 100), &batch);
  const std::string before = batch.SerializeAsString();
  std::string error;
  EXPECT_EQ(expandCollectiveBlocks(&batch, 4, &error), Expand::kTooMany);
  EXPECT_NE(error.find("more than 4"), std::string::npos) << error;
  EXPECT_EQ(batch.SerializeAsString(), before);

  batch.mutable_collective_blocks(0)->add_duration_ns(1);  // one column longer
  EXPECT_EQ(expandCollectiveBlocks(&batch, 100, &error), Expand::kMalformed);
  EXPECT_NE(error.find("different lengths"), std::string::npos) << error;
  EXPECT_EQ(batch.kernels_size(), 0);

  // Absurd deltas wrap instead of overflowing; the times are then the validator's to reject.
  flare::v1::RecordBatch wild;
  auto* blk = wild.add_collective_blocks();
  blk->set_base_issue_ns(INT64_MAX);
  blk->add_seq_delta(INT64_MIN);
  blk->add_issue_delta_ns(INT64_MAX);
  blk->add_issue_latency_ns(INT64_MAX);
  blk->add_duration_ns(INT64_MIN);
  EXPECT_EQ(expandCollectiveBlocks(&wild, 100, &error), Expand::kOk);
  EXPECT_EQ(wild.kernels_size(), 1);
}

}  // namespace
}  // namespace flare::records
