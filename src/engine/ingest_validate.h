// Batch validation of flared's ingest: what one RecordBatch may contain before anything of it is
// applied (ingest.h, "Validation"). Pure functions of the batch, the session's tables and the
// limits: no Ingest state, no lock, no counters, so each rule can be read and tested alone. The
// caller (Ingest::batch, ingest_apply.cc) counts and logs what they find and applies the rest.
//
// Thread-safe: nothing here keeps state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "flare/v1/service.pb.h"
#include "src/engine/ingest.h"

namespace flare::engine {

// Longest layout, library and API name of a batch, and device strings of a hello.
inline constexpr size_t kMaxShortString = 1024;

// The plausible range of times in what a rank sends (Unix-epoch ns).
struct TimeLimits {
  int64_t min_ns = 0;           // earliest timestamp
  int64_t max_ns = 0;           // latest timestamp (the daemon's now + --max-future)
  int64_t max_duration_ns = 0;  // longest kernel, span or step
};

// Why flared drops one StepStats, "" when it keeps it; `reason` gets the refusal's label. The
// rank's StepAccumulator (src/records) emits only statistics that pass (a property test checks).
std::string stepStatsError(const v1::StepStats& st, const TimeLimits& limits, Reason* reason);

// The limits of one batch's items (from IngestConfig and the daemon's clock).
struct BatchLimits {
  TimeLimits time;
  size_t max_signatures_per_rank = 0;  // the session's table with the batch's new ids
  size_t max_ranks_per_job = 0;        // bounds a collective's nranks
};

// The invalid items of one batch, by repeated field (indices ascending), and what they were.
struct BatchFilter {
  std::vector<int> sigs, apis, kernels, summaries, spans, steps, step_stats, run_queue;
  bool created = false;  // created_ns out of range: ignored
  std::array<uint64_t, static_cast<size_t>(Reason::kCount)> by_reason{};
  std::array<std::string, static_cast<size_t>(Reason::kCount)> first_error;  // per reason
  Reason first = Reason::kCount;  // the first reason met; kCount when nothing is invalid
  uint64_t dropped = 0;           // items marked, created_ns included

  // Marks item `index` of `list` (nullptr: no item, e.g. created_ns) as refused for `r`.
  void drop(std::vector<int>* list, int index, Reason r, std::string error);
};

// Every invalid item of `b`: a record, summary, span, step marker, step statistic, signature or
// API name out of bounds or naming an id neither `known_sigs` (the session's rank signature ids)
// / `known_apis` nor the batch itself defines. Signatures beyond max_signatures_per_rank (counting
// the session's and the batch's valid ones, in order) are invalid too.
BatchFilter findInvalidItems(const v1::RecordBatch& b, const BatchLimits& limits,
                             const std::unordered_map<uint32_t, uint32_t>& known_sigs,
                             const std::unordered_set<uint32_t>& known_apis);

// `b` without the items `f` marks (the others in their order; created_ns 0 when f.created).
v1::RecordBatch withoutInvalidItems(const v1::RecordBatch& b, const BatchFilter& f);

}  // namespace flare::engine
