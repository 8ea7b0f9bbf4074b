#include "src/hook/rank_commands.h"

#include <dlfcn.h>
#include <unistd.h>

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "src/common/config.h"
#include "src/common/log.h"
#include "src/hang/inspect.h"
#include "src/hang/stack_capture.h"
#include "src/hook/deep_trace.h"
#include "src/hook/runtime.h"

namespace flare::hook {

void CollectiveTracker::onSignature(uint32_t id, const timing::Signature& sig) {
  if (watch_ != nullptr) watch_->onSignature(id, sig);
  inner_->onSignature(id, sig);
}

void CollectiveTracker::onOps(std::span<const timing::CompletedOp> ops) {
  for (const timing::CompletedOp& op : ops) {
    if (op.info.kind == timing::OpKind::kCollective && op.info.comm_hash != 0 && op.info.seq > 0) {
      noteCollectiveCompleted(op.info.comm_hash, op.info.seq);
    }
  }
  if (watch_ != nullptr) watch_->onOps(ops);
  inner_->onOps(ops);
}

namespace {

// FLARE_HANG_KILL=1: answer, then end the (hung) process from a thread of its own, so that the
// answer goes out first and this (the exporter's reader) thread is not the one flushing the
// exporter. Records are flushed with the exit handler's bounds (drain 1 s, send
// FLARE_EXIT_FLUSH_SECONDS), then _exit: the main thread is stuck, so exit() and its handlers
// could block on it. Once per process.
void exitCommand(const flare::v1::Exit& req, flare::v1::CommandResult* result) {
  if (!common::paramBool("FLARE_HANG_KILL")) {
    result->set_ok(false);
    result->set_error("refused: this rank did not opt in (FLARE_HANG_KILL=1)");
    FLARE_LOG_WARN("hang",
                   "flare: the daemon asked this process to exit ({}); refused: "
                   "FLARE_HANG_KILL is not set",
                   req.reason());
    return;
  }
  result->set_ok(true);
  static std::atomic<bool> started{false};
  if (started.exchange(true)) return;
  FLARE_LOG_ERROR("hang",
                  "flare: FLARE_HANG_KILL: ending this process after a hang diagnosis (exit "
                  "code {}): {}",
                  kHangKillExitCode, req.reason());
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the answer go out
    finishAtExit();
    std::fflush(nullptr);
    _exit(kHangKillExitCode);
  }).detach();
}

// The simulated NCCL's flareSimNcclConnectionSteps (src/sim/flare_sim_nccl.h), looked up with
// dlsym: the real libnccl has no such symbol, and the hook must not depend on src/sim. The
// record mirrors FlareSimConnStep field for field (a C struct: same types, same order).
struct FlareSimConnStep {
  int32_t channel;
  int32_t peer;  // rank on the other end, in the communicator
  uint64_t step;
  int32_t send;  // 1: this rank's send connection to peer; 0: its receive connection from peer
};
static_assert(sizeof(FlareSimConnStep) == 24, "must match src/sim/flare_sim_nccl.h");
using StepsFn = int (*)(ncclComm_t, FlareSimConnStep*, int, uint64_t*);

void dumpStacks(const flare::v1::DumpStacks& req, flare::v1::CommandResult* result) {
  hang::CaptureOptions o;
  o.native = req.native();
  flare::v1::StackDump* dump = result->mutable_stacks();
  hang::CaptureStats stats;
  std::string error;
  const bool ok = hang::captureStacks(o, dump, &stats, &error);
  for (const CommProgress& p : commProgress()) {
    if (p.issued == 0 && p.completed == 0) continue;  // never used: nothing to compare
    flare::v1::CollectiveProgress* c = dump->add_collectives();
    c->set_communicator(communicatorName(p.hash));
    c->set_last_issued_seq(p.issued);
    c->set_last_completed_seq(p.completed);
    c->set_last_issued_op(p.last_op);
    c->set_comm_rank(p.rank);
    c->set_nranks(p.nranks);
  }
  // The collective progress alone is evidence: answer ok even when no stack could be taken.
  result->set_ok(ok || dump->collectives_size() > 0);
  if (!ok) result->set_error(error);
}

void inspect(const flare::v1::Inspect& req, int rank, int world_size,
             flare::v1::CommandResult* result) {
  flare::v1::InspectResult* out = result->mutable_inspect();
  if (auto fn = reinterpret_cast<StepsFn>(dlsym(RTLD_DEFAULT, "flareSimNcclConnectionSteps"))) {
    int sub = 0;
    for (const CommProgress& p : commProgress()) {
      FlareSimConnStep steps[64];
      uint64_t seq = 0;
      const int n = fn(static_cast<ncclComm_t>(p.comm), steps, 64, &seq);
      if (n <= 0) continue;
      // Peers are communicator ranks: global ranks for a job-wide communicator; for a smaller
      // one the daemon translates them from every rank's (communicator, comm rank).
      const bool job_wide = p.nranks == world_size && p.rank == rank;
      if (!job_wide) sub += n;
      for (int i = 0; i < n; ++i) {
        flare::v1::ConnectionStep* c = out->add_connections();
        c->set_channel(steps[i].channel);
        c->set_peer(steps[i].peer);
        c->set_step(steps[i].step);
        c->set_send(steps[i].send != 0);
        if (!job_wide) {
          c->set_communicator(communicatorName(p.hash));
          c->set_comm_rank(p.rank);
        }
      }
    }
    out->set_raw_output("simulated NCCL: " + std::to_string(out->connections_size()) +
                        " connections, " + std::to_string(sub) +
                        " of them on communicators smaller than the job");
    result->set_ok(true);
    return;
  }
  const std::string script = common::paramString("FLARE_CUDA_GDB_SCRIPT");
  if (script.empty()) {
    result->set_ok(false);
    result->set_error("inspect: not the simulated NCCL and FLARE_CUDA_GDB_SCRIPT is not set");
    return;
  }
  hang::InspectOptions o;
  o.script = script;
  if (req.deadline_ms() > 0) o.deadline_ms = req.deadline_ms();
  hang::ParseStats stats;
  std::string error;
  const bool ok = hang::runCudaGdb(o, out, &stats, &error);
  result->set_ok(ok);
  if (!ok) result->set_error(error);
}

}  // namespace

void RankCommands::handle(const flare::v1::Command& command, flare::v1::CommandResult* result) {
  if (command.has_dump_stacks()) {
    dumpStacks(command.dump_stacks(), result);
  } else if (command.has_inspect()) {
    inspect(command.inspect(), rank_, world_size_, result);
  } else if (command.has_deep_trace()) {
    deepTraceCommand(command, result);  // src/hook/deep_trace.h
  } else if (command.has_exit()) {
    exitCommand(command.exit(), result);
  } else {
    result->set_ok(false);
    result->set_error("not supported yet");
  }
}

}  // namespace flare::hook
