// LatencySketch: a mergeable, serializable sketch of an issue-latency distribution (ns) with a
// bounded relative error — DDSketch's log-bucketed histogram (Masson et al., VLDB 2019), with
// a zero bucket and a mirrored store for negative values (clock-map error makes a few
// latencies slightly negative).
//
//   value v            bucket
//   v >  zt            positive store, index i = ⌈log_γ v⌉, covering (γ^(i−1), γ^i]
//   |v| ≤ zt           the zero bucket
//   v < −zt            negative store, index ⌈log_γ |v|⌉
//   γ = (1+α)/(1−α), α the relative accuracy (default 1%), zt the zero threshold (default 1 ns)
//
// quantile(q) returns, for the element of rank ⌊q·(n−1)⌋ (numpy.quantile(..., method="lower")),
// a value within relative error α of it (absolute error ≤ zt in the zero bucket), clamped to the
// exact min and max. Count, sum, min and max are exact. Each store keeps at most maxBuckets
// contiguous buckets (memory ≤ 2·maxBuckets·8 bytes); past that the buckets nearest zero are
// collapsed into one (their values lose the accuracy guarantee; collapsed() says so). With the
// defaults 1 ns .. 1e11 ns fits in 1267 buckets, far below 2048.
//
// Serialized form (version 1, little-endian): see sketch.cc. deserialize() validates every field
// of untrusted input and returns an error rather than a sketch it cannot vouch for.
//
// Threading: a plain value type; not synchronized. Copy freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace flare::stats {

class LatencySketch {
 public:
  static constexpr double kDefaultRelativeAccuracy = 0.01;
  static constexpr double kDefaultZeroThreshold = 1.0;
  static constexpr uint32_t kDefaultMaxBuckets = 2048;
  static constexpr double kMinRelativeAccuracy = 1e-4;
  static constexpr double kMaxRelativeAccuracy = 0.5;
  static constexpr uint32_t kMinMaxBuckets = 16;
  static constexpr uint32_t kMaxMaxBuckets = 1u << 16;
  static constexpr uint8_t kSerialVersion = 1;

  // Out-of-range parameters are clamped to [kMin.., kMax..]; a non-finite or negative zero
  // threshold becomes the default.
  explicit LatencySketch(double relativeAccuracy = kDefaultRelativeAccuracy,
                         double zeroThreshold = kDefaultZeroThreshold,
                         uint32_t maxBuckets = kDefaultMaxBuckets);

  // Adds `count` occurrences of v. Non-finite values are not added; dropped() counts them.
  void add(double v, uint64_t count = 1);

  // Adds other's contents. Both must have the same relative accuracy and zero threshold;
  // otherwise nothing changes, false is returned and *error says why.
  bool merge(const LatencySketch& other, std::string* error = nullptr);

  // The sketch of `factor` copies of every value it holds: each count (and the sum) multiplied
  // by `factor` (0 leaves it unchanged); min, max and the buckets stay. A step measured by step
  // sampling stands for the steps sampled out before it (signals::issueLatencies, weighted).
  void scaleCounts(uint64_t factor);

  uint64_t count() const { return count_; }
  uint64_t dropped() const { return dropped_; }
  uint64_t zeroCount() const { return zeroCount_; }
  double sum() const { return sum_; }
  double min() const { return min_; }  // +inf when empty
  double max() const { return max_; }  // -inf when empty
  bool collapsed() const { return collapsed_; }
  double relativeAccuracy() const { return alpha_; }
  double zeroThreshold() const { return zeroThreshold_; }
  double gamma() const { return gamma_; }
  size_t bucketCount() const { return pos_.counts.size() + neg_.counts.size() + 1; }

  // See the header comment. NaN when empty.
  double quantile(double q) const;

  // Calls fn(lo, hi, count) for every non-empty bucket in ascending value order, with [lo, hi]
  // the bucket's value range clipped to [min, max] (the zero bucket: [−zt, zt] clipped).
  void forEachBucket(const std::function<void(double lo, double hi, uint64_t count)>& fn) const;

  // Bytes the sketch holds outside the object (its bucket arrays' capacity): for memory accounting.
  size_t heapBytes() const {
    return (pos_.counts.capacity() + neg_.counts.capacity()) * sizeof(uint64_t);
  }

  std::vector<uint8_t> serialize() const;
  static std::optional<LatencySketch> deserialize(std::span<const uint8_t> bytes,
                                                  std::string* error = nullptr);
  // What deserialize() would accept, checked without building the sketch (no allocation): the
  // sketch's count, or nullopt (and `error`) where deserialize() would fail.
  static std::optional<uint64_t> validCount(std::span<const uint8_t> bytes,
                                            std::string* error = nullptr);

 private:
  struct Store {
    int32_t offset = 0;  // index of counts[0]
    std::vector<uint64_t> counts;
    // Adds c at index; keeps at most maxBuckets buckets, collapsing the lowest indices.
    // Returns true when it collapsed.
    bool add(int32_t index, uint64_t c, uint32_t maxBuckets);
  };

  // deserialize() and validCount(): builds into `out` unless null; false (and `error`) when the
  // bytes are not a sketch.
  static bool decode(std::span<const uint8_t> bytes, LatencySketch* out, uint64_t* count,
                     std::string* error);
  int32_t indexOf(double magnitude) const;
  double lowerBound(int32_t index) const;  // γ^(index−1)
  double upperBound(int32_t index) const;  // γ^index

  double alpha_;
  double gamma_;
  double logGamma_;
  double zeroThreshold_;
  uint32_t maxBuckets_;
  Store pos_;
  Store neg_;
  uint64_t zeroCount_ = 0;
  uint64_t count_ = 0;
  uint64_t dropped_ = 0;
  double sum_ = 0;
  double min_;
  double max_;
  bool collapsed_ = false;
};

}  // namespace flare::stats
