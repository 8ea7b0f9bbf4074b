// flare-stats: the stats library behind a JSON command line, for debugging summaries by hand and
// for the SciPy cross-check (tests/python/test_stats_scipy.py).
//
//   echo '{"op":"w1","a":[1,2,3],"b":[4,5]}' | flare-stats
//
// One JSON object on stdin, one on stdout. Ops and their fields (see src/stats/README.md for
// outputs):
//   w1           a, b: samples                        → w1 (exact)
//   kde          values, rule (silverman|scott), at, grid_size, exact_max_n
//                                                     → bandwidth, at (exact density), grid
//   cluster      durations (ns)                       → bandwidth, cuts_log, clusters, dropped
//   quantile     values, q                            → quantiles (NumPy linear)
//   sketch       values, q, alpha, zero_threshold     → quantiles, count, sum, min, max, bytes
//   sketch_w1    a, b, alpha, zero_threshold          → w1, bound (vs the exact W1)
//   summary_w1   a, b: arrays of {count, p50, p99, sum} → w1
//   outliers     members: arrays of samples, alpha    → scores, high, low, fences
//   changepoints values                               → change_points
//   signtest     differences                          → n, positive, p_value (one-sided, > 0)
//   wilcoxon     differences                          → n, w_plus, p_value (one-sided), exact
//   excess       members: arrays per block, member, min_peers → excess (vs the peers' median)
//   gemm         device, dtype, b, m, n, k            → expected TFLOPS model, hint
// Errors: {"error": "..."} on stdout and exit status 2.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "src/stats/changepoint.h"
#include "src/stats/json.h"
#include "src/stats/kde.h"
#include "src/stats/outliers.h"
#include "src/stats/paired.h"
#include "src/stats/perf_model.h"
#include "src/stats/quantile.h"
#include "src/stats/sketch.h"
#include "src/stats/wasserstein.h"

namespace flare::stats {
namespace {

using json::Value;

struct UsageError {
  std::string what;
};

const Value& field(const Value& in, const char* key) {
  const Value* v = in.get(key);
  if (!v) throw UsageError{std::string("missing field '") + key + "'"};
  return *v;
}

double num(const Value& v, const char* what) {
  if (v.type != Value::Type::kNumber) throw UsageError{std::string(what) + " must be a number"};
  return v.number;
}

double numOr(const Value& in, const char* key, double dflt) {
  const Value* v = in.get(key);
  return v ? num(*v, key) : dflt;
}

std::vector<double> numbers(const Value& v, const char* what) {
  if (v.type != Value::Type::kArray) throw UsageError{std::string(what) + " must be an array"};
  std::vector<double> out;
  out.reserve(v.array.size());
  for (const Value& e : v.array) {
    // null stands for a non-finite value (what json::number writes for one).
    out.push_back(e.type == Value::Type::kNull ? NAN : num(e, what));
  }
  return out;
}

std::string array(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + json::number(v[i]);
  return out + "]";
}

std::string indices(const std::vector<size_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string clusterJson(const DurationCluster& c) {
  return "{\"count\":" + std::to_string(c.count) + ",\"p50\":" + json::number(c.p50) +
         ",\"p99\":" + json::number(c.p99) + ",\"sum\":" + json::number(c.sum) +
         ",\"min\":" + json::number(c.min) + ",\"max\":" + json::number(c.max) + "}";
}

std::vector<DurationCluster> clusters(const Value& v, const char* what) {
  if (v.type != Value::Type::kArray) throw UsageError{std::string(what) + " must be an array"};
  std::vector<DurationCluster> out;
  for (const Value& c : v.array) {
    DurationCluster d;
    const double count = num(field(c, "count"), "count");
    if (!(count >= 0 && count < 1e18)) throw UsageError{"count out of range"};
    d.count = static_cast<uint64_t>(count);
    d.p50 = num(field(c, "p50"), "p50");
    d.p99 = num(field(c, "p99"), "p99");
    d.sum = numOr(c, "sum", 0);
    out.push_back(d);
  }
  return out;
}

LatencySketch sketchOf(const std::vector<double>& values, const Value& in) {
  LatencySketch s(numOr(in, "alpha", LatencySketch::kDefaultRelativeAccuracy),
                  numOr(in, "zero_threshold", LatencySketch::kDefaultZeroThreshold));
  for (double v : values) s.add(v);
  return s;
}

std::string run(const Value& in) {
  const Value& opv = field(in, "op");
  if (opv.type != Value::Type::kString) throw UsageError{"op must be a string"};
  const std::string& op = opv.string;
  if (op == "w1") {
    return "{\"w1\":" +
           json::number(wasserstein1(std::span<const double>(numbers(field(in, "a"), "a")),
                                     std::span<const double>(numbers(field(in, "b"), "b")))) +
           "}";
  }
  if (op == "kde") {
    const auto x = numbers(field(in, "values"), "values");
    KdeOptions o;
    if (const Value* r = in.get("rule")) {
      if (r->string == "scott")
        o.rule = BandwidthRule::kScott;
      else if (r->string != "silverman")
        throw UsageError{"rule must be silverman or scott"};
    }
    o.gridSize = static_cast<size_t>(std::clamp(numOr(in, "grid_size", 512), 16.0, 1e6));
    o.exactMaxN = static_cast<size_t>(std::clamp(numOr(in, "exact_max_n", 64), 0.0, 1e12));
    const double h =
        in.get("bandwidth") ? num(field(in, "bandwidth"), "bandwidth") : kdeBandwidth(x, o.rule);
    std::vector<double> at;
    if (const Value* a = in.get("at"))
      for (double p : numbers(*a, "at")) at.push_back(kdeAt(x, h, p));
    const KdeGrid g = kdeGrid(x, h, o);
    return "{\"bandwidth\":" + json::number(h) + ",\"at\":" + array(at) +
           ",\"grid\":{\"lo\":" + json::number(g.lo) + ",\"step\":" + json::number(g.step) +
           ",\"binned\":" + (g.binned ? "true" : "false") + ",\"density\":" + array(g.density) +
           "}}";
  }
  if (op == "cluster") {
    const Clustering c = clusterDurations(numbers(field(in, "durations"), "durations"));
    std::string out = "{\"bandwidth\":" + json::number(c.bandwidth) +
                      ",\"cuts_log\":" + array(c.cutsLog) + ",\"clusters\":[";
    for (size_t i = 0; i < c.clusters.size(); ++i)
      out += (i ? "," : "") + clusterJson(c.clusters[i]);
    return out + "],\"dropped\":" + std::to_string(c.dropped) + "}";
  }
  if (op == "quantile") {
    auto x = numbers(field(in, "values"), "values");
    std::sort(x.begin(), x.end());
    std::vector<double> q;
    for (double p : numbers(field(in, "q"), "q")) q.push_back(quantileSorted(x, p));
    return "{\"quantiles\":" + array(q) + "}";
  }
  if (op == "sketch") {
    const LatencySketch s0 = sketchOf(numbers(field(in, "values"), "values"), in);
    // Answer from the deserialized copy: the round trip is part of what is checked.
    const auto bytes = s0.serialize();
    std::string error;
    const auto s = LatencySketch::deserialize(bytes, &error);
    if (!s) throw UsageError{error};
    std::vector<double> q;
    if (const Value* qs = in.get("q"))
      for (double p : numbers(*qs, "q")) q.push_back(s->quantile(p));
    return "{\"quantiles\":" + array(q) + ",\"count\":" + std::to_string(s->count()) +
           ",\"sum\":" + json::number(s->sum()) + ",\"min\":" + json::number(s->min()) +
           ",\"max\":" + json::number(s->max()) + ",\"bytes\":" + std::to_string(bytes.size()) +
           ",\"relative_accuracy\":" + json::number(s->relativeAccuracy()) + "}";
  }
  if (op == "sketch_w1") {
    const auto a = numbers(field(in, "a"), "a"), b = numbers(field(in, "b"), "b");
    const LatencySketch sa = sketchOf(a, in), sb = sketchOf(b, in);
    double ma = 0, mb = 0;
    for (double v : a) ma += std::fabs(v) / static_cast<double>(a.size());
    for (double v : b) mb += std::fabs(v) / static_cast<double>(b.size());
    const double bound = (sa.gamma() - 1) * (ma + mb) + 2 * sa.zeroThreshold();
    return "{\"w1\":" + json::number(wasserstein1(sa, sb)) + ",\"bound\":" + json::number(bound) +
           "}";
  }
  if (op == "summary_w1") {
    return "{\"w1\":" +
           json::number(
               wasserstein1(std::span<const DurationCluster>(clusters(field(in, "a"), "a")),
                            std::span<const DurationCluster>(clusters(field(in, "b"), "b")))) +
           "}";
  }
  if (op == "outliers") {
    const Value& m = field(in, "members");
    if (m.type != Value::Type::kArray) throw UsageError{"members must be an array"};
    std::vector<std::vector<double>> members;
    for (const Value& v : m.array) members.push_back(numbers(v, "member"));
    OutlierOptions o;
    o.alpha = numOr(in, "alpha", 1.5);
    const OutlierResult r = sampleOutliers(members, o);
    return "{\"scores\":" + array(r.scores) + ",\"high\":" + indices(r.high) +
           ",\"low\":" + indices(r.low) + ",\"fences\":{\"q1\":" + json::number(r.fences.q1) +
           ",\"q3\":" + json::number(r.fences.q3) + ",\"lower\":" + json::number(r.fences.lower) +
           ",\"upper\":" + json::number(r.fences.upper) + "}}";
  }
  if (op == "changepoints") {
    std::string out = "{\"change_points\":[";
    const auto cps = detectMeanShifts(numbers(field(in, "values"), "values"));
    for (size_t i = 0; i < cps.size(); ++i)
      out += std::string(i ? "," : "") + "{\"index\":" + std::to_string(cps[i].index) +
             ",\"before\":" + json::number(cps[i].before) +
             ",\"after\":" + json::number(cps[i].after) +
             ",\"magnitude\":" + json::number(cps[i].magnitude) + "}";
    return out + "]}";
  }
  if (op == "signtest") {
    const SignTestResult r = signTest(numbers(field(in, "differences"), "differences"));
    return "{\"n\":" + std::to_string(r.n) + ",\"positive\":" + std::to_string(r.positive) +
           ",\"p_value\":" + json::number(r.p_value) + "}";
  }
  if (op == "wilcoxon") {
    const WilcoxonResult r = wilcoxonSignedRank(numbers(field(in, "differences"), "differences"));
    return "{\"n\":" + std::to_string(r.n) + ",\"w_plus\":" + json::number(r.w_plus) +
           ",\"p_value\":" + json::number(r.p_value) +
           ",\"exact\":" + (r.exact ? "true" : "false") + "}";
  }
  if (op == "excess") {
    const Value& m = field(in, "members");
    if (m.type != Value::Type::kArray) throw UsageError{"members must be an array"};
    std::vector<std::vector<double>> members;
    for (const Value& v : m.array) members.push_back(numbers(v, "member"));
    const double member = num(field(in, "member"), "member");
    if (!(member >= 0 && member < static_cast<double>(members.size())))
      throw UsageError{"member out of range"};
    const double min_peers = numOr(in, "min_peers", 2);
    if (!(min_peers >= 1 && min_peers <= 1e6)) throw UsageError{"min_peers must be 1..1e6"};
    return "{\"excess\":" +
           array(excessOverPeers(members, static_cast<size_t>(member),
                                 static_cast<size_t>(min_peers))) +
           "}";
  }
  if (op == "gemm") {
    const Value& dev = field(in, "device");
    const DevicePeak* d = PeakTable::builtin().find(dev.string);
    if (!d) throw UsageError{"unknown device '" + dev.string + "'"};
    const auto dt = parseDtype(field(in, "dtype").string);
    if (!dt) throw UsageError{"dtype must be fp32, tf32, fp16, bf16 or fp8"};
    auto dim = [&](const char* k) {
      const double v = num(field(in, k), k);
      if (!(v >= 1 && v <= 1e9)) throw UsageError{std::string(k) + " must be 1..1e9"};
      return static_cast<int64_t>(v);
    };
    const int64_t b = in.get("b") ? dim("b") : 1, m = dim("m"), n = dim("n"), k = dim("k");
    const GemmExpectation e = expectedGemm(*d, *dt, b, m, n, k);
    return "{\"device\":" + json::quote(d->name) + ",\"flops\":" + json::number(e.flops) +
           ",\"tile_efficiency\":" + json::number(e.tileEfficiency) +
           ",\"wave_efficiency\":" + json::number(e.waveEfficiency) +
           ",\"align_efficiency\":" + json::number(e.alignEfficiency) +
           ",\"expected_tflops\":" + json::number(e.expectedTflops) +
           ",\"memory_bound\":" + (e.memoryBound ? "true" : "false") +
           ",\"hint\":" + json::quote(gemmAlignmentHint(m, n, k, *dt)) + "}";
  }
  throw UsageError{"unknown op '" + op + "'"};
}

}  // namespace
}  // namespace flare::stats

int main() {
  std::ostringstream buf;
  buf << std::cin.rdbuf();
  std::string error;
  const auto in = flare::stats::json::parse(buf.str(), &error);
  if (!in) {
    std::cout << "{\"error\":" << flare::stats::json::quote(error) << "}\n";
    return 2;
  }
  try {
    std::cout << flare::stats::run(*in) << "\n";
  } catch (const flare::stats::UsageError& e) {
    std::cout << "{\"error\":" << flare::stats::json::quote(e.what) << "}\n";
    return 2;
  }
  return 0;
}
