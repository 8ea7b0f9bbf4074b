// Packed raw records (raw_chunks.h): every field round-trips, chunks keep their bounds, damaged
// blobs yield nothing, and the chunked selection answers what the row-per-record query did.
#include "src/engine/raw_chunks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

namespace flare::engine {
namespace {

bool sameRecord(const RawRecord& a, const RawRecord& b) {
  return a.rank == b.rank && a.sig_id == b.sig_id && a.stream == b.stream &&
         a.issue_ns == b.issue_ns && a.start_ns == b.start_ns && a.end_ns == b.end_ns &&
         a.flops == b.flops && a.bytes == b.bytes && a.coll_seq == b.coll_seq;
}

std::vector<RawRecord> unpackAll(const std::vector<RawChunk>& chunks) {
  std::vector<RawRecord> out;
  for (const RawChunk& c : chunks) EXPECT_TRUE(unpackRawChunk(c.rank, c.blob, &out));
  return out;
}

std::vector<RawRecord> randomRecords(std::mt19937_64& rng, size_t n, int64_t t0, int64_t span) {
  std::uniform_int_distribution<int64_t> at(0, span);
  const uint64_t streams[] = {0, 7, 0x7f3a5c001230ULL, std::numeric_limits<uint64_t>::max()};
  std::vector<RawRecord> out;
  for (size_t i = 0; i < n; ++i) {
    RawRecord r;
    r.rank = static_cast<int32_t>(rng() % 3);
    r.sig_id = static_cast<uint32_t>(1 + rng() % 300);
    r.stream = streams[rng() % 4];
    r.start_ns = t0 + at(rng);
    r.issue_ns = r.start_ns - static_cast<int64_t>(rng() % 2000000) + 1000;  // either side
    r.end_ns = r.start_ns + static_cast<int64_t>(rng() % 50000000);
    r.flops = rng() % 4 == 0 ? rng() : 0;
    r.bytes = rng() % 2 == 0 ? rng() % (1ULL << 30) : 0;
    r.coll_seq = rng() % 3 == 0 ? 0 : 1 + rng() % 100000;
    out.push_back(r);
  }
  return out;
}

TEST(RawChunks, EveryFieldRoundTripsIncludingExtremes) {
  std::mt19937_64 rng(7);
  std::vector<RawRecord> recs =
      randomRecords(rng, 20000, 1'790'000'000'000'000'000LL, 60'000'000'000LL);
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  recs.push_back(
      {1, std::numeric_limits<uint32_t>::max(), 1, kMax, kMin, kMax, ~0ULL, ~0ULL, ~0ULL});
  recs.push_back({1, 0, 1, kMin, kMax, kMin, 0, 0, 1});
  recs.push_back({-5, 2, 3, -10, -20, -30, 1, 1, 0});
  const std::vector<RawChunk> chunks = packRawRecords(recs);
  std::vector<RawRecord> back = unpackAll(chunks);
  ASSERT_EQ(back.size(), recs.size());
  // The packing orders by rank, then start (stable): the same order sorts the input.
  std::stable_sort(recs.begin(), recs.end(), [](const RawRecord& a, const RawRecord& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.start_ns < b.start_ns;
  });
  for (size_t i = 0; i < recs.size(); ++i) {
    ASSERT_TRUE(sameRecord(back[i], recs[i])) << "record " << i;
  }
}

TEST(RawChunks, ChunksHoldOneRankWithinTheSpanAndTheSizeCap) {
  std::vector<RawRecord> recs;
  for (int64_t i = 0; i < 25000; ++i) {  // 25 s at 1 ms, two ranks interleaved
    recs.push_back({static_cast<int32_t>(i % 2), 1, 7, i * 1000000, i * 1000000, i * 1000000 + 500,
                    0, 0, static_cast<uint64_t>(i)});
  }
  const std::vector<RawChunk> chunks = packRawRecords(recs);
  size_t total = 0;
  for (const RawChunk& c : chunks) {
    EXPECT_LE(c.count, kRawChunkMaxRecords);
    EXPECT_LE(c.last_start_ns - c.first_start_ns, kRawChunkSpanNs);
    std::vector<RawRecord> got;
    ASSERT_TRUE(unpackRawChunk(c.rank, c.blob, &got));
    ASSERT_EQ(got.size(), c.count);
    EXPECT_EQ(got.front().start_ns, c.first_start_ns);
    EXPECT_EQ(got.back().start_ns, c.last_start_ns);
    for (const RawRecord& r : got) EXPECT_EQ(r.rank, c.rank);
    total += c.count;
  }
  EXPECT_EQ(total, recs.size());
  // 12,500 records per rank over 25 s: cut by the span (10 s), then by count (4,096).
  EXPECT_EQ(chunks.size(), 2u * 4);
}

TEST(RawChunks, ACollectiveRecordCostsAFewBytes) {
  // A summary-mode rank's raw collectives: ~1 ms apart, alternating two streams, sequential
  // collective numbers, durations of tens of microseconds.
  std::vector<RawRecord> recs;
  for (int64_t i = 0; i < 4000; ++i) {
    const int64_t t = 1'790'000'000'000'000'000LL + i * 1'013'000;
    recs.push_back({4, static_cast<uint32_t>(10 + i % 5),
                    i % 2 ? 0x7f3a5c001230ULL : 0x7f3a5c009990ULL, t - 40'000, t,
                    t + 35'000 + (i % 7) * 1000, 0, 50'331'648, static_cast<uint64_t>(i / 2 + 1)});
  }
  size_t bytes = 0;
  for (const RawChunk& c : packRawRecords(recs)) bytes += c.blob.size();
  EXPECT_LT(static_cast<double>(bytes) / recs.size(), 16.0);
}

TEST(RawChunks, DamagedBlobsYieldNothing) {
  std::mt19937_64 rng(11);
  const std::vector<RawChunk> chunks = packRawRecords(randomRecords(rng, 300, 0, 1'000'000'000));
  ASSERT_FALSE(chunks.empty());
  const std::string& good = chunks[0].blob;
  std::vector<RawRecord> out{RawRecord{}};
  for (size_t len = 0; len < good.size(); ++len) {  // every truncation
    EXPECT_FALSE(unpackRawChunk(0, good.substr(0, len), &out)) << len;
    EXPECT_EQ(out.size(), 1u);
  }
  EXPECT_FALSE(unpackRawChunk(0, good + std::string(1, '\0'), &out));  // trailing bytes
  std::string other_format = good;
  other_format[0] = 2;
  EXPECT_FALSE(unpackRawChunk(0, other_format, &out));
  // A count far beyond the blob's length is refused before anything is reserved.
  EXPECT_FALSE(unpackRawChunk(0, std::string("\x01\xff\xff\xff\xff\x0f\x00", 7), &out));
  for (int i = 0; i < 2000; ++i) {  // random bytes behind a valid format byte
    std::string junk(1 + rng() % 64, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    junk[0] = 1;
    std::vector<RawRecord> any;
    if (!unpackRawChunk(0, junk, &any)) {
      EXPECT_TRUE(any.empty());
    }
  }
  EXPECT_EQ(out.size(), 1u);
}

// The selection the stores run (first start in order, `wants` to stop early) against filtering,
// sorting and cutting every record: what `ORDER BY start_ns LIMIT n` gave with a row per record.
TEST(RawChunks, SelectionEqualsFilterSortAndLimit) {
  std::mt19937_64 rng(3);
  std::vector<RawChunk> chunks;
  for (int batch = 0; batch < 12; ++batch) {  // overlapping batches, as checkpoints write them
    auto part = packRawRecords(randomRecords(rng, 3000, batch * 2'000'000'000LL, 25'000'000'000LL));
    for (RawChunk& c : part) chunks.push_back(std::move(c));
  }
  std::stable_sort(chunks.begin(), chunks.end(), [](const RawChunk& a, const RawChunk& b) {
    return a.first_start_ns < b.first_start_ns;
  });
  std::vector<RawRecord> fed;  // every record in feeding order
  for (const RawChunk& c : chunks) ASSERT_TRUE(unpackRawChunk(c.rank, c.blob, &fed));
  for (const auto& [since, until] :
       std::vector<std::pair<int64_t, int64_t>>{{0, std::numeric_limits<int64_t>::max()},
                                                {5'000'000'000LL, 9'000'000'000LL},
                                                {30'000'000'000LL, 31'000'000'000LL},
                                                {std::numeric_limits<int64_t>::min(), 1}}) {
    for (size_t limit : {size_t{0}, size_t{1}, size_t{100}, size_t{5000}, size_t{100000}}) {
      std::vector<RawRecord> want;
      for (const RawRecord& r : fed)
        if (r.start_ns >= since && r.start_ns < until) want.push_back(r);
      std::stable_sort(want.begin(), want.end(), [](const RawRecord& a, const RawRecord& b) {
        return a.start_ns < b.start_ns;
      });
      if (want.size() > limit) want.resize(limit);
      RawSelection sel(since, until, limit);
      const int64_t lower = rawChunkLowerBound(since);
      for (const RawChunk& c : chunks) {
        // The stores' WHERE clause, then the early stop.
        if (c.first_start_ns < lower || c.first_start_ns >= until || c.last_start_ns < since)
          continue;
        if (!sel.wants(c.first_start_ns)) break;
        ASSERT_TRUE(sel.add(c.rank, c.blob));
      }
      const std::vector<RawRecord> got = sel.take();
      ASSERT_EQ(got.size(), want.size()) << since << " " << limit;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(sameRecord(got[i], want[i])) << since << " " << limit << " " << i;
      }
    }
  }
}

TEST(RawChunks, FoldMakesOneRowPerRankSignatureStreamAndMinute) {
  const int64_t min = 60'000'000'000LL;
  RawFold fold(min);
  fold.add("a", {0, 1, 7, 0, 10 * min + 1, 10 * min + 11, 0, 0, 0});
  fold.add("a", {0, 1, 7, 0, 10 * min + 2, 10 * min + 32, 0, 0, 0});
  fold.add("a", {0, 1, 8, 0, 10 * min + 3, 10 * min + 8, 0, 0, 0});  // another stream
  fold.add("a", {0, 1, 7, 0, 11 * min, 11 * min + 4, 0, 0, 0});      // the next minute
  fold.add("b", {0, 1, 7, 0, 10 * min + 5, 10 * min + 6, 0, 0, 0});  // another job
  EXPECT_EQ(fold.records(), 5u);
  const auto rows = fold.rows();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].job_id, "a");
  EXPECT_EQ(rows[0].window_start_ns, 10 * min);
  EXPECT_EQ(rows[0].window_end_ns, 11 * min);
  EXPECT_EQ(rows[0].count, 2u);
  EXPECT_EQ(rows[0].sum_ns, 40);
  EXPECT_EQ(rows[0].p50_ns, 20);
  EXPECT_EQ(rows[0].p99_ns, 30);
  EXPECT_EQ(rows[0].source, "raw");
  EXPECT_EQ(rows[3].job_id, "b");
}

}  // namespace
}  // namespace flare::engine
