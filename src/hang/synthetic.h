// Synthetic hang evidence for tests and the benchmark: N ranks of one data-parallel job whose
// main threads run train.py -> train_step, with one injected fault. Built independently of the
// analysis (it knows the truth it injected; the analysis must find it).
//
// Not thread-safe (plain functions returning values).
#pragma once

#include <vector>

#include "src/hang/analysis.h"

namespace flare::hang::testing {

enum class Scenario {
  kComputeHang,   // culprit stuck in a compute kernel (outside communication), issued everything
  kSkip,          // culprit stuck on the host, never issued collective #kSeq
  kUnresponsive,  // culprit does not answer
  kStalledLink,   // every rank in the all-reduce; ring edge culprit -> culprit+1 stalled
};

constexpr uint64_t kSeq = 42;  // the collective the job hangs in
constexpr uint64_t kStalledStep = 100;

struct JobShape {
  int ranks = 8;
  int channels = 2;
  int ranks_per_host = 8;
};

std::vector<RankEvidence> makeJob(const JobShape& shape, Scenario s, int culprit);

// The stacks of the main thread (and a second, idle thread) of a rank in an all-reduce.
flare::v1::StackDump allReduceStacks();
// ... of a rank whose main thread is stuck in a compute kernel's synchronization.
flare::v1::StackDump computeStacks();
// ... of a rank stuck on the host in the data loader (never reaches the collectives).
flare::v1::StackDump hostStuckStacks();

// Ring connection steps for `rank` on `channels` channels with the edge stalled -> stalled+1
// stopped at kStalledStep (the others bounded by 8 steps of buffering per hop from it).
std::vector<flare::v1::ConnectionStep> ringSteps(int rank, int nranks, int channels, int stalled);

}  // namespace flare::hang::testing
