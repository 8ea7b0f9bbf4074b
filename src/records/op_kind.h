// The op-kind facts that the rank, flared and the trace exporter must agree on: which kinds of
// op carry FLOPs, which move bytes between ranks, and the bus-bandwidth factor of a collective.
// One definition, so that flared's kernel report (src/engine/ingest.cc), the timeline
// (src/timeline) and the rank's batching (src/timing/batch_builder.cc) cannot drift apart.
// Pure functions of their arguments: any thread.
#pragma once

#include "flare/v1/common.pb.h"

namespace flare::records {

// GEMM, attention and registered custom kernels: their records carry FLOPs, so TFLOPS is defined.
bool computesFlops(flare::v1::OpKind kind);

// NCCL collectives and point-to-point send/recv: they move bytes between ranks, carry a
// CollectiveInfo (communicator, sequence number, rank count) and have a bus bandwidth.
bool isCollective(flare::v1::OpKind kind);

// nccl-tests' bus-bandwidth factor f (busbw = algbw · f) of `kind` over `nranks` ranks
// (docs/metrics.md): 2(n−1)/n all-reduce; (n−1)/n all-gather, reduce-scatter, all-to-all;
// 1 broadcast, reduce, send/recv and anything else. One rank moves nothing over a link, so
// all-reduce & co. give 0 there, as nccl-tests reports. nranks < 1 (count unknown): 1, i.e.
// busbw = algbw. The formula itself is stats::busBandwidthFactor (src/stats/perf_model.h).
double busBandwidthFactor(flare::v1::CollectiveKind kind, int nranks);

}  // namespace flare::records
