// The preload library's runtime accessor (runtime.h): lazy initialization on the first call that
// needs the Tracer, and the objects it wires together (device timer, sink, command handler, hang
// watch, collective tracker, Tracer). Its parts live beside it: device_timer.cc (the CUDA-backed
// DeviceTimer), sink_setup.cc (FLARE_* settings, exporter or spool), lifecycle.cc (fork and exit),
// kernel_registry.cc (kernel signatures, flare_register_kernel*), thread_state.cc (re-entrancy
// depth, per-thread signature cache), op_names.cc (demangling and naming helpers).
#include "src/hook/runtime.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "src/common/clock.h"
#include "src/common/config.h"
#include "src/common/identity.h"
#include "src/common/log.h"
#include "src/common/private_dir.h"
#include "src/hook/deep_trace.h"
#include "src/hook/device_timer.h"
#include "src/hook/hang_watch.h"
#include "src/hook/launch_sampling.h"
#include "src/hook/rank_commands.h"
#include "src/hook/runtime_state.h"
#include "src/hook/sink_setup.h"
#include "src/timing/exporter.h"
#include "src/timing/spool_sink.h"

namespace flare::hook {

std::atomic<timing::Tracer*> g_tracer{nullptr};
std::atomic<timing::GrpcExporter*> g_exporter{nullptr};
std::atomic<bool> g_off{false};
pid_t g_init_pid = 0;

namespace {

struct State {
  std::unique_ptr<timing::DeviceTimer> timer;
  std::unique_ptr<timing::Sink> sink;
  timing::GrpcExporter* exporter = nullptr;    // == sink when streaming to flared
  std::unique_ptr<RankCommands> commands;      // daemon commands (rank_commands.h)
  std::unique_ptr<HangWatch> watch;            // rank watchdog (FLARE_HANG_TIMEOUT)
  std::unique_ptr<CollectiveTracker> tracker;  // wraps sink: completed collectives
  std::unique_ptr<timing::Tracer> tracer;
};

std::once_flag g_init_once;

void turnOff(const char* why) {
  g_off.store(true);
  common::logOnce(common::LogLevel::kWarn, "hook", "hook-off",
                  "flare: tracing turned off: {}; the job continues untraced", why);
}

void init() {
  if (common::paramBool("FLARE_DISABLE")) {
    g_off.store(true);
    return;
  }
  auto* state = new State();  // lives until exit; never destroyed (threads may still run)
  state->timer = makeCudaDeviceTimer();
  if (!state->timer) {
    turnOff("the CUDA runtime's event functions were not found");
    return;
  }
  const common::Identity id = common::identityFromEnv();
  common::initLogging(id);
  std::string dir = common::paramString("FLARE_OUTPUT_DIR");
  if (dir.empty()) dir = common::defaultSpoolRoot();  // per user, 0700 (private_dir.h)
  const std::string daemon = common::paramString("FLARE_DAEMON");
  if (!daemon.empty()) {
    state->commands = std::make_unique<RankCommands>(id.rank, id.world_size);
    auto exporter = makeExporter(id, daemon, dir, state->commands.get());
    state->exporter = exporter.get();
    state->sink = std::move(exporter);
  }
  if (!state->sink) {
    timing::SpoolSinkOptions spool;
    spool.summary = summaryMode(false);
    spool.batch_bytes = batchBytes();
    state->sink =
        std::make_unique<timing::SpoolSink>(dir, id.job_id, id.rank, id.pid, std::move(spool));
  }
  timing::TracerOptions opts;
  opts.flush_interval_ns = batchIntervalNs();
  opts.end_only = endOnlyTiming();
  opts.correct_event_gap = common::paramBool("FLARE_EVENT_GAP_CORRECTION");
  opts.measure_cost = timingBudgetPct() > 0;  // step sampling by budget (step.cc)
  hang::WatchdogOptions watch_opts;
  if (HangWatch::optionsFromEnv(&watch_opts)) {
    timing::GrpcExporter* exporter = state->exporter;
    state->watch = std::make_unique<HangWatch>(
        std::move(watch_opts),
        [exporter](const flare::v1::HangReport& r) {
          if (exporter != nullptr) exporter->reportHang(r);
        },
        [] { return common::realtimeNs(); });
    opts.head_observer = state->watch.get();
  }
  state->tracker = std::make_unique<CollectiveTracker>(state->sink.get(), state->watch.get());
  state->tracer = std::make_unique<timing::Tracer>(state->timer.get(), &common::systemClock(),
                                                   state->tracker.get(), opts);
  installForkAndExitHandlers();
  g_exporter.store(state->exporter);
  g_tracer.store(state->tracer.get());
  if (state->exporter != nullptr) {
    FLARE_LOG_INFO("hook", "flare: tracing rank {} of job {} to the daemon {}", id.rank, id.job_id,
                   daemon);
  } else {
    FLARE_LOG_INFO("hook", "flare: tracing rank {} of job {} into {}/{}/{}", id.rank, id.job_id,
                   dir, id.job_id, id.rank);
  }
}

}  // namespace

timing::Tracer* tracer() {
  if (g_off.load(std::memory_order_relaxed)) return nullptr;
  if (timing::Tracer* t = g_tracer.load(std::memory_order_acquire)) return t;
  std::call_once(g_init_once, [] {
    try {
      init();
    } catch (const std::exception& e) {
      turnOff(e.what());
    } catch (...) {
      turnOff("initialization failed");
    }
  });
  return g_off.load() ? nullptr : g_tracer.load(std::memory_order_acquire);
}

void postCommandResult(const flare::v1::CommandResult& result) {
  if (timing::GrpcExporter* e = g_exporter.load()) e->postCommandResult(result);
}

timing::Tracer* activeTracer() {
  if (g_off.load(std::memory_order_relaxed)) return nullptr;
  return g_tracer.load(std::memory_order_acquire);
}

}  // namespace flare::hook
