// The wire form of MODE_SUMMARY's per-step statistics: a StepAccumulator result as a
// flare.v1.StepStats (records.proto). Shared by the rank's BatchBuilder and by tests that turn a
// raw record set into what summary mode sends. Part of `flare_records`.
#pragma once

#include <cstdint>
#include <functional>

#include "flare/v1/records.pb.h"
#include "src/records/step_accumulator.h"

namespace flare::records {

// Fills `out` from `r`; `to_epoch` converts the step's boundaries (the accumulator's clock) to
// the batch's epoch nanoseconds.
void encodeStepStats(const StepResult& r, const std::function<int64_t(int64_t)>& to_epoch,
                     flare::v1::StepStats* out);

}  // namespace flare::records
