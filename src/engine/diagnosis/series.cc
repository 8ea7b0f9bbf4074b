#include "src/engine/diagnosis/series.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <utility>

#include "src/common/text.h"
#include "src/records/op_kind.h"
#include "src/stats/quantile.h"
#include "src/stats/wasserstein.h"

namespace flare::engine {
namespace {

using flare::v1::OpKind;
using Interval = std::pair<int64_t, int64_t>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool isGpuOp(OpKind kind) {
  return kind != flare::v1::OP_KIND_SYNC;
}

// Issue latencies of a rank's GPU ops issued after its warm-up (its second step start).
void issueLatencies(const JobModel& job, const RankData& r, std::vector<double>* out) {
  const auto starts = job.stepStarts(r.rank);
  const int64_t after = starts.size() >= 2 ? starts[1] : INT64_MIN;
  for (const Op& op : r.ops) {
    if (op.issue >= after && isGpuOp(job.signatures()[op.sig].kind()))
      out->push_back(static_cast<double>(op.issueLatency()));
  }
}

LatencyQuantiles quantilesOf(std::vector<double>& v, const std::vector<double>& probabilities) {
  LatencyQuantiles q;
  q.samples = v.size();
  if (v.empty()) return q;
  std::sort(v.begin(), v.end());
  for (double p : probabilities) q.ns.push_back(stats::quantileSorted(v, p));
  return q;
}

// Per step interval of one rank: step time, V_inter, V_minority and the run-queue wait, from the
// shared per-step definition (JobModel::stepStats, src/records/step_stats.h); NaN where
// undefined (the wait: not measured, as in raw mode). A step sampled out by step sampling has
// its run-queue wait (the rank reads it every step) and no GPU figures.
void rankSteps(const JobModel& job, const RankData& r, const std::vector<int64_t>& starts,
               std::vector<double>* step_ns, std::vector<double>* v_inter,
               std::vector<double>* v_minority, std::vector<double>* run_queue) {
  const auto steps = job.stepStats(r.rank, /*with_sampled_out=*/true);
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    step_ns->push_back(static_cast<double>(starts[i + 1] - starts[i]));
    v_inter->push_back(kNaN);
    v_minority->push_back(kNaN);
    run_queue->push_back(kNaN);
  }
  for (const records::StepStats& st : steps) {
    const auto i = static_cast<size_t>(st.step);
    if (i >= v_inter->size()) continue;
    if (!st.sampled_out) {
      (*v_inter)[i] = st.vInter();
      (*v_minority)[i] = st.end_ns - st.start_ns - st.inter_ns > 0 ? st.vMinority() : kNaN;
    }
    if (st.run_queue_wait_ns >= 0) (*run_queue)[i] = static_cast<double>(st.run_queue_wait_ns);
  }
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string numbers(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + num(v[i]);
  return out + "]";
}

std::string latencyJson(const LatencyQuantiles& q) {
  return "{\"samples\":" + std::to_string(q.samples) + ",\"ns\":" + numbers(q.ns) + "}";
}

}  // namespace

JobSeries computeSeries(const JobModel& job, const SeriesOptions& options,
                        const JobModel* baseline) {
  JobSeries s;
  const size_t max_steps = std::clamp<size_t>(options.max_steps, 1, kSeriesMaxSteps);
  const size_t max_ranks = std::clamp<size_t>(options.max_ranks, 1, kSeriesMaxRanks);
  const size_t max_sigs = std::clamp<size_t>(options.max_signatures, 1, kSeriesMaxSignatures);
  const size_t points = std::clamp<size_t>(options.quantile_points, 2, kSeriesMaxQuantilePoints);
  for (size_t i = 0; i < points; ++i)
    s.probabilities.push_back(static_cast<double>(i) / static_cast<double>(points - 1));

  // Ranks: the priority ones that exist, then the lowest ids.
  s.rank_count = job.ranks().size();
  std::vector<int> included;
  std::set<int> taken;
  for (int r : options.priority_ranks) {
    if (included.size() < max_ranks && job.ranks().count(r) && taken.insert(r).second)
      included.push_back(r);
  }
  for (const auto& [r, data] : job.ranks()) {
    if (included.size() >= max_ranks) break;
    if (taken.insert(r).second) included.push_back(r);
  }
  s.ranks_truncated = included.size() < s.rank_count;

  // Steps: every rank's intervals, aligned by their index in the window; the last max_steps.
  std::map<int, std::vector<int64_t>> starts;
  for (const auto& [r, data] : job.ranks()) {
    starts[r] = job.stepStarts(r);
    if (starts[r].size() >= 2) s.total_steps = std::max(s.total_steps, starts[r].size() - 1);
  }
  s.first_step = s.total_steps > max_steps ? s.total_steps - max_steps : 0;
  s.step_count = s.total_steps - s.first_step;
  s.steps_truncated = s.first_step > 0;
  for (int r : included) {
    const RankData& data = job.ranks().at(r);
    std::vector<double> step_ns, vi, vm, rq;
    rankSteps(job, data, starts[r], &step_ns, &vi, &vm, &rq);
    RankSteps row;
    row.rank = r;
    for (size_t i = s.first_step; i < s.total_steps; ++i) {
      row.step_ns.push_back(i < step_ns.size() ? step_ns[i] : kNaN);
      row.v_inter.push_back(i < vi.size() ? vi[i] : kNaN);
      row.v_minority.push_back(i < vm.size() ? vm[i] : kNaN);
      row.run_queue_wait_ns.push_back(i < rq.size() ? rq[i] : kNaN);
    }
    s.ranks.push_back(std::move(row));
  }

  // Issue latencies: the job's (every rank), each included rank's, the baseline's.
  std::vector<double> all;
  for (const auto& [r, data] : job.ranks()) issueLatencies(job, data, &all);
  for (int r : included) {
    std::vector<double> mine;
    issueLatencies(job, job.ranks().at(r), &mine);
    s.rank_latency.push_back({r, quantilesOf(mine, s.probabilities)});
  }
  if (baseline != nullptr) {
    std::vector<double> base;
    for (const auto& [r, data] : baseline->ranks()) issueLatencies(*baseline, data, &base);
    if (!all.empty() && !base.empty())
      s.baseline_w1_ns = stats::wasserstein1(std::span<const double>(all), base);
    s.baseline_latency = quantilesOf(base, s.probabilities);
  }
  s.latency = quantilesOf(all, s.probabilities);

  // Signatures: count, GPU time, median duration and TFLOPS per rank (raw ops and summaries).
  struct Acc {
    uint64_t count = 0;
    double total_ns = 0;
    double flops = 0;
    std::vector<double> durations;
    std::vector<std::pair<double, uint64_t>> cluster_p50;  // summaries: (p50, count)
  };
  std::map<uint32_t, std::map<int, Acc>> acc;
  for (const auto& [r, data] : job.ranks()) {
    for (const Op& op : data.ops) {
      const auto& sig = job.signatures()[op.sig];
      if (!isGpuOp(sig.kind())) continue;
      Acc& a = acc[op.sig][r];
      ++a.count;
      a.total_ns += static_cast<double>(op.duration());
      a.flops += static_cast<double>(op.flops);
      a.durations.push_back(static_cast<double>(op.duration()));
    }
    for (const SummaryWindow& w : data.summaries) {
      const auto& sig = job.signatures()[w.sig];
      if (!isGpuOp(sig.kind())) continue;
      Acc& a = acc[w.sig][r];
      a.count += w.count();
      a.total_ns += w.sumNs();
      a.flops += w.flops;
      for (const auto& c : w.clusters) a.cluster_p50.push_back({c.p50, c.count});
    }
  }
  std::vector<SignatureSeries> sigs;
  for (auto& [sig_id, per_rank] : acc) {
    SignatureSeries ss;
    ss.sig = sig_id;
    double flops = 0;
    for (const auto& [r, a] : per_rank) {
      ss.count += a.count;
      ss.total_ns += a.total_ns;
      flops += a.flops;
    }
    const bool has_flops = records::computesFlops(job.signatures()[sig_id].kind());
    ss.tflops = has_flops && ss.total_ns > 0 ? flops / ss.total_ns / 1e3 : 0;  // flop/ns = GFLOP/s
    for (int r : included) {
      auto it = per_rank.find(r);
      if (it == per_rank.end()) continue;
      Acc& a = it->second;
      SignatureRankStat st;
      st.rank = r;
      st.count = a.count;
      st.total_ns = a.total_ns;
      if (!a.durations.empty()) {
        st.p50_ns = stats::quantileInPlace(a.durations, 0.5);
      } else if (!a.cluster_p50.empty()) {
        std::sort(a.cluster_p50.begin(), a.cluster_p50.end());
        uint64_t total = 0, seen = 0;
        for (const auto& c : a.cluster_p50) total += c.second;
        for (const auto& [p50, n] : a.cluster_p50) {
          seen += n;
          if (2 * seen >= total) {
            st.p50_ns = p50;
            break;
          }
        }
      }
      st.tflops = has_flops && a.total_ns > 0 ? a.flops / a.total_ns / 1e3 : 0;
      ss.ranks.push_back(st);
    }
    sigs.push_back(std::move(ss));
  }
  std::sort(sigs.begin(), sigs.end(), [](const SignatureSeries& a, const SignatureSeries& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.sig < b.sig;
  });
  s.signature_count = sigs.size();
  s.signatures_truncated = sigs.size() > max_sigs;
  if (s.signatures_truncated) sigs.resize(max_sigs);
  s.signatures = std::move(sigs);
  return s;
}

std::string seriesToJson(const std::string& job_id, const JobModel& job, const JobSeries& s,
                         const std::string& baseline_job) {
  std::string out = "{\"jobId\":" + common::jsonQuote(job_id);
  out += ",\"rankCount\":" + std::to_string(s.rank_count);
  out += ",\"ranks\":[";
  for (size_t i = 0; i < s.ranks.size(); ++i)
    out += (i ? "," : "") + std::to_string(s.ranks[i].rank);
  out += "],\"steps\":{\"total\":" + std::to_string(s.total_steps) +
         ",\"first\":" + std::to_string(s.first_step) +
         ",\"count\":" + std::to_string(s.step_count) + ",\"warmup\":1}";
  out += ",\"truncated\":{\"ranks\":" + std::string(s.ranks_truncated ? "true" : "false") +
         ",\"steps\":" + (s.steps_truncated ? "true" : "false") +
         ",\"signatures\":" + (s.signatures_truncated ? "true" : "false") + "}";
  auto matrix = [&](const char* name, std::vector<double> RankSteps::*field) {
    out += ",\"" + std::string(name) + "\":[";
    for (size_t i = 0; i < s.ranks.size(); ++i) out += (i ? "," : "") + numbers(s.ranks[i].*field);
    out += "]";
  };
  matrix("stepTimeNs", &RankSteps::step_ns);
  matrix("vInter", &RankSteps::v_inter);
  matrix("vMinority", &RankSteps::v_minority);
  matrix("runQueueWaitNs", &RankSteps::run_queue_wait_ns);
  out += ",\"issueLatency\":{\"probabilities\":" + numbers(s.probabilities) +
         ",\"job\":" + latencyJson(s.latency) + ",\"perRank\":[";
  for (size_t i = 0; i < s.rank_latency.size(); ++i) {
    const auto& [rank, q] = s.rank_latency[i];
    out += (i ? "," : "") + std::string("{\"rank\":") + std::to_string(rank) +
           ",\"samples\":" + std::to_string(q.samples) + ",\"ns\":" + numbers(q.ns) + "}";
  }
  out += "],\"baseline\":";
  if (s.baseline_latency) {
    out += "{\"jobId\":" + common::jsonQuote(baseline_job) +
           ",\"samples\":" + std::to_string(s.baseline_latency->samples) +
           ",\"ns\":" + numbers(s.baseline_latency->ns) + ",\"w1Ns\":" + num(s.baseline_w1_ns) +
           "}";
  } else {
    out += "null";
  }
  out += "},\"signatureCount\":" + std::to_string(s.signature_count) + ",\"signatures\":[";
  for (size_t i = 0; i < s.signatures.size(); ++i) {
    const SignatureSeries& ss = s.signatures[i];
    const flare::v1::Signature& sig = job.signatures()[ss.sig];
    out += i ? "," : "";
    out += "{\"name\":" + common::jsonQuote(sig.name()) + ",\"kind\":\"" +
           flare::v1::OpKind_Name(sig.kind()) + "\",\"dtype\":\"" +
           flare::v1::DType_Name(sig.dtype()) + "\",\"shape\":[";
    for (int k = 0; k < sig.shape_size(); ++k) out += (k ? "," : "") + std::to_string(sig.shape(k));
    out += "],\"layout\":" + common::jsonQuote(sig.layout()) +
           ",\"count\":" + std::to_string(ss.count) + ",\"totalNs\":" + num(ss.total_ns) +
           ",\"tflops\":" + num(ss.tflops) + ",\"perRank\":[";
    for (size_t k = 0; k < ss.ranks.size(); ++k) {
      const SignatureRankStat& st = ss.ranks[k];
      out += (k ? "," : "") + std::string("{\"rank\":") + std::to_string(st.rank) +
             ",\"count\":" + std::to_string(st.count) + ",\"totalNs\":" + num(st.total_ns) +
             ",\"p50Ns\":" + num(st.p50_ns) + ",\"tflops\":" + num(st.tflops) + "}";
    }
    out += "]}";
  }
  return out + "]}\n";
}

}  // namespace flare::engine
