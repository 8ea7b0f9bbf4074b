// LogHistogram: a fixed-size histogram of durations with log-spaced buckets (4 per power of
// two, so a quantile is off by at most ~19%), for the p50/p99 of the per-job kernel report. A
// stopgap until src/stats provides KDE clusters; cheap enough to update per record.
//
// Value type, not thread-safe (its owner's lock guards it). Serializes to a fixed-layout blob
// for the store.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace flare::engine {

class LogHistogram {
 public:
  static constexpr int kSubBuckets = 4;
  static constexpr int kBuckets = 64 * kSubBuckets;

  static int bucketOf(int64_t ns) {
    if (ns <= 1) return 0;
    const auto v = static_cast<uint64_t>(ns);
    const int log2 = 63 - std::countl_zero(v);
    // The two bits below the leading one pick the sub-bucket.
    const int sub = log2 >= 2 ? static_cast<int>((v >> (log2 - 2)) & 3) : 0;
    return log2 * kSubBuckets + sub;
  }
  // The smallest value of a bucket.
  static double lowerBound(int b) {
    const int log2 = b / kSubBuckets;
    const int sub = b % kSubBuckets;
    return std::ldexp(1.0 + sub / 4.0, log2);
  }

  void add(int64_t ns, uint64_t n = 1) {
    counts_[bucketOf(ns)] += n;
    total_ += n;
  }
  uint64_t total() const { return total_; }

  // The q-quantile (0..1) as the middle of the bucket it falls in; 0 when empty.
  int64_t quantile(double q) const {
    if (total_ == 0) return 0;
    const auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total_)));
    uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += counts_[b];
      if (seen >= rank && counts_[b] > 0) {
        return static_cast<int64_t>((lowerBound(b) + lowerBound(b + 1)) / 2);
      }
    }
    return static_cast<int64_t>(lowerBound(kBuckets - 1));
  }

  std::string serialize() const {
    std::string out(sizeof(counts_), '\0');
    std::memcpy(out.data(), counts_.data(), sizeof(counts_));
    return out;
  }
  // False (and unchanged) when the blob has the wrong size.
  bool deserialize(const std::string& blob) {
    if (blob.size() != sizeof(counts_)) return false;
    std::memcpy(counts_.data(), blob.data(), sizeof(counts_));
    total_ = 0;
    for (uint64_t c : counts_) total_ += c;
    return true;
  }

 private:
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t total_ = 0;
};

}  // namespace flare::engine
