// Deep trace on demand: the daemon's DeepTrace{steps} command makes this rank capture every
// kernel, memcpy and memset with the CUPTI Activity API for the next `steps` steps, then stop by
// itself. This covers the kernels no wrapper times (the "minority" kernels behind V_minority).
//
//   reader thread: DeepTrace command ──▶ command(): dlopen libcupti (first time only),
//     cuptiSubscribe (taken by torch.profiler/Nsight? → SKIPPED, said once), register buffer and
//     timestamp callbacks ──▶ answer ARMED
//   application thread, next step marker ──▶ onStep(): enable CONCURRENT_KERNEL, MEMCPY, MEMSET
//     (a refusal → SKIPPED) … `steps` markers later: disable
//   "flare-deeptrace" thread ──▶ cuptiActivityFlushAll until the records stop coming, then a
//     forced flush; unsubscribe; answer DONE (counts) through the exporter, replacing ARMED
//   CUPTI's threads ──▶ buffers from a fixed BufferPool (FLARE_DEEP_TRACE_BUFFERS ×
//     FLARE_DEEP_TRACE_BUFFER_BYTES; exhausted → CUPTI drops and counts), parsed into
//     timing::DeepTraceRecord, handed to Tracer::pushDeepTrace (→ RecordBatch.deep_trace), the
//     buffer recycled.
//
// Steps are the explicit step markers (flare_step, src/hook/step.cc), else the DataLoader's
// `__next__` spans (src/hook/python.cc; not exercised by the tests: the sim has no torch).
// Timestamps: CUPTI is asked for CLOCK_MONOTONIC through cuptiActivityRegisterTimestampCallback
// (the clock the Tracer's records are on); if that fails its default CLOCK_REALTIME is mapped back.
//
// Zero cost when unused: nothing is loaded before the first command; onStep() is one relaxed
// atomic load. The hook never links libcupti: FLARE_CUPTI_LIB, else libcupti.so.13, .so.12,
// .so, /usr/local/cuda/extras/CUPTI/lib64/libcupti.so are dlopened at the first command.
//
// Threading: command() on the exporter's reader thread (one command at a time), onStep() on any
// application thread, the buffer callbacks on CUPTI's threads. A mutex guards the state changes;
// the steady-state check in onStep() takes none. One process-wide instance (deepTrace()): CUPTI's
// callbacks carry no context pointer. Never destroyed (CUPTI may call back during exit).
#pragma once

#include <cstdint>

#include "flare/v1/commands.pb.h"

namespace flare::hook {

// One capture at a time: a command while one runs is SKIPPED ("already running"); a command
// while one is armed but no step has begun replaces it (the old one is answered SKIPPED).
//
// The daemon's DeepTrace command: fills `result` (command_id set by the caller) with ARMED, or
// SKIPPED and the reason.
void deepTraceCommand(const flare::v1::Command& command, flare::v1::CommandResult* result);

// A step boundary (onStepBoundary, step_boundary.h, says which count). Cheap unless a capture
// is armed or running.
void deepTraceOnStep();

// A CUDA graph launch (cudaGraphLaunch's wrapper, at `now_ns` on the monotonic clock): training
// work for the DataLoader step rule by which a deep trace counts steps (python.cc;
// records::StepBoundaryRule).
void stepRuleNoteGraphLaunch(int64_t now_ns);

// At process exit, before the Tracer's last drain: ends a running capture (flushes what was
// captured; DONE with the steps seen) or waits for a flush in progress (bounded).
void deepTraceAtExit();

}  // namespace flare::hook
