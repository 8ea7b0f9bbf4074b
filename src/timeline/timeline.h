// Distributed timeline export: a rank's records (flare.v1.RecordBatch) as a Chrome/Perfetto
// trace-event JSON shaped like PyTorch's Kineto traces, so that the Perfetto UI and Holistic
// Trace Analysis open it.
//
// Shape of the output (one JSON object, {"traceEvents": [...], ...}):
//   - per rank a CPU process (its threads: traced Python spans, host synchronization calls, and
//     one "cuda_runtime" launch slice per GPU op at its issue time) and a GPU process per device
//     (tid = stream) holding kernels, memcpys, memsets, GEMMs and collectives with their shape,
//     dtype, FLOPs, TFLOPS, bytes, bus bandwidth and issue latency in `args`;
//   - `ac2g` flow events from each launch slice to its GPU op (Kineto's launch→kernel arrows);
//   - "collective" flow events linking the instances of one collective (communicator, sequence
//     number) across ranks, in rank order;
//   - `distributedInfo` (rank, world size, backend) and `baseTimeNanoseconds`: every `ts` is in
//     microseconds relative to that epoch time, which keeps nanosecond precision in a double.
//
// Combined export (default): all selected ranks in one file; process ids are synthetic and
// unique per rank (CPU: 1000·(rank+1), GPU d: 1000·(rank+1) + 100 + d), named by metadata.
// Split export (`per_rank_files`): one file per rank with Kineto's own ids (CPU pid = the OS
// pid, GPU pid = device), which is what HTA's per-rank loader expects. Collective links join
// ranks, so only the combined export has them.
//
// Clock alignment: ranks on different hosts have different clocks. The instances of one
// collective finish together on every member (the last data arrives everywhere within a link
// latency), so each rank's offset is the median, over the collectives it shares with an
// already-aligned rank, of the difference of their end times; ranks are aligned outward from
// the lowest rank through shared communicators. The error is about the spread of completion
// times across ranks (microseconds on NVLink/IB), far below a kernel's duration.
//
// Memory: the input is read twice — a first pass keeps only collective end times and step
// boundaries; the second pass holds one rank's records at a time and streams its events to
// the output. Threading: plain functions, no shared state.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flare/v1/records.pb.h"

namespace flare::timeline {

// One rank's input: calls `fn` for each of its batches in order; returns false (with `error`)
// when the input is unreadable (the batches before the error were delivered).
struct RankSource {
  int rank = 0;
  int pid = 0;  // OS pid when known (split export), else 0
  std::function<bool(const std::function<void(const flare::v1::RecordBatch&)>& fn,
                     std::string* error)>
      for_each_batch;
};

struct Options {
  std::optional<std::pair<uint64_t, uint64_t>> steps;  // inclusive step range (from 0)
  bool align_clocks = true;
  std::string backend = "nccl";
  int world_size = 0;  // 0: the number of sources
};

struct Summary {
  uint64_t gpu_events = 0;
  uint64_t cpu_events = 0;
  uint64_t launch_flows = 0;
  uint64_t collective_flows = 0;
  uint64_t deep_trace_events = 0;           // CUPTI deep-trace records written (also in gpu_events)
  std::map<int, int64_t> clock_offsets_ns;  // subtracted from each rank's times
  std::vector<std::string> warnings;        // unreadable files, unmatched tables, ...
};

// The step boundaries of one rank: the start times of the DataLoader `__next__` spans that
// start a step (records::StepBoundaryRule; a step runs from one to the next); empty when the
// rank recorded none.
std::vector<int64_t> stepStarts(const std::vector<flare::v1::RecordBatch>& batches);

// Per-rank clock offsets from matched collective end times: `ends[rank][(comm, seq)] = end_ns`.
std::map<int, int64_t> alignClocks(
    const std::map<int, std::map<std::pair<uint64_t, uint64_t>, int64_t>>& ends);

// Writes one trace file holding every source. Returns false with `error` on a failure that
// leaves no usable output (unwritable file, no source readable, a step range with no steps).
bool writeCombined(const std::vector<RankSource>& sources, const Options& options, FILE* out,
                   Summary* summary, std::string* error);

// Writes one Kineto-shaped file per rank: `path_for_rank(rank)` names it.
bool writePerRank(const std::vector<RankSource>& sources, const Options& options,
                  const std::function<std::string(int rank)>& path_for_rank, Summary* summary,
                  std::string* error);

// Sources for an offline spool directory (DIR/<job>/<rank>/records-<pid>.pb). `job` may be
// empty when DIR holds one job; `ranks` empty selects all. Returns false with `error` when DIR
// holds no (or several, without `job`) jobs.
bool spoolSources(const std::string& dir, const std::string& job, const std::vector<int>& ranks,
                  std::vector<RankSource>* out, std::string* error);

}  // namespace flare::timeline
