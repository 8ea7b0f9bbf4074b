// A transformer training step on the CUDA/cuBLAS/NCCL API, for the simulated stack.
//
// Per layer, forward: layer norm, QKV GEMM, flash attention, output projection, tensor-parallel
// all-reduce (on its own stream), residual add, layer norm, MLP GEMMs with GELU, tensor-parallel
// all-reduce, residual add. Backward mirrors it (data- and weight-gradient GEMMs, the latter
// through cuBLASLt), and each layer's gradients are all-reduced across data-parallel ranks on a
// third stream, overlapping the rest of the backward pass. Then an optimizer kernel, and a
// host-side DataLoader wait before the next step. Faults come from FLARE_SIM_* (see
// src/sim/README.md). Used by flare-sim-rank; train.py is the same workload in Python.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flare::sim::workload {

struct Options {
  int rank = 0;
  int world_size = 1;
  int steps = 10;
  int layers = 4;
  int64_t hidden = 4096;
  int64_t seq = 2048;
  int64_t micro_batch = 1;
  int tp = 2;             // tensor-parallel group size (clamped to divide world_size)
  double data_ms = 2.0;   // DataLoader wait per step
  int64_t ffn = 0;        // FFN width (0: 4 × hidden); an odd value makes unaligned GEMMs
  int extra_kernels = 0;  // unfused elementwise kernels added to each layer's forward
  int copies = 0;         // per step: this many input-batch memcpys (HtoD) and memsets
  std::string rdzv_dir;   // where communicator ids are exchanged
};

struct StepResult {
  int step = 0;
  double step_ms = 0;  // host wall time from this step's start to the next's (the last: its end)
  double gemm_ms = 0;  // GPU time of layer 0's QKV GEMM (events around it)
  // How long the step's start took to mark (the clock read before flare_step to the one after):
  // Flare's marker time lies in that bracket, so Flare's step can differ from step_ms by up to
  // this step's and the next one's bracket (a preemption there on a loaded host).
  double boundary_ms = 0;
};

// Runs the workload; returns one result per step. Throws std::runtime_error on a CUDA/NCCL
// error (the rank then exits non-zero).
std::vector<StepResult> run(const Options& opts, void (*on_step)(const StepResult&));

}  // namespace flare::sim::workload
