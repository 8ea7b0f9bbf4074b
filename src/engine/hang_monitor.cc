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

std::string stuckOpText(const v1::StuckOp& op) {
  std::string t = op.name();
  if (!op.communicator().empty()) {
    t += " (communicator " + op.communicator() + " seq " + std::to_string(op.seq()) + ")";
  }
  return t;
}

// "watchdog: ncclAllReduce (communicator .. seq 5) stuck on ranks 0-7 (up to 3.1 s)", one
// clause per distinct first op.
std::string watchdogSummary(const std::vector<WatchdogEvidence>& w) {
  std::map<std::string, std::pair<std::vector<int>, int64_t>> by_op;
  for (const WatchdogEvidence& e : w) {
    auto& [ranks, age] = by_op[stuckOpText(e.report.first())];
    ranks.push_back(e.rank);
    age = std::max(age, e.report.first().age_ns());
  }
  std::string out = "watchdog:";
  bool first = true;
  for (const auto& [op, v] : by_op) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), " (up to %.1f s)", seconds(v.second));
    out += std::string(first ? " " : "; ") + op + " stuck on ranks " +
           hang::compactRanges(v.first) + buf;
    first = false;
  }
  return out;
}

std::string stuckOpJson(const v1::StuckOp& op) {
  char num[160];
  std::snprintf(num, sizeof(num),
                ",\"seq\":%llu,\"nranks\":%u,\"device\":%d,\"ageS\":%.3f,\"thresholdS\":%.3f}",
                static_cast<unsigned long long>(op.seq()), op.nranks(), op.device(),
                seconds(op.age_ns()), seconds(op.threshold_ns()));
  return "{\"op\":" + common::jsonQuote(op.name()) + ",\"kind\":" + common::jsonQuote(op.kind()) +
         ",\"communicator\":" + common::jsonQuote(op.communicator()) + num;
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
                   [this] { return stopping_ || wake_; });
      wake_ = false;
    }
  });
}

void HangMonitor::notify() {
  {
    std::lock_guard lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void HangMonitor::baseline(const std::string& job_id, JobWatch& w) {
  v1::ListRanksRequest rreq;
  rreq.set_job_id(job_id);
  v1::ListRanksResponse ranks;
  if (ingest_.ranks(rreq, &ranks) != Code::kOk) return;
  const int64_t now = wall_.nowNs();
  for (const v1::RankInfo& r : ranks.ranks()) {
    RankWatch& rw = w.ranks[r.rank()];
    if (r.records() != rw.records) {
      rw.records = r.records();
      rw.changed_ns = now;
    }
  }
}

void HangMonitor::addWatchdog(const std::string& job_id, uint64_t incident_id,
                              std::vector<WatchdogEvidence> more) {
  std::lock_guard lock(mu_);
  for (HangIncident& inc : incidents_[job_id]) {
    if (inc.id != incident_id) continue;
    for (WatchdogEvidence& e : more) inc.watchdog.push_back(std::move(e));
  }
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
  std::map<std::string, std::vector<WatchdogEvidence>> reports;
  std::vector<ReceivedHangReport> taken;
  {
    std::lock_guard lock(mu_);
    taken.swap(requeued_);
  }
  for (ReceivedHangReport& r : ingest_.takeHangReports()) taken.push_back(std::move(r));
  for (ReceivedHangReport& r : taken) {
    reports[r.job_id].push_back({r.rank, r.received_ns, std::move(r.report)});
  }
  const int64_t now = wall_.nowNs();
  const v1::ListJobsResponse jobs = ingest_.listJobs(v1::ListJobsRequest{});
  for (const v1::JobInfo& job : jobs.jobs()) {
    if (job.finished()) {
      jobs_.erase(job.job_id());
      continue;
    }
    std::vector<WatchdogEvidence> reported;
    if (auto it = reports.find(job.job_id()); it != reports.end()) reported = std::move(it->second);
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
      if (options_.hang_timeout_ns > 0 && now - rw.changed_ns >= options_.hang_timeout_ns) {
        silent.push_back(r.rank());
        silent_for = std::max(silent_for, now - rw.changed_ns);
        onset = std::min(onset, rw.changed_ns);
      }
    }
    if (w.episode_open) {
      if (!reported.empty()) addWatchdog(job.job_id(), w.incident_id, std::move(reported));
      if (progressed) {
        w.episode_open = false;  // the job moves again: the episode is over
        // Silence is counted afresh from here: the ranks that waited for the culprit resume
        // and report over the next flush interval, and are not a new hang (a second incident
        // was raised when the culprit's first batch beat theirs by one pass).
        for (auto& [rank, rw] : w.ranks) rw.changed_ns = std::max(rw.changed_ns, now);
        FLARE_LOG_INFO("engine", "hang episode of job {} ended: ranks progress again",
                       job.job_id());
      }
      continue;
    }
    // A job with no connected rank has ended (or every rank is gone): nothing to diagnose.
    if (connected == 0 || (silent.empty() && reported.empty())) continue;
    w.episode_open = true;
    std::string triggered_by;
    char trigger[256];
    if (!reported.empty()) {
      // The watchdog came first: the onset is when the stuck op became its stream's head.
      triggered_by = "watchdog";
      const WatchdogEvidence* first = &reported.front();
      for (const WatchdogEvidence& e : reported) {
        const int64_t t = e.received_ns - e.report.first().age_ns();
        if (t < first->received_ns - first->report.first().age_ns()) first = &e;
      }
      onset = first->received_ns - first->report.first().age_ns();
      const v1::StuckOp& op = first->report.first();
      std::vector<int> ranks_reporting;
      for (const WatchdogEvidence& e : reported) ranks_reporting.push_back(e.rank);
      std::snprintf(trigger, sizeof(trigger),
                    "watchdog of ranks %s: rank %d's %s%s%s%s not completed for %.1f s (bound "
                    "%.1f s)",
                    hang::compactRanges(ranks_reporting).c_str(), first->rank, op.name().c_str(),
                    op.communicator().empty() ? "" : " on communicator ", op.communicator().c_str(),
                    op.communicator().empty() ? "" : (" seq " + std::to_string(op.seq())).c_str(),
                    seconds(op.age_ns()), seconds(op.threshold_ns()));
    } else {
      triggered_by = "silence";
      std::snprintf(trigger, sizeof(trigger), "ranks %s silent for %.1f s (timeout %.1f s)",
                    hang::compactRanges(silent).c_str(), seconds(silent_for),
                    seconds(options_.hang_timeout_ns));
    }
    out.push_back(diagnose(job.job_id(), ranks, triggered_by, trigger, onset, w.last_progress_ns,
                           std::move(reported)));
    w.incident_id = out.back().id;
    baseline(job.job_id(), w);
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
                                   std::string triggered_by, std::string trigger, int64_t onset_ns,
                                   int64_t last_progress_ns,
                                   std::vector<WatchdogEvidence> watchdog) {
  HangIncident inc;
  inc.job_id = job_id;
  inc.triggered_by = std::move(triggered_by);
  inc.watchdog = std::move(watchdog);
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
  // Watchdog reports that arrived while the ranks answered belong to this episode too; what each
  // rank's watchdog found stuck is evidence for the analysis (hang::analyze, rule 6).
  auto takeLateReports = [&] {
    std::vector<ReceivedHangReport> late = ingest_.takeHangReports();
    for (ReceivedHangReport& r : late) {
      if (r.job_id == job_id) {
        inc.watchdog.push_back({r.rank, r.received_ns, std::move(r.report)});
      } else {
        std::lock_guard lock(mu_);
        requeued_.push_back(std::move(r));
      }
    }
  };
  takeLateReports();

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
    for (const WatchdogEvidence& w : inc.watchdog) {  // the rank's latest report
      if (w.rank == e.rank) e.stuck.assign(w.report.stuck().begin(), w.report.stuck().end());
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
  takeLateReports();
  inc.diagnosed_ns = wall_.nowNs();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  inc.took_s = took;
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
  if (!inc.diagnosis.victims.empty()) {
    msg += " victims (wait for the suspects, not at fault): ranks " +
           hang::compactRanges(inc.diagnosis.victims) + ";";
  }
  msg += " | " + inc.trigger;
  for (const std::string& line : inc.diagnosis.evidence) msg += " | " + line;
  if (!inc.watchdog.empty()) msg += " | " + watchdogSummary(inc.watchdog);
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
  if (store_ != nullptr) {
    inc.alert_id = store_->putAlert(a);
    // The incident is published once its alert is committed, so that a client reading both
    // (flare status, the alerts, the incidents) never sees the incident without its alert; the
    // wait is bounded, so that a stalled disk delays the incident (and FLARE_HANG_KILL) little.
    if (!store_->flushWithin(std::chrono::seconds(2)) && !said_alert_late_.exchange(true)) {
      FLARE_LOG_WARN("engine",
                     "job {}: hang incident published before its alert was committed: the "
                     "store's writes are behind (flare_store_queue_depth); said once",
                     job_id);
    }
  }
  FLARE_LOG_WARN("engine", "ALERT [operations] job {}: hang: {}", job_id, msg);
  {
    std::lock_guard lock(mu_);
    inc.id = next_id_++;
    no_answer_total_ += inc.no_answer.size();
    incidents_[job_id].push_back(inc);
  }
  // FLARE_HANG_KILL: only now, with the diagnosis stored and the alert posted, the ranks that
  // opted in are told to exit. The answers are not awaited: a rank that cannot act on it
  // (stopped, in uninterruptible sleep) stays as it is and blocks no one else.
  if (options_.kill_after_diagnosis && inc.diagnosis.kind != hang::HangKind::kInconclusive) {
    v1::SendCommandRequest req;
    req.set_job_id(job_id);
    for (const v1::RankInfo& r : ranks.ranks()) {
      if (r.connected() && r.hang_kill()) req.add_ranks(r.rank());
    }
    if (req.ranks_size() > 0) {
      req.mutable_command()->mutable_exit()->set_reason(
          "flared diagnosed a hang (incident " + std::to_string(inc.id) + ", alert " +
          std::to_string(inc.alert_id) + ": " +
          std::string(hang::hangKindName(inc.diagnosis.kind)) + ")");
      v1::SendCommandResponse sent;
      std::string error;
      if (ingest_.sendCommandTrusted(req, &sent, &error) == Code::kOk) {
        FLARE_LOG_WARN("engine",
                       "hang of job {}: exit sent to {} of {} opted-in ranks "
                       "(FLARE_HANG_KILL)",
                       job_id, sent.delivered(), req.ranks_size());
        std::lock_guard lock(mu_);
        inc.exit_sent = static_cast<int>(sent.delivered());
        exits_sent_ += sent.delivered();
        for (HangIncident& stored : incidents_[job_id]) {
          if (stored.id == inc.id) stored.exit_sent = inc.exit_sent;
        }
      } else {
        FLARE_LOG_WARN("engine", "hang of job {}: exit not sent: {}", job_id, error);
      }
    }
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
      ",\"triggeredBy\":" + common::jsonQuote(inc.triggered_by) +
      ",\"onsetUnixNs\":" + std::to_string(inc.onset_ns) +
      ",\"lastProgressUnixNs\":" + std::to_string(inc.last_progress_ns) +
      ",\"openedUnixNs\":" + std::to_string(inc.opened_ns) +
      ",\"diagnosedUnixNs\":" + std::to_string(inc.diagnosed_ns) +
      ",\"diagnosisSeconds\":" + std::to_string(inc.took_s) +
      ",\"answered\":" + jsonInts(inc.answered) + ",\"noAnswer\":" + jsonInts(inc.no_answer) +
      ",\"crashed\":" + jsonInts(inc.crashed) +
      ",\"inspected\":" + (inc.inspected ? "true" : "false") +
      ",\"exitSent\":" + std::to_string(inc.exit_sent) +
      ",\"needsInspection\":" + (d.needs_inspection ? "true" : "false") +
      ",\"alertId\":" + std::to_string(inc.alert_id) + ",\"victims\":" + jsonInts(d.victims) +
      ",\"suspects\":[";
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
         ",\"channelsAgreeing\":" + std::to_string(d.link->channels_agreeing) +
         ",\"communicator\":" + common::jsonQuote(d.link->communicator) + "}";
  }
  o += ",\"watchdog\":[";
  for (size_t i = 0; i < inc.watchdog.size(); ++i) {
    const WatchdogEvidence& e = inc.watchdog[i];
    o += std::string(i ? "," : "") + "{\"rank\":" + std::to_string(e.rank) +
         ",\"receivedUnixNs\":" + std::to_string(e.received_ns) +
         ",\"episode\":" + std::to_string(e.report.episode()) +
         ",\"first\":" + stuckOpJson(e.report.first()) + ",\"stuck\":[";
    for (int j = 0; j < e.report.stuck_size(); ++j) {
      o += std::string(j ? "," : "") + stuckOpJson(e.report.stuck(j));
    }
    o += "]}";
  }
  o += "],\"stackGroups\":[";
  for (size_t i = 0; i < d.groups.size(); ++i) {
    const hang::StackGroup& g = d.groups[i];
    o += std::string(i ? "," : "") + "{\"ranks\":" + jsonInts(g.ranks) +
         ",\"ranges\":" + common::jsonQuote(g.ranges) +
         ",\"inCommunication\":" + (g.in_communication ? "true" : "false") + ",\"frames\":[";
    for (size_t j = 0; j < g.frames.size(); ++j) {
      o += std::string(j ? "," : "") + common::jsonQuote(g.frames[j]);
    }
    o += "]}";
  }
  o += "],\"progress\":[";
  for (size_t i = 0; i < d.progress.size(); ++i) {
    const hang::ProgressGroup& g = d.progress[i];
    o += std::string(i ? "," : "") + "{\"communicator\":" + common::jsonQuote(g.communicator) +
         ",\"lastIssuedSeq\":" + std::to_string(g.last_issued_seq) +
         ",\"lastCompletedSeq\":" + std::to_string(g.last_completed_seq) +
         ",\"lastIssuedOp\":" + common::jsonQuote(g.last_issued_op) +
         ",\"ranks\":" + jsonInts(g.ranks) + ",\"ranges\":" + common::jsonQuote(g.ranges) + "}";
  }
  o += "],\"lagging\":[";
  for (size_t i = 0; i < d.lagging.size(); ++i) {
    const hang::LaggingCollective& l = d.lagging[i];
    o += std::string(i ? "," : "") + "{\"communicator\":" + common::jsonQuote(l.communicator) +
         ",\"seq\":" + std::to_string(l.seq) + ",\"op\":" + common::jsonQuote(l.op) +
         ",\"notIssued\":" + jsonInts(l.not_issued) + ",\"waiting\":" + jsonInts(l.waiting) + "}";
  }
  o += "]";
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
  w.family("flare_hang_exits_sent_total", "counter",
           "Exit commands delivered to opted-in ranks after hang diagnoses (FLARE_HANG_KILL)");
  w.sample("flare_hang_exits_sent_total", exits_sent_);
}

}  // namespace flare::engine
