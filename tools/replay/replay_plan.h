// flare-replay's model: turns one rank's recorded raw spool (a fixture) into what N ranks of a
// synchronous job would send, with one rank perturbed the way real faults do. Pure functions
// over protobuf messages: no I/O, no clock, no threads (the program, flare_replay.cc, reads the
// fixture, paces the batches and speaks to flared).
//
// The model. Every replayed rank runs the recorded rank's records, shifted by two delays (on the
// fixture's clock, 0 for a healthy job, so a healthy replay is N identical copies with rank
// identity and communicators rewritten): the host's, H_r (issue times, Python spans, step
// markers, host calls), and the GPU's, G_r (when its work runs).
//
//   - A GPU op issued with host delay h starts max(G_r, h - slack) late, where slack is how long
//     it waited in its queue beyond the fixture's quickest launch: a late issue delays it only by
//     what the queue did not absorb (a long stall drains the queue; issue latencies collapse).
//     Its end leaves G_r at least its own delay.
//   - A blocking synchronization (a host call named "...Synchronize") returns when the GPU is
//     done (at once when the host comes late), and H_r is then its return's delay.
//   - A collective instance starts on each member at its own shifted start and ends on every
//     member at the recorded end plus the largest delay any member started it with (the last
//     arrival): the others wait (their G grows; their H only at their next synchronization).
//
// Perturbations:
//
//   slow GPU (rank r, factor f):  its compute kernels (GEMM, attention, other kernels, graphs)
//                                 take f× their recorded time;
//   slow link (rank r, factor f): collectives of every communicator that contains r take f×
//                                 their time from the last arrival, on every member;
//   host stall (rank r, gap g):   in the middle of each step's issuing (the median issue time of
//                                 the step's GPU ops) the host of r pauses g: H_r += g;
//   hang (rank r, step s):        r's host stops issuing at the same point of step s (what it
//                                 issued before still runs); a rank that issues a collective a
//                                 stopped rank never issues waits in it forever: its host and
//                                 GPU stop there. Nothing later is sent.
//
// Communicators: the fixture names each of its communicators by hash and size. Replayed, they
// are laid out as nested grid dimensions, smallest first: the smallest is contiguous ranks
// (tensor parallel: {0,1},{2,3},...), the next strided by the first's size (data parallel:
// {0,2,4,6},{1,3,5,7}), and so on; the outermost grows to fill N ranks, the inner ones are cut
// to what N allows, one as large as two or more smaller dimensions together is job-wide, and one
// that no longer fits as a new dimension spans contiguous ranks. Each group gets its own hash,
// so every communicator holds exactly its members (nranks, rank_in_comm rewritten; p2p peers
// rotate within the group).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flare/v1/commands.pb.h"
#include "flare/v1/records.pb.h"

namespace flare::replay {

struct Perturbation {
  int slow_gpu_rank = -1;
  double gpu_factor = 1.0;  // > 1: kernels take longer (an underclocked GPU at 0.8: 1.25)
  int slow_link_rank = -1;
  double link_factor = 1.0;  // > 1: collectives take longer
  int stall_rank = -1;
  int64_t stall_ns = 0;  // host pause in the middle of each step's issuing
  int hang_rank = -1;
  int hang_step = 1;  // 0-based step index (steps between the fixture's boundaries)
};

struct PlanOptions {
  int ranks = 1;
  Perturbation perturb;
};

// What one replayed rank sends, on the fixture's clock (shift by the wall offset when sending).
struct RankPlan {
  std::vector<flare::v1::RecordBatch> batches;  // rank set, batch_seq 1.. without gaps
  // When each batch is due, on the fixture's clock (its newest record, delays included);
  // non-decreasing.
  std::vector<int64_t> due_ns;
  // Stopped (hang): on the fixture's clock; max() when it never stops.
  int64_t stopped_at_ns = std::numeric_limits<int64_t>::max();
  // Where it stopped: the collective it waits in ("" when it stopped outside communication).
  std::string waiting_in;
  // Per communicator (replayed), as a stack dump reports it for hang analysis.
  std::vector<flare::v1::CollectiveProgress> progress;
};

struct Plan {
  int64_t t0_ns = 0;                   // the fixture's first timestamp
  int64_t tend_ns = 0;                 // its last
  size_t steps = 0;                    // step intervals between the fixture's boundaries
  std::vector<int64_t> boundaries_ns;  // the fixture's step boundaries
  std::vector<RankPlan> ranks;
};

// `batches`: one rank's spool in order (readSpoolFile). Errors (no records, a hang step past the
// fixture's steps, a rank out of range) leave `error` set and return false.
bool makePlan(const std::vector<flare::v1::RecordBatch>& batches, const PlanOptions& options,
              Plan* plan, std::string* error);

// Adds `offset_ns` to every epoch timestamp of a batch (kernels, spans, steps, step statistics,
// summaries, collective blocks, deep-trace records, created_ns).
void shiftTimes(flare::v1::RecordBatch* batch, int64_t offset_ns);

// The replayed communicator of recorded communicator `comm_hash` for rank `rank` of `ranks`.
struct CommSlot {
  uint64_t hash = 0;  // 0: not a communicator (kept as is)
  int nranks = 1;
  int rank_in_comm = 0;
};

}  // namespace flare::replay
