// The commands a rank receives from the daemon: RankCommands, the CommandHandler the exporter
// calls (on its stream reader thread, which keeps running while the application's main thread is
// stuck) for every command — DumpStacks, Inspect and Exit (hang diagnosis, below), DeepTrace
// (deep_trace.h); anything else is answered "not supported yet" — and a Sink wrapper that
// records which collectives the timing layer saw complete.
//
//   DumpStacks: hang::captureStacks() (native and Python stacks of every thread), plus
//     StackDump.collectives: per NCCL communicator this process created, the last collective it
//     issued (the hook's per-communicator sequence number, counted at the API call) and the last
//     one whose GPU completion the timing layer observed (CollectiveTracker below, i.e. the
//     highest completed seq of that communicator the Tracer delivered to its sink). "Completed"
//     therefore lags the GPU by the poll interval and, under load, by the ring; it never runs
//     ahead of it. The communicator name is the hex hash of its ncclUniqueId (the same on every
//     rank).
//   Exit: refused unless FLARE_HANG_KILL=1; then answers ok, flushes the records (bounded) and
//     _exits with kHangKillExitCode from a thread of its own (once).
//   Inspect: on the simulated NCCL (the symbol flareSimNcclConnectionSteps exists, found with
//     dlsym), the connection steps of each communicator's in-flight collective, peers
//     translated to global ranks only for communicators that span the whole job (comm rank ==
//     global rank when nranks == world size and the comm rank equals this rank); others are
//     skipped and counted in raw_output. Else cuda-gdb (hang::runCudaGdb) with the script named
//     by FLARE_CUDA_GDB_SCRIPT (untested here: no GPU), else "not supported".
//
// Threading: handle() may run on any thread, one command at a time per exporter; it takes the
// communicator table's mutex briefly. CollectiveTracker forwards on the Tracer's poller thread.
// Ownership: the tracker does not own the wrapped sink.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/hook/hang_watch.h"
#include "src/timing/exporter.h"
#include "src/timing/timing.h"

namespace flare::hook {

// One communicator's progress as the hook saw it (nccl.cc).
struct CommProgress {
  void* comm = nullptr;  // ncclComm_t
  uint64_t hash = 0;
  int nranks = 0;
  int rank = 0;
  uint64_t issued = 0;
  uint64_t completed = 0;
  std::string last_op;
};
std::vector<CommProgress> commProgress();
// Raises the communicator's completed seq to `seq` (never lowers it).
void noteCollectiveCompleted(uint64_t comm_hash, uint64_t seq);

// Forwards everything to `inner`; notes completed collectives first, and hands signatures and
// completed ops to the rank's hang watch (when there is one).
class CollectiveTracker final : public timing::Sink {
 public:
  explicit CollectiveTracker(timing::Sink* inner, HangWatch* watch = nullptr)
      : inner_(inner), watch_(watch) {}
  void onSignature(uint32_t id, const timing::Signature& sig) override;
  void onOps(std::span<const timing::CompletedOp> ops) override;
  void onDrops(const timing::DropCounters& totals) override { inner_->onDrops(totals); }
  void flush() override { inner_->flush(); }
  void finish() override { inner_->finish(); }
  void onWatermark(int64_t issued_before_ns) override { inner_->onWatermark(issued_before_ns); }
  void onApiName(uint32_t id, const std::string& name) override { inner_->onApiName(id, name); }
  void onSpans(std::span<const timing::CompletedSpan> spans) override { inner_->onSpans(spans); }
  void onGraphLaunches(std::span<const int64_t> issue_ns) override {
    inner_->onGraphLaunches(issue_ns);
  }
  void onDevice(const timing::DeviceDescription& device) override { inner_->onDevice(device); }
  void onDeepTrace(std::span<const timing::DeepTraceRecord> records) override {
    inner_->onDeepTrace(records);
  }

 private:
  timing::Sink* inner_;
  HangWatch* watch_;  // not owned; may be null
};

// The exit status of a rank ended by the daemon's Exit command (FLARE_HANG_KILL=1): 75
// (EX_TEMPFAIL, "try again": the launcher may restart the job).
inline constexpr int kHangKillExitCode = 75;

class RankCommands final : public timing::CommandHandler {
 public:
  RankCommands(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  void handle(const flare::v1::Command& command, flare::v1::CommandResult* result) override;

 private:
  int rank_;
  int world_size_;
};

}  // namespace flare::hook
