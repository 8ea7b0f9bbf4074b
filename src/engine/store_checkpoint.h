// What both history stores (SqliteStore, PgStore) do with a Checkpoint (store.h) apart from
// their SQL: how many raw records it carries for the write queue's raw bound, shedding those
// records when the bound is reached, and the order and counting of its writes inside the one
// transaction it is applied in. Header-only; any thread (the write runs on the writer thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/engine/store.h"

namespace flare::engine {

// Raw records and deep-trace rows in `cp`.
inline size_t checkpointRawRecords(const Checkpoint& cp) {
  size_t n = 0;
  for (const auto& [job, recs] : cp.raw) n += recs.size();
  for (const auto& [job, rows] : cp.deep_trace) n += rows.size();
  return n;
}

// Prepares `cp` for `queue` (a StoreWriteQueue): returns the raw records it carries, or, when
// they do not fit under the queue's raw bound, drops them (counted by the queue) and returns 0:
// the state and the batch marks still commit.
template <typename Queue>
size_t admitCheckpoint(Checkpoint& cp, Queue& queue) {
  const size_t raw = checkpointRawRecords(cp);
  if (queue.admitRaw(raw)) return raw;
  cp.raw.clear();
  cp.deep_trace.clear();
  return 0;
}

struct CheckpointCounts {
  uint64_t rows_ok = 0;      // job, rank, signature-stats, window, open-window, batch-seq rows
  uint64_t rows_failed = 0;  // of those, refused by the database
  uint64_t raw_ok = 0;       // raw records and deep-trace rows written
  uint64_t raw_failed = 0;   // of those, refused
};

// Writes `cp` through `out` in the order the stores have always used: jobs, ranks, signature
// stats, raw records, deep-trace rows, closed windows, open windows, batch-seq marks (last, so
// that a batch counts as stored only with everything it brought). `Out` provides
//   bool job(const JobRow&), rank(const RankRow&), signatureStats(const SignatureStatsRow&),
//        openWindows(const OpenWindowsRow&), batchSeq(const BatchSeqRow&);   (row written?)
//   uint64_t raw(const std::string& job, std::vector<RawRecord>&&),
//            deepTrace(const std::string& job, const std::vector<DeepTraceRow>&),
//            windows(const std::vector<WindowSummaryRow>&);                  (rows written)
template <typename Out>
CheckpointCounts writeCheckpoint(Checkpoint& cp, Out& out) {
  CheckpointCounts n;
  auto count = [&](bool good) { ++(good ? n.rows_ok : n.rows_failed); };
  for (const JobRow& r : cp.jobs) count(out.job(r));
  for (const RankRow& r : cp.ranks) count(out.rank(r));
  for (const SignatureStatsRow& r : cp.signature_stats) count(out.signatureStats(r));
  uint64_t raw_n = 0;
  for (auto& [job, recs] : cp.raw) {
    raw_n += recs.size();
    n.raw_ok += out.raw(job, std::move(recs));
  }
  for (const auto& [job, rows] : cp.deep_trace) {
    n.raw_ok += out.deepTrace(job, rows);
    raw_n += rows.size();
  }
  const uint64_t win_ok = out.windows(cp.windows);
  n.rows_ok += win_ok;
  n.rows_failed += cp.windows.size() - win_ok;
  for (const OpenWindowsRow& r : cp.open_windows) count(out.openWindows(r));
  for (const BatchSeqRow& r : cp.seqs) count(out.batchSeq(r));
  n.raw_failed = raw_n - n.raw_ok;
  return n;
}

}  // namespace flare::engine
