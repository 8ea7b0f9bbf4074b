// Ingest's sessions (ingest.h, "Sessions" and "Exactly once"): a rank's stream from its hello to
// its close, and the checks of a batch that concern the batch as a whole (the stream's session and
// rank, batch_seq, size, rate). The items' validation is in ingest_validate.h, applying a batch in
// ingest_apply.cc. Everything here runs under Ingest::mu_.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "flare/v1/protocol.h"
#include "src/common/job_id.h"
#include "src/common/log.h"
#include "src/common/text.h"
#include "src/engine/ingest.h"
#include "src/engine/ingest_validate.h"

namespace flare::engine {
namespace {

constexpr size_t kMaxHostBytes = 256;

// The one job-id rule (src/common/job_id.h), the hook's and the CLI's too.
bool jobIdValid(const std::string& id) {
  return common::validJobId(id);
}

}  // namespace

Ingest::RankState::Incarnation& Ingest::incarnation(RankState& rs, int32_t pid, int64_t start_ns,
                                                    int64_t now) {
  auto [it, fresh] = rs.incarnations.try_emplace({pid, start_ns});
  if (fresh) {
    it->second.updated_ns = now;
    // Bounded: forget the process heard from least recently (its stored mark stays).
    while (rs.incarnations.size() > std::max<size_t>(config_.max_incarnations_per_rank, 1)) {
      auto oldest = rs.incarnations.end();
      for (auto i = rs.incarnations.begin(); i != rs.incarnations.end(); ++i) {
        if (i != it &&
            (oldest == rs.incarnations.end() || i->second.updated_ns < oldest->second.updated_ns)) {
          oldest = i;
        }
      }
      rs.incarnations.erase(oldest);
    }
  }
  return it->second;
}

Ingest::HelloOutcome Ingest::hello(const v1::RankHello& h,
                                   std::shared_ptr<CommandChannel> channel) {
  HelloOutcome out;
  out.ack.set_protocol_version(v1::kProtocolVersion);
  auto refuse = [&](Reason r, Code code, std::string error) {
    out.verdict = reject(r, code, std::move(error), true);
    out.ack.set_accepted(false);
    out.ack.set_error(out.verdict.error);
    return out;
  };
  if (h.protocol_version() != v1::kProtocolVersion) {
    return refuse(Reason::kProtocolVersion, Code::kFailedPrecondition,
                  "protocol version " + std::to_string(h.protocol_version()) +
                      " is not supported (daemon speaks " + std::to_string(v1::kProtocolVersion) +
                      ")");
  }
  if (!jobIdValid(h.job_id())) {
    return refuse(Reason::kBadHello, Code::kInvalidArgument,
                  "job id '" + common::printable(h.job_id().substr(0, 200)) +
                      "' is not valid: a job id is " + common::kJobIdRule +
                      " (set FLARE_JOB_ID to one)");
  }
  if (h.world_size() <= 0 || h.rank() < 0 || h.rank() >= h.world_size() ||
      h.host().size() > kMaxHostBytes || h.device().name().size() > kMaxShortString ||
      h.device().uuid().size() > kMaxShortString) {
    return refuse(Reason::kBadHello, Code::kInvalidArgument,
                  "rank must be in [0, world_size) and world_size positive; host and device "
                  "strings bounded");
  }
  if (!tokenValid(h.job_id(), h.token())) {
    return refuse(Reason::kUnauthenticated, Code::kUnauthenticated,
                  "missing or wrong token for job " + h.job_id());
  }
  if (static_cast<size_t>(h.world_size()) > config_.max_ranks_per_job) {
    return refuse(Reason::kTooManyRanks, Code::kResourceExhausted,
                  "world_size " + std::to_string(h.world_size()) + " is over --max-ranks-per-job");
  }
  const int64_t now = wall_.nowNs();
  std::shared_ptr<CommandChannel> replaced;
  {
    std::lock_guard lock(mu_);
    JobState* job = findJob(h.job_id());
    if (job == nullptr) {
      if (jobs_.size() >= config_.max_jobs) {
        return refuse(Reason::kTooManyJobs, Code::kResourceExhausted, "too many jobs (--max-jobs)");
      }
      auto fresh = std::make_unique<JobState>();
      fresh->job_id = h.job_id();
      fresh->start_ns = h.start_time_unix_ns() > 0 ? h.start_time_unix_ns() : now;
      job = fresh.get();
      jobs_.emplace(h.job_id(), std::move(fresh));
      // Stored now, ahead of the job's signatures (written as they are interned), so that a
      // restart before the first checkpoint finds their job.
      if (store_) store_->putJob({job->job_id, h.world_size(), job->start_ns, now});
    }
    if (!job->ranks.contains(h.rank()) && job->ranks.size() >= config_.max_ranks_per_job) {
      return refuse(Reason::kTooManyRanks, Code::kResourceExhausted,
                    "job has too many ranks (--max-ranks-per-job)");
    }
    job->world_size = std::max(job->world_size, h.world_size());
    job->last_seen_ns = now;
    job->dirty = true;
    RankState& rs = job->ranks[h.rank()];
    rs.rank = h.rank();
    if (rs.session_id != 0) {
      const auto it = sessions_.find(rs.session_id);
      if (it != sessions_.end()) {
        it->second.replaced = true;
        replaced = std::move(it->second.channel);
        sessions_.erase(it);
        counters_.sessions_replaced.fetch_add(1, std::memory_order_relaxed);
        --job->connected;
      }
    }
    if (rs.pid != h.pid()) rs.drops.Clear();  // a new process: its counters start from zero
    rs.host = h.host();
    rs.pid = h.pid();
    rs.local_rank = h.local_rank();
    if (validDeviceInfo(h.device())) {
      rs.device_name = h.device().name();
      rs.device_uuid = h.device().uuid();
    } else {
      counters_.bad_device_info.fetch_add(1, std::memory_order_relaxed);
      rs.device_name.clear();
      rs.device_uuid.clear();
    }
    rs.mode = h.mode();
    rs.hang_kill = h.hang_kill();
    rs.last_seen_ns = now;
    rs.dirty = true;
    Session s;
    s.id = next_session_id_++;
    s.job = job;
    s.rank = h.rank();
    s.pid = h.pid();
    s.start_ns = h.start_time_unix_ns();
    out.ack.set_resume_after_seq(incarnation(rs, s.pid, s.start_ns, now).seq);
    s.tokens = config_.rank_rate_limit * config_.rank_rate_burst_s;
    s.refill_ns = now;
    s.channel = std::move(channel);
    rs.session_id = s.id;
    ++job->connected;
    out.session_id = s.id;
    out.pending.assign(rs.pending.begin(), rs.pending.end());
    rs.pending.clear();
    sessions_.emplace(s.id, std::move(s));
  }
  if (replaced) {
    replaced->close(Code::kFailedPrecondition, "replaced by a newer stream of the same rank");
  }
  counters_.hellos_accepted.fetch_add(1, std::memory_order_relaxed);
  out.ack.set_accepted(true);
  out.ack.set_session_id(out.session_id);
  out.ack.set_hang_reports(true);
  FLARE_LOG_DEBUG("engine", "session {}: job {} rank {}/{} host {} pid {}", out.session_id,
                  h.job_id(), h.rank(), h.world_size(), h.host(), h.pid());
  return out;
}

void Ingest::close(uint64_t session_id) {
  std::lock_guard lock(mu_);
  const auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  JobState* job = it->second.job;
  auto rit = job->ranks.find(it->second.rank);
  if (rit != job->ranks.end() && rit->second.session_id == session_id) {
    rit->second.session_id = 0;
    rit->second.dirty = true;
    --job->connected;
  }
  sessions_.erase(it);
}

size_t Ingest::activeSessions() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

std::optional<Verdict> Ingest::admitBatch(uint64_t session_id, const v1::RecordBatch& b,
                                          int64_t now, Session** session,
                                          RankState::Incarnation** incarnation_out) {
  const auto sit = sessions_.find(session_id);
  if (sit == sessions_.end()) {
    return reject(Reason::kSessionReplaced, Code::kFailedPrecondition,
                  "stream is no longer the rank's session", true);
  }
  Session& s = sit->second;
  *session = &s;
  if (b.rank() != s.rank) {
    return reject(Reason::kRankMismatch, Code::kPermissionDenied,
                  "batch for rank " + std::to_string(b.rank()) + " on the stream of rank " +
                      std::to_string(s.rank) + " of job " + s.job->job_id,
                  true);
  }
  JobState& job = *s.job;
  RankState& rs = job.ranks[s.rank];
  // Exactly once: a batch at or below the highest seq applied for this process was applied
  // before (a re-send or spool replay after a reconnect or a daemon restart).
  RankState::Incarnation& inc = incarnation(rs, s.pid, s.start_ns, now);
  *incarnation_out = &inc;
  if (b.batch_seq() != 0 && (b.batch_seq() <= inc.seq || b.batch_seq() == inc.jump_seq)) {
    if (b.from_spool()) return reject(Reason::kDuplicateBatch, Code::kOk, "batch already held");
    return refuseBatch(
        job, rs, now, Reason::kOutOfOrder, Code::kInvalidArgument,
        "batch_seq " + std::to_string(b.batch_seq()) + " after " + std::to_string(inc.seq));
  }
  const size_t items = static_cast<size_t>(b.kernels_size()) + b.summaries_size() + b.spans_size() +
                       b.steps_size() + b.signatures_size() + b.api_names_size() +
                       b.step_stats_size() + b.run_queue_size();
  if (items > config_.max_batch_items) {
    return refuseBatch(job, rs, now, Reason::kOversized, Code::kResourceExhausted,
                       "batch of " + std::to_string(items) + " items is over --max-batch-items");
  }
  const size_t sent_records =
      static_cast<size_t>(b.kernels_size()) + b.summaries_size() + b.spans_size() + b.steps_size();
  if (config_.rank_rate_limit > 0) {
    const double cap = config_.rank_rate_limit * config_.rank_rate_burst_s;
    s.tokens = std::min(
        cap, s.tokens + config_.rank_rate_limit * static_cast<double>(now - s.refill_ns) / 1e9);
    s.refill_ns = now;
    if (static_cast<double>(sent_records) > s.tokens) {
      return refuseBatch(job, rs, now, Reason::kRateLimited, Code::kResourceExhausted,
                         "rank is over --rank-rate-limit records/s");
    }
  }
  return std::nullopt;
}

}  // namespace flare::engine
