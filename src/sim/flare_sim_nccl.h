// The simulated NCCL's private C API, exported by the simulated libnccl.so.2 (names start with
// `flareSim`, so the hook never interposes them). Only the sim tests and Flare's hang tests use
// it; the real library has no such symbol.
//
// Per-connection step counters of the in-flight collective: what tools/cuda-gdb-scripts read
// from a real hung NCCL kernel, modelled so that hang analysis can be tested without a GPU.
// Topology: a ring over the communicator's ranks on kFlareSimNcclChannels channels; on each
// channel rank r sends to r+1 and receives from r-1 (mod nranks). A connection's step counts
// the slices it has moved, out of 16 * (nranks - 1) for the whole collective:
//   - before every rank has arrived: 8 (one buffer) on connections whose two ends arrived, else 0;
//   - then all connections advance together, linearly over the collective's modelled duration;
//   - with an injected collective hang (FLARE_SIM_HANG=RANK:collective:STEP) the hung rank's
//     outgoing connection stops at 4 * (nranks - 1) steps and a connection k hops away from it
//     (either direction around the ring) at most 8 * k steps later (one buffer per hop).
// The receive side of a connection always equals the send side (the simulator loses nothing).
#pragma once

#include <stdint.h>

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { kFlareSimNcclChannels = 2 };

typedef struct {
  int32_t channel;
  int32_t peer;  // rank on the other end, in the communicator
  uint64_t step;
  int32_t send;  // 1: this rank's send connection to peer; 0: its receive connection from peer
} FlareSimConnStep;

// Writes the connections of this rank's in-flight collective on `comm` into out[0..max) and
// its sequence number into *seq (when not null). Returns the number written: 0 when no
// collective is in flight (or nranks == 1), -1 on a bad argument.
int flareSimNcclConnectionSteps(ncclComm_t comm, FlareSimConnStep* out, int max, uint64_t* seq);

#ifdef __cplusplus
}
#endif
