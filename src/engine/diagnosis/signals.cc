#include "src/engine/diagnosis/signals.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <span>
#include <utility>

#include "flare/step.h"
#include "src/stats/changepoint.h"
#include "src/stats/outliers.h"
#include "src/stats/paired.h"
#include "src/stats/quantile.h"
#include "src/stats/wasserstein.h"

namespace flare::engine {
namespace signals {
namespace {

// How many of a sketch's values lie below `x` (by bucket midpoint).
uint64_t countBelow(const stats::LatencySketch& sketch, double x) {
  uint64_t n = 0;
  sketch.forEachBucket([&n, x](double lo, double hi, uint64_t count) {
    if (0.5 * (lo + hi) < x) n += count;
  });
  return n;
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

}  // namespace

using flare::v1::OpKind;

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

std::string stepList(const std::vector<size_t>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size() && i < 12; ++i)
    out += (i ? "," : "") + std::to_string(steps[i]);
  if (steps.size() > 12) out += ",...";
  return out;
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

int64_t warmupEnd(const JobModel& job, int rank) {
  const auto starts = job.stepStarts(rank);
  return starts.size() >= 2 ? starts[1] : INT64_MIN;
}

std::vector<double> issueLatencies(const JobModel& job, const RankData& r, size_t max_values,
                                   bool weighted) {
  std::vector<double> v;
  if (!r.steps.empty()) {
    const std::vector<const ReceivedStep*> steps = job.receivedSteps(r.rank);
    // Each step's (or folded bucket's) sketch and the factor its counts are read with.
    std::vector<std::pair<const stats::LatencySketch*, uint64_t>> parts;
    for (const ReceivedStep* st : steps)
      parts.emplace_back(&st->stats.latency, weighted ? st->weight : 1);
    for (const CoarseSteps& c : r.coarse_steps) {  // folded steps
      const uint64_t w =
          weighted && c.ops > 0 ? std::max<uint64_t>(1, (c.weighted_ops + c.ops / 2) / c.ops) : 1;
      parts.emplace_back(&c.latency, w);
    }
    uint64_t total = 0;
    for (const auto& [sketch, w] : parts) total += sketch->count() * w;
    auto add = [&v](double lo, double hi, uint64_t count) {
      v.insert(v.end(), count, 0.5 * (lo + hi));
    };
    if (total <= max_values) {
      v.reserve(total);
      for (const auto& part : parts) {
        const uint64_t w = part.second;  // a lambda captures no structured binding (clang)
        part.first->forEachBucket(
            [&](double lo, double hi, uint64_t count) { add(lo, hi, count * w); });
      }
      return v;
    }
    // The quantile sample from the steps' merged sketch (its buckets come in ascending order).
    stats::LatencySketch merged(records::StepStats::kStepSketchAccuracy);
    for (const auto& [sketch, w] : parts) {
      if (w == 1) {
        merged.merge(*sketch);
      } else {
        stats::LatencySketch scaled = *sketch;
        scaled.scaleCounts(w);
        merged.merge(scaled);
      }
    }
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

std::map<int, double> runQueueWaitPerStep(const JobModel& job) {
  // Every analysis pass asks (the job metrics): the summary mode's figures are read in place,
  // and a rank that measured nothing costs one scan (stepStats() builds every step, sketch
  // included: +30% on a pass at 1,024 ranks).
  std::map<int, double> out;
  std::vector<double> wait;
  for (const auto& [rank, r] : job.ranks()) {
    wait.clear();
    if (!r.steps.empty()) {  // MODE_SUMMARY: the rank's own StepStats
      if (std::none_of(r.steps.begin(), r.steps.end(),
                       [](const ReceivedStep& st) { return st.stats.run_queue_wait_ns >= 0; }))
        continue;
      // After the window's first; sampled-out steps too (the wait is read in every step).
      for (const ReceivedStep* st : job.receivedSteps(rank, /*with_sampled_out=*/true)) {
        if (st->stats.run_queue_wait_ns >= 0)
          wait.push_back(static_cast<double>(st->stats.run_queue_wait_ns));
      }
    } else if (!r.run_queue.empty()) {  // MODE_RAW: placed from the rank's readings
      for (const records::StepStats& st : job.stepStats(rank)) {
        if (st.step != 0 && st.run_queue_wait_ns >= 0)
          wait.push_back(static_cast<double>(st.run_queue_wait_ns));
      }
    }
    if (wait.size() >= 3) out[rank] = median(wait);
  }
  return out;
}

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

std::vector<SharedGpu> sharedGpus(const JobModel& job) {
  std::map<std::string, std::vector<int>> by_uuid;
  for (const auto& [rank, r] : job.ranks()) {
    if (!r.device_uuid.empty()) by_uuid[r.device_uuid].push_back(rank);
  }
  std::vector<SharedGpu> out;
  for (auto& [uuid, ranks] : by_uuid) {
    if (ranks.size() >= 2) out.push_back({uuid, std::move(ranks)});  // ranks: map order
  }
  std::sort(out.begin(), out.end(), [](const SharedGpu& a, const SharedGpu& b) {
    return a.ranks.front() < b.ranks.front();
  });
  return out;
}

}  // namespace signals

using namespace signals;

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

std::vector<CollectiveInstance> completeCollectives(const JobModel& job) {
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::pair<int, const Op*>>> instances;
  for (const auto& [rank, r] : job.ranks()) {
    for (const Op& op : r.ops) {
      if (job.signatures()[op.sig].kind() == flare::v1::OP_KIND_COLLECTIVE && op.comm != 0)
        instances[{op.comm, op.seq}].push_back({rank, &op});
    }
  }
  std::vector<CollectiveInstance> out;
  for (auto& [key, members] : instances) {
    if (members.size() < 2 || static_cast<int>(members.size()) != members[0].second->nranks)
      continue;
    const auto last = std::max_element(
        members.begin(), members.end(),
        [](const auto& a, const auto& b) { return a.second->start < b.second->start; });
    const size_t index = static_cast<size_t>(last - members.begin());
    out.push_back({std::move(members), index});
  }
  return out;
}

std::map<int, ArrivalStats> collectiveArrivals(const JobModel& job) {
  std::map<int, ArrivalStats> out;
  std::map<int, double> wait_sum;
  for (const CollectiveInstance& c : completeCollectives(job)) {
    for (const auto& [rank, op] : c.members) {
      ArrivalStats& s = out[rank];
      ++s.instances;
      wait_sum[rank] += static_cast<double>(op->duration());
    }
    ++out[c.members[c.last].first].last;
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

double signals::robustSigma(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const double m = median(v);
  std::vector<double> dev;
  dev.reserve(v.size());
  for (double x : v) dev.push_back(std::abs(x - m));
  return 1.4826 * median(std::move(dev));
}

namespace {

// One-sided Mann-Whitney U test that `a` tends to be larger than `b`: the normal approximation
// with tie correction and continuity correction (both samples of 3 or more here). 1 when it
// cannot be computed.
double mannWhitneyGreater(const std::vector<double>& a, const std::vector<double>& b) {
  const double n1 = static_cast<double>(a.size()), n2 = static_cast<double>(b.size());
  if (a.empty() || b.empty()) return 1;
  std::vector<std::pair<double, int>> all;
  for (double x : a) all.push_back({x, 0});
  for (double x : b) all.push_back({x, 1});
  std::sort(all.begin(), all.end());
  double rank_sum_a = 0, ties = 0;
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].first == all[i].first) ++j;
    const double avg_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    const double t = static_cast<double>(j - i);
    ties += t * t * t - t;
    for (size_t k = i; k < j; ++k) {
      if (all[k].second == 0) rank_sum_a += avg_rank;
    }
    i = j;
  }
  const double u = rank_sum_a - n1 * (n1 + 1) / 2;
  const double n = n1 + n2;
  const double var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)));
  if (var <= 0) return 1;
  const double z = (u - n1 * n2 / 2 - 0.5) / std::sqrt(var);
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

}  // namespace

namespace {

// Per step (each rank's own step k, as in onlySteps), the rank that arrived last at most of the
// step's complete collectives; steps with a tie or none are absent. One pass over the ops: a
// collective instance belongs to the step in which its last arriver issued it.
std::map<size_t, int> lastArriverPerStep(const JobModel& job) {
  std::map<int, std::vector<int64_t>> starts;
  for (const auto& [rank, r] : job.ranks()) starts[rank] = job.stepStarts(rank);
  std::map<size_t, std::map<int, size_t>> lasts;  // step -> rank -> collectives it came last to
  for (const CollectiveInstance& c : completeCollectives(job)) {
    const int last_rank = c.members[c.last].first;
    const Op* last_op = c.members[c.last].second;
    const auto same = std::count_if(c.members.begin(), c.members.end(), [last_op](const auto& m) {
      return m.second->start == last_op->start;
    });
    if (same > 1) continue;  // nobody came last
    const std::vector<int64_t>& s = starts[last_rank];
    const auto it = std::upper_bound(s.begin(), s.end(), last_op->issue);
    if (it == s.begin() || it == s.end()) continue;  // before the first or after the last boundary
    ++lasts[static_cast<size_t>(it - s.begin()) - 1][last_rank];
  }
  std::map<size_t, int> out;
  for (const auto& [step, per_rank] : lasts) {
    int best = -1;
    size_t most = 0;
    bool tie = false;
    for (const auto& [rank, n] : per_rank) {
      if (n > most) {
        most = n;
        best = rank;
        tie = false;
      } else if (n == most) {
        tie = true;
      }
    }
    if (best >= 0 && !tie) out[step] = best;
  }
  return out;
}

}  // namespace

std::optional<Jitter> findJitter(const JobModel& job, const DiagnoseOptions& options) {
  const std::vector<double> series = jobStepSeries(job);
  if (series.size() < 2 * options.jitter_min_spikes + 2) return std::nullopt;
  const double med = median(series);
  // A spike passes the relative floor and jitter_min_sigmas robust standard deviations
  // (1.4826·MAD, which spikes in a minority of the steps do not inflate) of the step time's own
  // noise above its median (docs/metrics.md, "Evidence that passed its test"). A far-out Tukey
  // fence (Q3 + 3·IQR, about 4.7σ for Gaussian noise) was the bar before; it rises with the
  // spikes once they are a quarter of the steps.
  const double sigma = robustSigma(series);
  const double threshold =
      std::max(med * (1.0 + options.jitter_min_relative), med + options.jitter_min_sigmas * sigma);
  std::vector<size_t> candidates;
  std::vector<double> excess;
  for (size_t i = 0; i < series.size(); ++i) {
    if (series[i] > threshold) {
      candidates.push_back(i);
      excess.push_back(series[i] - med);
    }
  }
  if (candidates.empty()) return std::nullopt;
  // Recurring: one cause costs about the same time each time it strikes; host noise spikes are
  // of every size. Only the spikes within jitter_alike_factor of their median excess count.
  const double typical = median(excess);
  Jitter j;
  std::vector<double> spikes;
  for (size_t k = 0; k < candidates.size(); ++k) {
    if (excess[k] * options.jitter_alike_factor >= typical &&
        excess[k] <= typical * options.jitter_alike_factor) {
      j.steps.push_back(candidates[k] + 1);
      spikes.push_back(series[candidates[k]]);
    }
  }
  if (j.steps.size() < options.jitter_min_spikes ||
      static_cast<double>(j.steps.size()) > options.jitter_max_share * series.size()) {
    return std::nullopt;
  }
  // Beyond chance: host noise strikes a rank at random, a recurring fault the same rank. Each
  // step is attributed to the rank that arrived last at most of its collectives. A rank's spikes
  // must be attributed to it more often than chance and than its own share of the quiet steps
  // (those under the threshold) would give: a one-sided binomial test against the larger of 1/ranks
  // and that share (Laplace-smoothed; × ranks, Bonferroni) at jitter_alpha; the rank with the
  // smallest p-value is kept, and only its spikes. Against 1/ranks instead, a rank that is steadily
  // last (a slow GPU) took every host hiccup of the job as its own jitter. Spike steps without a
  // complete collective attribute nothing; when none can be attributed the test is not made.
  const std::map<size_t, int> last_of = lastArriverPerStep(job);
  std::map<int, size_t> per_rank, quiet_per_rank;
  size_t attributed = 0, quiet = 0;
  std::set<size_t> spiky(j.steps.begin(), j.steps.end());
  for (const auto& [step, rank] : last_of) {
    if (spiky.count(step)) {
      ++per_rank[rank];
      ++attributed;
    } else if (step >= 1 && step <= series.size() && series[step - 1] <= threshold) {
      ++quiet_per_rank[rank];
      ++quiet;
    }
  }
  if (attributed > 0) {
    const double ranks = static_cast<double>(std::max<size_t>(job.ranks().size(), 2));
    int top = -1;
    double best_p = 2;
    for (const auto& [rank, k] : per_rank) {
      const double share = std::max(1.0 / ranks, (static_cast<double>(quiet_per_rank[rank]) + 1) /
                                                     (static_cast<double>(quiet) + ranks));
      const double p = std::min(1.0, ranks * stats::binomialUpperTail(attributed, k, share));
      if (p < best_p) {
        best_p = p;
        top = rank;
      }
    }
    if (best_p > options.jitter_alpha) return std::nullopt;
    std::vector<size_t> kept;
    spikes.clear();
    for (size_t step : j.steps) {
      auto it = last_of.find(step);
      if (it != last_of.end() && it->second == top) {
        kept.push_back(step);
        spikes.push_back(series[step - 1]);
      }
    }
    if (kept.size() < options.jitter_min_spikes) return std::nullopt;
    j.steps = std::move(kept);
  }
  j.median_ns = med;
  j.spike_ns = median(spikes);
  j.fence_ns = threshold;
  return j;
}

std::vector<double> rankComputePerStep(const JobModel& job, int rank) {
  const auto it = job.ranks().find(rank);
  if (it == job.ranks().end()) return {};
  const RankData& r = it->second;
  const std::vector<int64_t> starts = job.stepStarts(rank);
  if (starts.size() < 3) return {};
  // The step of time `t` (0 before the second boundary).
  auto stepAt = [&starts](int64_t t) {
    const auto s = std::upper_bound(starts.begin(), starts.end(), t);
    return s == starts.begin() ? size_t{0} : static_cast<size_t>(s - starts.begin()) - 1;
  };
  const size_t n = starts.size() - 1;  // complete steps 0..n-1
  std::vector<double> x(n, 0.0);
  if (r.summaries.empty()) {
    for (const Op& op : r.ops) {
      if (!isCompute(job.signatures()[op.sig].kind())) continue;
      const size_t s = stepAt(op.issue);
      if (s < n) x[s] += static_cast<double>(op.duration());
    }
  } else {
    for (const records::StepStats& st : job.stepStats(rank, /*with_sampled_out=*/true)) {
      if (st.step < 0 || static_cast<size_t>(st.step) >= n) continue;
      // A step that step sampling left out has no GPU figure: the series would read 0 there, a
      // false fall and rise for the change-point search. Not known per step: none.
      if (st.sampled_out) return {};
      x[static_cast<size_t>(st.step)] = static_cast<double>(st.gpu_busy_ns);
    }
    for (const Op& op : r.ops) {
      if (job.signatures()[op.sig].kind() != flare::v1::OP_KIND_COLLECTIVE) continue;
      const size_t s = stepAt(op.start);
      if (s < n) x[s] -= static_cast<double>(std::min(op.end, starts[s + 1]) - op.start);
    }
  }
  x.erase(x.begin());  // the warm-up step
  return x;
}

namespace {

// The fail-slow tests (docs/metrics.md) for a rise of the job's step time `series` at index `at`,
// the steps before it counted from index `from` (the previous change point, else 0): the shift
// of the medians (after − before, > 0) when they pass, else 0.
double testedRise(const std::vector<double>& series, size_t from, size_t at,
                  const DiagnoseOptions& options) {
  const std::vector<double> before(series.begin() + from, series.begin() + at);
  const std::vector<double> after(series.begin() + at, series.end());
  if (before.size() < options.fail_slow_min_steps || after.size() < options.fail_slow_min_after)
    return 0;
  const double med_before = median(before);
  const double med_after = median(after);
  const double shift = med_after - med_before;
  // Larger than the relative floor and than the noise's robust spread: 1.4826·MAD of the
  // successive differences / √2 over both sides (a level shift is one difference, a slow drift
  // cancels in them; the steps before alone gave a noisy spread, with hog bursts there hiding
  // an 18% shift, and the deviations from each side's median counted a drift as noise) ...
  std::vector<double> diffs;
  for (size_t k = from + 1; k < series.size(); ++k) diffs.push_back(series[k] - series[k - 1]);
  const double noise = robustSigma(diffs) / std::sqrt(2.0);
  if (shift < options.fail_slow_min_relative * med_before ||
      shift < options.fail_slow_min_sigmas * noise) {
    return 0;
  }
  // ... the level holds: most steps since sit above the midpoint of the shift (a burst of
  // host hiccups raises a few steps, not the level) ...
  const double mid = med_before + shift / 2;
  const auto held = std::count_if(after.begin(), after.end(), [mid](double v) { return v > mid; });
  if (static_cast<double>(held) < options.fail_slow_min_held * static_cast<double>(after.size()))
    return 0;
  // ... and the steps since are slower than the steps before (one-sided Mann-Whitney).
  if (mannWhitneyGreater(after, before) > options.fail_slow_alpha) return 0;
  return shift;
}

double meanOf(const std::vector<double>& v, size_t b, size_t e) {
  double sum = 0;
  for (size_t i = b; i < e; ++i) sum += v[i];
  return e > b ? sum / static_cast<double>(e - b) : 0;
}

// Where a fail-slow began. The step time is wall time, and host contention (a CPU hog: every
// rank waits at the next collective for the one whose host it delays) stretches steps. A few
// stretched steps just before the onset sit nearer the new level than the old, and the split,
// whatever its cost, takes them with the new level: the change point comes a few steps early.
// A burst of stretched steps elsewhere can itself become the change point, its "after" side
// running on into the real rise, or leave no room for a split at the onset (fail_slow_min_steps
// per segment), which then comes a step late. A rank's GPU compute time per step is not
// stretched by the host. So when one rose (a change point of its own series, same segmentation)
// by at least gpu_min_effect of its own and half the job's `rise`, at most fail_slow_min_after
// steps before the job's change point `at` or anywhere after it, its change point is the onset —
// the one nearest `at`, then the largest rise, then the lowest rank — provided the job's step
// time split there still rose: at least fail_slow_min_relative between the medians of the steps
// since (at least fail_slow_min_after) and of the steps before (since `from`, and at least
// fail_slow_min_steps: a burst's own change point may lie closer). The job's rise passed its
// tests at its own change point; the holding and Mann-Whitney tests are not repeated at the
// onset, since the stretched steps, now before the split, are what they would weigh. Sets `f`'s
// rank and, when the onset moved, its step and the job's means on either side.
void refineOnset(const JobModel& job, const std::vector<double>& series,
                 const std::vector<stats::ChangePoint>& changes, size_t from, size_t at,
                 double rise, const DiagnoseOptions& options, FailSlow* f) {
  const size_t n = series.size();
  // The first of the steps before an onset (above).
  auto firstBefore = [&](size_t onset) {
    return std::min(from, onset - std::min(onset, options.fail_slow_min_steps));
  };
  auto stillRose = [&](size_t onset) {
    if (onset == at) return true;
    if (onset < options.fail_slow_min_steps || onset + options.fail_slow_min_after > n)
      return false;
    const double med_before = median({series.begin() + firstBefore(onset), series.begin() + onset});
    const double med_after = median({series.begin() + onset, series.end()});
    return med_after - med_before >= options.fail_slow_min_relative * med_before;
  };
  stats::SegmentationOptions seg;
  seg.minSegment = options.fail_slow_min_steps;
  auto distance = [at](const stats::ChangePoint& c) {
    return c.index > at ? c.index - at : at - c.index;
  };
  std::optional<stats::ChangePoint> best;
  for (const auto& [rank, r] : job.ranks()) {
    std::vector<double> compute = rankComputePerStep(job, rank);
    if (compute.size() < n) continue;
    compute.resize(n);  // the job's steps
    for (const stats::ChangePoint& c : stats::detectMeanShifts(compute, seg)) {
      if (c.relative < options.gpu_min_effect || c.magnitude < 0.5 * rise ||
          c.index + options.fail_slow_min_after < at || !stillRose(c.index))
        continue;
      if (!best || distance(c) < distance(*best) ||
          (distance(c) == distance(*best) && c.magnitude > best->magnitude)) {
        best = c;
        f->rank = rank;
      }
    }
  }
  if (!best) return;
  f->rank_before_ns = best->before;
  f->rank_after_ns = best->after;
  if (best->index == at) return;
  // The job's step time on either side: the steps before as above, and to the next change point
  // after the onset (the host's burst may have been a segment of its own), else the end.
  const auto next =
      std::find_if(changes.begin(), changes.end(),
                   [&best](const stats::ChangePoint& c) { return c.index > best->index; });
  f->step = best->index + 1;
  f->before_ns = meanOf(series, firstBefore(best->index), best->index);
  f->after_ns = meanOf(series, best->index, next != changes.end() ? next->index : n);
}

}  // namespace

std::optional<FailSlow> findFailSlow(const JobModel& job, const DiagnoseOptions& options) {
  const std::vector<double> series = jobStepSeries(job);
  if (series.size() + 1 < 2 * options.fail_slow_min_steps + 1) return std::nullopt;
  stats::SegmentationOptions seg;
  seg.minSegment = options.fail_slow_min_steps;
  const auto changes = stats::detectMeanShifts(series, seg);
  // The last slow-down that passes the tests (docs/metrics.md): the steps since it against the
  // steps before it — what the job is living with now against what it had.
  for (auto it = changes.rbegin(); it != changes.rend(); ++it) {
    if (it->relative < options.fail_slow_min_relative) continue;
    // Before: the segment since the previous change point (the first steps after the warm-up
    // often run slower, a level of their own).
    const size_t from = std::next(it) != changes.rend() ? std::next(it)->index : 0;
    const double rise = testedRise(series, from, it->index, options);
    if (rise <= 0) continue;
    FailSlow found{it->index + 1, it->before, it->after, it->index + 1};
    refineOnset(job, series, changes, from, it->index, rise, options, &found);
    return found;
  }
  return std::nullopt;
}

std::vector<double> rankIssueLatencies(const JobModel& job, int rank) {
  auto it = job.ranks().find(rank);
  return it == job.ranks().end() ? std::vector<double>{}
                                 : issueLatencies(job, it->second, SIZE_MAX, /*weighted=*/true);
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
      auto v = issueLatencies(*b, r, SIZE_MAX, /*weighted=*/true);
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

std::vector<double> collectiveIssueOffsets(const JobModel& job, int rank,
                                           const std::vector<int64_t>& step_starts) {
  std::vector<double> sum(step_starts.size(), 0.0);
  std::vector<size_t> count(step_starts.size(), 0);
  const auto r = job.ranks().find(rank);
  if (r != job.ranks().end()) {
    for (const Op& op : r->second.ops) {
      if (job.signatures()[op.sig].kind() != flare::v1::OP_KIND_COLLECTIVE) continue;
      const auto at = std::upper_bound(step_starts.begin(), step_starts.end(), op.issue);
      if (at == step_starts.begin() || at == step_starts.end()) continue;  // outside its steps
      const auto k = static_cast<size_t>(at - step_starts.begin()) - 1;
      sum[k] += static_cast<double>(op.issue - step_starts[k]);
      ++count[k];
    }
  }
  std::vector<double> out(step_starts.size(), NAN);
  for (size_t k = 0; k < out.size(); ++k) {
    if (count[k] > 0) out[k] = sum[k] / static_cast<double>(count[k]);
  }
  return out;
}

void offsetsFromCollectivesWhereSampledOut(
    const JobModel& job, const std::map<int, std::vector<int64_t>>& starts,
    const std::vector<std::vector<size_t>>& rank_step, const std::vector<char>& sampled_out,
    std::vector<std::vector<double>>* offsets,
    std::initializer_list<std::vector<std::vector<double>>*> blanked) {
  if (std::find(sampled_out.begin(), sampled_out.end(), 1) == sampled_out.end()) return;
  size_t i = 0;
  for (const auto& [rank, s] : starts) {
    const std::vector<double> collective = collectiveIssueOffsets(job, rank, s);
    for (size_t g = 0; g < sampled_out.size(); ++g) {
      if (!sampled_out[g]) continue;
      const size_t k = rank_step[i][g];
      (*offsets)[i][g] = k != 0 ? collective[k] : NAN;
      for (auto* table : blanked) (*table)[i][g] = NAN;
    }
    ++i;
  }
}

RankStepStarts rankStepStarts(const JobModel& job) {
  RankStepStarts out;
  for (const auto& [rank, r] : job.ranks()) {
    auto s = job.stepStarts(rank);
    if (s.size() >= 3) out.starts[rank] = std::move(s);
  }
  if (out.starts.size() < 3) {
    out.starts.clear();
    return out;
  }
  for (const auto& [rank, s] : out.starts) {
    for (size_t i = 1; i + 1 < s.size(); ++i)
      out.durations.push_back(static_cast<double>(s[i + 1] - s[i]));
  }
  return out;
}

StepIssueLatency stepIssueLatency(const JobModel& job) {
  StepIssueLatency out;
  RankStepStarts rs = rankStepStarts(job);
  if (rs.starts.empty()) return out;
  const std::map<int, std::vector<int64_t>>& starts = rs.starts;
  out.median_step_ns = median(std::move(rs.durations));
  // The grid: the lowest rank's complete steps, the first skipped (warm-up). Ranks that meet at
  // collectives run their steps together, so a rank's step is the one that starts nearest the
  // grid's (within half a step). A rank that runs at its own pace (it shares no collective:
  // independent processes, a fixture's ranks replayed side by side) drifts off the grid; where
  // that leaves fewer than half its steps matched, its steps are paired by index instead.
  const std::vector<int64_t>& ref = starts.begin()->second;
  const size_t n_steps = ref.size() - 2;
  const double tolerance = 0.5 * out.median_step_ns;
  auto nearest = [&](const std::vector<int64_t>& s, size_t g) -> size_t {
    size_t best = 0;
    double best_dist = INFINITY;
    for (size_t i = 1; i + 1 < s.size(); ++i) {
      const double dist = std::abs(static_cast<double>(s[i] - ref[g + 1]));
      if (dist < best_dist) {
        best_dist = dist;
        best = i;
      }
    }
    return best_dist <= tolerance ? best : 0;
  };
  std::vector<char> sampled_out(n_steps, 0);  // grid steps sampled out on some rank
  std::vector<std::vector<size_t>> steps_of;  // [rank index][grid step] the rank's step
  for (const auto& [rank, s] : starts) {
    // This rank's complete step (not its first) for each grid step: the nearest one, or the same
    // index where fewer than half are near; 0 for none.
    std::vector<size_t> step_of(n_steps);
    size_t matched = 0;
    for (size_t g = 0; g < n_steps; ++g) matched += (step_of[g] = nearest(s, g)) != 0;
    if (2 * matched < n_steps) {
      for (size_t g = 0; g < n_steps; ++g) step_of[g] = g + 2 < s.size() ? g + 1 : 0;
    }
    std::vector<double> means(n_steps, NAN), offsets(n_steps, NAN), idle(n_steps, NAN);
    // Each step's issue-latency and issue-offset sums (the rank's own in MODE_SUMMARY).
    std::map<int64_t, records::StepStats> by_step;
    for (records::StepStats& st : job.stepStats(rank, /*with_sampled_out=*/true)) {
      const int64_t k = st.step;
      by_step.insert_or_assign(k, std::move(st));
    }
    for (size_t g = 0; g < n_steps; ++g) {
      const size_t best = step_of[g];
      if (best == 0) continue;
      auto st = by_step.find(static_cast<int64_t>(best));
      if (st == by_step.end()) continue;
      if (st->second.sampled_out) sampled_out[g] = 1;
      if (st->second.sampled_out || st->second.gpu_ops < 1) continue;
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
    steps_of.push_back(std::move(step_of));
  }
  // Steps sampled out (nested ones where budgets chose different K): compared by collectives.
  offsetsFromCollectivesWhereSampledOut(job, starts, steps_of, sampled_out, &out.offsets,
                                        {&out.means, &out.idle});
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

// ---- kernel summaries ---------------------------------------------------------------------------

bool hasSummaries(const JobModel& job) {
  for (const auto& [rank, r] : job.ranks()) {
    if (!r.summaries.empty()) return true;
  }
  return false;
}

const SummaryIndex::Run* SummaryIndex::Rank::find(uint32_t sig) const {
  const auto run = std::lower_bound(runs.begin(), runs.end(), sig,
                                    [](const Run& x, uint32_t s) { return x.sig < s; });
  return run == runs.end() || run->sig != sig ? nullptr : &*run;
}

SummaryIndex indexSummaries(const JobModel& job, const std::vector<char>& keep, bool skip_warmup) {
  SummaryIndex index;
  index.ranks.reserve(job.ranks().size());
  std::vector<char> seen(job.signatures().size());
  for (const auto& [rank, r] : job.ranks()) {
    const int64_t warm = skip_warmup ? job.warmupEnd(rank) : INT64_MIN;
    const bool has_later =
        skip_warmup && std::any_of(r.summaries.begin(), r.summaries.end(),
                                   [warm](const SummaryWindow& w) { return w.start >= warm; });
    SummaryIndex::Rank& rw = index.ranks.emplace_back();
    rw.data = &r;
    for (size_t i = r.summaries.size(); i-- > 0;) {
      const SummaryWindow& w = r.summaries[i];
      if (w.sig >= keep.size() || !keep[w.sig] || (has_later && w.start < warm)) continue;
      rw.order.emplace_back(w.sig, static_cast<uint32_t>(i));
      if (!seen[w.sig]) {
        seen[w.sig] = 1;
        index.sigs.push_back(w.sig);
      }
    }
    std::stable_sort(rw.order.begin(), rw.order.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (uint32_t a = 0; a < rw.order.size();) {
      SummaryIndex::Run run{rw.order[a].first, a, a, 0, 0};
      for (; run.hi < rw.order.size() && rw.order[run.hi].first == run.sig; ++run.hi) {
        const SummaryWindow& w = r.summaries[rw.order[run.hi].second];
        run.count += w.count();
        run.sum += w.sumNs();
      }
      a = run.hi;
      rw.runs.push_back(run);
    }
  }
  std::sort(index.sigs.begin(), index.sigs.end());
  return index;
}

}  // namespace flare::engine
