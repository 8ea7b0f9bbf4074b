#include "src/engine/analyzer.h"

#include <algorithm>
#include <optional>

#include "src/common/log.h"
#include "src/engine/diagnosis/job_metrics.h"
#include "src/engine/ingest.h"
#include "src/engine/metrics.h"
#include "src/engine/store.h"

namespace flare::engine {
namespace {

constexpr const char* kBaselinePrefix = "healthy/";

}  // namespace

Analyzer::Analyzer(Store* store, AnalyzerOptions options)
    : store_(store), options_(std::move(options)) {
  if (store_ == nullptr) return;
  for (const auto& [key, value] : store_->baselines(kBaselinePrefix)) {
    v1::HealthyBaseline b;
    if (!b.ParseFromString(value) || b.job_id().empty()) {
      FLARE_LOG_WARN("engine", "baseline {} in the store is unreadable; ignored", key);
      continue;
    }
    baselines_[b.job_id()] = std::move(b);
  }
}

void Analyzer::onBatch(const std::string& job_id, int32_t rank, const v1::RecordBatch& batch) {
  bool ask = false;
  {
    std::lock_guard lock(mu_);
    auto [slot, created] = jobs_.try_emplace(job_id);
    JobWindow& w = slot->second;
    // `model` is only touched under analysis_mu_, except here, before any reader can see it.
    if (created) w.model.setCompaction(options_.fold_after_ns, options_.fold_bucket_ns);
    w.incoming.addBatch(rank, batch);
    w.pending = true;
    for (const auto& k : batch.kernels()) w.newest_ns = std::max(w.newest_ns, k.end_ns());
    for (const auto& s : batch.summaries()) w.newest_ns = std::max(w.newest_ns, s.window_end_ns());
    w.fresh = true;
    ask = options_.rank_meta && w.known_ranks.insert(rank).second;
    if (!ask && batch.has_device() && validDeviceInfo(batch.device())) {
      // The GPU, named after the hello (the timing thread describes it at its first op).
      auto it = w.incoming.ranks().find(rank);
      w.incoming.setRankInfo(rank, it != w.incoming.ranks().end() ? it->second.host : std::string(),
                             batch.device().name(), batch.device().uuid());
      noteBackend(w, rank, batch.device().name());
    }
  }
  if (!ask) return;
  const RankMeta meta = options_.rank_meta(job_id, rank);  // outside the lock: it may lock Ingest
  std::lock_guard lock(mu_);
  JobWindow& w = jobs_[job_id];
  // A DeviceInfo in this very batch is newer than what Ingest held when it was asked.
  const bool fresh = batch.has_device() && validDeviceInfo(batch.device());
  const std::string device = fresh ? batch.device().name() : meta.device_name;
  w.incoming.setRankInfo(rank, meta.host, device, fresh ? batch.device().uuid() : meta.device_uuid);
  w.world_size = std::max(w.world_size, meta.world_size);
  noteBackend(w, rank, device);
}

void Analyzer::onRefused(const std::string& job_id, int32_t rank, const std::string& reason,
                         uint64_t batches, uint64_t items, const std::string& error,
                         int64_t now_ns) {
  std::lock_guard lock(mu_);
  auto [slot, created] = jobs_.try_emplace(job_id);
  JobWindow& w = slot->second;
  if (created) w.model.setCompaction(options_.fold_after_ns, options_.fold_bucket_ns);
  JobWindow::Refused& r = w.refused[rank];
  auto& [b, i] = r.by_reason[reason];
  b += batches;
  i += items;
  r.last_error = reason + ": " + error;
  r.last_ns = now_ns;
  w.fresh = true;  // diagnosed at the next run, even if nothing of the job was accepted
}

std::optional<Diagnosis> Analyzer::refusedDiagnosis(JobWindow& w, int64_t now_ns) const {
  std::erase_if(w.refused,
                [&](const auto& kv) { return kv.second.last_ns < now_ns - options_.window_ns; });
  if (w.refused.empty()) return std::nullopt;
  Diagnosis d;
  d.kind = "data_refused";
  d.team = Team::kInfrastructure;
  d.cause = "flared refused the rank's data";
  uint64_t batches = 0, items = 0;
  for (const auto& [rank, r] : w.refused) {
    d.ranks.push_back(rank);
    std::string reasons;
    for (const auto& [reason, n] : r.by_reason) {
      if (!reasons.empty()) reasons += ", ";
      reasons += reason + " " +
                 (n.first > 0 ? std::to_string(n.first) + " batches" : std::string()) +
                 (n.first > 0 && n.second > 0 ? " + " : "") +
                 (n.second > 0 ? std::to_string(n.second) + " items" : std::string());
      batches += n.first;
      items += n.second;
    }
    d.evidence.push_back(
        {"refused", "rank " + std::to_string(rank) + ": " + reasons + "; last: " + r.last_error, 0,
         0});
  }
  d.summary = "flared refused " +
              (batches > 0 ? std::to_string(batches) + " batch(es) and " : std::string()) +
              std::to_string(items) + " item(s) of " + std::to_string(d.ranks.size()) +
              " rank(s) in the last " + std::to_string(options_.window_ns / 1'000'000'000) +
              " s: the detectors do not see that data (flare status; "
              "flare_ingest_rejected_total, flare_ingest_items_dropped_total)";
  d.severity = batches > 0 ? 1.0 : 0.1;
  return d;
}

// The backend: the device name of the lowest rank that reported one. O(1) per report (a scan
// of every rank per new rank was O(ranks²) at 10,000 ranks without device names).
void Analyzer::noteBackend(JobWindow& w, int32_t rank, const std::string& device_name) {
  if (device_name.empty()) return;
  if (w.backend.empty() || rank <= w.backend_rank) {
    w.backend = device_name;
    w.backend_rank = rank;
  }
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

int32_t Analyzer::scaleOf(const JobWindow& w) {
  return w.world_size > 0 ? w.world_size : static_cast<int32_t>(w.incoming.ranks().size());
}

const History* Analyzer::historyFor(const JobWindow& w) const {
  const std::pair<std::string, int32_t> key{w.backend, scaleOf(w)};
  auto it = history_cache_.find(key);
  if (it == history_cache_.end()) {
    std::vector<const v1::HealthyBaseline*> runs;
    for (const auto& [job, b] : baselines_) {
      if (b.backend() == key.first && b.scale() == key.second) runs.push_back(&b);
    }
    it = history_cache_.emplace(key, buildHistory(runs, options_.history)).first;
    if (it->second.runs > 0) {
      FLARE_LOG_INFO("engine",
                     "history of backend '{}' at {} ranks: {} runs, issue-latency median {:.1f} "
                     "us, learned W1 threshold {:.1f} us",
                     key.first, key.second, it->second.runs, it->second.issue_cap_ns / 1e3,
                     it->second.issue_w1_threshold_ns / 1e3);
    }
  }
  return it->second.runs > 0 ? &it->second : nullptr;
}

std::vector<v1::Alert> Analyzer::run(int64_t now_ns) {
  // Under mu_ only: hand each fresh job's new records over (O(ranks)) and copy its history. The
  // window is then trimmed, folded and diagnosed under analysis_mu_ alone, so ingest (onBatch,
  // from every rank stream) never waits for the detectors of a large job, and nothing copies
  // the window.
  std::lock_guard analysis_lock(analysis_mu_);
  struct Work {
    std::string job_id;
    JobWindow* window;
    JobModel taken;
    int64_t newest_ns;
    std::optional<History> history;
  };
  std::vector<Work> work;
  {
    std::lock_guard lock(mu_);
    ++runs_;
    for (auto& [job_id, w] : jobs_) {
      if (!w.fresh) continue;
      w.fresh = false;
      // A job never compares with its own baseline (it would learn nothing and alarm on nothing).
      const History* history = baselines_.contains(job_id) ? nullptr : historyFor(w);
      work.push_back({job_id, &w, takePending(w), w.newest_ns,
                      history ? std::optional<History>(*history) : std::nullopt});
    }
  }
  std::vector<v1::Alert> raised;
  for (Work& job : work) {
    JobModel& model = job.window->model;
    model.absorb(std::move(job.taken));
    model.trim(job.newest_ns - options_.window_ns, options_.max_ops_per_rank);
    const History* history = job.history ? &*job.history : nullptr;
    v1::JobMetrics metrics = computeJobMetrics(model, history, options_.samples_per_step);
    metrics.set_computed_unix_ns(now_ns);
    std::map<std::string, SignatureBusbw> signature_busbw = signatureBusbw(model);
    std::vector<Diagnosis> found = diagnose(model, options_.diagnose, nullptr, history);
    const size_t ops = model.opCount();
    std::lock_guard lock(mu_);
    JobWindow& w = *job.window;
    if (std::optional<Diagnosis> refused = refusedDiagnosis(w, now_ns))
      found.push_back(std::move(*refused));
    w.window_ops = ops;
    w.metrics = std::move(metrics);
    w.signature_busbw = std::move(signature_busbw);
    for (auto& [key, age] : w.active) ++age;
    for (const Diagnosis& d : found) {
      std::vector<int> ranks = d.ranks;
      std::sort(ranks.begin(), ranks.end());
      auto [it, inserted] = w.active.try_emplace({d.kind, ranks}, 0);
      const bool repeat = !inserted && it->second <= options_.forget_after_runs;
      it->second = 0;
      if (repeat) continue;
      v1::Alert a = toAlert(job.job_id, d, now_ns);
      if (store_ != nullptr) a.set_id(store_->putAlert(a));
      FLARE_LOG_WARN("engine", "ALERT [{}] job {}: {}", a.team(), job.job_id, d.summary);
      ++alerts_total_[{job.job_id, d.kind, a.team()}];
      if (options_.on_alert) options_.on_alert(a, d);
      raised.push_back(std::move(a));
    }
    std::erase_if(w.active,
                  [this](const auto& kv) { return kv.second > options_.forget_after_runs; });
  }
  return raised;
}

JobModel Analyzer::takePending(JobWindow& w) {
  w.pending = false;
  return w.incoming.takeRecords();
}

JobModel* Analyzer::syncedModel(const std::string& job_id) {
  JobWindow* w = nullptr;
  JobModel taken;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return nullptr;
    w = &it->second;
    taken = takePending(*w);
  }
  w->model.absorb(std::move(taken));
  return &w->model;
}

void Analyzer::handOver() {
  std::lock_guard analysis_lock(analysis_mu_);
  std::vector<std::pair<JobWindow*, JobModel>> taken;
  {
    std::lock_guard lock(mu_);
    for (auto& [job_id, w] : jobs_) {
      if (w.pending) taken.emplace_back(&w, takePending(w));
    }
  }
  for (auto& [w, records] : taken) w->model.absorb(std::move(records));
}

std::vector<Diagnosis> Analyzer::diagnoseJob(const std::string& job_id, LookedAt* looked_at) {
  std::lock_guard analysis_lock(analysis_mu_);
  JobModel* model = syncedModel(job_id);
  if (model == nullptr) return {};
  std::optional<History> history;
  std::optional<Diagnosis> refused;
  {
    std::lock_guard lock(mu_);
    JobWindow& w = jobs_.at(job_id);
    const History* h = baselines_.contains(job_id) ? nullptr : historyFor(w);
    if (h != nullptr) history = *h;
    refused = refusedDiagnosis(w, common::realtimeNs());
  }
  std::vector<DetectorRun> runs;
  std::vector<Diagnosis> found =
      diagnose(*model, options_.diagnose, nullptr, history ? &*history : nullptr, &runs);
  if (looked_at != nullptr) *looked_at = lookedAt(*model, std::move(runs));
  if (refused) found.push_back(std::move(*refused));
  return found;
}

std::optional<v1::HealthyBaseline> Analyzer::addBaseline(const std::string& job_id,
                                                         const std::string& backend, int64_t now_ns,
                                                         std::string* error) {
  std::lock_guard analysis_lock(analysis_mu_);
  const JobModel* live = syncedModel(job_id);
  std::optional<StoredJob> stored;
  if (live == nullptr || live->opCount() == 0) {
    // Not in memory (flared restarted, or the job left the window): from its stored records.
    stored = jobFromStore(job_id);
    if (!stored || stored->model.opCount() == 0) {
      *error = "job " + job_id +
               " has no records in the detectors' window nor raw records in the store (run "
               "flared with --store-raw 1, the default, to mark finished jobs later)";
      return std::nullopt;
    }
  }
  const JobModel& model = stored ? stored->model : *live;
  v1::HealthyBaseline b = makeBaseline(model);
  auto sketch = stats::LatencySketch::deserialize(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(b.issue_latency().data()), b.issue_latency().size()));
  if (!sketch || sketch->count() < 30) {
    *error = "job " + job_id + " has too few GPU ops after its warm-up step to be a baseline";
    return std::nullopt;
  }
  b.set_job_id(job_id);
  std::lock_guard lock(mu_);
  if (stored) {
    b.set_backend(backend.empty() ? stored->backend : backend);
    b.set_scale(stored->scale);
  } else {
    const JobWindow& w = jobs_.at(job_id);
    b.set_backend(backend.empty() ? w.backend : backend);
    b.set_scale(scaleOf(w));
  }
  b.set_added_unix_ns(now_ns);
  if (store_ != nullptr) {
    store_->putBaseline(kBaselinePrefix + job_id, b.SerializeAsString(), now_ns);
    store_->flush();
  }
  baselines_[job_id] = b;
  history_cache_.clear();
  FLARE_LOG_INFO("engine", "job {} marked as healthy history (backend '{}', {} ranks)", job_id,
                 b.backend(), b.scale());
  return b;
}

bool Analyzer::removeBaseline(const std::string& job_id) {
  std::lock_guard lock(mu_);
  if (baselines_.erase(job_id) == 0) return false;
  if (store_ != nullptr) {
    store_->removeBaseline(kBaselinePrefix + job_id);
    store_->flush();
  }
  history_cache_.clear();
  return true;
}

v1::ListBaselinesResponse Analyzer::listBaselines() const {
  std::lock_guard lock(mu_);
  v1::ListBaselinesResponse out;
  for (const auto& [job, b] : baselines_) {
    v1::HealthyBaseline* c = out.add_baselines();
    *c = b;
    c->clear_issue_latency();
    c->clear_issue_latency_by_kind();
    c->clear_signatures();
  }
  return out;
}

std::optional<v1::JobMetrics> Analyzer::jobMetrics(const std::string& job_id) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.metrics;
}

void Analyzer::enrichReport(v1::GetReportResponse* report) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(report->job_id());
  if (it == jobs_.end()) return;
  const JobWindow& w = it->second;
  if (w.metrics) *report->mutable_metrics() = *w.metrics;
  if (!w.signature_busbw.empty()) {
    for (auto& s : *report->mutable_signatures()) {
      auto b = w.signature_busbw.find(signatureKey(s.signature()));
      if (b == w.signature_busbw.end()) continue;
      s.set_job_busbw_gbps(b->second.gbps);
      s.set_job_busbw_instances(b->second.instances);
    }
  }
  const History* history = baselines_.contains(report->job_id()) ? nullptr : historyFor(w);
  if (history == nullptr) return;
  report->set_baseline_runs(static_cast<uint32_t>(history->runs));
  for (auto& s : *report->mutable_signatures()) {
    auto h = history->signatures.find(signatureKey(s.signature()));
    if (h == history->signatures.end() || h->second.p50_ns <= 0) continue;
    auto* c = s.mutable_history();
    c->set_baseline_runs(h->second.runs);
    c->set_baseline_p50_ns(static_cast<int64_t>(h->second.p50_ns));
    c->set_baseline_tflops(h->second.tflops);
    if (s.p50_ns() > 0) {
      c->set_duration_ratio(static_cast<double>(s.p50_ns()) / h->second.p50_ns);
      // TFLOPS at the median duration: the same FLOPs per call, so the inverse duration ratio.
      if (h->second.tflops > 0) c->set_tflops_ratio(h->second.p50_ns / s.p50_ns());
    }
    if (h->second.busbw_gbps > 0) {
      c->set_baseline_busbw_gbps(h->second.busbw_gbps);
      if (s.job_busbw_gbps() > 0) c->set_busbw_ratio(s.job_busbw_gbps() / h->second.busbw_gbps);
    }
  }
}

std::optional<Analyzer::StoredJob> Analyzer::jobFromStore(const std::string& job_id) const {
  if (store_ == nullptr) return std::nullopt;
  constexpr size_t kMaxRecords = 4'000'000;  // ~100 B each in memory
  const std::vector<RawRecord> rows = store_->rawRecords(job_id, INT64_MIN, INT64_MAX, kMaxRecords);
  if (rows.empty()) return std::nullopt;
  if (rows.size() == kMaxRecords) {
    FLARE_LOG_WARN("engine", "job {}: only its oldest {} stored raw records are used", job_id,
                   kMaxRecords);
  }
  std::vector<v1::Signature> sigs;
  for (const SignatureRow& row : store_->loadSignatures()) {
    if (row.job_id != job_id) continue;
    v1::Signature s;
    if (!s.ParseFromString(row.signature)) continue;
    s.set_id(row.sig_id);
    sigs.push_back(std::move(s));
  }
  std::map<int32_t, v1::RecordBatch> batches;
  for (const RawRecord& r : rows) {
    v1::RecordBatch& b = batches[r.rank];
    if (b.signatures_size() == 0) {
      b.set_rank(r.rank);
      for (const auto& s : sigs) *b.add_signatures() = s;
    }
    v1::KernelRecord* k = b.add_kernels();
    k->set_signature_id(r.sig_id);
    k->set_stream_id(r.stream);
    k->set_issue_ns(r.issue_ns);
    k->set_start_ns(r.start_ns);
    k->set_end_ns(r.end_ns);
    k->set_issue_latency_ns(r.start_ns - r.issue_ns);
    k->set_flops(r.flops);
    k->set_bytes(r.bytes);
  }
  StoredJob out;
  for (const auto& [rank, b] : batches) out.model.addBatch(rank, b);
  int32_t backend_rank = INT32_MAX;
  for (const RankRow& row : store_->loadRanks()) {
    if (row.job_id != job_id || !out.model.ranks().contains(row.rank)) continue;
    out.model.setRankInfo(row.rank, row.host, row.device_name, row.device_uuid);
    if (!row.device_name.empty() && row.rank < backend_rank) {
      backend_rank = row.rank;
      out.backend = row.device_name;
    }
  }
  for (const JobRow& row : store_->loadJobs()) {
    if (row.job_id == job_id) out.scale = row.world_size;
  }
  if (out.scale <= 0) out.scale = static_cast<int32_t>(out.model.ranks().size());
  return out;
}

std::optional<std::vector<v1::RecordBatch>> Analyzer::recordBatches(const std::string& job_id,
                                                                    const std::vector<int>& ranks) {
  std::lock_guard analysis_lock(analysis_mu_);  // ingest does not wait for this read
  const JobModel* live = syncedModel(job_id);
  std::optional<StoredJob> stored;
  if (live == nullptr) {
    stored = jobFromStore(job_id);
    if (!stored) return std::nullopt;
  }
  std::vector<v1::RecordBatch> out;
  const JobModel& model = stored ? stored->model : *live;
  if (ranks.empty()) {
    for (const auto& [rank, data] : model.ranks()) {
      if (auto b = model.rankBatch(rank)) out.push_back(std::move(*b));
    }
  } else {
    for (int rank : ranks) {
      if (auto b = model.rankBatch(rank)) out.push_back(std::move(*b));
    }
  }
  return out;
}

std::optional<std::string> Analyzer::seriesJson(const std::string& job_id,
                                                const SeriesOptions& options,
                                                const std::string& baseline_job) {
  std::lock_guard analysis_lock(analysis_mu_);  // ingest does not wait for this read
  const JobModel* model = syncedModel(job_id);
  if (model == nullptr) return std::nullopt;
  const JobModel* reference =
      baseline_job.empty() || baseline_job == job_id ? nullptr : syncedModel(baseline_job);
  const JobSeries series = computeSeries(*model, options, reference);
  return seriesToJson(job_id, *model, series, reference ? baseline_job : "");
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
           "GPU ops held in the detectors' sliding window as of their last run, by job.");
  for (const auto& [job, win] : jobs_) {
    w.sample("flare_analyzer_window_ops", static_cast<double>(win.window_ops), {{"job", job}});
  }
  w.family("flare_analyzer_runs_total", "counter", "Detector runs over all jobs.");
  w.sample("flare_analyzer_runs_total", runs_, {});
  w.family("flare_baseline_runs", "gauge",
           "Jobs kept as healthy history (flare baseline add), over all backends and scales.");
  w.sample("flare_baseline_runs", static_cast<uint64_t>(baselines_.size()), {});

  // The five metrics per job (docs/metrics.md "Per-job gauges"), as of the job's latest run.
  auto each = [this](auto fn) {
    for (const auto& [job, win] : jobs_) {
      if (win.metrics) fn(job, *win.metrics);
    }
  };
  w.family("flare_job_steps_per_second", "gauge",
           "Training steps per second (median over ranks, after the warm-up step).");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (m.steps() > 0) w.sample("flare_job_steps_per_second", m.steps_per_second(), {{"job", job}});
  });
  w.family("flare_job_samples_per_second", "gauge",
           "Samples per second: steps/s times the batch size (configured or from step markers).");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (m.samples_per_second() > 0)
      w.sample("flare_job_samples_per_second", m.samples_per_second(), {{"job", job}});
  });
  w.family("flare_job_flops_per_second", "gauge",
           "Achieved FLOP/s of GEMM/attention kernels, job-wide: their FLOPs over their time.");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (!m.rank_tflops().empty())
      w.sample("flare_job_flops_per_second", m.tflops() * 1e12, {{"job", job}});
  });
  w.family("flare_job_rank_flops_per_second", "gauge",
           "Achieved FLOP/s of GEMM/attention kernels on one rank.");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    for (const auto& r : m.rank_tflops()) {
      w.sample("flare_job_rank_flops_per_second", r.tflops() * 1e12,
               {{"job", job}, {"rank", std::to_string(r.rank())}});
    }
  });
  w.family("flare_job_rank_run_queue_wait_seconds", "gauge",
           "Time one rank's issuing threads waited for a CPU per step (run queue), median over "
           "its measured steps after the warm-up.");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    for (const auto& r : m.rank_run_queue_wait()) {
      w.sample("flare_job_rank_run_queue_wait_seconds", r.wait_ns() / 1e9,
               {{"job", job}, {"rank", std::to_string(r.rank())}});
    }
  });
  w.family("flare_job_busbw_bytes_per_second", "gauge",
           "Collective bus bandwidth (nccl-tests), median over complete instances, by kind.");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    for (const auto& b : m.busbw()) {
      w.sample("flare_job_busbw_bytes_per_second", b.busbw_gbps() * 1e9,
               {{"job", job}, {"kind", b.kind()}});
    }
  });
  w.family("flare_job_issue_latency_w1_seconds", "gauge",
           "1-Wasserstein distance of the job's issue-latency distribution to healthy history "
           "(both clipped at the history median); only with a baseline.");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (m.has_baseline())
      w.sample("flare_job_issue_latency_w1_seconds", m.issue_latency_w1_ns() / 1e9, {{"job", job}});
  });
  w.family("flare_job_issue_latency_w1_threshold_seconds", "gauge",
           "The learned alarm threshold of flare_job_issue_latency_w1_seconds.");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (m.has_baseline())
      w.sample("flare_job_issue_latency_w1_threshold_seconds",
               m.issue_latency_w1_threshold_ns() / 1e9, {{"job", job}});
  });
  w.family("flare_job_bytes_per_rank_step", "gauge",
           "Encoded bytes a rank sends per training step (batches over steps in the detectors' "
           "window, median over ranks): the volume of FLARE_MODE.");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (m.bytes_per_rank_step() > 0)
      w.sample("flare_job_bytes_per_rank_step", m.bytes_per_rank_step(), {{"job", job}});
  });
  w.family("flare_job_void_inter_ratio", "gauge",
           "V_inter: GPU idle around the DataLoader call, share of the step (median over ranks).");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (m.steps() > 0) w.sample("flare_job_void_inter_ratio", m.v_inter(), {{"job", job}});
  });
  w.family("flare_job_void_minority_ratio", "gauge",
           "V_minority: time in minority kernels, share of the busy step (median over ranks).");
  each([&](const std::string& job, const v1::JobMetrics& m) {
    if (m.steps() > 0) w.sample("flare_job_void_minority_ratio", m.v_minority(), {{"job", job}});
  });
}

}  // namespace flare::engine
