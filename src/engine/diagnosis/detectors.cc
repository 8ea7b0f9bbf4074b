#include "src/engine/diagnosis/detectors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <utility>

#include "flare/step.h"
#include "src/common/text.h"
#include "src/engine/diagnosis/summary_detectors.h"
#include "src/records/op_kind.h"
#include "src/stats/changepoint.h"
#include "src/stats/outliers.h"
#include "src/stats/paired.h"
#include "src/stats/perf_model.h"
#include "src/stats/quantile.h"
#include "src/stats/wasserstein.h"

namespace flare::engine {
namespace {

using flare::v1::OpKind;

// Up to this many ranks, a rank's issue latencies are compared with the other ranks' exactly;
// beyond, with every rank's pooled, each rank represented by a quantile sample of this size.
constexpr size_t kExactPeerRanks = 128;
constexpr size_t kRankLatencySample = 256;
// Up to kExactPeerRanks ranks, each rank's issue latencies are compared with the other ranks'
// exactly (leave-one-out), from at most this many values a rank (a quantile sample beyond: a
// summary-mode rank of 1,000 ops a step holds ~120,000 in a 120 s window).
constexpr size_t kExactRankSample = 8192;

double median(std::vector<double> v) {
  return stats::quantileInPlace(v, 0.5);
}

double wasserstein1(const std::vector<double>& a, const std::vector<double>& b) {
  return stats::wasserstein1(std::span<const double>(a), std::span<const double>(b));
}

double tukeyUpperFence(const std::vector<double>& values, double alpha) {
  return stats::tukeyFences(values, alpha).upper;
}

bool isCompute(OpKind kind) {
  return kind == flare::v1::OP_KIND_GEMM || kind == flare::v1::OP_KIND_ATTENTION;
}

bool isGpuOp(OpKind kind) {
  return kind != flare::v1::OP_KIND_SYNC;
}

std::string fmtMs(double ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f ms", ns / 1e6);
  return buf;
}

std::string fmtPct(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", ratio * 100);
  return buf;
}

std::string fmtNum(double v, const char* unit) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, unit);
  return buf;
}

std::string shapeText(const flare::v1::Signature& sig) {
  std::string out = "[";
  for (int i = 0; i < sig.shape_size(); ++i) out += (i ? "," : "") + std::to_string(sig.shape(i));
  out += "]";
  const std::string dtype = flare::v1::DType_Name(sig.dtype());
  if (sig.dtype() != flare::v1::DTYPE_UNSPECIFIED) out += " " + dtype.substr(6);  // DTYPE_
  return out;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

// A GEMM's flops per call from its signature's shape [m, n, k, batch] (the hook's count).
uint64_t gemmFlops(const flare::v1::Signature& sig) {
  if (sig.kind() != flare::v1::OP_KIND_GEMM || sig.shape_size() < 3) return 0;
  double f =
      2.0 * static_cast<double>(sig.shape(0)) * static_cast<double>(sig.shape(1)) *
      static_cast<double>(sig.shape(2)) *
      (sig.shape_size() >= 4 ? static_cast<double>(std::max<int64_t>(sig.shape(3), 1)) : 1.0);
  return f > 0 && f < 1.8e19 ? static_cast<uint64_t>(f) : 0;
}

std::optional<stats::Dtype> statsDtype(flare::v1::DType t) {
  switch (t) {
    case flare::v1::DTYPE_F32:
      return stats::Dtype::kFp32;
    case flare::v1::DTYPE_F16:
      return stats::Dtype::kFp16;
    case flare::v1::DTYPE_BF16:
      return stats::Dtype::kBf16;
    case flare::v1::DTYPE_F8E4M3:
    case flare::v1::DTYPE_F8E5M2:
      return stats::Dtype::kFp8;
    default:
      return std::nullopt;
  }
}

// Intervals of collectives per rank and stream, to exclude compute that overlapped one on
// another stream (its slowness is contention, not the GPU).
struct CollectiveIntervals {
  std::vector<std::pair<int64_t, int64_t>> spans;  // sorted by start
  std::vector<uint64_t> streams;
  bool overlapsOtherStream(const Op& op) const {
    auto it = std::upper_bound(spans.begin(), spans.end(), std::make_pair(op.end, INT64_MAX));
    for (auto i = it - spans.begin() - 1; i >= 0; --i) {
      const auto& s = spans[static_cast<size_t>(i)];
      if (s.second <= op.start) {
        // Sorted by start only: earlier ones may still be long; scan a bounded window.
        if (it - spans.begin() - i > 64) break;
        continue;
      }
      if (streams[static_cast<size_t>(i)] != op.stream) return true;
    }
    return false;
  }
};

CollectiveIntervals collectiveIntervals(const JobModel& job, const RankData& r) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, uint64_t>> all;
  for (const Op& op : r.ops) {
    const OpKind kind = job.signatures()[op.sig].kind();
    if (kind == flare::v1::OP_KIND_COLLECTIVE || kind == flare::v1::OP_KIND_P2P)
      all.push_back({{op.start, op.end}, op.stream});
  }
  std::sort(all.begin(), all.end());
  CollectiveIntervals out;
  for (const auto& [span, stream] : all) {
    out.spans.push_back(span);
    out.streams.push_back(stream);
  }
  return out;
}

int64_t warmupEnd(const JobModel& job, int rank);

// ---- A. slow GPU ------------------------------------------------------------------------

void detectSlowGpu(const JobModel& job, const DiagnoseOptions& opt,
                   const std::map<int, ArrivalStats>& arrivals, std::vector<Diagnosis>* out) {
  std::map<int, CollectiveIntervals> intervals;
  for (const auto& [rank, r] : job.ranks()) intervals[rank] = collectiveIntervals(job, r);
  // signature -> rank -> durations (compute not overlapping a collective on another stream)
  std::map<uint32_t, std::map<int, std::vector<double>>> durations;
  std::map<uint32_t, double> flops_of;
  for (const auto& [rank, r] : job.ranks()) {
    const int64_t after = warmupEnd(job, rank);
    for (const Op& op : r.ops) {
      if (op.issue < after || !isCompute(job.signatures()[op.sig].kind())) continue;
      if (intervals[rank].overlapsOtherStream(op)) continue;
      durations[op.sig][rank].push_back(static_cast<double>(op.duration()));
      flops_of[op.sig] = static_cast<double>(op.flops);
    }
  }
  struct RankScore {
    double flagged_weight = 0;
    double total_weight = 0;
    double weighted_ratio = 0;
    uint32_t top_sig = 0;
    double top_flops = 0;
    double top_weight = -1;
    double top_median = 0;
    double top_reference = 0;
  };
  std::map<int, RankScore> scores;
  for (const auto& [sig, per_rank] : durations) {
    std::map<int, double> medians;
    double weight = 0;
    for (const auto& [rank, d] : per_rank) {
      if (static_cast<int>(d.size()) < opt.min_samples) continue;
      medians[rank] = median(d);
      weight += std::accumulate(d.begin(), d.end(), 0.0);
    }
    if (medians.size() < 3) continue;  // two ranks cannot say which one is different
    std::vector<double> meds;
    for (const auto& [rank, m] : medians) meds.push_back(m);
    const double reference = median(meds);
    if (reference <= 0) continue;
    std::vector<double> ratios;
    for (double m : meds) ratios.push_back(m / reference);
    const double fence =
        std::max(1.0 + opt.gpu_min_effect, tukeyUpperFence(ratios, opt.tukey_alpha));
    for (const auto& [rank, m] : medians) {
      RankScore& s = scores[rank];
      const double ratio = m / reference;
      s.total_weight += weight;
      s.weighted_ratio += weight * ratio;
      if (ratio > fence) {
        s.flagged_weight += weight;
        if (weight > s.top_weight) {
          s.top_weight = weight;
          s.top_sig = sig;
          s.top_flops = flops_of[sig];
          s.top_median = m;
          s.top_reference = reference;
        }
      }
    }
  }
  for (const auto& [rank, s] : scores) {
    if (s.total_weight <= 0 || s.flagged_weight < 0.5 * s.total_weight) continue;
    const double slowdown = s.weighted_ratio / s.total_weight - 1.0;
    const auto& sig = job.signatures()[s.top_sig];
    Diagnosis d;
    d.kind = "gpu_slow";
    d.team = Team::kOperations;
    d.cause = "GPU";
    d.ranks = {rank};
    d.severity = slowdown;
    const double flops = s.top_flops;
    Evidence e;
    e.metric = "compute_duration";
    e.value = s.top_median;
    e.reference = s.top_reference;
    e.text = sig.name() + " " + shapeText(sig) + ": median " + fmtMs(s.top_median) + " on rank " +
             std::to_string(rank) + " vs " + fmtMs(s.top_reference) + " on the other ranks";
    if (flops > 0) {
      e.text += " (" + fmtNum(flops / s.top_median / 1e3, "TFLOPS") + " vs " +
                fmtNum(flops / s.top_reference / 1e3, "TFLOPS") + ")";
    }
    d.evidence.push_back(e);
    if (auto arrival = arrivalEvidence(arrivals, rank)) d.evidence.push_back(*arrival);
    d.summary = "rank " + std::to_string(rank) + ": GPU slow — its GEMM/attention kernels run " +
                fmtPct(slowdown) + " slower than the same kernels on the other ranks; the " +
                "other ranks only wait for it";
    out->push_back(std::move(d));
  }
}

// ---- B. slow link --------------------------------------------------------------------------

struct Instance {
  std::vector<std::pair<int, const Op*>> members;
};

void detectSlowLink(const JobModel& job, const DiagnoseOptions& opt, std::vector<Diagnosis>* out) {
  std::map<std::pair<uint64_t, uint64_t>, Instance> instances;
  for (const auto& [rank, r] : job.ranks()) {
    for (const Op& op : r.ops) {
      if (job.signatures()[op.sig].kind() != flare::v1::OP_KIND_COLLECTIVE || op.comm == 0)
        continue;
      instances[{op.comm, op.seq}].members.push_back({rank, &op});
    }
  }
  // Per communicator and signature: busbw of complete instances, from the last arrival.
  struct CommStats {
    std::vector<double> busbw;
    std::set<int> ranks;
    uint32_t sig = 0;
    double bytes = 0;
  };
  std::map<std::pair<uint64_t, uint32_t>, CommStats> comms;
  for (const auto& [key, inst] : instances) {
    const Op* first = inst.members.front().second;
    if (first->nranks <= 1 || static_cast<int>(inst.members.size()) != first->nranks) continue;
    int64_t last_start = INT64_MIN, last_end = INT64_MIN;
    for (const auto& [rank, op] : inst.members) {
      last_start = std::max(last_start, op->start);
      last_end = std::max(last_end, op->end);
    }
    const double t = static_cast<double>(last_end - last_start);
    if (t <= 0 || first->bytes == 0) continue;
    const auto& sig = job.signatures()[first->sig];
    CommStats& cs = comms[{key.first, first->sig}];
    cs.busbw.push_back(static_cast<double>(first->bytes) / t *
                       records::busBandwidthFactor(sig.collective(), first->nranks));  // GB/s
    for (const auto& [rank, op] : inst.members) cs.ranks.insert(rank);
    cs.sig = first->sig;
    cs.bytes = static_cast<double>(first->bytes);
  }
  // Peer groups: communicators doing the same collective of the same size over as many ranks.
  std::map<std::tuple<int, size_t, uint64_t>, std::vector<std::pair<uint64_t, double>>> groups;
  std::map<uint64_t, const CommStats*> by_comm;
  for (const auto& [key, cs] : comms) {
    if (static_cast<int>(cs.busbw.size()) < opt.min_samples) continue;
    const auto& sig = job.signatures()[cs.sig];
    groups[{sig.collective(), cs.ranks.size(), static_cast<uint64_t>(cs.bytes)}].push_back(
        {key.first, median(cs.busbw)});
    by_comm[key.first] = &cs;
  }
  std::map<uint64_t, std::pair<double, double>> slow;  // comm -> (busbw, reference)
  std::set<uint64_t> evaluated;
  for (const auto& [gkey, members] : groups) {
    if (members.size() < 2) continue;
    std::vector<double> values;
    for (const auto& [comm, bw] : members) values.push_back(bw);
    const double reference =
        members.size() >= 3 ? median(values) : *std::max_element(values.begin(), values.end());
    for (const auto& [comm, bw] : members) {
      evaluated.insert(comm);
      if (bw < reference * (1.0 - opt.link_min_effect)) {
        auto& s = slow[comm];
        if (s.second == 0 || bw / reference < s.first / s.second) s = {bw, reference};
      }
    }
  }
  if (slow.empty()) return;
  // The culprit is in every slow communicator and in no healthy one that was compared.
  std::map<int, int> slow_count, healthy_count;
  for (uint64_t comm : evaluated) {
    for (int rank : by_comm[comm]->ranks) (slow.count(comm) ? slow_count : healthy_count)[rank]++;
  }
  std::vector<int> culprits;
  for (const auto& [rank, n] : slow_count) {
    if (n == static_cast<int>(slow.size()) && healthy_count[rank] == 0) culprits.push_back(rank);
  }
  if (culprits.empty()) {  // e.g. one slow communicator: name its members (the link between them)
    std::set<int> members;
    for (const auto& [comm, unused] : slow) {
      for (int rank : by_comm[comm]->ranks) members.insert(rank);
    }
    culprits.assign(members.begin(), members.end());
  }
  Diagnosis d;
  d.kind = "link_slow";
  d.team = Team::kOperations;
  d.cause = "network";
  d.ranks = culprits;
  double worst = 0;
  for (const auto& [comm, v] : slow) {
    const CommStats& cs = *by_comm[comm];
    const auto& sig = job.signatures()[cs.sig];
    std::vector<int> ranks(cs.ranks.begin(), cs.ranks.end());
    char hash[24];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(comm));
    d.evidence.push_back({"busbw",
                          sig.name() + " of " + fmtNum(cs.bytes / (1 << 20), "MiB") +
                              " on communicator " + hash + " (ranks " + rankList(ranks) +
                              "): busbw " + fmtNum(v.first, "GB/s") + " vs " +
                              fmtNum(v.second, "GB/s") + " on peer communicators",
                          v.first, v.second});
    worst = std::max(worst, 1.0 - v.first / v.second);
  }
  d.severity = worst;
  d.summary = "rank" + std::string(culprits.size() > 1 ? "s " : " ") + rankList(culprits) +
              ": slow network link — bus bandwidth " + fmtPct(worst) +
              " below peer communicators on every communicator " +
              (culprits.size() > 1 ? "they share" : "it is in");
  out->push_back(std::move(d));
}

// ---- C. host-side issue stall ---------------------------------------------------------------

// The end of a rank's warm-up: the start of its second step (first sightings, communicator set-up
// and pool growth make the first step unlike the others); INT64_MIN without step boundaries.
int64_t warmupEnd(const JobModel& job, int rank) {
  const auto starts = job.stepStarts(rank);
  return starts.size() >= 2 ? starts[1] : INT64_MIN;
}

// How many of a sketch's values lie below `x` (by bucket midpoint).
uint64_t countBelow(const stats::LatencySketch& sketch, double x) {
  uint64_t n = 0;
  sketch.forEachBucket([&n, x](double lo, double hi, uint64_t count) {
    if (0.5 * (lo + hi) < x) n += count;
  });
  return n;
}

// The issue latencies of a rank's GPU ops issued after its warm-up step: from its raw ops, or
// in MODE_SUMMARY rebuilt from the per-step sketches it sent. At most `max_values` of them:
// beyond, an evenly spaced quantile sample (the values of rank ⌊(k + ½)·n / max_values⌋,
// ascending), which keeps the distribution a W1 or a median reads at a bounded size.
std::vector<double> issueLatencies(const JobModel& job, const RankData& r,
                                   size_t max_values = SIZE_MAX) {
  std::vector<double> v;
  if (!r.steps.empty()) {
    const std::vector<const ReceivedStep*> steps = job.receivedSteps(r.rank);
    uint64_t total = 0;
    for (const ReceivedStep* st : steps) total += st->stats.latency.count();
    for (const CoarseSteps& c : r.coarse_steps) total += c.latency.count();  // folded steps
    auto add = [&v](double lo, double hi, uint64_t count) {
      v.insert(v.end(), count, 0.5 * (lo + hi));
    };
    if (total <= max_values) {
      v.reserve(total);
      for (const ReceivedStep* st : steps) st->stats.latency.forEachBucket(add);
      for (const CoarseSteps& c : r.coarse_steps) c.latency.forEachBucket(add);
      return v;
    }
    // The quantile sample from the steps' merged sketch (its buckets come in ascending order).
    stats::LatencySketch merged(records::StepStats::kStepSketchAccuracy);
    for (const ReceivedStep* st : steps) merged.merge(st->stats.latency);
    for (const CoarseSteps& c : r.coarse_steps) merged.merge(c.latency);
    v.reserve(max_values);
    uint64_t below = 0;  // values in the buckets before this one
    size_t k = 0;
    merged.forEachBucket([&](double lo, double hi, uint64_t count) {
      for (; k < max_values; ++k) {
        const auto target = static_cast<uint64_t>((static_cast<double>(k) + 0.5) *
                                                  static_cast<double>(merged.count()) /
                                                  static_cast<double>(max_values));
        if (target >= below + count) break;
        v.push_back(0.5 * (lo + hi));
      }
      below += count;
    });
    return v;
  }
  const int64_t after = warmupEnd(job, r.rank);
  for (const Op& op : r.ops) {
    if (op.issue >= after && isGpuOp(job.signatures()[op.sig].kind()))
      v.push_back(static_cast<double>(op.issueLatency()));
  }
  if (v.size() > max_values) {
    std::sort(v.begin(), v.end());
    std::vector<double> sample(max_values);
    for (size_t k = 0; k < max_values; ++k) {
      sample[k] =
          v[static_cast<size_t>((static_cast<double>(k) + 0.5) * static_cast<double>(v.size()) /
                                static_cast<double>(max_values))];
    }
    v = std::move(sample);
  }
  return v;
}

// What held the host just before the kernels a stall starved: for each starved kernel, the
// host gap since the previous launch on its thread; a traced Python span or host
// synchronization call that ended inside that gap and covers at least half of it is named.
// (An untraced stall — a sleep, an untraced API — names nothing, rather than a bystander.)
std::vector<std::pair<std::string, int>> causesBefore(const JobModel& job, const RankData& r,
                                                      const std::vector<const Op*>& starved) {
  struct HostEvent {
    int64_t start, end;
    uint64_t thread;
    std::string name;
  };
  std::vector<HostEvent> host;
  for (const Span& s : r.spans) host.push_back({s.start, s.end, s.thread, job.apis()[s.api]});
  std::map<uint64_t, std::vector<int64_t>> issues;  // thread -> launch times
  for (const Op& op : r.ops) {
    const auto& sig = job.signatures()[op.sig];
    if (sig.kind() == flare::v1::OP_KIND_SYNC) {
      if (sig.name() != FLARE_STEP_MARKER_NAME)
        host.push_back({op.start, op.end, op.thread, sig.name()});
    } else {
      issues[op.thread].push_back(op.issue);
    }
  }
  for (auto& [thread, v] : issues) std::sort(v.begin(), v.end());
  std::sort(host.begin(), host.end(),
            [](const HostEvent& a, const HostEvent& b) { return a.end < b.end; });
  std::map<std::string, int> counts;
  for (const Op* op : starved) {
    const auto& v = issues[op->thread];
    auto it = std::lower_bound(v.begin(), v.end(), op->issue);
    if (it == v.begin()) continue;
    const int64_t prev = *(it - 1);
    const int64_t gap = op->issue - prev;
    auto h = std::lower_bound(host.begin(), host.end(), prev,
                              [](const HostEvent& e, int64_t t) { return e.end < t; });
    std::set<std::string> seen;
    for (; h != host.end() && h->end <= op->issue; ++h) {
      if (h->thread != op->thread || 2 * (h->end - h->start) < gap) continue;
      if (seen.insert(h->name).second) counts[h->name]++;
    }
  }
  std::vector<std::pair<std::string, int>> out(counts.begin(), counts.end());
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

// Per rank: median over steps (the first skipped) of the time no GPU op ran, and the median step
// time, from the per-step statistics (the rank's own in MODE_SUMMARY). Ranks without a complete
// step after the warm-up are absent.
std::map<int, std::pair<double, double>> idlePerStep(const JobModel& job) {
  std::map<int, std::pair<double, double>> out;
  for (const auto& [rank, r] : job.ranks()) {
    std::vector<double> idle, steps;
    for (const records::StepStats& st : job.stepStats(rank)) {
      if (st.step == 0) continue;
      const double step = static_cast<double>(st.end_ns - st.start_ns);
      idle.push_back(step - static_cast<double>(st.gpu_busy_ns));
      steps.push_back(step);
    }
    if (!idle.empty()) out[rank] = {median(idle), median(steps)};
  }
  return out;
}

// Per traced API: the median over the rank's steps (the first skipped) of the host time its
// spans took inside the step (both modes send spans). The second way a stall's cause is named:
// on a real GPU the first kernel after a long host pause is not among the fastest-issued (it
// pays the GPU's wake-up), so the starved-kernel rule below can miss a GC pause that the
// step's own time shows plainly.
std::map<std::string, double> apiTimePerStep(const JobModel& job, int rank) {
  std::map<std::string, double> out;
  const auto it = job.ranks().find(rank);
  if (it == job.ranks().end() || it->second.spans.empty()) return out;
  std::vector<records::StepStats> steps = job.stepStats(rank);
  std::erase_if(steps, [](const records::StepStats& st) { return st.step == 0; });
  std::sort(steps.begin(), steps.end(),
            [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  if (steps.empty()) return out;
  // Each span's time, split over the steps it overlaps (found by binary search on the steps'
  // starts): O(spans × log steps), not spans × steps.
  std::map<std::string, std::vector<double>> per_step;
  for (const Span& sp : it->second.spans) {
    auto st = std::upper_bound(steps.begin(), steps.end(), sp.start,
                               [](int64_t t, const auto& s) { return t < s.start_ns; });
    if (st != steps.begin()) --st;
    for (; st != steps.end() && st->start_ns < sp.end; ++st) {
      const int64_t lo = std::max(sp.start, st->start_ns);
      const int64_t hi = std::min(sp.end, st->end_ns);
      if (hi <= lo) continue;
      std::vector<double>& v = per_step[job.apis()[sp.api]];
      v.resize(steps.size(), 0.0);  // steps without the API count as 0
      v[static_cast<size_t>(st - steps.begin())] += static_cast<double>(hi - lo);
    }
  }
  for (auto& [name, v] : per_step) out[name] = median(v);
  return out;
}

// The kernels a stall starved (issue latency below `low`) and what held the host just before
// them: from the raw ops (causesBefore) or, in MODE_SUMMARY, from the host causes the rank sent
// per step (the same rule, applied on the rank; counts by sketch bucket).
struct Starved {
  size_t count = 0;
  std::vector<std::pair<std::string, int>> causes;  // most frequent first
};
Starved starvedBy(const JobModel& job, const RankData& r, double low) {
  Starved out;
  if (!r.steps.empty()) {
    std::map<std::string, int> counts;
    for (const ReceivedStep* st : job.receivedSteps(r.rank)) {
      out.count += countBelow(st->stats.latency, low);
      for (const auto& [api, sketch] : st->causes)
        counts[job.apis()[api]] += static_cast<int>(countBelow(sketch, low));
    }
    for (const CoarseSteps& c : r.coarse_steps) {  // folded steps (JobModel::setCompaction)
      out.count += countBelow(c.latency, low);
      for (const auto& [api, sketch] : c.causes)
        counts[job.apis()[api]] += static_cast<int>(countBelow(sketch, low));
    }
    for (const auto& [name, n] : counts) {
      if (n > 0) out.causes.emplace_back(name, n);
    }
    std::stable_sort(out.causes.begin(), out.causes.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    return out;
  }
  std::vector<const Op*> starved;
  const int64_t after = warmupEnd(job, r.rank);
  for (const Op& op : r.ops) {
    if (op.issue >= after && isGpuOp(job.signatures()[op.sig].kind()) && op.issueLatency() < low)
      starved.push_back(&op);
  }
  out.count = starved.size();
  out.causes = causesBefore(job, r, starved);
  return out;
}

void detectIssueStall(const JobModel& job, const DiagnoseOptions& opt,
                      const std::map<int, ArrivalStats>& arrivals, std::vector<Diagnosis>* out) {
  // A large job compares each rank with every rank's pooled distribution instead of the other
  // ranks' (a 1/n difference), from a bounded quantile sample of each rank: O(n) instead of
  // O(n² × ops) — 10,000 ranks of 120 steps' sketches in well under a second.
  const bool pooled_reference = job.ranks().size() > kExactPeerRanks;
  const size_t cap = pooled_reference
                         ? std::max<size_t>(kRankLatencySample,
                                            static_cast<size_t>(std::max(opt.min_samples * 10, 1)))
                         : kExactRankSample;
  std::map<int, std::vector<double>> lat;
  for (const auto& [rank, r] : job.ranks()) {
    auto v = issueLatencies(job, r, cap);
    if (static_cast<int>(v.size()) >= opt.min_samples * 10) lat[rank] = std::move(v);
  }
  if (lat.size() < 3) return;
  // Every rank's sample, ascending; each rank's own sorted too. Below kExactPeerRanks a rank is
  // compared with the others' values (the pool without its own: leave-one-out, O(pool) a rank
  // by stats::wasserstein1LeaveOneOut instead of building and sorting the others' values for
  // every rank — at 128 summary-mode ranks of a 120 s window that took ~70 s a pass).
  std::vector<double> pooled;
  for (auto& [rank, v] : lat) {
    std::sort(v.begin(), v.end());
    pooled.insert(pooled.end(), v.begin(), v.end());
  }
  std::sort(pooled.begin(), pooled.end());
  std::map<int, double> score;
  std::map<int, double> others_median;
  for (auto& [rank, v] : lat) {
    if (pooled_reference) {
      // W1 by the midpoint rule: the rank's i-th of m sorted values against the pooled
      // quantile at (i + ½)/m.
      double w1 = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        const double q = (static_cast<double>(i) + 0.5) / static_cast<double>(v.size());
        w1 += std::abs(v[i] - stats::quantileSorted(pooled, q));
      }
      score[rank] = w1 / static_cast<double>(v.size());
      others_median[rank] = stats::quantileSorted(pooled, 0.5);
      continue;
    }
    others_median[rank] = stats::quantileLeaveOneOut(pooled, v, 0.5);
    score[rank] = stats::wasserstein1LeaveOneOut(pooled, v);
  }
  std::vector<double> scores;
  for (const auto& [rank, s] : score) scores.push_back(s);
  const double fence = tukeyUpperFence(scores, opt.tukey_alpha);
  // Second signal: GPU idle time per step. The stalled rank's GPU has nothing to run while its
  // host is stuck; its peers' GPUs are not idle but waiting inside a collective kernel.
  const auto idle = idlePerStep(job);
  double idle_fence = 0, idle_floor = 0, idle_median = 0;
  {
    std::vector<double> values, steps;
    for (const auto& [rank, v] : idle) {
      values.push_back(v.first);
      steps.push_back(v.second);
    }
    idle_fence = values.size() >= 3 ? tukeyUpperFence(values, opt.tukey_alpha) : 0;
    idle_median = values.empty() ? 0 : median(values);
    idle_floor = steps.empty() ? 0 : opt.idle_min_share * median(steps);
  }
  // Third signal, paired by step: a small stall in every step lowers this rank's mean issue
  // latency below its peers' in (nearly) every step, though not enough to move the pooled W1
  // beyond the ranks' spread (docs/metrics.md).
  const StepIssueLatency per_step = stepIssueLatency(job);
  std::map<int, PairedStall> paired;
  std::vector<double> delays;
  const std::vector<PairedStall> tests = pairedStallTests(per_step);
  for (size_t i = 0; i < per_step.ranks.size(); ++i) {
    paired[per_step.ranks[i]] = tests[i];
    delays.push_back(tests[i].median_delay_ns);
  }
  // The idle signal must hold step by step too: a stalled host idles its GPU in (nearly) every
  // step, while on a shared host the scheduler's delays land on one rank in some steps and on
  // another in others, and one rank's median can exceed the others' by chance.
  std::map<int, stats::SignTestResult> idle_steps;
  {
    const auto excess = stats::excessOverPeersAll(per_step.idle, 2);
    for (size_t i = 0; i < per_step.ranks.size(); ++i)
      idle_steps[per_step.ranks[i]] = stats::signTest(excess[i]);
  }
  // The rank's median delay must also stand out from the ranks' (Tukey fence): on a shared host
  // one rank's process may be scheduled a little later in every step, consistently but by no more
  // than the others differ among themselves.
  const double delay_fence =
      delays.size() >= 3 ? tukeyUpperFence(delays, opt.tukey_alpha) : INFINITY;
  std::optional<Starved> all_starved;  // pooled_reference: every rank's, summed
  std::optional<std::map<int, std::map<std::string, double>>> api_time;  // apiTimePerStep
  std::map<std::string, int> all_counts;
  for (const auto& [rank, s] : score) {
    const double floor = std::max(opt.issue_w1_floor_ns, 0.2 * std::abs(others_median[rank]));
    const double own_median = median(lat[rank]);
    const bool latency_outlier = s > fence && s > floor && own_median < others_median[rank];
    const PairedStall* pair = paired.count(rank) ? &paired.at(rank) : nullptr;
    const bool paired_outlier =
        pair != nullptr && pair->p_adjusted <= opt.stall_paired_alpha &&
        pair->median_delay_ns >= opt.stall_paired_min_share * per_step.median_step_ns &&
        pair->median_delay_ns > delay_fence;
    double idle_excess = 0;
    bool idle_outlier = false;
    if (auto it = idle.find(rank); it != idle.end() && idle.size() >= 3) {
      double others_idle = idle_median;  // pooled_reference: every rank's
      if (!pooled_reference) {
        std::vector<double> others;
        for (const auto& [o, v] : idle) {
          if (o != rank) others.push_back(v.first);
        }
        others_idle = median(others);
      }
      idle_excess = it->second.first - others_idle;
      const auto steps = idle_steps.find(rank);
      idle_outlier = it->second.first > idle_fence && idle_excess > idle_floor &&
                     steps != idle_steps.end() &&
                     steps->second.p_value * static_cast<double>(per_step.ranks.size()) <=
                         opt.idle_steps_alpha;
    }
    if (!latency_outlier && !idle_outlier && !paired_outlier) continue;
    // The starved kernels: issued when the GPU had nothing queued (issue latency below the
    // other ranks' 5th percentile).
    const double low = pooled_reference ? stats::quantileSorted(pooled, 0.05)
                                        : stats::quantileLeaveOneOut(pooled, lat[rank], 0.05);
    const RankData& r = job.ranks().at(rank);
    const Starved starved = starvedBy(job, r, low);
    Diagnosis d;
    d.kind = "issue_stall";
    d.team = Team::kAlgorithm;
    d.cause = "host stall";
    d.ranks = {rank};
    d.severity = s / std::max(1.0, std::abs(others_median[rank]));
    d.evidence.push_back({"issue_latency_w1",
                          "issue-latency distribution W1 " + fmtMs(s) +
                              " from the other ranks (fence " + fmtMs(fence) + "); median " +
                              fmtMs(own_median) + " vs " + fmtMs(others_median[rank]),
                          s, fence});
    if (pair != nullptr && pair->steps > 0 && (paired_outlier || pair->p_adjusted <= 0.5)) {
      // Shown as supporting evidence also when the paired test alone does not reach its level;
      // then it says so, and its effect does not raise the severity (severity follows the tests
      // that hold: an alert is never more severe than its significant evidence).
      char text[400];
      std::snprintf(
          text, sizeof(text),
          "its host issued each step's work later than the other ranks' median in %zu of "
          "%zu steps, by %.3f ms per step (median; %.1f%% of the step; issue latency %.3f "
          "ms lower); sign test p = %.2g, x%zu ranks = %.2g (%s %.2g)",
          pair->later, pair->steps, pair->median_delay_ns / 1e6,
          per_step.median_step_ns > 0 ? 100 * pair->median_delay_ns / per_step.median_step_ns : 0.0,
          pair->latency_shift_ns / 1e6, pair->p_value, per_step.ranks.size(), pair->p_adjusted,
          paired_outlier ? "significant at" : "supporting only: not significant on its own at",
          opt.stall_paired_alpha);
      d.evidence.push_back({"issue_delay_paired", text, pair->median_delay_ns,
                            opt.stall_paired_min_share * per_step.median_step_ns});
      if (paired_outlier && per_step.median_step_ns > 0)
        d.severity = std::max(d.severity, pair->median_delay_ns / per_step.median_step_ns);
    }
    if (idle_excess > 0) {
      std::string steps_text;
      if (auto t = idle_steps.find(rank); t != idle_steps.end() && t->second.n > 0) {
        char buf[128];
        std::snprintf(buf, sizeof(buf), " (above them in %zu of %zu steps, sign test p = %.2g%s)",
                      t->second.positive, t->second.n, t->second.p_value,
                      idle_outlier ? "" : "; supporting only");
        steps_text = buf;
      }
      d.evidence.push_back({"gpu_idle",
                            "GPU idle " + fmtMs(idle.at(rank).first) + " per step, " +
                                fmtMs(idle_excess) + " more than the other ranks' median" +
                                steps_text,
                            idle.at(rank).first, idle.at(rank).first - idle_excess});
    }
    d.evidence.push_back({"starved_kernels",
                          std::to_string(starved.count) +
                              " kernels issued to an idle GPU (issue "
                              "latency below the other ranks' 5th percentile, " +
                              fmtMs(low) + ")",
                          static_cast<double>(starved.count), 0});
    if (auto arrival = arrivalEvidence(arrivals, rank)) d.evidence.push_back(*arrival);
    // A cause is named when it precedes this rank's starved kernels clearly more often than
    // it precedes the other ranks' low-latency kernels (a per-step loss.item() drains every
    // rank's GPU alike and is not this rank's problem).
    std::map<std::string, int> other_counts;
    size_t other_starved = 0;
    if (pooled_reference) {
      // One `low` for every rank: the job's totals once, this rank's own taken out.
      if (!all_starved) {
        all_starved.emplace();
        for (const auto& [o, ro] : job.ranks()) {
          const Starved low_ops = starvedBy(job, ro, low);
          all_starved->count += low_ops.count;
          for (const auto& [name, n] : low_ops.causes) all_counts[name] += n;
        }
      }
      other_starved = all_starved->count - starved.count;
      other_counts = all_counts;
      for (const auto& [name, n] : starved.causes) other_counts[name] -= n;
    } else {
      for (const auto& [o, ro] : job.ranks()) {
        if (o == rank) continue;
        const Starved low_ops = starvedBy(job, ro, low);
        other_starved += low_ops.count;
        for (const auto& [name, n] : low_ops.causes) other_counts[name] += n;
      }
    }
    std::string named;
    for (const auto& [name, n] : starved.causes) {
      const double share =
          starved.count == 0 ? 0 : static_cast<double>(n) / static_cast<double>(starved.count);
      const double other_share =
          other_starved ? static_cast<double>(other_counts[name]) / other_starved : 0;
      if (share >= 0.25 && share >= 2 * other_share) {
        named = name;
        d.evidence.push_back({"api_before",
                              named + " held the host just before " + std::to_string(n) + " of " +
                                  std::to_string(starved.count) + " starved kernels (" +
                                  fmtPct(other_share) + " on the other ranks)",
                              share, other_share});
        break;
      }
    }
    if (named.empty() && idle_excess > 0) {
      // The most specific traced API (the smallest that qualifies: a GC pause rather than the
      // backward() call around it) whose host time per step exceeds the other ranks' by at
      // least half this rank's excess GPU idle.
      if (!api_time) {
        api_time.emplace();
        for (const auto& [o, ro] : job.ranks()) (*api_time)[o] = apiTimePerStep(job, o);
      }
      const auto& mine = api_time->at(rank);
      double best_excess = INFINITY, best_others = 0;
      for (const auto& [name, ns] : mine) {
        std::vector<double> others;
        for (const auto& [o, times] : *api_time) {
          if (o == rank && !pooled_reference) continue;
          const auto t = times.find(name);
          others.push_back(t == times.end() ? 0.0 : t->second);
        }
        const double others_ns = others.empty() ? 0.0 : median(others);
        const double excess = ns - others_ns;
        if (excess >= 0.5 * idle_excess && excess < best_excess) {
          best_excess = excess;
          best_others = others_ns;
          named = name;
        }
      }
      if (!named.empty()) {
        d.evidence.push_back(
            {"api_time",
             named + " held the host " + fmtMs(mine.at(named)) + " per step on this rank vs " +
                 fmtMs(best_others) + " on the other ranks (median): " +
                 fmtPct(std::min(1.0, best_excess / idle_excess)) + " of its excess GPU idle",
             mine.at(named), best_others});
      }
    }
    d.summary = "rank " + std::to_string(rank) +
                ": kernel-issue stall on the host — its GPU runs dry while the host is busy" +
                (named.empty() ? std::string(" (no traced API ran just before; trace GC and "
                                             "suspects with TRACED_PYTHON_API)")
                               : " (likely cause: " + named + ")");
    out->push_back(std::move(d));
  }
}

// ---- issue-latency regression against a healthy baseline -----------------------------------

// Names what this job calls clearly more often than the baseline: the traced Python API first
// (what the algorithm team changes), then the host synchronization call it makes.
void nameRegressionCause(const ApiRates& now_rates, const ApiRates& base_rates, Diagnosis* d) {
  auto grown = [d](const std::map<std::string, double>& now,
                   const std::map<std::string, double>& before) {
    std::string best_name;
    double best = 0;
    for (const auto& [name, rate] : now) {
      auto it = before.find(name);
      const double was = it == before.end() ? 0 : it->second;
      if (rate - was > best && rate - was > 0.2 * rate) {
        best = rate - was;
        best_name = name;
      }
    }
    if (!best_name.empty()) {
      auto it = before.find(best_name);
      d->evidence.push_back({"api_rate",
                             best_name + " runs " + fmtNum(now.at(best_name) * 1000, "") +
                                 "times per 1000 GPU ops vs " +
                                 fmtNum(it == before.end() ? 0 : it->second * 1000, "") +
                                 "in the baseline",
                             now.at(best_name), it == before.end() ? 0 : it->second});
    }
    return best_name;
  };
  const std::string api = grown(now_rates.spans, base_rates.spans);
  const std::string sync = grown(now_rates.syncs, base_rates.syncs);
  std::string named = api;
  if (!sync.empty()) named += named.empty() ? sync : " (which calls " + sync + ")";
  d->summary = "job: issue-latency regression against healthy history" +
               (named.empty() ? std::string() : " (likely cause: " + named + ")");
}

void detectRegression(const JobModel& job, const JobModel& baseline, const DiagnoseOptions& opt,
                      std::vector<Diagnosis>* out) {
  std::vector<double> all, base_all;
  std::map<int, std::vector<double>> base_ranks;
  for (const auto& [rank, r] : job.ranks()) {
    auto v = issueLatencies(job, r);
    all.insert(all.end(), v.begin(), v.end());
  }
  for (const auto& [rank, r] : baseline.ranks()) {
    base_ranks[rank] = issueLatencies(baseline, r);
    base_all.insert(base_all.end(), base_ranks[rank].begin(), base_ranks[rank].end());
  }
  if (all.size() < 30 || base_all.size() < 30) return;
  // Kernel-issue stalls move the lower half of the distribution toward zero; the upper tail
  // (how far the host runs ahead) varies from run to run and rank to rank and would drown the
  // signal. Both distributions are clipped at the baseline's median before W1 (docs/metrics.md).
  const double cap = median(base_all);
  auto clip = [cap](std::vector<double>* v) {
    for (double& x : *v) x = std::min(x, cap);
  };
  clip(&all);
  clip(&base_all);
  for (auto& [rank, v] : base_ranks) clip(&v);
  // Healthy spread: measured between healthy runs when several were given; else the largest W1
  // of a baseline rank to the baseline as a whole (the one-baseline proxy).
  double threshold = std::max(opt.regression_w1_floor_ns, opt.regression_relative_floor * cap);
  const bool measured = opt.regression_healthy_spread_ns > 0;
  if (measured) {
    threshold =
        std::max(threshold, opt.regression_spread_factor * opt.regression_healthy_spread_ns);
  } else {
    for (const auto& [rank, v] : base_ranks) {
      if (v.size() >= 30) threshold = std::max(threshold, wasserstein1(v, base_all));
    }
  }
  const double w1 = wasserstein1(all, base_all);
  if (w1 <= threshold) return;
  Diagnosis d;
  d.kind = "issue_latency_regression";
  d.team = Team::kAlgorithm;
  d.cause = "issue latency";
  d.severity = w1 / threshold - 1.0;
  d.evidence.push_back(
      {"issue_latency_w1",
       "job issue-latency distribution (clipped at the baseline median) W1 " + fmtMs(w1) +
           " from the healthy baseline (threshold " + fmtMs(threshold) +
           (measured ? ", twice the largest W1 between healthy runs"
                     : ", the largest W1 of a baseline rank to its run") +
           ", at least " + fmtPct(opt.regression_relative_floor) + " of the baseline median" +
           "); median " + fmtMs(median(all)) + " vs " + fmtMs(median(base_all)),
       w1, threshold});
  nameRegressionCause(apiRates(job), apiRates(baseline), &d);
  out->push_back(std::move(d));
}

// The same detector against stored healthy history (history.h): the job's distribution against
// the baseline runs' merged sketch, both clipped at its median, with the learned threshold.
void detectRegressionFromHistory(const JobModel& job, const History& history,
                                 std::vector<Diagnosis>* out) {
  if (history.runs == 0 || history.issue_latency.count() < 30) return;
  stats::LatencySketch sketch;
  for (const auto& [rank, r] : job.ranks()) {
    for (double v : issueLatencies(job, r)) sketch.add(v);
  }
  if (sketch.count() < 30) return;
  const double w1 = clippedW1(sketch, history.issue_latency, history.issue_cap_ns);
  const double threshold = history.issue_w1_threshold_ns;
  if (!(w1 > threshold) || threshold <= 0) return;
  Diagnosis d;
  d.kind = "issue_latency_regression";
  d.team = Team::kAlgorithm;
  d.cause = "issue latency";
  d.severity = w1 / threshold - 1.0;
  d.evidence.push_back(
      {"issue_latency_w1",
       "job issue-latency distribution (clipped at the history median) W1 " + fmtMs(w1) + " from " +
           std::to_string(history.runs) + " healthy baseline run" + (history.runs > 1 ? "s" : "") +
           " (learned threshold " + fmtMs(threshold) + "); median " + fmtMs(sketch.quantile(0.5)) +
           " vs " + fmtMs(history.issue_latency.quantile(0.5)),
       w1, threshold});
  nameRegressionCause(apiRates(job), {history.api_rate, history.sync_rate}, &d);
  out->push_back(std::move(d));
}

// ---- D. void percentages --------------------------------------------------------------------

// Per rank: V_inter and V_minority per step (the first skipped).
struct VoidSteps {
  std::vector<double> v_inter, v_minority;
};
std::map<int, VoidSteps> voidPerStep(const JobModel& job) {
  std::map<int, VoidSteps> result;
  for (const auto& [rank, r] : job.ranks()) {
    // The shared per-step definition (src/records/step_stats.h), the first step skipped (warm-up).
    const auto steps = job.stepStats(rank);
    std::vector<double> v_inter, v_minority;
    for (const records::StepStats& st : steps) {
      if (st.step == 0) continue;
      v_inter.push_back(st.vInter());
      if (st.end_ns - st.start_ns - st.inter_ns > 0) v_minority.push_back(st.vMinority());
    }
    if (v_inter.empty()) continue;
    result[rank] = {std::move(v_inter), std::move(v_minority)};
  }
  return result;
}

// A void threshold learned from a healthy baseline (docs/metrics.md): the largest per-rank median
// of the baseline plus the larger of `min_delta` and 1.5 × the IQR of its per-step values (a rank
// whose median moved by less than the baseline's own step-to-step spread is not a regression).
std::optional<double> learnedVoidThreshold(const std::map<int, VoidSteps>& base,
                                           std::vector<double> VoidSteps::*field,
                                           double min_delta) {
  std::vector<double> pooled;
  double top = -1;
  for (const auto& [rank, v] : base) {
    const std::vector<double>& x = v.*field;
    if (x.empty()) continue;
    top = std::max(top, median(x));
    pooled.insert(pooled.end(), x.begin(), x.end());
  }
  if (top < 0 || pooled.size() < 3) return std::nullopt;
  const auto f = stats::tukeyFences(pooled, 1.5);
  return top + std::max(min_delta, 1.5 * f.iqr);
}

// Thresholds: learned from a healthy baseline run (offline) or from stored healthy history
// (flared), else the configured ones.
void detectVoid(const JobModel& job, const DiagnoseOptions& opt, const JobModel* baseline,
                const History* history, std::vector<Diagnosis>* out) {
  double inter_threshold = opt.v_inter_threshold, minority_threshold = opt.v_minority_threshold;
  std::string inter_source = "fixed", minority_source = "fixed";
  if (history != nullptr && history->v_inter_threshold) {
    inter_threshold = *history->v_inter_threshold;
    inter_source = "learned from healthy history";
  }
  if (history != nullptr && history->v_minority_threshold) {
    minority_threshold = *history->v_minority_threshold;
    minority_source = "learned from healthy history";
  }
  if (baseline != nullptr) {
    const auto base = voidPerStep(*baseline);
    if (auto t = learnedVoidThreshold(base, &VoidSteps::v_inter, opt.void_learned_min_delta)) {
      inter_threshold = *t;
      inter_source = "learned from the healthy baseline";
    }
    if (auto t = learnedVoidThreshold(base, &VoidSteps::v_minority, opt.void_learned_min_delta)) {
      minority_threshold = *t;
      minority_source = "learned from the healthy baseline";
    }
  }
  std::vector<int> inter_ranks, minority_ranks;
  std::vector<double> inter_values, minority_values;
  for (const auto& [rank, v] : voidPerStep(job)) {
    const double vi = median(v.v_inter);
    const double vm = v.v_minority.empty() ? 0 : median(v.v_minority);
    if (vi > inter_threshold) {
      inter_ranks.push_back(rank);
      inter_values.push_back(vi);
    }
    if (vm > minority_threshold) {
      minority_ranks.push_back(rank);
      minority_values.push_back(vm);
    }
  }
  if (!inter_ranks.empty()) {
    Diagnosis d;
    d.kind = "void_inter";
    d.team = Team::kAlgorithm;
    d.cause = "input pipeline";
    d.ranks = inter_ranks;
    const double v = median(inter_values);
    d.severity = v;
    d.evidence.push_back({"v_inter",
                          "V_inter (GPU idle around the DataLoader call) " + fmtPct(v) +
                              " of the step, median over steps and ranks (threshold " +
                              fmtPct(inter_threshold) + ", " + inter_source + ")",
                          v, inter_threshold});
    d.summary = "ranks " + rankList(inter_ranks) + ": the GPU waits for input — " + fmtPct(v) +
                " of each step is spent around the DataLoader's __next__";
    out->push_back(std::move(d));
  }
  if (!minority_ranks.empty()) {
    Diagnosis d;
    d.kind = "void_minority";
    d.team = Team::kAlgorithm;
    d.cause = "minority kernels";
    d.ranks = minority_ranks;
    const double v = median(minority_values);
    d.severity = v;
    d.evidence.push_back({"v_minority",
                          "V_minority (time in kernels other than GEMM, attention and "
                          "communication) " +
                              fmtPct(v) + " of the busy step (threshold " +
                              fmtPct(minority_threshold) + ", " + minority_source + ")",
                          v, minority_threshold});
    d.summary = "ranks " + rankList(minority_ranks) + ": minority kernels take " + fmtPct(v) +
                " of the step (elementwise/normalization work that fusion could remove)";
    out->push_back(std::move(d));
  }
}

// ---- E. un-optimized GEMM ---------------------------------------------------------------------

// The duration at quantile `q` of (duration, how many ops took it) pairs: the smallest value
// whose cumulative count reaches q × total. Reorders `v`; 0 when empty.
double weightedQuantile(std::vector<std::pair<double, uint64_t>>& v, uint64_t total, double q) {
  if (v.empty() || total == 0) return 0;
  std::sort(v.begin(), v.end());
  const double target = std::max(1.0, std::ceil(q * static_cast<double>(total)));
  uint64_t seen = 0;
  for (const auto& [value, count] : v) {
    seen += count;
    if (static_cast<double>(seen) >= target) return value;
  }
  return v.back().first;
}

void detectUnoptimized(const JobModel& job, const DiagnoseOptions& opt,
                       std::vector<Diagnosis>* out) {
  // Per GEMM signature after the ranks' warm-up: the TFLOPS of its median call (what every call
  // pays: misalignment) and of its fast calls (the 10th percentile: what the kernel cuBLAS picked
  // for the shape reaches when nothing around it slows the GPU down), the GPU time, the flops
  // of one call and its arithmetic intensity.
  struct Stat {
    double tflops = 0;       // median call
    double fast_tflops = 0;  // 10th-percentile duration
    double time = 0;
    double flops = 0;
    double intensity = 0;  // flops per byte of A, B and C; 0 when the shape is unknown
    bool misaligned = false;
  };
  std::map<uint32_t, Stat> stats;
  // Per GEMM signature: (duration, how many ops took it) — raw ops one each; in MODE_SUMMARY
  // each cluster's median for its count — the total time, and the flops of one call.
  struct Durations {
    std::vector<std::pair<double, uint64_t>> values;
    uint64_t count = 0;
    double time = 0;
    uint64_t flops = 0;
  };
  auto measure = [&](uint32_t sig_id, Durations& d) {
    if (d.count < static_cast<uint64_t>(std::max(opt.min_samples, 1))) return;
    const auto& sig = job.signatures()[sig_id];
    const double flops = static_cast<double>(sig.flops_per_call() ? sig.flops_per_call() : d.flops);
    const double m = stats::weightedMedian(d.values, d.count);
    const double fast = weightedQuantile(d.values, d.count, 0.1);
    if (m <= 0 || fast <= 0 || flops <= 0) return;
    Stat st{flops / m / 1e3, flops / fast / 1e3, d.time, flops, 0, false};
    const auto dt = statsDtype(sig.dtype());
    if (dt && sig.shape_size() >= 3) {
      const double b = sig.shape_size() >= 4 ? static_cast<double>(sig.shape(3)) : 1.0;
      const double mm = static_cast<double>(sig.shape(0)), nn = static_cast<double>(sig.shape(1)),
                   kk = static_cast<double>(sig.shape(2));
      const double bytes = stats::dtypeBytes(*dt) * b * (mm * kk + kk * nn + mm * nn);
      if (bytes > 0) st.intensity = flops / bytes;
      st.misaligned = !stats::gemmAlignmentIssues(sig.shape(0), sig.shape(1), sig.shape(2),
                                                  stats::dtypeBytes(*dt))
                           .empty();
    }
    stats[sig_id] = st;
  };
  // Raw ops (a raw-mode window holds at most --max-ops-per-rank a rank), after the rank's
  // warm-up (its first step: lazy module loading, cuBLAS heuristics and cold caches make a
  // shape's first calls 10–1000× slower).
  std::map<uint32_t, Durations> durations;
  for (const auto& [rank, r] : job.ranks()) {
    const int64_t warm = warmupEnd(job, rank);
    for (const Op& op : r.ops) {
      const auto& sig = job.signatures()[op.sig];
      if (sig.kind() != flare::v1::OP_KIND_GEMM || op.flops < opt.unoptimized_min_flops) continue;
      if (op.start < warm) continue;
      Durations& d = durations[op.sig];
      d.values.emplace_back(static_cast<double>(op.duration()), 1);
      d.count += 1;
      d.time += static_cast<double>(op.duration());
      if (d.flops == 0) d.flops = op.flops;
    }
  }
  // Kernel summaries, one GEMM signature at a time over every rank (each rank's windows in the
  // order they arrived, those of its warm-up left out): only one signature's cluster medians are
  // held at once.
  std::vector<char> gemm(job.signatures().size());
  for (size_t i = 0; i < gemm.size(); ++i)
    gemm[i] = job.signatures()[i].kind() == flare::v1::OP_KIND_GEMM;
  const SummaryIndex index = indexSummaries(job, gemm, true);
  for (const uint32_t sig_id : index.sigs) {
    const auto& sig = job.signatures()[sig_id];
    auto from_ops = durations.extract(sig_id);  // the signature's raw ops, if any, come first
    Durations d = from_ops ? std::move(from_ops.mapped()) : Durations{};
    for (const SummaryIndex::Rank& rw : index.ranks) {
      const SummaryIndex::Run* run = rw.find(sig_id);
      if (run == nullptr) continue;
      for (uint32_t k = run->hi; k-- > run->lo;) {
        const SummaryWindow& w = rw.window(k);
        // The flops of one call: the summary's total over its count (else the hook's GEMM
        // count, 2·m·n·k·batch of the shape).
        const uint64_t n_ops = w.count();
        const uint64_t flops = w.flops > 0 && n_ops > 0
                                   ? static_cast<uint64_t>(w.flops / static_cast<double>(n_ops))
                                   : gemmFlops(sig);
        if (flops < opt.unoptimized_min_flops) continue;
        for (const WindowCluster& c : w.clusters) {
          d.values.emplace_back(c.p50, c.count);
          d.count += c.count;
          d.time += c.sum;
        }
        if (d.flops == 0) d.flops = flops;
      }
    }
    measure(sig_id, d);
  }
  for (auto& [sig_id, d] : durations) measure(sig_id, d);
  // The reference for a shape: the best of the job's *alike* aligned GEMMs — same dtype, flops
  // per call and arithmetic intensity each within a factor of `unoptimized_alike_factor` — by
  // the same statistic. A small or thin GEMM cannot reach what the job's largest one does (too
  // few tiles for the SMs, too little work per byte), so it is only held to shapes like it.
  auto alike = [&](uint32_t a, const Stat& sa, uint32_t b, const Stat& sb) {
    if (a == b || sb.misaligned) return false;
    if (job.signatures()[a].dtype() != job.signatures()[b].dtype()) return false;
    const double f = opt.unoptimized_alike_factor;
    auto near = [f](double x, double y) { return x > 0 && y > 0 && x <= f * y && y <= f * x; };
    if (!near(sa.flops, sb.flops)) return false;
    return sa.intensity == 0 || sb.intensity == 0 || near(sa.intensity, sb.intensity);
  };
  // One diagnosis for the job (duplicates merged): every slow GEMM shape as evidence, the ones
  // with the most GPU time first.
  struct Slow {
    uint32_t sig;
    double tflops, ref, time;
    std::string hint;
    std::string device;  // set when the reference is the device's expected TFLOPS
  };
  // The device of the job's ranks (the lowest rank that reported one) in the peak table.
  const stats::PeakTable& peaks = opt.peaks != nullptr ? *opt.peaks : stats::PeakTable::builtin();
  const stats::DevicePeak* device = nullptr;
  for (const auto& [rank, r] : job.ranks()) {
    if (!r.device_name.empty()) {
      device = peaks.find(r.device_name);
      break;
    }
  }
  std::vector<Slow> slow;
  for (const auto& [sig_id, st] : stats) {
    const auto& sig = job.signatures()[sig_id];
    double ref_median = 0, ref_fast = 0;
    for (const auto& [other_id, other] : stats) {
      if (!alike(sig_id, st, other_id, other)) continue;
      ref_median = std::max(ref_median, other.tflops);
      ref_fast = std::max(ref_fast, other.fast_tflops);
    }
    // A misaligned shape (a dimension whose bytes are not a multiple of 128): every call pays,
    // so its median call is held to `unoptimized_misaligned_ratio` of alike aligned shapes; the
    // fix (pad the dimension) is the team's to make. An aligned shape only when even its fast
    // calls are below `unoptimized_ratio` of theirs (on a real GPU alike aligned shapes differ by
    // up to ~35%: layout, clock ramp after an idle GPU).
    double value = 0, ref = 0;
    if (st.misaligned && ref_median > 0 &&
        st.tflops < opt.unoptimized_misaligned_ratio * ref_median) {
      value = st.tflops;
      ref = ref_median;
    } else if (!st.misaligned && ref_fast > 0 &&
               st.fast_tflops < opt.unoptimized_ratio * ref_fast) {
      value = st.fast_tflops;
      ref = ref_fast;
    }
    const bool below_alike = ref > 0;
    // Against the device: the shape's expected TFLOPS ([m, n, k, batch] as the hook records).
    double expected = 0;
    const auto dt = statsDtype(sig.dtype());
    if (device != nullptr && dt && sig.shape_size() >= 3) {
      expected = stats::expectedGemm(*device, *dt, sig.shape_size() >= 4 ? sig.shape(3) : 1,
                                     sig.shape(0), sig.shape(1), sig.shape(2))
                     .expectedTflops;
    }
    const bool below_device = expected > 0 && st.tflops < opt.unoptimized_peak_ratio * expected;
    if (!below_alike && !below_device) continue;
    if (!below_alike) {  // the evidence then names the device's expectation
      value = st.tflops;
      ref = expected;
    }
    // Alignment hint: a dimension whose bytes are not a multiple of 128.
    std::string hint;
    if (dt && sig.shape_size() >= 3)
      hint = stats::gemmAlignmentHint(sig.shape(0), sig.shape(1), sig.shape(2), *dt);
    slow.push_back({sig_id, value, ref, st.time, hint, below_alike ? std::string() : device->name});
  }
  if (slow.empty()) return;
  std::sort(slow.begin(), slow.end(), [](const Slow& a, const Slow& b) { return a.time > b.time; });
  Diagnosis d;
  d.kind = "unoptimized_gemm";
  d.team = Team::kInfrastructure;
  d.cause = "kernel shape";
  double worst = 1.0;
  for (const Slow& x : slow) worst = std::min(worst, x.tflops / x.ref);
  d.severity = 1.0 - worst;
  for (const Slow& x : slow) {
    const auto& sig = job.signatures()[x.sig];
    d.evidence.push_back({"tflops",
                          sig.name() + " " + shapeText(sig) + " " + sig.layout() + ": " +
                              fmtNum(x.tflops, "TFLOPS") + " vs " + fmtNum(x.ref, "TFLOPS") +
                              (x.device.empty() ? std::string(" for alike GEMMs of the job")
                                                : " expected for this shape on " + x.device) +
                              (x.hint.empty() ? std::string() : " — " + x.hint),
                          x.tflops, x.ref});
  }
  const Slow& top = slow.front();
  d.summary = std::to_string(slow.size()) + " GEMM shape" + (slow.size() > 1 ? "s run" : " runs") +
              " at " + fmtPct(worst) + "–" +
              fmtPct(std::max_element(slow.begin(), slow.end(),
                                      [](const Slow& a, const Slow& b) {
                                        return a.tflops / a.ref < b.tflops / b.ref;
                                      })
                         ->tflops /
                     top.ref) +
              (top.device.empty() ? std::string(" of what alike GEMMs of the job reach")
                                  : " of the TFLOPS expected for the shape on " + top.device) +
              (top.hint.empty() ? std::string() : "; e.g. " + top.hint);
  out->push_back(std::move(d));
}

}  // namespace

const char* teamName(Team team) {
  switch (team) {
    case Team::kOperations:
      return "operations";
    case Team::kAlgorithm:
      return "algorithm";
    case Team::kInfrastructure:
      return "infrastructure";
  }
  return "infrastructure";
}

std::optional<Evidence> arrivalEvidence(const std::map<int, ArrivalStats>& arrivals, int rank) {
  auto a = arrivals.find(rank);
  if (a == arrivals.end() || a->second.instances == 0) return std::nullopt;
  const double share = static_cast<double>(a->second.last) / a->second.instances;
  return Evidence{"collective_arrival",
                  "arrives last at " + fmtPct(share) + " of its collectives (" +
                      std::to_string(a->second.last) + " of " +
                      std::to_string(a->second.instances) + ")",
                  share, 0};
}

std::map<int, ArrivalStats> collectiveArrivals(const JobModel& job) {
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::pair<int, const Op*>>> instances;
  for (const auto& [rank, r] : job.ranks()) {
    for (const Op& op : r.ops) {
      if (job.signatures()[op.sig].kind() == flare::v1::OP_KIND_COLLECTIVE && op.comm != 0)
        instances[{op.comm, op.seq}].push_back({rank, &op});
    }
  }
  std::map<int, ArrivalStats> out;
  std::map<int, double> wait_sum;
  for (const auto& [key, members] : instances) {
    if (members.size() < 2 || static_cast<int>(members.size()) != members[0].second->nranks)
      continue;
    const auto last = std::max_element(
        members.begin(), members.end(),
        [](const auto& a, const auto& b) { return a.second->start < b.second->start; });
    for (const auto& [rank, op] : members) {
      ArrivalStats& s = out[rank];
      ++s.instances;
      wait_sum[rank] += static_cast<double>(op->duration());
    }
    ++out[last->first].last;
  }
  for (auto& [rank, s] : out) s.mean_wait_ns = s.instances ? wait_sum[rank] / s.instances : 0;
  return out;
}

namespace {

// The job's step time per step from step 1 on (series[i] is step i + 1): the median over ranks
// of each rank's step (a synchronous job steps together; the median ignores one rank's missing
// marker). Empty without step boundaries.
std::vector<double> jobStepSeries(const JobModel& job) {
  size_t steps = SIZE_MAX;
  std::map<int, std::vector<int64_t>> starts;
  for (const auto& [rank, r] : job.ranks()) {
    starts[rank] = job.stepStarts(rank);
    if (starts[rank].size() >= 2) steps = std::min(steps, starts[rank].size() - 1);
  }
  std::vector<double> series;
  if (steps == SIZE_MAX) return series;
  for (size_t i = 1; i < steps; ++i) {  // step 0 is warm-up
    std::vector<double> per_rank;
    for (const auto& [rank, s] : starts) {
      if (s.size() > i + 1) per_rank.push_back(static_cast<double>(s[i + 1] - s[i]));
    }
    series.push_back(median(per_rank));
  }
  return series;
}

}  // namespace

std::optional<Jitter> findJitter(const JobModel& job, const DiagnoseOptions& options) {
  const std::vector<double> series = jobStepSeries(job);
  if (series.size() < 2 * options.jitter_min_spikes + 2) return std::nullopt;
  const double med = median(series);
  const auto fences = stats::tukeyFences(series, 3.0);
  const double threshold = std::max(fences.upper, med * (1.0 + options.jitter_min_relative));
  Jitter j;
  std::vector<double> spikes;
  for (size_t i = 0; i < series.size(); ++i) {
    if (series[i] > threshold) {
      j.steps.push_back(i + 1);
      spikes.push_back(series[i]);
    }
  }
  if (j.steps.size() < options.jitter_min_spikes ||
      static_cast<double>(j.steps.size()) > options.jitter_max_share * series.size()) {
    return std::nullopt;
  }
  j.median_ns = med;
  j.spike_ns = median(spikes);
  j.fence_ns = threshold;
  return j;
}

std::optional<FailSlow> findFailSlow(const JobModel& job, const DiagnoseOptions& options) {
  const std::vector<double> series = jobStepSeries(job);
  if (series.size() + 1 < 2 * options.fail_slow_min_steps + 1) return std::nullopt;
  stats::SegmentationOptions seg;
  seg.minSegment = options.fail_slow_min_steps;
  const auto changes = stats::detectMeanShifts(series, seg);
  // The last significant slow-down: what the job is living with now.
  for (auto it = changes.rbegin(); it != changes.rend(); ++it) {
    if (it->relative >= options.fail_slow_min_relative) {
      return FailSlow{it->index + 1, it->before, it->after};
    }
  }
  return std::nullopt;
}

std::vector<double> rankIssueLatencies(const JobModel& job, int rank) {
  auto it = job.ranks().find(rank);
  return it == job.ranks().end() ? std::vector<double>{} : issueLatencies(job, it->second);
}

std::map<int, VoidStats> voidPerRank(const JobModel& job) {
  std::map<int, VoidStats> out;
  for (const auto& [rank, v] : voidPerStep(job)) {
    VoidStats& vs = out[rank];
    vs.v_inter = median(v.v_inter);
    vs.v_minority = v.v_minority.empty() ? 0 : median(v.v_minority);
    vs.steps = v.v_inter.size();
  }
  return out;
}

ApiRates apiRates(const JobModel& m) {
  ApiRates found;
  uint64_t ops = 0;
  for (const auto& [rank, r] : m.ranks()) {
    ops += r.ops.size();
    // MODE_SUMMARY: the summarised ops count too (host spans such as cudaStreamWaitEvent among
    // them, as syncs), so that rates compare across modes.
    for (const SummaryWindow& w : r.summaries) {
      ops += w.count();
      const auto& sig = m.signatures()[w.sig];
      if (sig.kind() == flare::v1::OP_KIND_SYNC && sig.name() != FLARE_STEP_MARKER_NAME)
        found.syncs[sig.name()] += static_cast<double>(w.count());
    }
    for (const Span& s : r.spans) found.spans[m.apis()[s.api]] += 1;
    for (const Op& op : r.ops) {
      const auto& sig = m.signatures()[op.sig];
      if (sig.kind() == flare::v1::OP_KIND_SYNC && sig.name() != FLARE_STEP_MARKER_NAME)
        found.syncs[sig.name()] += 1;
    }
  }
  for (auto* table : {&found.spans, &found.syncs}) {
    for (auto& [name, n] : *table) n /= static_cast<double>(std::max<uint64_t>(ops, 1));
  }
  return found;
}

double healthyIssueLatencySpread(const std::vector<const JobModel*>& baselines) {
  std::vector<std::vector<double>> pooled;
  for (const JobModel* b : baselines) {
    std::vector<double> all;
    for (const auto& [rank, r] : b->ranks()) {
      auto v = issueLatencies(*b, r);
      all.insert(all.end(), v.begin(), v.end());
    }
    if (all.size() >= 30) pooled.push_back(std::move(all));
  }
  if (pooled.size() < 2) return 0;
  const double cap = median(pooled[0]);
  for (auto& v : pooled) {
    for (double& x : v) x = std::min(x, cap);
  }
  double spread = 0;
  for (size_t i = 0; i < pooled.size(); ++i) {
    for (size_t j = i + 1; j < pooled.size(); ++j)
      spread = std::max(spread, wasserstein1(pooled[i], pooled[j]));
  }
  return spread;
}

StepIssueLatency stepIssueLatency(const JobModel& job) {
  StepIssueLatency out;
  std::map<int, std::vector<int64_t>> starts;
  for (const auto& [rank, r] : job.ranks()) {
    auto s = job.stepStarts(rank);
    if (s.size() >= 3) starts[rank] = std::move(s);
  }
  if (starts.size() < 3) return out;
  std::vector<double> step_times;
  for (const auto& [rank, s] : starts) {
    for (size_t i = 1; i + 1 < s.size(); ++i)
      step_times.push_back(static_cast<double>(s[i + 1] - s[i]));
  }
  out.median_step_ns = median(step_times);
  // The grid: the lowest rank's complete steps, the first skipped (warm-up).
  const std::vector<int64_t>& ref = starts.begin()->second;
  const size_t n_steps = ref.size() - 2;
  const double tolerance = 0.5 * out.median_step_ns;
  for (const auto& [rank, s] : starts) {
    std::vector<double> means(n_steps, NAN), offsets(n_steps, NAN), idle(n_steps, NAN);
    // Each step's issue-latency and issue-offset sums (the rank's own in MODE_SUMMARY).
    std::map<int64_t, records::StepStats> by_step;
    for (records::StepStats& st : job.stepStats(rank)) {
      const int64_t k = st.step;
      by_step.insert_or_assign(k, std::move(st));
    }
    for (size_t g = 0; g < n_steps; ++g) {
      const int64_t target = ref[g + 1];
      // This rank's complete step (not its first) starting nearest the grid's step.
      size_t best = 0;
      double best_dist = INFINITY;
      for (size_t i = 1; i + 1 < s.size(); ++i) {
        const double dist = std::abs(static_cast<double>(s[i] - target));
        if (dist < best_dist) {
          best_dist = dist;
          best = i;
        }
      }
      if (best == 0 || best_dist > tolerance) continue;
      auto st = by_step.find(static_cast<int64_t>(best));
      if (st == by_step.end() || st->second.gpu_ops < 1) continue;
      const auto n = static_cast<double>(st->second.gpu_ops);
      means[g] = st->second.issue_latency_sum_ns / n;
      offsets[g] = st->second.issue_offset_sum_ns / n;
      idle[g] = static_cast<double>(st->second.end_ns - st->second.start_ns) -
                static_cast<double>(st->second.gpu_busy_ns);
    }
    out.ranks.push_back(rank);
    out.means.push_back(std::move(means));
    out.offsets.push_back(std::move(offsets));
    out.idle.push_back(std::move(idle));
  }
  return out;
}

namespace {

// The test from a rank's per-step excess offsets (`delay`) and excess issue latencies.
PairedStall pairedFrom(const std::vector<double>& delay, std::vector<double> shift, size_t ranks) {
  PairedStall out;
  const stats::SignTestResult t = stats::signTest(delay);
  out.steps = delay.size();
  out.later = t.positive;
  out.p_value = t.p_value;
  out.p_adjusted = std::min(1.0, t.p_value * static_cast<double>(ranks));
  out.median_delay_ns = delay.empty() ? 0 : median(delay);
  for (double& x : shift) x = -x;
  out.latency_shift_ns = shift.empty() ? 0 : median(shift);
  return out;
}

}  // namespace

PairedStall pairedStallTest(const StepIssueLatency& s, size_t rank_index) {
  if (rank_index >= s.offsets.size() || s.offsets.size() < 3) return {};
  // Positive = this rank's host issued the step's work later than its peers' median.
  return pairedFrom(stats::excessOverPeers(s.offsets, rank_index, 2),
                    stats::excessOverPeers(s.means, rank_index, 2), s.ranks.size());
}

std::vector<PairedStall> pairedStallTests(const StepIssueLatency& s) {
  std::vector<PairedStall> out(s.offsets.size());
  if (s.offsets.size() < 3) return out;
  const auto delays = stats::excessOverPeersAll(s.offsets, 2);
  auto shifts = stats::excessOverPeersAll(s.means, 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = pairedFrom(delays[i], std::move(shifts[i]), s.ranks.size());
  return out;
}

std::vector<Diagnosis> diagnose(const JobModel& whole, const DiagnoseOptions& options,
                                const JobModel* baseline, const History* history) {
  std::vector<Diagnosis> out;
  // Fail-slow: when the job's step time rose at some step, the culprit detectors look at the
  // steps since, where the cause lives (before it, every rank was healthy and would dilute it).
  const std::optional<FailSlow> fail_slow = findFailSlow(whole, options);
  std::optional<JobModel> recent;
  if (fail_slow) recent = whole.sinceStep(fail_slow->step);
  const JobModel& job = recent ? *recent : whole;
  // Jitter (no level shift, spikes in a minority of steps): the GPU and network culprits are
  // looked for in the spike steps only; the other detectors keep the whole window.
  const std::optional<Jitter> jitter = fail_slow ? std::nullopt : findJitter(whole, options);
  std::optional<JobModel> spiky;
  if (jitter) spiky = whole.onlySteps(jitter->steps);
  const JobModel& culprit_job = spiky ? *spiky : job;
  const auto arrivals = collectiveArrivals(culprit_job);
  const size_t first_culprit = out.size();
  detectSlowGpu(culprit_job, options, arrivals, &out);
  detectSlowGpuFromSummaries(culprit_job, options, arrivals, &out);
  detectSlowLink(culprit_job, options, &out);
  if (jitter) {
    std::string steps;
    for (size_t i = 0; i < jitter->steps.size() && i < 12; ++i)
      steps += (i ? "," : "") + std::to_string(jitter->steps[i]);
    if (jitter->steps.size() > 12) steps += ",...";
    char text[256];
    std::snprintf(text, sizeof(text),
                  "step-time jitter: %zu steps (%s) took %.3f ms (median) against %.3f ms for "
                  "the job's median step (threshold %.3f ms); those steps were analysed",
                  jitter->steps.size(), steps.c_str(), jitter->spike_ns / 1e6,
                  jitter->median_ns / 1e6, jitter->fence_ns / 1e6);
    for (size_t i = first_culprit; i < out.size(); ++i) {
      out[i].evidence.insert(out[i].evidence.begin(), Evidence{"step_time_jitter", text,
                                                               jitter->spike_ns, jitter->fence_ns});
    }
  }
  const auto job_arrivals = spiky ? collectiveArrivals(job) : arrivals;
  // MODE_SUMMARY: GPU idle time and issue latencies come from the per-step statistics the ranks
  // sent (JobModel::stepStats, issueLatencies), the same definitions as from raw ops.
  detectIssueStall(job, options, job_arrivals, &out);
  // A rank named GPU-slow is not also named host-stalled: its slow GPU shifts its own host timing
  // and GPU idle pattern (the host waits on it at blocking calls, its collectives wait less),
  // which the stall signals can read as a stall; the slow GPU is the cause (docs/metrics.md).
  std::set<int> slow_gpus;
  for (const Diagnosis& d : out) {
    if (d.kind == "gpu_slow") slow_gpus.insert(d.ranks.begin(), d.ranks.end());
  }
  std::erase_if(out, [&](const Diagnosis& d) {
    return d.kind == "issue_stall" && d.ranks.size() == 1 && slow_gpus.count(d.ranks[0]) > 0;
  });
  if (fail_slow) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  "fail-slow: the job's step time rose from %.3f ms to %.3f ms (+%.1f%%) at step "
                  "%zu (change point); the steps since were analysed",
                  fail_slow->before_ns / 1e6, fail_slow->after_ns / 1e6,
                  (fail_slow->after_ns / fail_slow->before_ns - 1) * 100, fail_slow->step);
    for (size_t i = first_culprit; i < out.size(); ++i) {
      out[i].evidence.insert(
          out[i].evidence.begin(),
          Evidence{"step_time_change", text, fail_slow->after_ns, fail_slow->before_ns});
    }
  }
  if (baseline != nullptr) {
    detectRegression(job, *baseline, options, &out);
  } else if (history != nullptr) {
    detectRegressionFromHistory(job, *history, &out);
  }
  detectVoid(job, options, baseline, history, &out);
  detectUnoptimized(job, options, &out);
  std::stable_sort(out.begin(), out.end(),
                   [](const Diagnosis& a, const Diagnosis& b) { return a.severity > b.severity; });
  return out;
}

namespace {

std::string jsonNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", std::isfinite(v) ? v : 0.0);
  return buf;
}

}  // namespace

std::string diagnosisToJson(const Diagnosis& d) {
  std::string out = "{\"kind\":" + common::jsonQuote(d.kind) + ",\"team\":\"" + teamName(d.team) +
                    "\",\"cause\":" + common::jsonQuote(d.cause) +
                    ",\"severity\":" + jsonNumber(d.severity) + ",\"ranks\":[";
  for (size_t r = 0; r < d.ranks.size(); ++r) out += (r ? "," : "") + std::to_string(d.ranks[r]);
  out += "],\"summary\":" + common::jsonQuote(d.summary) + ",\"evidence\":[";
  for (size_t e = 0; e < d.evidence.size(); ++e) {
    const Evidence& ev = d.evidence[e];
    out += (e ? "," : "") + std::string("{\"metric\":") + common::jsonQuote(ev.metric) +
           ",\"text\":" + common::jsonQuote(ev.text) + ",\"value\":" + jsonNumber(ev.value) +
           ",\"reference\":" + jsonNumber(ev.reference) + "}";
  }
  return out + "]}";
}

std::string diagnosesToJson(const std::vector<Diagnosis>& diagnoses) {
  std::string out = "{\"diagnoses\":[";
  for (size_t i = 0; i < diagnoses.size(); ++i)
    out += (i ? "," : "") + diagnosisToJson(diagnoses[i]);
  return out + "]}\n";
}

std::string formatDiagnoses(const std::vector<Diagnosis>& diagnoses) {
  std::string out;
  for (const Diagnosis& d : diagnoses) {
    out += "[" + std::string(teamName(d.team)) + "] " + d.summary + "\n";
    for (const Evidence& e : d.evidence) out += "    - " + e.text + "\n";
  }
  return out;
}

}  // namespace flare::engine
