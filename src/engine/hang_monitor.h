// HangMonitor: the daemon side of hang diagnosis (issue 7). Every poll it looks at each
// unfinished job's ranks. Two triggers open ONE incident for the job's episode, whichever comes
// first: (1) a rank's watchdog reported a suspected hang (RankMessage.hang_report, queued by
// Ingest; the stuck op — name, communicator, seq, age — becomes evidence, and the monitor's
// thread is woken at once); (2) a connected rank has delivered no new record for
// `hang_timeout_ns` (measured on the monitor's clock from the last time its record count
// moved; heartbeats and empty batches do not count, so a rank whose exporter thread is alive
// but whose GPU work is stuck is silent). Reports that arrive while an episode is open are
// added to its incident's watchdog evidence. The incident: DumpStacks to every connected rank,
// wait until all answered or `answer_timeout_ns`; ranks that did not answer are recorded as
// unresponsive (silence is evidence), ranks whose stream is closed as crashed; hang::analyze();
// when the analysis needs connection steps (every rank waits in the same collective), Inspect
// to the answering ranks and analyze again. The result is one alert of kind "hang" (critical,
// team operations) naming the suspects with the evidence and the time the diagnosis took,
// stored through Store::putAlert, logged, and kept in memory for /api/v1/jobs/{job}/hangs.
// The episode ends when any rank of the job delivers new records after the diagnosis (record
// counts are re-read when it is done, so batches in flight at the onset do not end it); a later
// stall opens a new one.
//
// Threading: start() runs check() on its own thread every poll_interval_ns; check() blocks while
// it waits for answers (the ranks' answers arrive on gRPC threads). incidents()/json/metrics
// may be called from any thread. Not owned: the Ingest, the Store, the clock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/common/clock.h"
#include "src/engine/ingest.h"
#include "src/engine/metrics.h"
#include "src/engine/store.h"
#include "src/hang/analysis.h"

namespace flare::engine {

struct HangMonitorOptions {
  int64_t hang_timeout_ns = 300'000'000'000;   // --hang-timeout-s
  int64_t answer_timeout_ns = 10'000'000'000;  // per command round (DumpStacks, Inspect)
  int64_t poll_interval_ns = 1'000'000'000;
  int64_t answer_poll_ns = 20'000'000;  // how often results are checked while waiting
  // --hang-kill: after a conclusive diagnosis is stored and its alert posted, send Exit to the
  // connected ranks that opted in (FLARE_HANG_KILL=1, RankInfo.hang_kill); ranks that did not
  // opt in are never sent it (and refuse it). false: never.
  bool kill_after_diagnosis = true;
};

// A rank's watchdog report, as evidence of an incident.
struct WatchdogEvidence {
  int32_t rank = 0;
  int64_t received_ns = 0;
  v1::HangReport report;
};

struct HangIncident {
  uint64_t id = 0;  // per daemon, from 1
  std::string job_id;
  std::string triggered_by;                // "watchdog" or "silence"
  std::vector<WatchdogEvidence> watchdog;  // reports of the episode, by arrival
  std::string trigger;                     // "ranks 3 silent for 2.0 s"
  int64_t onset_ns = 0;                    // the first silent rank's last new records (hang onset)
  int64_t last_progress_ns = 0;  // the last time any rank of the job delivered new records
  int64_t opened_ns = 0;
  int64_t diagnosed_ns = 0;
  double took_s = 0;  // the diagnosis itself (command rounds and analysis)
  std::vector<int> answered, no_answer, crashed;
  bool inspected = false;
  int exit_sent = 0;  // opted-in ranks the Exit command was delivered to (FLARE_HANG_KILL)
  hang::Diagnosis diagnosis;
  std::string text;  // formatDiagnosis()
  uint64_t alert_id = 0;
};

class HangMonitor {
 public:
  HangMonitor(Ingest& ingest, Store* store, const common::Clock& wall, HangMonitorOptions options);
  ~HangMonitor();
  HangMonitor(const HangMonitor&) = delete;
  HangMonitor& operator=(const HangMonitor&) = delete;

  void start();
  void stop();
  // Any thread: run check() now (a hang report arrived).
  void notify();
  // One pass over the jobs; returns the incidents it opened and diagnosed.
  std::vector<HangIncident> check();
  std::vector<HangIncident> incidents(const std::string& job_id) const;
  // {"jobId":..,"incidents":[{...}]} for the HTTP API.
  std::string incidentsJson(const std::string& job_id) const;
  void writeMetrics(PromWriter& w) const;

 private:
  struct RankWatch {
    uint64_t records = 0;
    int64_t changed_ns = 0;  // monitor clock: when `records` last moved (or first seen)
  };
  struct JobWatch {
    std::map<int32_t, RankWatch> ranks;
    bool episode_open = false;
    int64_t last_progress_ns = 0;
    uint64_t incident_id = 0;  // the open episode's incident
  };

  HangIncident diagnose(const std::string& job_id, const v1::ListRanksResponse& ranks,
                        std::string triggered_by, std::string trigger, int64_t onset_ns,
                        int64_t last_progress_ns, std::vector<WatchdogEvidence> watchdog);
  // Re-reads the job's record counts (after a diagnosis): what arrived during it is no progress.
  void baseline(const std::string& job_id, JobWatch& w);
  void addWatchdog(const std::string& job_id, uint64_t incident_id,
                   std::vector<WatchdogEvidence> more);
  // Sends `cmd` to `ranks`, waits for their results until the deadline; answers by rank.
  std::map<int32_t, v1::CommandResult> roundTrip(const std::string& job_id,
                                                 const std::vector<int32_t>& ranks,
                                                 const v1::Command& cmd);

  Ingest& ingest_;
  Store* store_;
  const common::Clock& wall_;
  HangMonitorOptions options_;
  std::map<std::string, JobWatch> jobs_;  // check() only
  mutable std::mutex mu_;
  std::map<std::string, std::vector<HangIncident>> incidents_;  // guarded by mu_
  uint64_t next_id_ = 1;                                        // guarded by mu_
  uint64_t no_answer_total_ = 0;                                // guarded by mu_
  uint64_t exits_sent_ = 0;                                     // guarded by mu_
  std::atomic<bool> said_alert_late_{false};  // the "published before its alert" line, once
  std::condition_variable cv_;
  bool stopping_ = false;                     // guarded by mu_
  bool wake_ = false;                         // guarded by mu_
  std::vector<ReceivedHangReport> requeued_;  // guarded by mu_; other jobs' reports taken
                                              // during a diagnosis
  std::thread thread_;
};

// JSON of one incident (suspects, kind, evidence, timings).
std::string incidentToJson(const HangIncident& inc);

}  // namespace flare::engine
