#include "src/stats/sketch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace flare::stats {
namespace {

// Issue latencies: mostly log-normal (µs to ms), some exact zeros and small negatives (clock
// error), a few large stalls.
std::vector<double> latencies(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> body(std::log(2e4), 1.2);
  std::uniform_real_distribution<double> neg(-3000, -2);
  std::vector<double> x;
  for (size_t i = 0; i < n; ++i) {
    if (i % 50 == 0)
      x.push_back(neg(rng));
    else if (i % 97 == 0)
      x.push_back(0);
    else if (i % 501 == 0)
      x.push_back(2e9);
    else
      x.push_back(body(rng));
  }
  return x;
}

// numpy.quantile(x, q, method="lower").
double lowerQuantile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  return x[static_cast<size_t>(std::floor(q * static_cast<double>(x.size() - 1)))];
}

TEST(Sketch, QuantilesWithinTheRelativeErrorBound) {
  const auto x = latencies(1, 20000);
  LatencySketch s;
  for (double v : x) s.add(v);
  EXPECT_EQ(s.count(), x.size());
  EXPECT_EQ(s.min(), *std::min_element(x.begin(), x.end()));
  EXPECT_EQ(s.max(), *std::max_element(x.begin(), x.end()));
  double sum = 0;
  for (double v : x) sum += v;
  EXPECT_NEAR(s.sum(), sum, 1e-9 * std::fabs(sum));
  for (double q : {0.0, 0.001, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0}) {
    const double truth = lowerQuantile(x, q);
    const double got = s.quantile(q);
    const double tol = std::fabs(truth) <= s.zeroThreshold()
                           ? s.zeroThreshold()
                           : s.relativeAccuracy() * std::fabs(truth) * (1 + 1e-12);
    EXPECT_NEAR(got, truth, tol) << "q=" << q;
  }
  EXPECT_TRUE(std::isnan(LatencySketch().quantile(0.5)));
}

TEST(Sketch, MergeEqualsTheSketchOfTheUnion) {
  const auto x = latencies(2, 5000), y = latencies(3, 3000);
  LatencySketch a, b, all;
  for (double v : x) a.add(v), all.add(v);
  for (double v : y) b.add(v), all.add(v);
  ASSERT_TRUE(a.merge(b));
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.zeroCount(), all.zeroCount());
  for (double q = 0; q <= 1.0; q += 0.01) EXPECT_EQ(a.quantile(q), all.quantile(q)) << q;
  std::string error;
  LatencySketch coarse(0.05);
  EXPECT_FALSE(a.merge(coarse, &error));
  EXPECT_NE(error.find("different accuracy"), std::string::npos);
  EXPECT_EQ(a.count(), all.count());
}

TEST(Sketch, ScaledCountsEqualTheSketchOfThatManyCopies) {
  const auto x = latencies(4, 2000);
  LatencySketch once, thrice;
  for (double v : x) once.add(v), thrice.add(v, 3);
  thrice.add(0.0, 3);
  once.add(0.0);
  once.scaleCounts(3);
  EXPECT_EQ(once.count(), thrice.count());
  EXPECT_EQ(once.zeroCount(), thrice.zeroCount());
  EXPECT_DOUBLE_EQ(once.sum(), thrice.sum());
  for (double q = 0; q <= 1.0; q += 0.01) EXPECT_EQ(once.quantile(q), thrice.quantile(q)) << q;
  // Merged with an unscaled one: the copies weigh three times in the pool.
  LatencySketch other;
  for (int i = 0; i < 6000; ++i) other.add(1e6);
  ASSERT_TRUE(once.merge(other));
  EXPECT_EQ(once.count(), 3 * x.size() + 3 + 6000);
  once.scaleCounts(0);  // no-op
  once.scaleCounts(1);
  EXPECT_EQ(once.count(), 3 * x.size() + 3 + 6000);
}

TEST(Sketch, SerializationRoundTrip) {
  LatencySketch s(0.02, 5.0);
  for (double v : latencies(4, 3000)) s.add(v);
  s.add(NAN);
  const auto bytes = s.serialize();
  EXPECT_EQ(bytes[0], LatencySketch::kSerialVersion);
  std::string error;
  const auto back = LatencySketch::deserialize(bytes, &error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->serialize(), bytes);
  EXPECT_EQ(back->count(), s.count());
  EXPECT_EQ(back->dropped(), 1u);
  EXPECT_EQ(back->relativeAccuracy(), 0.02);
  for (double q : {0.0, 0.3, 0.5, 0.99, 1.0}) EXPECT_EQ(back->quantile(q), s.quantile(q));
  const auto empty = LatencySketch::deserialize(LatencySketch().serialize(), &error);
  ASSERT_TRUE(empty) << error;
  EXPECT_EQ(empty->count(), 0u);
}

TEST(Sketch, HostileInputIsRejected) {
  LatencySketch s;
  for (double v : latencies(5, 500)) s.add(v);
  const auto good = s.serialize();
  std::string error;
  // Every truncation fails, with a reason.
  for (size_t n = 0; n < good.size(); ++n) {
    error.clear();
    EXPECT_FALSE(LatencySketch::deserialize(std::span(good.data(), n), &error)) << n;
    EXPECT_FALSE(error.empty());
  }
  auto bad = good;
  bad[0] = 2;
  EXPECT_FALSE(LatencySketch::deserialize(bad, &error));
  EXPECT_NE(error.find("version"), std::string::npos);
  bad = good;
  bad.push_back(0);
  EXPECT_FALSE(LatencySketch::deserialize(bad, &error));
  EXPECT_NE(error.find("trailing"), std::string::npos);
  bad = good;
  bad[1] = 0x80;  // unknown flag
  EXPECT_FALSE(LatencySketch::deserialize(bad, &error));
  // count (first varint after the fixed header: 1+1+8+8+4 = 22 bytes) off by one.
  bad = good;
  ++bad[22];
  EXPECT_FALSE(LatencySketch::deserialize(bad, &error));
  // A hand-made sketch whose bucket index overflows the double range, and one claiming more
  // buckets than allowed.
  LatencySketch tiny;
  tiny.add(10);
  auto t = tiny.serialize();
  // Layout after the header: sum, min, max (24 bytes), then the positive store's offset at
  // 22+3+24 = 49: zigzag(⌈ln 10 / ln γ⌉ = 116) = 232, a two-byte varint. Replace it with
  // zigzag(2^22) (γ^(2^22) = inf).
  ASSERT_TRUE((t[49] & 0x80) && !(t[50] & 0x80));
  t.erase(t.begin() + 49, t.begin() + 51);
  t.insert(t.begin() + 49, {0x80, 0x80, 0x80, 0x04});
  EXPECT_FALSE(LatencySketch::deserialize(t, &error));
  EXPECT_NE(error.find("out of range"), std::string::npos) << error;
  // Random garbage never crashes.
  std::mt19937 rng(6);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> junk(rng() % 80);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (!junk.empty()) junk[0] = 1;
    (void)LatencySketch::deserialize(junk, &error);
  }
}

// flared checks every step sketch of a batch before the detectors decode it: the check without
// building (validCount) accepts exactly what deserialize accepts, with the same count, over
// truncations and single-byte corruptions of real sketches.
TEST(Sketch, ValidCountAcceptsExactlyWhatDeserializeDoes) {
  std::vector<std::vector<uint8_t>> inputs;
  for (int n : {0, 1, 7, 500}) {
    LatencySketch s;
    for (double v : latencies(static_cast<uint64_t>(n + 1), static_cast<size_t>(n))) s.add(v);
    inputs.push_back(s.serialize());
  }
  std::mt19937 rng(9);
  size_t accepted = 0, refused = 0;
  for (const auto& good : inputs) {
    std::vector<std::vector<uint8_t>> variants{good};
    for (size_t n = 0; n < good.size(); ++n) variants.emplace_back(good.begin(), good.begin() + n);
    for (int i = 0; i < 400; ++i) {
      auto bad = good;
      bad[rng() % bad.size()] = static_cast<uint8_t>(rng());
      variants.push_back(std::move(bad));
    }
    for (const auto& v : variants) {
      std::string e1, e2;
      const auto full = LatencySketch::deserialize(v, &e1);
      const auto count = LatencySketch::validCount(v, &e2);
      ASSERT_EQ(full.has_value(), count.has_value());
      EXPECT_EQ(e1, e2);
      if (full) {
        EXPECT_EQ(full->count(), *count);
        ++accepted;
      } else {
        ++refused;
      }
    }
  }
  EXPECT_GT(accepted, 4u);  // both outcomes were exercised
  EXPECT_GT(refused, 100u);
}

TEST(Sketch, CollapsesTheLowestBucketsPastTheLimit) {
  LatencySketch s(0.01, 1.0, 16);
  for (int e = 1; e <= 6; ++e) s.add(std::pow(10.0, e));
  EXPECT_TRUE(s.collapsed());
  EXPECT_EQ(s.count(), 6u);
  EXPECT_NEAR(s.quantile(1.0), 1e6, 1e4);  // the top keeps its accuracy
  EXPECT_LE(s.bucketCount(), 16u + 1);
  const auto back = LatencySketch::deserialize(s.serialize());
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->collapsed());
}

TEST(Sketch, ParametersAreClamped) {
  LatencySketch s(7.0, -1, 1);
  EXPECT_EQ(s.relativeAccuracy(), LatencySketch::kMaxRelativeAccuracy);
  EXPECT_EQ(s.zeroThreshold(), LatencySketch::kDefaultZeroThreshold);
  s.add(INFINITY);
  EXPECT_EQ(s.count(), 0u);
  EXPECT_EQ(s.dropped(), 1u);
}

}  // namespace
}  // namespace flare::stats
