// Fork and exit handling of the preload library (runtime_state.h): a forked child (a DataLoader
// worker) turns tracing off for itself, quietly; at exit (Python's atexit through finishAtExit,
// or exit()) the Tracer is drained and the exporter flushed, bounded, once per process.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "src/common/config.h"
#include "src/common/log.h"
#include "src/hook/deep_trace.h"
#include "src/hook/runtime.h"
#include "src/hook/runtime_state.h"
#include "src/hook/step_boundary.h"

namespace flare::hook {
namespace {

void atForkChild() {
  // The poller thread does not exist in the child: stop tracing there, quietly.
  g_off.store(true);
  if (timing::Tracer* t = g_tracer.load()) t->disableAfterFork();
  if (timing::GrpcExporter* e = g_exporter.load()) e->disableAfterFork();
}

std::atomic<bool> g_exit_done{false};

void atExit() {
  timing::Tracer* t = g_tracer.load();
  if (!t || getpid() != g_init_pid) return;
  if (g_exit_done.exchange(true)) return;  // once: Python's atexit (finishAtExit) or exit()
  deepTraceAtExit();                       // its last records reach the Tracer before the drain
  stepSamplingAtExit();                    // asked for and never applied: said once
  // Write out what completed; never hold the exit up for long (a hung stream stays hung).
  if (!t->drain(1'000'000'000, /*final=*/true)) {
    common::logOnce(common::LogLevel::kInfo, "hook", "exit-undrained",
                    "flare: exiting with GPU work still in flight; unfinished ops not recorded");
  }
  if (timing::GrpcExporter* e = g_exporter.load()) {
    // Send what is queued, bounded; the rest goes to the spool.
    const double s = common::paramDurationSeconds("FLARE_EXIT_FLUSH_SECONDS", 0.0, 60.0);
    e->shutdown(static_cast<int64_t>(s * 1e9));
  }
  g_tracer.store(nullptr);
}

}  // namespace

void installForkAndExitHandlers() {
  g_init_pid = getpid();
  pthread_atfork(nullptr, nullptr, atForkChild);
  std::atexit(atExit);
}

void finishAtExit() {
  atExit();
}

}  // namespace flare::hook
