#include "src/engine/diagnosis/own_change.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "src/engine/diagnosis/signals.h"
#include "src/records/op_kind.h"
#include "src/stats/changepoint.h"

namespace flare::engine {
namespace {

using namespace signals;

// The step of time `t` on a rank with step boundaries `starts` (0 before its second boundary).
size_t stepAt(const std::vector<int64_t>& starts, int64_t t) {
  const auto it = std::upper_bound(starts.begin(), starts.end(), t);
  return it == starts.begin() ? 0 : static_cast<size_t>(it - starts.begin()) - 1;
}

// The sides of the raw comparison: steps 1..K−2 and K+1..last.
struct Sides {
  size_t change = 0, last = 0;
  bool before(size_t s) const { return s >= 1 && s + 2 <= change; }
  bool after(size_t s) const { return s >= change + 1; }
};

void setSteps(const Sides& sides, OwnChange* c) {
  c->change_step = sides.change;
  c->before_first = 1;
  c->before_last = sides.change - 2;
  c->after_first = sides.change + 1;
  c->after_last = sides.last;
}

std::optional<OwnChange> computeFromOps(const JobModel& whole, const DiagnoseOptions& opt,
                                        const RankData& r, const std::vector<int64_t>& starts,
                                        const Sides& sides) {
  std::map<uint32_t, std::pair<std::vector<double>, std::vector<double>>> by_sig;
  for (const Op& op : r.ops) {
    if (!isCompute(whole.signatures()[op.sig].kind())) continue;
    const size_t s = stepAt(starts, op.issue);
    auto& [before, after] = by_sig[op.sig];
    if (sides.before(s)) before.push_back(static_cast<double>(op.duration()));
    if (sides.after(s)) after.push_back(static_cast<double>(op.duration()));
  }
  OwnChange c;
  double weight = 0, weighted = 0;
  for (auto& [sig, sides_values] : by_sig) {
    auto& [before, after] = sides_values;
    if (static_cast<int>(before.size()) < opt.min_samples ||
        static_cast<int>(after.size()) < opt.min_samples)
      continue;
    const double b = median(before), a = median(after);
    if (b <= 0) continue;
    double w = 0;
    for (double x : after) w += x;
    weight += w;
    weighted += w * a / b;
    c.before += b * static_cast<double>(after.size());
    c.after += a * static_cast<double>(after.size());
    ++c.signatures;
  }
  if (c.signatures == 0 || weight <= 0) return std::nullopt;
  c.ratio = weighted / weight;
  setSteps(sides, &c);
  return c;
}

std::optional<OwnChange> computeFromSummaries(const JobModel& whole, const DiagnoseOptions& opt,
                                              const RankData& r, const std::vector<int64_t>& starts,
                                              size_t change) {
  if (change >= starts.size()) return std::nullopt;
  const int64_t boundary = starts[change];
  const int64_t warm = whole.warmupEnd(r.rank);
  struct Side {
    uint64_t count = 0;
    double sum = 0;
    int64_t first = INT64_MAX, last = INT64_MIN;
  };
  std::map<uint32_t, std::pair<Side, Side>> by_sig;
  for (const SummaryWindow& w : r.summaries) {
    if (!isCompute(whole.signatures()[w.sig].kind()) || w.start < warm) continue;
    Side* side = w.end <= boundary     ? &by_sig[w.sig].first
                 : w.start >= boundary ? &by_sig[w.sig].second
                                       : nullptr;
    if (side == nullptr) continue;  // straddles the change
    side->count += w.count();
    side->sum += w.sumNs();
    side->first = std::min(side->first, w.start);
    side->last = std::max(side->last, w.end);
  }
  OwnChange c;
  c.from_summaries = true;
  double weight = 0, weighted = 0;
  int64_t b_first = INT64_MAX, b_last = INT64_MIN, a_first = INT64_MAX, a_last = INT64_MIN;
  for (const auto& [sig, sides] : by_sig) {
    const auto& [before, after] = sides;
    const auto min = static_cast<uint64_t>(std::max(opt.min_samples, 1));
    if (before.count < min || after.count < min || before.sum <= 0) continue;
    const double b = before.sum / static_cast<double>(before.count);
    const double a = after.sum / static_cast<double>(after.count);
    weight += after.sum;
    weighted += after.sum * a / b;
    c.before += b * static_cast<double>(after.count);
    c.after += a * static_cast<double>(after.count);
    ++c.signatures;
    b_first = std::min(b_first, before.first);
    b_last = std::max(b_last, before.last);
    a_first = std::min(a_first, after.first);
    a_last = std::max(a_last, after.last);
  }
  if (c.signatures == 0 || weight <= 0) return std::nullopt;
  c.ratio = weighted / weight;
  c.change_step = change;
  // The steps the windows covered (a window's end may fall just past a step boundary).
  c.before_first = std::max<size_t>(1, stepAt(starts, b_first));
  c.before_last = stepAt(starts, b_last - 1);
  c.after_first = stepAt(starts, a_first);
  c.after_last = stepAt(starts, a_last - 1);
  return c;
}

// The rank's own slow-down point: the last rise of its GPU compute time per step
// (rankComputePerStep) by at least gpu_min_effect (binary segmentation, flare_stats), as a step
// number; 0: none.
size_t ownChangeStep(const std::vector<double>& per_step, const DiagnoseOptions& opt) {
  if (per_step.size() < 2 * opt.fail_slow_min_steps + 1) return 0;
  stats::SegmentationOptions seg;
  seg.minSegment = opt.fail_slow_min_steps;
  const auto changes = stats::detectMeanShifts(per_step, seg);
  for (auto it = changes.rbegin(); it != changes.rend(); ++it) {
    if (it->relative >= opt.gpu_min_effect) return it->index + 1;
  }
  return 0;
}

}  // namespace

std::optional<OwnChange> ownComputeChange(const JobModel& whole, const DiagnoseOptions& options,
                                          int rank) {
  const auto it = whole.ranks().find(rank);
  if (it == whole.ranks().end()) return std::nullopt;
  const std::vector<int64_t> starts = whole.stepStarts(rank);
  if (starts.size() < 3) return std::nullopt;
  const RankData& r = it->second;
  // The job's change point (placed by a rank's GPU compute time where one rose there), else
  // the rank's own.
  const auto fail = findFailSlow(whole, options);
  const size_t change = fail ? fail->step : ownChangeStep(rankComputePerStep(whole, rank), options);
  if (change < 3 || change + 1 >= starts.size()) return std::nullopt;
  std::optional<OwnChange> c =
      r.summaries.empty() ? computeFromOps(whole, options, r, starts, {change, starts.size() - 1})
                          : computeFromSummaries(whole, options, r, starts, change);
  return c;
}

std::optional<OwnChange> ownBusbwChange(const JobModel& whole, const DiagnoseOptions& options,
                                        const std::vector<int>& ranks) {
  const auto fail = findFailSlow(whole, options);
  if (!fail || ranks.empty() || !whole.ranks().count(ranks[0])) return std::nullopt;
  const std::vector<int64_t> starts = whole.stepStarts(ranks[0]);
  if (starts.size() < 3) return std::nullopt;
  const Sides sides{fail->step, starts.size() - 1};
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::pair<int, const Op*>>> instances;
  for (const auto& [rank, r] : whole.ranks()) {
    for (const Op& op : r.ops) {
      if (whole.signatures()[op.sig].kind() == flare::v1::OP_KIND_COLLECTIVE && op.comm != 0)
        instances[{op.comm, op.seq}].push_back({rank, &op});
    }
  }
  // (communicator, signature) -> busbw before, after.
  std::map<std::pair<uint64_t, uint32_t>, std::pair<std::vector<double>, std::vector<double>>> bw;
  for (const auto& [key, members] : instances) {
    const Op* first = members.front().second;
    if (first->nranks <= 1 || static_cast<int>(members.size()) != first->nranks ||
        first->bytes == 0)
      continue;
    std::set<int> in;
    int64_t last_start = INT64_MIN, last_end = INT64_MIN, own_start = 0;
    for (const auto& [rank, op] : members) {
      in.insert(rank);
      last_start = std::max(last_start, op->start);
      last_end = std::max(last_end, op->end);
      if (rank == ranks[0]) own_start = op->start;
    }
    if (!std::all_of(ranks.begin(), ranks.end(), [&in](int r) { return in.count(r) > 0; }))
      continue;
    const double t = static_cast<double>(last_end - last_start);
    if (t <= 0) continue;
    const auto& sig = whole.signatures()[first->sig];
    const double busbw = static_cast<double>(first->bytes) / t *
                         records::busBandwidthFactor(sig.collective(), first->nranks);
    const size_t s = stepAt(starts, own_start);
    auto& [before, after] = bw[{key.first, first->sig}];
    if (sides.before(s)) before.push_back(busbw);
    if (sides.after(s)) after.push_back(busbw);
  }
  std::optional<OwnChange> worst;
  for (const auto& [key, values] : bw) {
    const auto& [before, after] = values;
    if (static_cast<int>(before.size()) < options.min_samples ||
        static_cast<int>(after.size()) < options.min_samples)
      continue;
    OwnChange c;
    c.before = median(before);
    c.after = median(after);
    if (c.before <= 0) continue;
    c.ratio = c.after / c.before;
    c.signatures = 1;
    setSteps(sides, &c);
    if (!worst || c.ratio < worst->ratio) worst = c;
  }
  return worst;
}

std::string ownChangeSteps(const OwnChange& c) {
  char text[160];
  std::snprintf(text, sizeof(text),
                "steps %zu-%zu against steps %zu-%zu (change point at step %zu)", c.after_first,
                c.after_last, c.before_first, c.before_last, c.change_step);
  return text;
}

void measureAgainstOwnSteps(const JobModel& whole, const DiagnoseOptions& options,
                            std::vector<Diagnosis>* diagnoses) {
  for (Diagnosis& d : *diagnoses) {
    if (d.ranks.empty()) continue;
    const std::string who = (d.ranks.size() > 1 ? "ranks " : "rank ") + rankList(d.ranks);
    if (d.kind == "gpu_slow" && d.ranks.size() == 1) {
      const auto c = ownComputeChange(whole, options, d.ranks[0]);
      if (!c || c->ratio <= 1) continue;
      d.severity = c->ratio - 1;
      const std::string what = "its GEMM/attention kernels take " + fmtPct(c->ratio - 1) +
                               " longer than its own before the change (" +
                               std::to_string(c->signatures) + " kernel signatures, " +
                               (c->from_summaries ? "mean" : "median") + " per call, " +
                               ownChangeSteps(*c) + ")";
      d.evidence.push_back({"own_change", what, c->after, c->before});
      d.summary = who + ": GPU slow since step " + std::to_string(c->change_step) + " — its " +
                  "GEMM/attention kernels run " + fmtPct(c->ratio - 1) +
                  " slower than its own kernels before (" + ownChangeSteps(*c) +
                  "); the other ranks only wait for it";
    } else if (d.kind == "link_slow") {
      const auto c = ownBusbwChange(whole, options, d.ranks);
      if (!c || c->ratio >= 1) continue;
      d.severity = 1 - c->ratio;
      d.evidence.push_back({"own_change",
                            "bus bandwidth " + fmtNum(c->after, "GB/s") + " against " +
                                fmtNum(c->before, "GB/s") + " on the same communicator before " +
                                "the change: " + fmtPct(1 - c->ratio) + " lower (" +
                                ownChangeSteps(*c) + ")",
                            c->after, c->before});
      d.summary = who + ": slow network link since step " + std::to_string(c->change_step) +
                  " — bus bandwidth " + fmtPct(1 - c->ratio) + " below its own before (" +
                  ownChangeSteps(*c) + ")";
    }
  }
}

}  // namespace flare::engine
