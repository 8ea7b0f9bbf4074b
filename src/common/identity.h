// Who this process is in the training job: job id, rank and node-local rank, host and pid.
//
// The launcher says so through environment variables, read in this order:
//   1. torchrun (torch.distributed.elastic): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
//      TORCHELASTIC_RUN_ID (job id; when missing or "none": MASTER_ADDR/MASTER_PORT, else the
//      host and the parent pid, which is the elastic agent common to a node's ranks);
//   2. Slurm (srun): SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE or
//      SLURM_TASKS_PER_NODE (which may read "4(x2),3"; SLURM_NODEID picks this node's entry),
//      SLURM_JOB_ID plus ".SLURM_STEP_ID" when set;
//   3. otherwise a single process: rank 0 of 1, job id "local-<host>-<pid>".
// FLARE_JOB_ID overrides the job id whatever the source.
//
// Values are validated (numeric, non-negative, rank < world size, local rank < local world
// size <= world size). A launcher whose variables are invalid is skipped with one warning
// naming the variable and value, and the next source is tried; a bad local rank or local world
// size alone only loses the node-local part. Nothing here throws; all functions are
// thread-safe (they read the environment, see config.h).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace flare::common {

struct Identity {
  std::string job_id;
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string host;
  int pid = 0;
  std::string source;  // "torchrun", "slurm" or "local": which variables gave the ranks
};

// Reads a variable; nullopt when unset (an empty value counts as unset).
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// Facts about the process that do not come from the environment, injectable for tests.
struct ProcessInfo {
  std::string host;
  int pid = 0;
  int ppid = 0;
};

// This process's host name, pid and parent pid.
ProcessInfo currentProcess();

// The identity of this process, from the real environment.
Identity identityFromEnv();

// The same, from `env` and `proc`. Warnings go through configWarningOnce (config.h).
Identity identityFromEnv(const EnvLookup& env, const ProcessInfo& proc);

// Parses a Slurm task-count list ("4", "4(x2)", "2(x3),1") and returns the count of node
// `node_index` (0-based); nullopt when the list is malformed or too short.
std::optional<int> parseSlurmTasksPerNode(std::string_view value, int node_index);

}  // namespace flare::common
