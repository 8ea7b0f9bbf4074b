// Implementation of identity.h.
#include "src/common/identity.h"

#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "src/common/config.h"
#include "src/common/job_id.h"

namespace flare::common {
namespace {

// One warning per distinct line per process.
void warn(const std::string& line) {
  configWarningOnce(line, line);
}

enum class VarState { kUnset, kOk, kBad };

struct IntVar {
  const char* name = "";
  VarState state = VarState::kUnset;
  int value = 0;
  std::string raw;
};

std::optional<std::string> lookup(const EnvLookup& env, const char* name) {
  if (!env) return std::nullopt;
  auto v = env(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

// Reads `name` as an integer >= min_value. A malformed value is kBad (the caller decides what
// to say, since only it knows the consequence).
IntVar readInt(const EnvLookup& env, const char* name, int min_value) {
  IntVar v;
  v.name = name;
  auto raw = lookup(env, name);
  if (!raw) return v;
  v.raw = *raw;
  auto parsed = parseInt(*raw);
  if (!parsed || *parsed < min_value || *parsed > INT_MAX) {
    v.state = VarState::kBad;
    return v;
  }
  v.state = VarState::kOk;
  v.value = static_cast<int>(*parsed);
  return v;
}

std::string describeBad(const IntVar& v, int min_value) {
  return fmt::format("{}='{}' is not {} integer", v.name, v.raw,
                     min_value > 0 ? "a positive" : "a non-negative");
}

struct Ranks {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
};

// Validates one launcher's variables. Returns nullopt (after one warning when some were set
// but unusable) if the launcher's rank and world size cannot be used.
std::optional<Ranks> validate(const char* launcher, const IntVar& rank, const IntVar& world,
                              const IntVar& local_rank, const IntVar& local_world) {
  if (rank.state == VarState::kUnset && world.state == VarState::kUnset) return std::nullopt;
  auto reject = [&](const std::string& why) {
    warn(fmt::format("flare: {}; ignoring the {} variables", why, launcher));
    return std::nullopt;
  };
  if (rank.state == VarState::kBad) return reject(describeBad(rank, 0));
  if (world.state == VarState::kBad) return reject(describeBad(world, 1));
  if (rank.state == VarState::kUnset) {
    return reject(fmt::format("{} is set but {} is not", world.name, rank.name));
  }
  if (world.state == VarState::kUnset) {
    return reject(fmt::format("{} is set but {} is not", rank.name, world.name));
  }
  if (rank.value >= world.value) {
    return reject(
        fmt::format("{}={} is not below {}={}", rank.name, rank.value, world.name, world.value));
  }

  Ranks r;
  r.rank = rank.value;
  r.world_size = world.value;
  // The node-local part: without it, assume one node (local = global), which keeps
  // local_rank < local_world_size <= world_size true.
  r.local_world_size = r.world_size;
  if (local_world.state == VarState::kBad) {
    warn(fmt::format("flare: {}; using {}", describeBad(local_world, 1), r.local_world_size));
  } else if (local_world.state == VarState::kOk) {
    if (local_world.value > r.world_size) {
      warn(fmt::format("flare: {}={} is above {}={}; using {}", local_world.name, local_world.value,
                       world.name, world.value, r.world_size));
    } else {
      r.local_world_size = local_world.value;
    }
  }
  const int fallback_local = r.rank % r.local_world_size;
  r.local_rank = fallback_local;
  if (local_rank.state == VarState::kBad) {
    warn(fmt::format("flare: {}; using {}", describeBad(local_rank, 0), fallback_local));
  } else if (local_rank.state == VarState::kOk) {
    if (local_rank.value >= r.local_world_size) {
      warn(fmt::format("flare: {}={} is not below the local world size {}; using {}",
                       local_rank.name, local_rank.value, r.local_world_size, fallback_local));
    } else {
      r.local_rank = local_rank.value;
    }
  }
  return r;
}

// Job ids become file names, metric labels and query keys: the one rule of job_id.h.
std::string sanitizeJobId(const char* variable, const std::string& id) {
  std::string out;
  for (char c : id.substr(0, kMaxJobIdLength)) out.push_back(jobIdChar(c) ? c : '_');
  if (out.empty()) out = "_";
  if (out != id) {
    warn(fmt::format("flare: {}='{}' is not a valid job id ({}); using '{}'", variable, id,
                     kJobIdRule, out));
  }
  return out;
}

std::string localJobId(const ProcessInfo& proc) {
  return fmt::format("local-{}-{}", proc.host, proc.pid);
}

// The ranks `source` gave, into `id`.
void assign(const Ranks& r, const char* source, Identity& id) {
  id.rank = r.rank;
  id.world_size = r.world_size;
  id.local_rank = r.local_rank;
  id.local_world_size = r.local_world_size;
  id.source = source;
}

bool fromTorchrun(const EnvLookup& env, const ProcessInfo& proc, Identity& id) {
  auto r = validate("torchrun", readInt(env, "RANK", 0), readInt(env, "WORLD_SIZE", 1),
                    readInt(env, "LOCAL_RANK", 0), readInt(env, "LOCAL_WORLD_SIZE", 1));
  if (!r) return false;
  assign(*r, "torchrun", id);
  // torchrun's default rendezvous id is "none"; ranks of one job still agree on the master's
  // address, or, on one node without one, on the elastic agent that is their parent.
  auto run_id = lookup(env, "TORCHELASTIC_RUN_ID");
  auto addr = lookup(env, "MASTER_ADDR");
  auto port = lookup(env, "MASTER_PORT");
  if (run_id && *run_id != "none") {
    id.job_id = sanitizeJobId("TORCHELASTIC_RUN_ID", *run_id);
  } else if (addr && port) {
    id.job_id = sanitizeJobId("MASTER_ADDR", fmt::format("torchrun-{}-{}", *addr, *port));
  } else {
    id.job_id = fmt::format("torchrun-{}-{}", proc.host, proc.ppid);
  }
  return true;
}

bool fromSlurm(const EnvLookup& env, Identity& id) {
  IntVar local_world;
  local_world.name = "SLURM_NTASKS_PER_NODE";
  auto per_node = lookup(env, "SLURM_NTASKS_PER_NODE");
  if (!per_node) {
    per_node = lookup(env, "SLURM_TASKS_PER_NODE");
    local_world.name = "SLURM_TASKS_PER_NODE";
  }
  if (per_node) {
    local_world.raw = *per_node;
    IntVar node = readInt(env, "SLURM_NODEID", 0);
    auto count = parseSlurmTasksPerNode(*per_node, node.state == VarState::kOk ? node.value : 0);
    if (count && *count >= 1) {
      local_world.state = VarState::kOk;
      local_world.value = *count;
    } else {
      local_world.state = VarState::kBad;
    }
  }
  IntVar world = readInt(env, "SLURM_NTASKS", 1);
  if (world.state == VarState::kUnset) world = readInt(env, "SLURM_NPROCS", 1);
  auto r = validate("Slurm", readInt(env, "SLURM_PROCID", 0), world,
                    readInt(env, "SLURM_LOCALID", 0), local_world);
  if (!r) return false;
  assign(*r, "slurm", id);
  auto job = lookup(env, "SLURM_JOB_ID");
  if (!job) job = lookup(env, "SLURM_JOBID");
  auto step = lookup(env, "SLURM_STEP_ID");
  if (!step) step = lookup(env, "SLURM_STEPID");
  if (job) {
    id.job_id = sanitizeJobId("SLURM_JOB_ID", step ? *job + "." + *step : *job);
  } else {
    id.job_id = fmt::format("slurm-{}", id.host);
  }
  return true;
}

}  // namespace

std::optional<int> parseSlurmTasksPerNode(std::string_view value, int node_index) {
  if (node_index < 0) return std::nullopt;
  // The whole list is checked, not only the part before this node: a malformed value is a sign
  // of a format this parser does not know.
  std::optional<int> found;
  int64_t first_node = 0;  // index of the first node the current item covers
  size_t pos = 0;
  while (pos <= value.size()) {
    size_t comma = value.find(',', pos);
    if (comma == std::string_view::npos) comma = value.size();
    std::string_view item = value.substr(pos, comma - pos);
    pos = comma + 1;
    int64_t repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      // "N(xM)": N tasks on each of M nodes.
      std::string_view rep = item.substr(paren);
      if (rep.size() < 4 || rep.substr(0, 2) != "(x" || rep.back() != ')') return std::nullopt;
      auto m = parseInt(rep.substr(2, rep.size() - 3));
      if (!m || *m < 1 || *m > INT_MAX) return std::nullopt;
      repeat = *m;
      item = item.substr(0, paren);
    }
    auto n = parseInt(item);
    if (!n || *n < 0 || *n > INT_MAX) return std::nullopt;
    if (!found && node_index < first_node + repeat) found = static_cast<int>(*n);
    first_node += repeat;
  }
  return found;
}

ProcessInfo currentProcess() {
  ProcessInfo p;
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) == 0 && buf[0] != '\0') {
    p.host = buf;
  } else {
    p.host = "unknown-host";
  }
  p.pid = static_cast<int>(getpid());
  p.ppid = static_cast<int>(getppid());
  return p;
}

Identity identityFromEnv(const EnvLookup& env, const ProcessInfo& proc) {
  Identity id;
  try {
    id.host = proc.host;
    id.pid = proc.pid;
    if (!fromTorchrun(env, proc, id) && !fromSlurm(env, id)) {
      id.rank = 0;
      id.local_rank = 0;
      id.world_size = 1;
      id.local_world_size = 1;
      id.source = "local";
      id.job_id = localJobId(proc);
    }
    if (auto forced = lookup(env, "FLARE_JOB_ID")) {
      id.job_id = sanitizeJobId("FLARE_JOB_ID", *forced);
    }
  } catch (...) {
    // Out of memory: what was filled in so far is still a usable identity.
  }
  return id;
}

Identity identityFromEnv() {
  return identityFromEnv([](const char* name) { return getEnv(name); }, currentProcess());
}

}  // namespace flare::common
