// The batches flare-loadgen sends (tools/flare_loadgen.cc), built in one place so that the
// in-process window measurement (diagnosis/compaction_test.cc) feeds flared's model the same
// load the daemon benchmarks do (docs/benchmarks.md).
#pragma once

#include <cstdint>

#include "flare/v1/service.pb.h"

namespace flare::engine::load {

// The signature table: `sigs` signatures (ids 1..sigs), every fifth an all-reduce of 64 MiB,
// the rest bf16 GEMMs of growing n.
void addSignatures(v1::RecordBatch* b, int sigs);

// One summary-mode interval (now_ns − interval_ns, now_ns]: a KernelSummary of two clusters per
// signature and, when ops_per_step > 0, the step's statistics as a rank's StepAccumulator sends
// them (an issue-latency sketch of ops_per_step ops spread log-uniformly over 5 µs .. 50 ms,
// ~230 buckets at 2%, and two host causes holding 1% of them each). Returns the items added.
int addSummaryInterval(v1::RecordBatch* b, int sigs, int ops_per_step, int64_t now_ns,
                       int64_t interval_ns);

// The step marker of that interval (step `step`, 1,024 samples).
void addStepMarker(v1::RecordBatch* b, uint64_t step, int64_t now_ns, int64_t interval_ns);

}  // namespace flare::engine::load
