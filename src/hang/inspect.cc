#include "src/hang/inspect.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "src/common/text.h"

namespace flare::hang {
namespace {

int64_t nowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

// Reads "key=<number>" from `line`; false when absent or not a number.
bool field(std::string_view line, std::string_view key, long long* out) {
  size_t pos = 0;
  while ((pos = line.find(key, pos)) != std::string_view::npos) {
    if ((pos == 0 || line[pos - 1] == ' ') && pos + key.size() < line.size() &&
        line[pos + key.size()] == '=') {
      std::string value(line.substr(pos + key.size() + 1));
      value = value.substr(0, value.find(' '));
      if (value.empty()) return false;
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(value.c_str(), &end, 10);
      if (errno != 0 || *end != '\0') return false;
      *out = v;
      return true;
    }
    pos += key.size();
  }
  return false;
}

}  // namespace

ParseStats parseInspectOutput(std::string_view output, flare::v1::InspectResult* result) {
  ParseStats st;
  for (std::string_view line : common::splitLines(output)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.substr(0, 11) == "FLARE-STEP ") {
      long long channel, peer, step, send;
      if (!field(line, "channel", &channel) || !field(line, "peer", &peer) ||
          !field(line, "step", &step) || !field(line, "send", &send) || channel < 0 || peer < 0 ||
          step < 0 || (send != 0 && send != 1) || channel > INT32_MAX || peer > INT32_MAX) {
        st.bad_lines++;
        continue;
      }
      auto* c = result->add_connections();
      c->set_channel(int32_t(channel));
      c->set_peer(int32_t(peer));
      c->set_step(uint64_t(step));
      c->set_send(send == 1);
      st.steps++;
    } else if (line.substr(0, 12) == "FLARE-ERROR ") {
      st.errors.emplace_back(line.substr(12));
    }
  }
  return st;
}

bool runCudaGdb(const InspectOptions& options, flare::v1::InspectResult* result, ParseStats* stats,
                std::string* error) {
  ParseStats local;
  ParseStats& st = stats ? *stats : local;
  result->Clear();
  const pid_t self = getpid();
  std::vector<std::string> args = {options.cuda_gdb, "-batch", "-nx", "-p", std::to_string(self)};
  if (!options.script.empty()) {
    args.push_back("-x");
    args.push_back(options.script);
  }
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_extra = options.extra_env;

  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  // Let a child trace us (Yama ptrace_scope=1); undone after the run.
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  const pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork: ") + std::strerror(errno);
    close(pipefd[0]);
    close(pipefd[1]);
    prctl(PR_SET_PTRACER, 0, 0, 0, 0);
    return false;
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    setpgid(0, 0);
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    for (auto& e : env_extra) putenv(e.data());
    execvp(argv[0], argv.data());
    const char msg[] = "FLARE-ERROR cannot execute cuda-gdb\n";
    (void)!write(1, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipefd[1]);
  std::string output;
  const int64_t deadline = nowMs() + options.deadline_ms;
  bool timed_out = false;
  for (;;) {
    const int64_t left = deadline - nowMs();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    int r = poll(&p, 1, int(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: cuda-gdb exited (or closed its output)
    output.append(buf, size_t(n));
    if (output.size() > 16 * options.max_raw_output) output.erase(0, output.size() / 2);
  }
  close(pipefd[0]);
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  // After EOF cuda-gdb normally exits at once; never wait past the deadline plus a second.
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (nowMs() > deadline + 1000) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    timespec ts{0, 5'000'000};
    nanosleep(&ts, nullptr);
  }
  prctl(PR_SET_PTRACER, 0, 0, 0, 0);

  st = parseInspectOutput(output, result);
  result->set_timed_out(timed_out);
  if (output.size() > options.max_raw_output) {
    output = output.substr(output.size() - options.max_raw_output);  // keep the end
  }
  result->set_raw_output(output);
  if (timed_out) {
    *error = "cuda-gdb did not finish within " + std::to_string(options.deadline_ms) + " ms";
    return st.steps > 0;
  }
  const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  if (st.steps == 0) {
    if (!st.errors.empty()) {
      *error = st.errors.front();
    } else if (failed) {
      *error = "cuda-gdb failed (status " + std::to_string(status) + ") and read no connection";
    } else {
      *error = "cuda-gdb read no connection";
    }
    return false;
  }
  return true;
}

}  // namespace flare::hang
