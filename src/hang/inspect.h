// Intra-kernel inspection of a hung NCCL kernel, rank side: runs cuda-gdb in batch mode
// attached to this very process with tools/cuda-gdb-scripts/flare_nccl_steps.py, under a
// deadline, and turns the script's output into an InspectResult (ConnectionStep per channel and
// direction, cuda-gdb's output cut to a bounded size, timed_out).
//
// The script prints one line per connection (anything else on the output is kept only in
// raw_output):
//   FLARE-STEP channel=<int> peer=<int> step=<uint64> send=<0|1>
//   FLARE-ERROR <text>            (the script could not read the kernel)
//
// Threading: runCudaGdb() blocks the calling thread (a helper thread, never the hooked
// application's) until cuda-gdb exits or the deadline passes; then it kills cuda-gdb's process
// group. It allows this process to be traced by its child (prctl PR_SET_PTRACER) for the run,
// which Yama's ptrace_scope=1 requires.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flare/v1/commands.pb.h"

namespace flare::hang {

struct InspectOptions {
  std::string cuda_gdb = "cuda-gdb";  // program (PATH lookup) — tests substitute a fake
  std::string script;                 // path of flare_nccl_steps.py
  std::vector<std::string> extra_args;
  std::vector<std::string> extra_env;  // "NAME=value" added to the environment
  int64_t deadline_ms = 60'000;
  size_t max_raw_output = 64 * 1024;
};

struct ParseStats {
  int steps = 0;
  int bad_lines = 0;                // FLARE-STEP lines that did not parse (counted, skipped)
  std::vector<std::string> errors;  // FLARE-ERROR texts
};

// Parses the script's lines out of `output` into result->connections.
ParseStats parseInspectOutput(std::string_view output, flare::v1::InspectResult* result);

// Runs cuda-gdb on this process. Returns false with `error` when it could not be started or
// exited with a failure and printed no step; `result` holds whatever was read (timed_out set
// when the deadline passed).
bool runCudaGdb(const InspectOptions& options, flare::v1::InspectResult* result, ParseStats* stats,
                std::string* error);

}  // namespace flare::hang
