#include "src/engine/analyzer.h"

#include <algorithm>

#include "src/common/log.h"
#include "src/engine/metrics.h"
#include "src/engine/store.h"

namespace flare::engine {

Analyzer::Analyzer(Store* store, AnalyzerOptions options)
    : store_(store), options_(std::move(options)) {}

void Analyzer::onBatch(const std::string& job_id, int32_t rank, const v1::RecordBatch& batch) {
  std::lock_guard lock(mu_);
  JobWindow& w = jobs_[job_id];
  w.model.addBatch(rank, batch);
  for (const auto& k : batch.kernels()) w.newest_ns = std::max(w.newest_ns, k.end_ns());
  for (const auto& s : batch.summaries()) w.newest_ns = std::max(w.newest_ns, s.window_end_ns());
  w.fresh = true;
}

v1::Alert toAlert(const std::string& job_id, const Diagnosis& d, int64_t now_ns) {
  v1::Alert a;
  a.set_job_id(job_id);
  a.set_rank(d.ranks.size() == 1 ? d.ranks[0] : -1);
  a.set_kind(d.kind);
  a.set_severity(d.severity >= 0.2 ? "critical" : "warning");
  a.set_team(teamName(d.team));
  std::string message = d.summary;
  for (const Evidence& e : d.evidence) message += " | " + e.text;  // one line: logs, webhooks
  a.set_message(message);
  a.set_time_unix_ns(now_ns);
  return a;
}

std::vector<v1::Alert> Analyzer::run(int64_t now_ns) {
  std::vector<v1::Alert> raised;
  std::lock_guard lock(mu_);
  ++runs_;
  for (auto& [job_id, w] : jobs_) {
    if (!w.fresh) continue;
    w.fresh = false;
    w.model.trim(w.newest_ns - options_.window_ns, options_.max_ops_per_rank);
    for (auto& [key, age] : w.active) ++age;
    for (const Diagnosis& d : diagnose(w.model, options_.diagnose)) {
      std::vector<int> ranks = d.ranks;
      std::sort(ranks.begin(), ranks.end());
      auto [it, inserted] = w.active.try_emplace({d.kind, ranks}, 0);
      const bool repeat = !inserted && it->second <= options_.forget_after_runs;
      it->second = 0;
      if (repeat) continue;
      v1::Alert a = toAlert(job_id, d, now_ns);
      if (store_ != nullptr) a.set_id(store_->putAlert(a));
      FLARE_LOG_WARN("engine", "ALERT [{}] job {}: {}", a.team(), job_id, d.summary);
      ++alerts_total_[{job_id, d.kind, a.team()}];
      raised.push_back(std::move(a));
    }
    std::erase_if(w.active,
                  [this](const auto& kv) { return kv.second > options_.forget_after_runs; });
  }
  return raised;
}

std::vector<Diagnosis> Analyzer::diagnoseJob(const std::string& job_id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return {};
  return diagnose(it->second.model, options_.diagnose);
}

std::optional<std::string> Analyzer::seriesJson(const std::string& job_id,
                                                const SeriesOptions& options,
                                                const std::string& baseline_job) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::nullopt;
  auto base =
      baseline_job.empty() || baseline_job == job_id ? jobs_.end() : jobs_.find(baseline_job);
  const JobModel* reference = base == jobs_.end() ? nullptr : &base->second.model;
  const JobSeries series = computeSeries(it->second.model, options, reference);
  return seriesToJson(job_id, it->second.model, series, reference ? baseline_job : "");
}

void Analyzer::writeMetrics(PromWriter& w) const {
  std::lock_guard lock(mu_);
  w.family("flare_alerts_total", "counter",
           "Alerts raised by the detectors, by job, kind and the team they are routed to.");
  for (const auto& [key, n] : alerts_total_) {
    const auto& [job, kind, team] = key;
    w.sample("flare_alerts_total", n, {{"job", job}, {"kind", kind}, {"team", team}});
  }
  w.family("flare_analyzer_window_ops", "gauge",
           "GPU ops held in the detectors' sliding window, by job.");
  for (const auto& [job, win] : jobs_) {
    w.sample("flare_analyzer_window_ops", static_cast<double>(win.model.opCount()), {{"job", job}});
  }
  w.family("flare_analyzer_runs_total", "counter", "Detector runs over all jobs.");
  w.sample("flare_analyzer_runs_total", runs_, {});
}

}  // namespace flare::engine
