// Serialized form, version 1 (all integers little-endian; varint = LEB128, at most 10 bytes):
//
//   u8  version (1)          u8  flags (bit 0: collapsed; other bits must be 0)
//   f64 relative accuracy    f64 zero threshold      u32 maxBuckets
//   varint count   varint zeroCount   varint dropped   f64 sum   f64 min   f64 max
//   store positive, store negative, each:
//     zigzag-varint offset   varint bucket count (≤ maxBuckets)   varint count × buckets
//
// deserialize() checks: version, flags, parameter ranges, every varint's length, bucket counts
// and index ranges (the top bucket's bound must be a finite double), that the bucket counts plus
// zeroCount add up to count without overflow, finite sum/min/max with min ≤ max when count > 0,
// and that no byte is left over.
#include "src/stats/sketch.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace flare::stats {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void putU64(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void putF64(std::vector<uint8_t>& out, double v) {
  putU64(out, std::bit_cast<uint64_t>(v), 8);
}
void putVarint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}
uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
int64_t unzigzag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  bool u64(uint64_t* v, int bytes) {
    if (b_.size() - pos_ < static_cast<size_t>(bytes)) return false;
    *v = 0;
    for (int i = 0; i < bytes; ++i) *v |= static_cast<uint64_t>(b_[pos_++]) << (8 * i);
    return true;
  }
  bool f64(double* v) {
    uint64_t u;
    if (!u64(&u, 8)) return false;
    *v = std::bit_cast<double>(u);
    return true;
  }
  bool varint(uint64_t* v) {
    *v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos_ >= b_.size()) return false;
      const uint8_t byte = b_[pos_++];
      if (i == 9 && byte > 1) return false;  // would overflow 64 bits
      *v |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if (!(byte & 0x80)) return true;
    }
    return false;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

bool fail(std::string* error, const char* what) {
  if (error) *error = std::string("invalid latency sketch: ") + what;
  return false;
}

}  // namespace

LatencySketch::LatencySketch(double relativeAccuracy, double zeroThreshold, uint32_t maxBuckets)
    : alpha_(std::isfinite(relativeAccuracy)
                 ? std::clamp(relativeAccuracy, kMinRelativeAccuracy, kMaxRelativeAccuracy)
                 : kDefaultRelativeAccuracy),
      gamma_((1 + alpha_) / (1 - alpha_)),
      logGamma_(std::log(gamma_)),
      zeroThreshold_(std::isfinite(zeroThreshold) && zeroThreshold >= 0 ? zeroThreshold
                                                                        : kDefaultZeroThreshold),
      maxBuckets_(std::clamp(maxBuckets, kMinMaxBuckets, kMaxMaxBuckets)),
      min_(kInf),
      max_(-kInf) {}

int32_t LatencySketch::indexOf(double magnitude) const {
  const double idx = std::ceil(std::log(magnitude) / logGamma_);
  return static_cast<int32_t>(std::clamp(idx, -1e9, 1e9));
}
double LatencySketch::lowerBound(int32_t index) const {
  return std::exp(static_cast<double>(index - 1) * logGamma_);
}
double LatencySketch::upperBound(int32_t index) const {
  return std::exp(static_cast<double>(index) * logGamma_);
}

bool LatencySketch::Store::add(int32_t index, uint64_t c, uint32_t maxBuckets) {
  if (counts.empty()) {
    offset = index;
    counts.assign(1, c);
    return false;
  }
  const int64_t lowest = offset;
  const int64_t highest = offset + static_cast<int64_t>(counts.size()) - 1;
  int64_t new_lo = std::min<int64_t>(lowest, index);
  const int64_t new_hi = std::max<int64_t>(highest, index);
  bool collapsed = false;
  if (new_hi - new_lo + 1 > static_cast<int64_t>(maxBuckets)) {
    new_lo = new_hi - maxBuckets + 1;
    collapsed = true;
  }
  if (new_lo < lowest) {
    counts.insert(counts.begin(), static_cast<size_t>(lowest - new_lo), 0);
  } else if (new_lo > lowest) {
    // Collapse the buckets below new_lo into new_lo.
    const size_t drop = static_cast<size_t>(std::min<int64_t>(new_lo - lowest, counts.size()));
    uint64_t moved = 0;
    for (size_t i = 0; i < drop; ++i) moved += counts[i];
    counts.erase(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(drop));
    if (counts.empty()) counts.push_back(0);
    counts.front() += moved;
  }
  offset = static_cast<int32_t>(new_lo);
  if (new_hi > offset + static_cast<int64_t>(counts.size()) - 1)
    counts.resize(static_cast<size_t>(new_hi - offset + 1), 0);
  const int64_t at = std::max<int64_t>(index, new_lo);
  counts[static_cast<size_t>(at - offset)] += c;
  return collapsed;
}

void LatencySketch::add(double v, uint64_t count) {
  if (count == 0) return;
  if (!std::isfinite(v)) {
    dropped_ += count;
    return;
  }
  if (v > zeroThreshold_) {
    collapsed_ |= pos_.add(indexOf(v), count, maxBuckets_);
  } else if (v < -zeroThreshold_) {
    collapsed_ |= neg_.add(indexOf(-v), count, maxBuckets_);
  } else {
    zeroCount_ += count;
  }
  count_ += count;
  sum_ += v * static_cast<double>(count);
  min_ = std::min(min_, v);
  max_ = std::max(max_, v);
}

bool LatencySketch::merge(const LatencySketch& other, std::string* error) {
  if (other.alpha_ != alpha_ || other.zeroThreshold_ != zeroThreshold_) {
    if (error) *error = "cannot merge latency sketches with different accuracy or zero threshold";
    return false;
  }
  for (size_t i = 0; i < other.pos_.counts.size(); ++i)
    if (other.pos_.counts[i])
      collapsed_ |=
          pos_.add(other.pos_.offset + static_cast<int32_t>(i), other.pos_.counts[i], maxBuckets_);
  for (size_t i = 0; i < other.neg_.counts.size(); ++i)
    if (other.neg_.counts[i])
      collapsed_ |=
          neg_.add(other.neg_.offset + static_cast<int32_t>(i), other.neg_.counts[i], maxBuckets_);
  collapsed_ |= other.collapsed_;
  zeroCount_ += other.zeroCount_;
  count_ += other.count_;
  dropped_ += other.dropped_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  return true;
}

double LatencySketch::quantile(double q) const {
  if (count_ == 0) return std::numeric_limits<double>::quiet_NaN();
  q = std::isnan(q) ? 0.5 : std::clamp(q, 0.0, 1.0);
  const double rank = q * static_cast<double>(count_ - 1);
  const double rep_scale = 2.0 / (gamma_ + 1.0);  // representative = 2γ^i/(γ+1)
  double cum = 0;
  double value = 0;
  bool found = false;
  for (size_t i = neg_.counts.size(); i-- > 0 && !found;) {
    cum += static_cast<double>(neg_.counts[i]);
    if (cum > rank) {
      value = -upperBound(neg_.offset + static_cast<int32_t>(i)) * rep_scale;
      found = true;
    }
  }
  if (!found) {
    cum += static_cast<double>(zeroCount_);
    if (cum > rank) {
      value = 0;
      found = true;
    }
  }
  for (size_t i = 0; i < pos_.counts.size() && !found; ++i) {
    cum += static_cast<double>(pos_.counts[i]);
    if (cum > rank) {
      value = upperBound(pos_.offset + static_cast<int32_t>(i)) * rep_scale;
      found = true;
    }
  }
  if (!found) value = max_;
  return std::clamp(value, min_, max_);
}

void LatencySketch::scaleCounts(uint64_t factor) {
  if (factor <= 1) return;
  for (Store* store : {&pos_, &neg_}) {
    for (uint64_t& c : store->counts) c *= factor;
  }
  zeroCount_ *= factor;
  count_ *= factor;
  sum_ *= static_cast<double>(factor);
}

void LatencySketch::forEachBucket(
    const std::function<void(double lo, double hi, uint64_t count)>& fn) const {
  auto emit = [&](double lo, double hi, uint64_t c) {
    lo = std::max(lo, min_);
    hi = std::min(hi, max_);
    if (lo > hi) lo = hi = std::clamp(0.5 * (lo + hi), min_, max_);
    fn(lo, hi, c);
  };
  for (size_t i = neg_.counts.size(); i-- > 0;) {
    if (!neg_.counts[i]) continue;
    const int32_t idx = neg_.offset + static_cast<int32_t>(i);
    emit(-upperBound(idx), -lowerBound(idx), neg_.counts[i]);
  }
  if (zeroCount_) emit(-zeroThreshold_, zeroThreshold_, zeroCount_);
  for (size_t i = 0; i < pos_.counts.size(); ++i) {
    if (!pos_.counts[i]) continue;
    const int32_t idx = pos_.offset + static_cast<int32_t>(i);
    emit(lowerBound(idx), upperBound(idx), pos_.counts[i]);
  }
}

std::vector<uint8_t> LatencySketch::serialize() const {
  std::vector<uint8_t> out;
  out.reserve(64 + 2 * (pos_.counts.size() + neg_.counts.size()));
  out.push_back(kSerialVersion);
  out.push_back(collapsed_ ? 1 : 0);
  putF64(out, alpha_);
  putF64(out, zeroThreshold_);
  putU64(out, maxBuckets_, 4);
  putVarint(out, count_);
  putVarint(out, zeroCount_);
  putVarint(out, dropped_);
  putF64(out, sum_);
  putF64(out, min_);
  putF64(out, max_);
  for (const Store* s : {&pos_, &neg_}) {
    putVarint(out, zigzag(s->offset));
    putVarint(out, s->counts.size());
    for (uint64_t c : s->counts) putVarint(out, c);
  }
  return out;
}

bool LatencySketch::decode(std::span<const uint8_t> bytes, LatencySketch* out, uint64_t* count_out,
                           std::string* error) {
  Reader r(bytes);
  uint64_t version, flags, max_buckets, count, zero, dropped;
  double alpha, zt, sum, mn, mx;
  if (!r.u64(&version, 1)) return fail(error, "empty input");
  if (version != kSerialVersion) return fail(error, "unknown version");
  if (!r.u64(&flags, 1) || !r.f64(&alpha) || !r.f64(&zt) || !r.u64(&max_buckets, 4) ||
      !r.varint(&count) || !r.varint(&zero) || !r.varint(&dropped) || !r.f64(&sum) || !r.f64(&mn) ||
      !r.f64(&mx))
    return fail(error, "truncated header");
  if (flags & ~uint64_t{1}) return fail(error, "unknown flags");
  if (!(alpha >= kMinRelativeAccuracy && alpha <= kMaxRelativeAccuracy))
    return fail(error, "relative accuracy out of range");
  if (!(std::isfinite(zt) && zt >= 0)) return fail(error, "bad zero threshold");
  if (max_buckets < kMinMaxBuckets || max_buckets > kMaxMaxBuckets)
    return fail(error, "maxBuckets out of range");
  // The same γ as the constructor's (alpha is in range, so it is not clamped there).
  const double log_gamma = std::log((1 + alpha) / (1 - alpha));
  if (out != nullptr) *out = LatencySketch(alpha, zt, static_cast<uint32_t>(max_buckets));
  // A bucket index whose bound is not a finite positive double cannot come from add().
  const double max_index = std::floor(std::log(std::numeric_limits<double>::max()) / log_gamma);
  const double min_index =
      std::ceil(std::log(std::numeric_limits<double>::denorm_min()) / log_gamma);
  uint64_t total = zero;
  for (int side = 0; side < 2; ++side) {
    Store* st = out == nullptr ? nullptr : side == 0 ? &out->pos_ : &out->neg_;
    uint64_t off_z, n;
    if (!r.varint(&off_z) || !r.varint(&n)) return fail(error, "truncated store");
    const int64_t off = unzigzag(off_z);
    if (n > max_buckets) return fail(error, "too many buckets");
    if (n > 0 && (static_cast<double>(off) < min_index ||
                  static_cast<double>(off) + static_cast<double>(n) - 1 > max_index))
      return fail(error, "bucket index out of range");
    if (st != nullptr) {
      st->offset = static_cast<int32_t>(n > 0 ? off : 0);
      st->counts.resize(static_cast<size_t>(n));
    }
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t c;
      if (!r.varint(&c)) return fail(error, "truncated buckets");
      if (c > std::numeric_limits<uint64_t>::max() - total) return fail(error, "counts overflow");
      total += c;
      if (st != nullptr) st->counts[k] = c;
    }
  }
  if (!r.done()) return fail(error, "trailing bytes");
  if (total != count) return fail(error, "bucket counts do not add up to count");
  if (count > 0) {
    if (!std::isfinite(sum) || !std::isfinite(mn) || !std::isfinite(mx) || mn > mx)
      return fail(error, "bad sum/min/max");
  } else if (sum != 0 || mn != kInf || mx != -kInf) {
    return fail(error, "non-empty statistics in an empty sketch");
  }
  if (count_out != nullptr) *count_out = count;
  if (out == nullptr) return true;
  out->collapsed_ = flags & 1;
  out->count_ = count;
  out->zeroCount_ = zero;
  out->dropped_ = dropped;
  out->sum_ = sum;
  out->min_ = mn;
  out->max_ = mx;
  return true;
}

std::optional<LatencySketch> LatencySketch::deserialize(std::span<const uint8_t> bytes,
                                                        std::string* error) {
  LatencySketch s;
  if (!decode(bytes, &s, nullptr, error)) return std::nullopt;
  return s;
}

std::optional<uint64_t> LatencySketch::validCount(std::span<const uint8_t> bytes,
                                                  std::string* error) {
  uint64_t count = 0;
  if (!decode(bytes, nullptr, &count, error)) return std::nullopt;
  return count;
}

}  // namespace flare::stats
