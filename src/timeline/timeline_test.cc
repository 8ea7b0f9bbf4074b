#include "src/timeline/timeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace flare::timeline {
namespace {

using ::testing::HasSubstr;
using Ends = std::map<int, std::map<std::pair<uint64_t, uint64_t>, int64_t>>;

TEST(AlignClocks, RecoversOffsetsThroughSharedCommunicators) {
  // Rank 1 runs 5 ms ahead of rank 0 and shares communicator A with it; rank 2 runs 2 ms behind
  // rank 1 and shares only communicator B with rank 1. Completion jitter: up to ±3 us.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> jitter(-3'000, 3'000);
  Ends ends;
  for (uint64_t seq = 1; seq <= 50; ++seq) {
    const int64_t t = 1'000'000'000 + static_cast<int64_t>(seq) * 1'000'000;
    ends[0][{0xA, seq}] = t + jitter(rng);
    ends[1][{0xA, seq}] = t + 5'000'000 + jitter(rng);
    ends[1][{0xB, seq}] = t + 500'000 + 5'000'000 + jitter(rng);
    ends[2][{0xB, seq}] = t + 500'000 + 3'000'000 + jitter(rng);
  }
  ends[3] = {};  // shares nothing: left as it is
  const auto offsets = alignClocks(ends);
  ASSERT_EQ(offsets.size(), 4u);
  EXPECT_EQ(offsets.at(0), 0);
  EXPECT_NEAR(offsets.at(1), 5'000'000, 4'000);
  EXPECT_NEAR(offsets.at(2), 3'000'000, 8'000);
  EXPECT_EQ(offsets.at(3), 0);
}

flare::v1::RecordBatch batchWithSteps(int n_steps) {
  flare::v1::RecordBatch b;
  auto* api = b.add_api_names();
  api->set_id(1);
  api->set_qualified_name("torch.utils.data.dataloader._BaseDataLoaderIter@__next__");
  auto* other = b.add_api_names();
  other->set_id(2);
  other->set_qualified_name("torch.cuda@synchronize");
  for (int i = n_steps - 1; i >= 0; --i) {  // out of order on purpose
    auto* s = b.add_spans();
    s->set_api_id(1);
    s->set_start_ns(1000 * i);
    s->set_end_ns(1000 * i + 10);
    auto* sync = b.add_spans();
    sync->set_api_id(2);
    sync->set_start_ns(1000 * i + 500);
    sync->set_end_ns(1000 * i + 600);
  }
  return b;
}

TEST(StepStarts, FromDataLoaderSpansOnly) {
  const auto starts = stepStarts({batchWithSteps(3)});
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 1000, 2000}));
}

RankSource source(int rank, std::vector<flare::v1::RecordBatch> batches) {
  RankSource src;
  src.rank = rank;
  src.for_each_batch = [batches](const std::function<void(const flare::v1::RecordBatch&)>& fn,
                                 std::string*) {
    for (const auto& b : batches) fn(b);
    return true;
  };
  return src;
}

std::string writeToString(const std::vector<RankSource>& sources, const Options& options, bool* ok,
                          std::string* error, Summary* summary) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  *ok = writeCombined(sources, options, f, summary, error);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

TEST(WriteCombined, StepRangeWithoutStepsIsAClearError) {
  flare::v1::RecordBatch b;
  auto* k = b.add_kernels();
  k->set_signature_id(1);
  auto* sig = b.add_signatures();
  sig->set_id(1);
  sig->set_name("k");
  Options options;
  options.steps = std::make_pair(uint64_t{2}, uint64_t{3});
  bool ok = true;
  std::string error;
  Summary summary;
  writeToString({source(0, {b})}, options, &ok, &error, &summary);
  EXPECT_FALSE(ok);
  EXPECT_THAT(error, HasSubstr("no rank recorded step 2"));
}

TEST(WriteCombined, KeepsOnlyTheSelectedStepsAndNamesEveryTrack) {
  flare::v1::RecordBatch b = batchWithSteps(4);
  auto* sig = b.add_signatures();
  sig->set_id(1);
  sig->set_name("gemm");
  sig->set_kind(flare::v1::OP_KIND_GEMM);
  for (int i = 0; i < 4; ++i) {  // one GEMM issued in each step
    auto* k = b.add_kernels();
    k->set_signature_id(1);
    k->set_stream_id(0x7f00);
    k->set_thread_id(11);
    k->set_issue_ns(1000 * i + 100);
    k->set_start_ns(1000 * i + 150);
    k->set_end_ns(1000 * i + 350);
    k->set_flops(2'000'000);
  }
  Options options;
  options.steps = std::make_pair(uint64_t{1}, uint64_t{2});
  bool ok = false;
  std::string error;
  Summary summary;
  const std::string json = writeToString({source(0, {b})}, options, &ok, &error, &summary);
  ASSERT_TRUE(ok) << error;
  EXPECT_EQ(summary.gpu_events, 2u);  // steps 1 and 2 only
  EXPECT_EQ(summary.launch_flows, 2u);
  EXPECT_EQ(summary.cpu_events, 2u + 4u);             // 2 launches + 2×(__next__, synchronize)
  EXPECT_THAT(json, HasSubstr("\"TFLOPS\":10.000"));  // 2 MFLOP in 200 ns
  EXPECT_THAT(json, HasSubstr("\"name\":\"rank 0 GPU 0\""));
  EXPECT_THAT(json, HasSubstr("stream 1 (0x7f00)"));
  EXPECT_THAT(json, HasSubstr("\"name\":\"thread 11\""));
  EXPECT_THAT(json, HasSubstr("\"baseTimeNanoseconds\":0"));
}

}  // namespace
}  // namespace flare::timeline
