// The preload library's one runtime accessor (conventions.md #5: no singletons in core
// classes, at most one accessor here): the Tracer, its CUDA-backed DeviceTimer, the spool sink,
// and the per-thread caches the wrappers use.
//
// Initialized lazily by the first intercepted call that needs it (never in a constructor at
// load time), on whatever thread that is. If anything fails, tracing turns off, one line says
// why, and every wrapper just forwards from then on. A forked child (DataLoader worker) turns
// tracing off for itself and stays quiet.
//
// This header is the wrappers' one include: it also brings the per-thread state
// (thread_state.h: Guard, the signature cache), kernel signatures and the registration API
// (kernel_registry.h) and the naming helpers (op_names.h). The accessor is in runtime.cc, the
// fork and exit handling in lifecycle.cc (finishAtExit).
#pragma once

#include "src/hook/kernel_registry.h"
#include "src/hook/op_names.h"
#include "src/hook/thread_state.h"
#include "src/timing/timing.h"

namespace flare::v1 {
class CommandResult;
}

namespace flare::hook {

// The tracer, or nullptr when tracing is off (disabled, failed, forked child, exiting).
timing::Tracer* tracer();

// Flare's exit work now (drain the tracer, flush the exporter; once per process, also from the
// exit handler): called by the Python tracing from an atexit callback, before the interpreter is
// finalized (src/pyprof/pyprof_api.h, before_exit).
void finishAtExit();

// The tracer if it is up already, without starting it (the Python span path, src/hook/python.cc:
// spans must not start the Tracer before the CUDA runtime is loaded).
timing::Tracer* activeTracer();

// Sends a command result produced after the command was answered (a deep trace that finished)
// to the daemon; no-op when not streaming to one. Any thread.
void postCommandResult(const flare::v1::CommandResult& result);

}  // namespace flare::hook
