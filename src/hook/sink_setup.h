// What the FLARE_* settings choose for the runtime (runtime.cc) at initialization: where records
// go (the exporter to flared over libflare_exporter.so with its TLS files, or the local spool),
// raw or summary mode, one or two events per op, the batch bounds. Called once, on the thread
// that initializes the runtime; each bad value is one warning and its default.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "src/common/identity.h"
#include "src/timing/exporter.h"

namespace flare::hook {

// FLARE_MODE: true for summary (compute kernels as per-window summaries, each step as
// StepStats), false for raw. Unset: summary when `streaming` to flared, raw for a local spool.
bool summaryMode(bool streaming);

// FLARE_TIMING=end: one event per op (TracerOptions::end_only); pair (the default): two.
bool endOnlyTiming();

// The batch bounds: FLARE_BATCH_BYTES, FLARE_BATCH_INTERVAL_MS (in ns).
size_t batchBytes();
int64_t batchIntervalNs();

// FLARE_DAEMON set: the exporter over libflare_exporter.so (FLARE_EXPORTER_LIB, else beside
// this library; dlopened RTLD_LOCAL, src/timing/transport.h), with the FLARE_TLS_* files read.
// nullptr (one warning) when it cannot be loaded or its TLS settings cannot be used: the caller
// uses the spool (never plaintext when TLS was asked for). `handler` answers the daemon's
// commands (not owned).
std::unique_ptr<timing::GrpcExporter> makeExporter(const common::Identity& id,
                                                   const std::string& daemon,
                                                   const std::string& dir,
                                                   timing::CommandHandler* handler);

}  // namespace flare::hook
