// The runtime's process-wide state, shared by runtime.cc (initialization, the accessors) and
// lifecycle.cc (fork and exit). Private to libflare_hook.so (hidden visibility, like all of its
// non-interposed symbols).
#pragma once

#include <sys/types.h>

#include <atomic>

#include "src/timing/exporter.h"
#include "src/timing/timing.h"

namespace flare::hook {

extern std::atomic<timing::Tracer*> g_tracer;          // set once initialized; null at exit
extern std::atomic<timing::GrpcExporter*> g_exporter;  // when streaming to flared
extern std::atomic<bool> g_off;  // tracing off: disabled, failed, forked child
extern pid_t g_init_pid;         // the process that initialized (not a forked child)

// Registers the fork-child and exit handlers (lifecycle.cc) and notes this process as the one
// that initialized. Called once, by the initialization, before g_tracer is set.
void installForkAndExitHandlers();

}  // namespace flare::hook
