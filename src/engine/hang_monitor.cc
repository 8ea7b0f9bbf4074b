#include "src/engine/hang_monitor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "src/common/log.h"
#include "src/common/text.h"

namespace flare::engine {
namespace {

std::string jsonInts(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

double seconds(int64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

}  // namespace

HangMonitor::HangMonitor(Ingest& ingest, Store* store, const common::Clock& wall,
                         HangMonitorOptions options)
    : ingest_(ingest), store_(store), wall_(wall), options_(options) {}

HangMonitor::~HangMonitor() {
  stop();
}

void HangMonitor::start() {
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      lock.unlock();
      check();
      lock.lock();
      cv_.wait_for(lock, std::chrono::nanoseconds(options_.poll_interval_ns),
                   [this] { return stopping_; });
    }
  });
}

void HangMonitor::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<HangIncident> HangMonitor::check() {
  std::vector<HangIncident> out;
  const int64_t now = wall_.nowNs();
  const v1::ListJobsResponse jobs = ingest_.listJobs(v1::ListJobsRequest{});
  for (const v1::JobInfo& job : jobs.jobs()) {
    if (job.finished()) {
      jobs_.erase(job.job_id());
      continue;
    }
    v1::ListRanksRequest rreq;
    rreq.set_job_id(job.job_id());
    v1::ListRanksResponse ranks;
    if (ingest_.ranks(rreq, &ranks) != Code::kOk) continue;
    JobWatch& w = jobs_[job.job_id()];
    bool progressed = false;
    std::vector<int> silent;
    int64_t silent_for = 0;
    int64_t onset = now;
    size_t connected = 0;
    for (const v1::RankInfo& r : ranks.ranks()) {
      auto [it, fresh] = w.ranks.try_emplace(r.rank());
      RankWatch& rw = it->second;
      if (fresh || r.records() != rw.records) {
        if (!fresh) progressed = true;
        rw.records = r.records();
        rw.changed_ns = now;
        w.last_progress_ns = std::max(w.last_progress_ns, now);
      }
      if (!r.connected()) continue;
      ++connected;
      if (now - rw.changed_ns >= options_.hang_timeout_ns) {
        silent.push_back(r.rank());
        silent_for = std::max(silent_for, now - rw.changed_ns);
        onset = std::min(onset, rw.changed_ns);
      }
    }
    if (w.episode_open) {
      if (progressed) {
        w.episode_open = false;  // the job moves again: the episode is over
        FLARE_LOG_INFO("engine", "hang episode of job {} ended: ranks progress again",
                       job.job_id());
      }
      continue;
    }
    // A job with no connected rank has ended (or every rank is gone): nothing to diagnose.
    if (connected == 0 || silent.empty()) continue;
    w.episode_open = true;
    char trigger[160];
    std::snprintf(trigger, sizeof(trigger), "ranks %s silent for %.1f s (timeout %.1f s)",
                  hang::compactRanges(silent).c_str(), seconds(silent_for),
                  seconds(options_.hang_timeout_ns));
    out.push_back(diagnose(job.job_id(), ranks, trigger, onset, w.last_progress_ns));
  }
  return out;
}

std::map<int32_t, v1::CommandResult> HangMonitor::roundTrip(const std::string& job_id,
                                                            const std::vector<int32_t>& ranks,
                                                            const v1::Command& cmd) {
  std::map<int32_t, v1::CommandResult> answers;
  if (ranks.empty()) return answers;
  v1::SendCommandRequest req;
  req.set_job_id(job_id);
  for (int32_t r : ranks) req.add_ranks(r);
  *req.mutable_command() = cmd;
  v1::SendCommandResponse sent;
  std::string error;
  if (ingest_.sendCommandTrusted(req, &sent, &error) != Code::kOk) {
    FLARE_LOG_WARN("engine", "hang diagnosis of job {}: command not sent: {}", job_id, error);
    return answers;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(options_.answer_timeout_ns);
  v1::GetCommandResultsRequest rq;
  rq.set_job_id(job_id);
  rq.set_command_id(sent.command_id());
  while (true) {
    v1::GetCommandResultsResponse res;
    if (ingest_.commandResults(rq, &res) == Code::kOk) {
      for (const v1::RankCommandResult& r : res.results()) answers[r.rank()] = r.result();
    }
    if (answers.size() >= ranks.size() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::nanoseconds(options_.answer_poll_ns));
  }
  return answers;
}

HangIncident HangMonitor::diagnose(const std::string& job_id, const v1::ListRanksResponse& ranks,
                                   std::string trigger, int64_t onset_ns,
                                   int64_t last_progress_ns) {
  HangIncident inc;
  inc.job_id = job_id;
  inc.trigger = std::move(trigger);
  inc.onset_ns = onset_ns;
  inc.last_progress_ns = last_progress_ns;
  inc.opened_ns = wall_.nowNs();
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<int32_t> connected;
  for (const v1::RankInfo& r : ranks.ranks()) {
    if (r.connected()) connected.push_back(r.rank());
  }
  v1::Command dump;
  dump.mutable_dump_stacks()->set_native(true);
  const auto answers = roundTrip(job_id, connected, dump);

  std::vector<hang::RankEvidence> evidence;
  char why[96];
  std::snprintf(why, sizeof(why), "no answer to DumpStacks in %.1f s",
                seconds(options_.answer_timeout_ns));
  for (const v1::RankInfo& r : ranks.ranks()) {
    hang::RankEvidence e;
    e.rank = r.rank();
    e.host = r.host();
    e.gpu_uuid = r.device_uuid();
    e.gpu_index = r.local_rank();
    if (!r.connected()) {
      e.state = hang::Responsiveness::kCrashed;
      e.why = "stream closed (process gone)";
      inc.crashed.push_back(r.rank());
    } else if (auto it = answers.find(r.rank()); it == answers.end()) {
      e.state = hang::Responsiveness::kNoAnswer;
      e.why = why;
      inc.no_answer.push_back(r.rank());
    } else {
      // An answer without stacks (capture failed) still proves the rank is alive.
      e.stacks = it->second.stacks();
      inc.answered.push_back(r.rank());
    }
    evidence.push_back(std::move(e));
  }
  inc.diagnosis = hang::analyze(evidence);

  if (inc.diagnosis.needs_inspection && !inc.answered.empty()) {
    v1::Command insp;
    insp.mutable_inspect()->set_deadline_ms(
        static_cast<uint32_t>(std::max<int64_t>(options_.answer_timeout_ns / 1'000'000, 1)));
    const std::vector<int32_t> targets(inc.answered.begin(), inc.answered.end());
    const auto steps = roundTrip(job_id, targets, insp);
    for (hang::RankEvidence& e : evidence) {
      auto it = steps.find(e.rank);
      if (it == steps.end() || !it->second.ok()) continue;
      e.inspected = true;
      e.connections.assign(it->second.inspect().connections().begin(),
                           it->second.inspect().connections().end());
      inc.inspected = true;
    }
    if (inc.inspected) inc.diagnosis = hang::analyze(evidence);
  }
  inc.diagnosed_ns = wall_.nowNs();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  inc.text = hang::formatDiagnosis(inc.diagnosis, 4);

  v1::Alert a;
  a.set_job_id(job_id);
  a.set_rank(inc.diagnosis.suspects.size() == 1 ? inc.diagnosis.suspects[0].rank : -1);
  a.set_kind("hang");
  // Inconclusive (e.g. a long host-only phase: every rank answered, no collective outstanding):
  // reported, but not paged as critical.
  a.set_severity(inc.diagnosis.kind == hang::HangKind::kInconclusive ? "warning" : "critical");
  a.set_team("operations");
  std::string msg = std::string(hang::hangKindName(inc.diagnosis.kind));
  if (!inc.diagnosis.suspects.empty()) {
    msg += ": suspects";
    for (const hang::Suspect& s : inc.diagnosis.suspects) {
      msg += " rank " + std::to_string(s.rank) + " on " + s.host + " GPU " +
             std::to_string(s.gpu_index) + (s.gpu_uuid.empty() ? "" : " (" + s.gpu_uuid + ")") +
             " [" + s.reason + "];";
    }
  }
  msg += " | " + inc.trigger;
  for (const std::string& line : inc.diagnosis.evidence) msg += " | " + line;
  char tail[160];
  std::snprintf(tail, sizeof(tail),
                " | %zu answered, %zu no answer, %zu crashed%s; diagnosed in %.2f s, %.1f s after "
                "the onset",
                inc.answered.size(), inc.no_answer.size(), inc.crashed.size(),
                inc.inspected ? ", connection steps inspected" : "", took,
                seconds(inc.diagnosed_ns - onset_ns));
  msg += tail;
  a.set_message(msg);
  a.set_time_unix_ns(inc.diagnosed_ns);
  if (store_ != nullptr) inc.alert_id = store_->putAlert(a);
  FLARE_LOG_WARN("engine", "ALERT [operations] job {}: hang: {}", job_id, msg);
  {
    std::lock_guard lock(mu_);
    inc.id = next_id_++;
    no_answer_total_ += inc.no_answer.size();
    incidents_[job_id].push_back(inc);
  }
  return inc;
}

std::vector<HangIncident> HangMonitor::incidents(const std::string& job_id) const {
  std::lock_guard lock(mu_);
  auto it = incidents_.find(job_id);
  return it == incidents_.end() ? std::vector<HangIncident>{} : it->second;
}

std::string incidentToJson(const HangIncident& inc) {
  const hang::Diagnosis& d = inc.diagnosis;
  std::string o =
      "{\"id\":" + std::to_string(inc.id) + ",\"jobId\":" + common::jsonQuote(inc.job_id) +
      ",\"kind\":" + common::jsonQuote(std::string(hang::hangKindName(d.kind))) +
      ",\"trigger\":" + common::jsonQuote(inc.trigger) +
      ",\"onsetUnixNs\":" + std::to_string(inc.onset_ns) +
      ",\"lastProgressUnixNs\":" + std::to_string(inc.last_progress_ns) +
      ",\"openedUnixNs\":" + std::to_string(inc.opened_ns) +
      ",\"diagnosedUnixNs\":" + std::to_string(inc.diagnosed_ns) +
      ",\"answered\":" + jsonInts(inc.answered) + ",\"noAnswer\":" + jsonInts(inc.no_answer) +
      ",\"crashed\":" + jsonInts(inc.crashed) +
      ",\"inspected\":" + (inc.inspected ? "true" : "false") +
      ",\"needsInspection\":" + (d.needs_inspection ? "true" : "false") +
      ",\"alertId\":" + std::to_string(inc.alert_id) + ",\"suspects\":[";
  for (size_t i = 0; i < d.suspects.size(); ++i) {
    const hang::Suspect& s = d.suspects[i];
    o += std::string(i ? "," : "") + "{\"rank\":" + std::to_string(s.rank) +
         ",\"host\":" + common::jsonQuote(s.host) +
         ",\"gpuUuid\":" + common::jsonQuote(s.gpu_uuid) +
         ",\"gpuIndex\":" + std::to_string(s.gpu_index) +
         ",\"reason\":" + common::jsonQuote(s.reason) + "}";
  }
  o += "]";
  if (d.link) {
    o += ",\"link\":{\"sender\":" + std::to_string(d.link->sender) +
         ",\"receiver\":" + std::to_string(d.link->receiver) +
         ",\"step\":" + std::to_string(d.link->step) +
         ",\"channelsAgreeing\":" + std::to_string(d.link->channels_agreeing) + "}";
  }
  o += ",\"evidence\":[";
  for (size_t i = 0; i < d.evidence.size(); ++i) {
    o += std::string(i ? "," : "") + common::jsonQuote(d.evidence[i]);
  }
  o += "],\"text\":" + common::jsonQuote(inc.text) + "}";
  return o;
}

std::string HangMonitor::incidentsJson(const std::string& job_id) const {
  std::string o = "{\"jobId\":" + common::jsonQuote(job_id) + ",\"incidents\":[";
  const auto list = incidents(job_id);
  for (size_t i = 0; i < list.size(); ++i) o += (i ? "," : "") + incidentToJson(list[i]);
  return o + "]}";
}

void HangMonitor::writeMetrics(PromWriter& w) const {
  std::lock_guard lock(mu_);
  w.family("flare_hang_incidents_total", "counter", "Hang incidents opened and diagnosed");
  w.sample("flare_hang_incidents_total", static_cast<uint64_t>(next_id_ - 1));
  w.family("flare_hang_unanswered_ranks_total", "counter",
           "Ranks that did not answer DumpStacks during hang incidents");
  w.sample("flare_hang_unanswered_ranks_total", no_answer_total_);
}

}  // namespace flare::engine
