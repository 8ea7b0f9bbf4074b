// flare-sim-train: starts N ranks of the simulated training job, like torchrun.
//
//   flare-sim-train --ranks N --steps S [--layers L] [--hidden H] [--seq S] [--tp T]
//                   [--data-ms MS] [--python] [--python-exe PATH] [--timeout SEC]
//                   [--json FILE] [--quiet] [--keep-going]
//   flare-sim-train --pytorch-like --ranks N --steps S [--layers L] [--hidden H] [--seq S]
//                   [--micro-batch B] [--data-ms MS] [--setup-ms MS] [--eval-at STEP]
//                   [--eval-ms MS] [--eval-micro-batch B] [--eval-loader 0|1] [--save-at STEP]
//                   [--save-ms MS] [--markers-from STEP] [--stats-dir DIR] ...
//
//   flare-sim-train --trace FIXTURE [--ranks N] [--speed X] [--source-rank R]
//                   [--rank-map A,B,...] [--repeat N] [--warmup W] ...
//
// --pytorch-like runs the PyTorch-like Python workload (share/flare/sim_pytorch_like.py,
// src/sim/workload/pytorch_like.py) instead of sim_train.py; --trace replays a recorded trace
// (share/flare/sim_trace_driver.py, src/sim/workload/trace_driver.py; --steps is ignored).
//
// Each rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID) and inherits LD_PRELOAD and every FLARE_*
// variable. The ranks find the simulated libraries through LD_LIBRARY_PATH (prepended) and
// FLARE_SIM_LIB_DIR. Rank output is prefixed with the rank; step lines are collected and a
// per-rank table of step times and GEMM times is printed at the end. If a rank fails, the
// others are stopped and the launcher exits 1 (like torchrun); with --keep-going they are left
// running, so survivors wait in their next collective for the dead peer like a real NCCL job
// (hang diagnosis tests; --timeout or a signal ends them). On --timeout, exit 124.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/common/config.h"

namespace fs = std::filesystem;

namespace {

struct Args {
  int ranks = 8;
  int steps = 10;
  std::vector<std::string> passthrough;  // forwarded to each rank
  bool python = false;
  bool pytorch_like = false;  // sim_pytorch_like.py (implies python)
  std::string trace;          // sim_trace_driver.py on this fixture (implies python)
  std::string python_exe = "python3";
  double timeout_s = 0;
  std::string json;
  bool quiet = false;
  bool keep_going = false;  // a failed rank does not stop the others
};

[[noreturn]] void usage(const char* msg) {
  if (msg) std::fprintf(stderr, "flare-sim-train: %s\n", msg);
  std::fprintf(
      stderr,
      "usage: flare-sim-train --ranks N --steps S [--layers L] [--hidden H] [--seq S]\n"
      "                       [--micro-batch B] [--tp T] [--data-ms MS] [--ffn F]\n"
      "                       [--extra-kernels N] [--copies N] [--python]\n"
      "                       [--python-exe PATH] [--timeout SEC] [--json FILE]"
      " [--quiet] [--keep-going]\n"
      "       flare-sim-train --pytorch-like --ranks N --steps S [--layers L] [--hidden H]\n"
      "                       [--seq S] [--micro-batch B] [--data-ms MS] [--setup-ms MS]\n"
      "                       [--eval-at STEP] [--eval-ms MS] [--eval-micro-batch B]\n"
      "                       [--eval-loader 0|1]\n"
      "                       [--save-at STEP] [--save-ms MS] [--markers-from STEP]\n"
      "                       [--stats-dir DIR]\n"
      "                       [--python-exe PATH]\n"
      "                       [--timeout SEC] [--json FILE] [--quiet] [--keep-going]\n"
      "       flare-sim-train --trace FIXTURE [--ranks N] [--speed X] [--source-rank R]\n"
      "                       [--rank-map A,B,...] [--repeat N] [--warmup W]\n"
      "                       [--python-exe PATH] [--timeout SEC] [--json FILE] [--quiet]\n");
  std::exit(2);
}

bool positiveNumber(const char* s, double* out) {
  auto v = flare::common::parseDouble(s);
  if (!v || !(*v >= 0) || *v > 1e9) return false;
  *out = *v;
  return true;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--python") {
      a.python = true;
      continue;
    }
    if (k == "--pytorch-like") {
      a.python = a.pytorch_like = true;
      continue;
    }
    if (k == "--quiet") {
      a.quiet = true;
      continue;
    }
    if (k == "--keep-going") {
      a.keep_going = true;
      continue;
    }
    if (k == "-h" || k == "--help") usage(nullptr);
    if (i + 1 >= argc) usage(("missing value for " + k).c_str());
    const char* v = argv[++i];
    double x = 0;
    if (k == "--python-exe") {
      a.python_exe = v;
    } else if (k == "--json") {
      a.json = v;
    } else if (k == "--trace") {
      a.trace = v;
      a.python = true;
      a.passthrough.push_back(k);
      a.passthrough.push_back(v);
    } else if (k == "--speed" || k == "--source-rank" || k == "--repeat" || k == "--warmup") {
      if (!positiveNumber(v, &x)) usage(("bad value for " + k + ": '" + v + "'").c_str());
      a.passthrough.push_back(k);
      a.passthrough.push_back(v);
    } else if (k == "--stats-dir" || k == "--rank-map") {
      a.passthrough.push_back(k);
      a.passthrough.push_back(v);
    } else if (!positiveNumber(v, &x)) {
      usage(("bad value for " + k + ": '" + v + "'").c_str());
    } else if (k == "--ranks") {
      if (x < 1 || x > 1024) usage("--ranks must be in [1, 1024]");
      a.ranks = static_cast<int>(x);
    } else if (k == "--steps") {
      if (x < 1) usage("--steps must be at least 1");
      a.steps = static_cast<int>(x);
    } else if (k == "--timeout") {
      a.timeout_s = x;
    } else if (k == "--layers" || k == "--hidden" || k == "--seq" || k == "--micro-batch" ||
               k == "--tp" || k == "--data-ms" || k == "--ffn" || k == "--extra-kernels" ||
               k == "--copies") {
      if ((k == "--ffn" || k == "--extra-kernels" || k == "--copies") && a.python)
        usage((k + " is only supported by the C++ workload").c_str());
      a.passthrough.push_back(k);
      a.passthrough.push_back(v);
    } else if (k == "--setup-ms" || k == "--eval-at" || k == "--eval-ms" || k == "--save-at" ||
               k == "--save-ms" || k == "--eval-micro-batch" || k == "--eval-loader" ||
               k == "--markers-from") {
      a.passthrough.push_back(k);
      a.passthrough.push_back(v);
    } else {
      usage(("unknown option " + k).c_str());
    }
  }
  // The two Python workloads take different options (each rank's argparse would refuse them).
  for (size_t i = 0; i + 1 < a.passthrough.size(); i += 2) {
    const std::string& k = a.passthrough[i];
    const bool own = k == "--setup-ms" || k == "--eval-at" || k == "--eval-ms" ||
                     k == "--eval-micro-batch" || k == "--eval-loader" || k == "--save-at" ||
                     k == "--save-ms" || k == "--markers-from" || k == "--stats-dir";
    if (own && !a.pytorch_like) usage((k + " needs --pytorch-like").c_str());
    const bool trace_own = k == "--trace" || k == "--speed" || k == "--source-rank" ||
                           k == "--repeat" || k == "--warmup" || k == "--rank-map";
    if (trace_own && a.trace.empty()) usage((k + " needs --trace").c_str());
    if (!trace_own && !a.trace.empty()) usage((k + " is not an option of --trace").c_str());
    if (a.pytorch_like &&
        (k == "--tp" || k == "--ffn" || k == "--extra-kernels" || k == "--copies"))
      usage((k + " is not supported by the PyTorch-like workload").c_str());
  }
  return a;
}

fs::path selfDir() {
  return fs::read_symlink("/proc/self/exe").parent_path();
}

struct Rank {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;
  std::vector<double> step_ms, gemm_ms, boundary_ms, run_queue_ms, run_queue_all_ms;
};

double field(const std::string& line, const char* key) {
  auto p = line.find(std::string("\"") + key + "\":");
  if (p == std::string::npos) return -1;
  return std::strtod(line.c_str() + p + std::strlen(key) + 3, nullptr);
}

void handleLine(int r, Rank& rank, const std::string& line, bool is_err, bool quiet) {
  static const std::string kTag = "FLARE_SIM_STEP ";
  if (!is_err && line.rfind(kTag, 0) == 0) {
    rank.step_ms.push_back(field(line, "step_ms"));
    rank.gemm_ms.push_back(field(line, "gemm_ms"));
    rank.boundary_ms.push_back(field(line, "boundary_ms"));
    rank.run_queue_ms.push_back(field(line, "run_queue_ms"));
    rank.run_queue_all_ms.push_back(field(line, "run_queue_all_ms"));
    return;
  }
  if (!quiet || is_err) std::fprintf(is_err ? stderr : stdout, "[rank %d] %s\n", r, line.c_str());
}

void drain(int r, Rank& rank, int fd, std::string& buf, bool is_err, bool quiet) {
  char chunk[4096];
  ssize_t n = read(fd, chunk, sizeof(chunk));
  if (n <= 0) {
    close(fd);
    (is_err ? rank.err_fd : rank.out_fd) = -1;
    if (!buf.empty()) handleLine(r, rank, buf, is_err, quiet);
    buf.clear();
    return;
  }
  buf.append(chunk, static_cast<size_t>(n));
  size_t nl;
  while ((nl = buf.find('\n')) != std::string::npos) {
    handleLine(r, rank, buf.substr(0, nl), is_err, quiet);
    buf.erase(0, nl + 1);
  }
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "unknown status";
}

// Median: robust to the first step's warm-up and to a host descheduled between two events.
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void printTable(const Args& a, const std::vector<Rank>& ranks) {
  // A replay's steps are the fixture's: the boundaries rank 0 crossed.
  const int step_count =
      a.trace.empty() || ranks.empty() ? a.steps : static_cast<int>(ranks[0].step_ms.size());
  std::printf("\nflare-sim-train: %d ranks, %d steps (%s workload)\n", a.ranks, step_count,
              !a.trace.empty() ? "trace replay"
              : a.pytorch_like ? "PyTorch-like Python"
              : a.python       ? "Python"
                               : "C++");
  for (const char* var : {"FLARE_SIM_CLOCK_FACTOR", "FLARE_SIM_LINK_FACTOR", "FLARE_SIM_HOST_STALL",
                          "FLARE_SIM_HANG", "FLARE_SIM_CRASH"}) {
    if (const char* v = std::getenv(var)) std::printf("  fault: %s=%s\n", var, v);
  }
  int slow = -1;
  double slowest = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    double g = median(ranks[r].gemm_ms);
    if (g > slowest) {
      slowest = g;
      slow = static_cast<int>(r);
    }
  }
  double median_gemm = 0;
  {
    std::vector<double> g;
    for (const auto& r : ranks) g.push_back(median(r.gemm_ms));
    std::sort(g.begin(), g.end());
    if (!g.empty()) median_gemm = g[g.size() / 2];
  }
  std::printf("%-5s %10s %12s  %s\n", "rank", "step_ms", "qkv_gemm_ms", "step times (ms)");
  std::printf("%-5s %10s %12s\n", "", "(median)", "(median)");
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& k = ranks[r];
    std::string steps;
    for (size_t i = 0; i < k.step_ms.size(); ++i) {
      if (i == 12 && k.step_ms.size() > 14) {
        steps += " ...";
        i = k.step_ms.size() - 2;
      }
      char b[32];
      std::snprintf(b, sizeof(b), " %.1f", k.step_ms[i]);
      steps += b;
    }
    const bool flag = static_cast<int>(r) == slow && slowest > median_gemm * 1.1;
    std::printf("%-5zu %10.2f %12.4f %s%s\n", r, median(k.step_ms), median(k.gemm_ms),
                steps.c_str(), flag ? "   <- slowest GEMMs" : "");
  }
}

void writeJson(const std::string& path, const std::vector<Rank>& ranks) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "flare-sim-train: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return;
  }
  std::fprintf(f, "{\"ranks\":[");
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::fprintf(f, "%s{\"rank\":%zu", r ? "," : "", r);
    // Per step; -1 where the rank did not say (run_queue_*: schedstat unreadable).
    const std::pair<const char*, const std::vector<double>*> series[] = {
        {"step_ms", &ranks[r].step_ms},
        {"gemm_ms", &ranks[r].gemm_ms},
        {"boundary_ms", &ranks[r].boundary_ms},
        {"run_queue_ms", &ranks[r].run_queue_ms},
        {"run_queue_all_ms", &ranks[r].run_queue_all_ms}};
    for (const auto& [name, values] : series) {
      std::fprintf(f, ",\"%s\":[", name);
      for (size_t i = 0; i < values->size(); ++i)
        std::fprintf(f, "%s%.5f", i ? "," : "", (*values)[i]);
      std::fprintf(f, "]");
    }
    std::fprintf(f, ",\"status\":\"%s\"}", describe(ranks[r].status).c_str());
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

volatile sig_atomic_t g_interrupted = 0;

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Args a = parse(argc, argv);
  const fs::path bin = selfDir();
  const fs::path lib_dir = bin.parent_path() / "lib" / "sim";
  const fs::path script = bin.parent_path() / "share" / "flare" /
                          (!a.trace.empty() ? "sim_trace_driver.py"
                           : a.pytorch_like ? "sim_pytorch_like.py"
                                            : "sim_train.py");
  const fs::path rank_exe = bin / "flare-sim-rank";
  if (!fs::exists(lib_dir / "libcudart.so.13")) {
    std::fprintf(stderr, "flare-sim-train: simulated libraries not found in %s\n", lib_dir.c_str());
    return 2;
  }

  char tmpl[] = "/tmp/flare-sim-rdzv-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("flare-sim-train: mkdtemp");
    return 2;
  }
  const std::string rdzv = tmpl;
  const std::string run_id = "sim" + std::to_string(getpid());

  std::string ld_path = lib_dir.string();
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old && *old)
    ld_path += ":" + std::string(old);
  setenv("LD_LIBRARY_PATH", ld_path.c_str(), 1);
  setenv("FLARE_SIM_LIB_DIR", lib_dir.c_str(), 1);
  setenv("FLARE_SIM_RDZV_DIR", rdzv.c_str(), 1);
  setenv("FLARE_SIM_RUN_ID", run_id.c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(a.ranks).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(std::min(a.ranks, 8)).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  if (!std::getenv("TORCHELASTIC_RUN_ID")) setenv("TORCHELASTIC_RUN_ID", run_id.c_str(), 1);

  std::vector<std::string> argv_rank;
  if (a.python) {
    argv_rank = {a.python_exe, script.string()};
  } else {
    argv_rank = {rank_exe.string()};
  }
  argv_rank.push_back("--steps");
  argv_rank.push_back(std::to_string(a.steps));
  for (const auto& p : a.passthrough) argv_rank.push_back(p);

  signal(SIGINT, [](int) { g_interrupted = 1; });
  signal(SIGTERM, [](int) { g_interrupted = 1; });

  std::vector<Rank> ranks(a.ranks);
  for (int r = 0; r < a.ranks; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      std::perror("flare-sim-train: pipe");
      return 2;
    }
    pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      dup2(err[1], 2);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r % 8).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(r / 8).c_str(), 1);
      std::vector<char*> args;
      for (auto& s : argv_rank) args.push_back(s.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    ranks[r].pid = pid;
    ranks[r].out_fd = out[0];
    ranks[r].err_fd = err[0];
  }

  const auto start = std::chrono::steady_clock::now();
  int failed = -1;
  bool timed_out = false;
  auto live = [&] {
    int n = 0;
    for (auto& k : ranks) n += !k.exited;
    return n;
  };
  auto stopAll = [&](int sig) {
    for (auto& k : ranks) {
      if (!k.exited) kill(k.pid, sig);
    }
  };
  auto open_fds = [&] {
    int n = 0;
    for (auto& k : ranks) n += (k.out_fd >= 0) + (k.err_fd >= 0);
    return n;
  };
  auto kill_deadline = std::chrono::steady_clock::time_point::max();
  auto drain_deadline = std::chrono::steady_clock::time_point::max();
  // Until every rank exited and its output is read to the end (a rank's own children could
  // keep a pipe open: give them 2 s after the last rank exited).
  while (live() > 0 || (open_fds() > 0 && std::chrono::steady_clock::now() < drain_deadline)) {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> who;
    for (int r = 0; r < a.ranks; ++r) {
      if (ranks[r].out_fd >= 0) {
        fds.push_back({ranks[r].out_fd, POLLIN, 0});
        who.push_back({r, false});
      }
      if (ranks[r].err_fd >= 0) {
        fds.push_back({ranks[r].err_fd, POLLIN, 0});
        who.push_back({r, true});
      }
    }
    poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        auto [r, is_err] = who[i];
        Rank& k = ranks[r];
        drain(r, k, is_err ? k.err_fd : k.out_fd, is_err ? k.err_buf : k.out_buf, is_err, a.quiet);
      }
    }
    for (int r = 0; r < a.ranks; ++r) {
      Rank& k = ranks[r];
      if (k.exited) continue;
      if (waitpid(k.pid, &k.status, WNOHANG) == k.pid) {
        k.exited = true;
        const bool ok = WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0;
        if (!ok && failed < 0 && !timed_out && !g_interrupted) {
          failed = r;
          if (a.keep_going) {
            std::fprintf(stderr,
                         "flare-sim-train: rank %d failed (%s); the other ranks keep running "
                         "(--keep-going)\n",
                         r, describe(k.status).c_str());
          } else {
            std::fprintf(stderr, "flare-sim-train: rank %d failed (%s); stopping the other ranks\n",
                         r, describe(k.status).c_str());
            stopAll(SIGTERM);
            kill_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          }
        }
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (live() == 0 && drain_deadline == std::chrono::steady_clock::time_point::max()) {
      drain_deadline = now + std::chrono::seconds(2);
    }
    if (!timed_out && a.timeout_s > 0 && now - start > std::chrono::duration<double>(a.timeout_s)) {
      timed_out = true;
      std::fprintf(stderr, "flare-sim-train: timed out after %.0f s; stopping the ranks\n",
                   a.timeout_s);
      stopAll(SIGTERM);
      kill_deadline = now + std::chrono::seconds(5);
    }
    if (g_interrupted == 1) {
      g_interrupted = 2;
      stopAll(SIGTERM);
      kill_deadline = now + std::chrono::seconds(5);
    }
    if (now > kill_deadline) {
      stopAll(SIGKILL);
      kill_deadline = std::chrono::steady_clock::time_point::max();
    }
  }
  for (auto& k : ranks) {
    if (k.out_fd >= 0) close(k.out_fd);
    if (k.err_fd >= 0) close(k.err_fd);
  }
  std::error_code ec;
  fs::remove_all(rdzv, ec);
  // Communicator segments of ranks that died before every rank joined.
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    if (e.path().filename().string().rfind("flare-nccl-" + run_id + "-", 0) == 0) {
      fs::remove(e.path(), ec);
    }
  }
  printTable(a, ranks);
  if (!a.json.empty()) writeJson(a.json, ranks);
  if (timed_out) return 124;
  if (failed >= 0 || g_interrupted) return 1;
  return 0;
}
