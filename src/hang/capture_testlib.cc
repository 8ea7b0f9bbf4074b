// A small shared library for tests/python/test_hang_capture.py: lets a Python process (loaded
// with ctypes) trigger a stack capture from a native thread while its own threads are busy.
// Test-only; not installed.
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "src/hang/stack_capture.h"

namespace {

// True once the main thread (tid = pid) is blocked in read(fd, ...): /proc's syscall file shows
// the number and the arguments of the system call a thread is blocked in.
bool mainBlockedInRead(int fd) {
  std::ifstream f("/proc/self/task/" + std::to_string(getpid()) + "/syscall");
  long nr = -1;
  std::string arg0;
  if (!(f >> nr >> arg0)) return false;
  return nr == SYS_read && std::stol(arg0, nullptr, 16) == fd;
}

}  // namespace

// Captures every thread's stacks once the main thread is blocked in read(wait_fd) (checked
// every millisecond; after 30 s it captures anyway), writes them to out_path (through a
// temporary file and a rename), then writes one byte to done_fd so that the read returns. The
// capture never depends on how long the main thread takes to get there: under load a fixed
// delay caught it on its way (a 3.11 run found it inside os.path.exists).
extern "C" __attribute__((visibility("default"))) int flare_hang_test_capture_when_blocked(
    int wait_fd, int done_fd, const char* out_path) {
  std::string path = out_path ? out_path : "";
  if (path.empty()) return -1;
  std::thread([wait_fd, done_fd, path] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!mainBlockedInRead(wait_fd) && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    flare::v1::StackDump dump;
    flare::hang::CaptureStats stats;
    std::string error;
    bool ok = flare::hang::captureStacks({}, &dump, &stats, &error);
    // A line format the test parses: thread / py / native lines.
    std::ofstream tmp(path + ".tmp");
    tmp << "status " << (ok ? "ok" : "error") << " python=" << stats.python_status
        << " error=" << error << "\n";
    for (const auto& t : dump.threads()) {
      tmp << "thread " << t.thread_id() << " main=" << t.main_thread() << "\n";
      for (const auto& f : t.python_frames()) {
        tmp << "py " << f.function() << "\t" << f.file() << "\t" << f.line() << "\n";
      }
      for (const auto& f : t.native_frames()) tmp << "native " << f.symbol() << "\n";
    }
    tmp.close();
    std::rename((path + ".tmp").c_str(), path.c_str());
    const char byte = 1;
    (void)!write(done_fd, &byte, 1);
  }).detach();
  return 0;
}
