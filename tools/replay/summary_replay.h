// Summary-mode replay: turns a replayed rank's raw batches (replay_plan.h) into what the rank
// would have sent with FLARE_MODE=summary, by running them through the rank's own encoder, the
// BatchBuilder (src/timing/batch_builder.h) with summary mode on: compute ops become
// KernelSummary clusters, collectives CollectiveBlocks, completed steps StepStats (the
// StepAccumulator), exactly as on a rank. Only the clock differs: the records are already on the
// epoch clock, so the builder's monotonic→epoch map is the identity.
//
// What a real summary-mode rank would not have: the raw records' thread, parent span and
// correlation id are passed through (the builder drops them from what it sends, as on a rank).
#pragma once

#include <cstdint>
#include <vector>

#include "flare/v1/records.pb.h"

namespace flare::replay {

struct SummaryBatches {
  std::vector<flare::v1::RecordBatch> batches;
  std::vector<int64_t> due_ns;  // as RankPlan::due_ns: the raw batch whose records closed it
};

// `raw`/`due_ns`: one rank's plan (RankPlan::batches, due_ns). `finished`: the rank ended
// normally (its last complete step is sent, as Tracer shutdown does); false for a stopped rank.
SummaryBatches toSummary(int rank, const std::vector<flare::v1::RecordBatch>& raw,
                         const std::vector<int64_t>& due_ns, bool finished,
                         int64_t summary_window_ns);

}  // namespace flare::replay
