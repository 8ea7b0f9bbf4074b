// Hang analysis: from what every rank reported during a hang episode (its stacks, its
// per-communicator collective progress, optionally the per-connection step counters of the
// hung NCCL kernel), decide what kind of hang it is and which rank(s), host(s) and GPU(s) to
// blame. Pure functions: no I/O, no clock, no globals besides the constant rule table.
//
// Rules (each has a unit test in analysis_test.cc):
//   1. A rank that cannot answer (no answer, crashed, stopped) while the others are stuck is a
//      suspect: kind kUnresponsiveRank.
//   2. Per communicator, the lagging collective is the first sequence number not completed by
//      every rank (min last_completed_seq + 1). A rank of that communicator whose
//      last_issued_seq is below it never issued the collective the others wait in: suspect.
//   3. A responsive rank whose main thread is outside communication (see the frame rules) while
//      other ranks wait inside a collective is a suspect. Rules 2 and 3 give kNonCommunication;
//      when both name ranks and the sets are disjoint, the evidence contradicts: kInconclusive.
//   4. Every responsive rank inside communication, every rank issued the lagging collective:
//      kCommunication. With connection steps (InspectResult) the topology join names the
//      slowest connection: per channel, rank r's send connection to p is joined with p's
//      receive connection from r; an edge's progress is the smaller of the two steps; the edge
//      with the smallest progress in the most channels is the suspect link, its two ends the
//      suspects. Without steps: needs_inspection.
//   5. No rank inside communication and nothing else pointing at a rank: kInconclusive.
//   4b. With connection steps, ranks whose every connection stayed at step 0 while others
//      moved never reached the collective: suspects (kNonCommunication). Among them, one whose
//      inspection found a collective kernel running (it reported connections) waits for one
//      whose GPU runs none (no connection reported): when both kinds are there, the first are
//      victims (Diagnosis::victims), the second the suspects.
//   6. Watchdog evidence (RankEvidence.stuck): when several ranks are suspects and the op stuck
//      longest on some of them is a compute kernel (kernel, gemm, attention) while on the others
//      it is a collective (they wait for the first ones; the kernels queued behind their
//      collective are younger), the compute-stuck ranks are the suspects, the others victims.
// A rank that answered but whose main thread has no frame (it did not answer the capture
// signal) counts neither as inside nor as outside communication (unknown_stack).
//
// Frame classification ("in communication") is table-driven (frameRules(), analysis.cc), applied
// to the rank's main thread (ThreadStack.main_thread, else the first thread). A frame's class is
// that of the first rule of its side (Python or native) that matches it. Per side, frames are
// walked innermost first, kNeutral frames (CUDA synchronization, futex/pthread waits, the
// interpreter loop, unsymbolized frames) are skipped, and the first other frame decides: a
// communication rule, or application code (no rule). The thread is in communication when the
// native side or the Python side decides so.
//
// Threading: every function is reentrant; inputs are read-only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flare/v1/commands.pb.h"

namespace flare::hang {

enum class Responsiveness { kAnswered, kNoAnswer, kCrashed, kStopped };
std::string_view responsivenessName(Responsiveness r);

// Everything known about one rank for one hang episode.
struct RankEvidence {
  int rank = -1;
  std::string host;
  std::string gpu_uuid;
  int gpu_index = -1;
  Responsiveness state = Responsiveness::kAnswered;
  std::string why;              // free text for an unresponsive rank ("no answer in 30 s")
  flare::v1::StackDump stacks;  // collectives (CollectiveProgress) ride in stacks.collectives
  bool inspected = false;       // connections came from an inspection (may be empty)
  std::vector<flare::v1::ConnectionStep> connections;
  // What the rank's watchdog found stuck (HangReport.stuck: the head op of each stuck stream);
  // empty when it sent no report.
  std::vector<flare::v1::StuckOp> stuck;
};

// ---- frame classification ----

enum class FrameClass { kNone, kCommunication, kNeutral };
enum class FrameSide { kPython, kNative };
enum class MatchKind { kPrefix, kContains };

struct FrameRule {
  FrameSide side;
  MatchKind match;
  std::string_view field;  // "function", "file" (python) or "symbol", "module" (native)
  std::string_view pattern;
  FrameClass result;
};

// The rule table (documented in docs/hang-analysis.md).
std::span<const FrameRule> frameRules();

FrameClass classifyPython(const flare::v1::PythonFrame& f);
FrameClass classifyNative(const flare::v1::NativeFrame& f);
// The thread's class: the first frame (innermost first; Python frames, then native frames)
// matched by a rule other than kNeutral; kNone when none.
FrameClass classifyThread(const flare::v1::ThreadStack& t);
// The thread that represents the rank: main_thread, else threads[0]; nullptr when no threads.
const flare::v1::ThreadStack* mainThread(const flare::v1::StackDump& d);

// ---- output ----

enum class HangKind { kNonCommunication, kCommunication, kUnresponsiveRank, kInconclusive };
std::string_view hangKindName(HangKind k);

struct Suspect {
  int rank = -1;
  std::string host;
  std::string gpu_uuid;
  int gpu_index = -1;
  std::string reason;
};

struct StackGroup {
  uint64_t signature = 0;
  std::vector<int> ranks;  // ascending
  std::string ranges;      // compact: "0-3,5,7"
  bool in_communication = false;
  std::vector<std::string> frames;  // representative frames of the main thread, innermost first
};

struct LaggingCollective {
  std::string communicator;
  uint64_t seq = 0;             // the first sequence number not completed by every rank
  std::string op;               // as reported by a rank that issued it
  std::vector<int> not_issued;  // ranks whose last_issued_seq < seq
  std::vector<int> waiting;     // ranks that issued it and did not complete it
};

// Ranks that report the same (communicator, last issued, last completed): the per-rank list of
// "last collective issued and completed", compacted.
struct ProgressGroup {
  std::string communicator;
  uint64_t last_issued_seq = 0;
  uint64_t last_completed_seq = 0;
  std::string last_issued_op;  // as the first rank of the group reported it
  std::vector<int> ranks;      // ascending
  std::string ranges;
};

struct SuspectLink {
  int channel = -1;  // the channel where it was found first (lowest)
  int sender = -1;
  int receiver = -1;
  uint64_t step = 0;          // the edge's progress: min(send step, receive step)
  int channels_agreeing = 0;  // channels where this edge is the unique slowest
  int channels_total = 0;
  std::string communicator;  // the sub-communicator of its first channel ("": global peers)
};

struct Diagnosis {
  HangKind kind = HangKind::kInconclusive;
  std::vector<Suspect> suspects;  // ascending rank
  // Ranks the evidence first pointed at that it then clears (rules 4b and 6): they wait in a
  // collective for a suspect. Ascending; never among the suspects.
  std::vector<int> victims;
  std::vector<StackGroup> groups;          // largest first
  std::vector<LaggingCollective> lagging;  // per communicator with an incomplete collective
  std::vector<ProgressGroup> progress;     // by communicator, then issued, then completed
  std::optional<SuspectLink> link;
  bool needs_inspection = false;  // communication hang without connection steps
  std::vector<int> unresponsive;
  std::vector<int> unknown_stack;     // answered, but the main thread's stack is empty (timed out)
  std::vector<std::string> evidence;  // one line per fact used
  // Counters of input problems (bad input is counted, never fatal).
  uint64_t duplicate_ranks = 0;
  uint64_t unmatched_connections = 0;     // a side without the peer's matching side
  uint64_t inconsistent_connections = 0;  // receive step ahead of the matching send step
  uint64_t invalid_connections = 0;       // bad channel/peer (negative, self, out of range)
  uint64_t untranslated_connections = 0;  // sub-communicator peer with no known global rank
};

// The analysis. Ranks may come in any order; a rank listed twice counts in duplicate_ranks
// and only its first entry is used.
Diagnosis analyze(std::span<const RankEvidence> ranks);

// "0-3,5,7" from ascending (or unsorted; sorted and de-duplicated first) ranks.
std::string compactRanges(std::vector<int> ranks);

// A short multi-line text for operators: kind, suspects, lagging collectives, groups.
std::string formatDiagnosis(const Diagnosis& d, size_t max_frames = 6);

}  // namespace flare::hang
