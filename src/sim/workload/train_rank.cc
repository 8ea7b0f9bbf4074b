// flare-sim-rank: one rank of the simulated training job (started by flare-sim-train).
//
// Reads its identity from torchrun's variables (RANK, WORLD_SIZE) and prints one line per
// step on stdout:  FLARE_SIM_STEP {"rank":R,"step":S,"step_ms":X,"gemm_ms":Y,...}, with the
// step's run-queue wait (run_queue_ms: main thread; run_queue_all_ms: all threads; -1 unread).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "src/common/config.h"
#include "src/sim/workload/workload.h"

namespace {

int usage() {
  std::fprintf(
      stderr,
      "usage: flare-sim-rank [--steps N] [--layers L] [--hidden H] [--seq S] "
      "[--micro-batch B] [--tp T] [--data-ms MS] [--ffn F] [--extra-kernels N] [--copies N]\n"
      "Identity from RANK/WORLD_SIZE; communicator ids through FLARE_SIM_RDZV_DIR.\n");
  return 2;
}

// Cumulative ns a thread of this process waited for a CPU (schedstat's second field); -1 where
// it cannot be read.
int64_t threadRunQueueNs(const std::string& tid) {
  FILE* f = std::fopen(("/proc/self/task/" + tid + "/schedstat").c_str(), "r");
  if (!f) return -1;
  long long on_cpu = 0, waited = -1;
  if (std::fscanf(f, "%lld %lld", &on_cpu, &waited) != 2) waited = -1;
  std::fclose(f);
  return waited;
}

// This rank's run-queue wait so far: its main thread's, and all its threads' together (the
// simulated GPU's stream workers too); -1 where schedstat cannot be read. The workload's own
// account of CPU contention, which tests hold Flare's host-stall findings against.
std::pair<int64_t, int64_t> runQueueNs() {
  const int64_t main = threadRunQueueNs(std::to_string(getpid()));
  int64_t all = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const int64_t w = threadRunQueueNs(e.path().filename().string());
    if (w >= 0) all += w;
  }
  return {main, ec || main < 0 ? -1 : all};
}

int g_rank = 0;
std::pair<int64_t, int64_t> g_waited{-1, -1};  // at the previous step's end (runQueueNs)
void printStep(const flare::sim::workload::StepResult& r) {
  const auto now = runQueueNs();
  auto ms = [](int64_t a, int64_t b) { return a < 0 || b < 0 ? -1.0 : (a - b) / 1e6; };
  std::printf(
      "FLARE_SIM_STEP {\"rank\":%d,\"step\":%d,\"step_ms\":%.3f,\"gemm_ms\":%.4f,"
      "\"boundary_ms\":%.4f,\"run_queue_ms\":%.4f,\"run_queue_all_ms\":%.4f}\n",
      g_rank, r.step, r.step_ms, r.gemm_ms, r.boundary_ms, ms(now.first, g_waited.first),
      ms(now.second, g_waited.second));
  std::fflush(stdout);
  g_waited = now;
}

}  // namespace

int main(int argc, char** argv) {
  flare::sim::workload::Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    char* end = nullptr;
    double x = std::strtod(v, &end);
    if (*end || x < 0) return usage();
    if (a == "--steps")
      o.steps = static_cast<int>(x);
    else if (a == "--layers")
      o.layers = static_cast<int>(x);
    else if (a == "--hidden")
      o.hidden = static_cast<int64_t>(x);
    else if (a == "--seq")
      o.seq = static_cast<int64_t>(x);
    else if (a == "--micro-batch")
      o.micro_batch = static_cast<int64_t>(x);
    else if (a == "--tp")
      o.tp = static_cast<int>(x);
    else if (a == "--data-ms")
      o.data_ms = x;
    else if (a == "--ffn")
      o.ffn = static_cast<int64_t>(x);
    else if (a == "--extra-kernels")
      o.extra_kernels = static_cast<int>(x);
    else if (a == "--copies")
      o.copies = static_cast<int>(x);
    else
      return usage();
  }
  o.rank = static_cast<int>(flare::common::envInt("RANK", 0, 0, 1 << 24));
  o.world_size = static_cast<int>(flare::common::envInt("WORLD_SIZE", 1, 1, 1 << 24));
  if (o.rank >= o.world_size) {
    std::fprintf(stderr, "flare-sim-rank: RANK %d >= WORLD_SIZE %d\n", o.rank, o.world_size);
    return 2;
  }
  o.rdzv_dir = flare::common::paramString("FLARE_SIM_RDZV_DIR");
  g_rank = o.rank;
  g_waited = runQueueNs();
  try {
    flare::sim::workload::run(o, printStep);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flare-sim-rank %d: %s\n", o.rank, e.what());
    return 1;
  }
  return 0;
}
