// A small shared library for tests/python/test_hang_capture.py: lets a Python process (loaded
// with ctypes) trigger a stack capture from a native thread while its own threads are busy.
// Test-only; not installed.
#include <fstream>
#include <string>
#include <thread>

#include "src/hang/stack_capture.h"

extern "C" __attribute__((visibility("default"))) int flare_hang_test_capture_later(
    int delay_ms, const char* out_path) {
  std::string path = out_path ? out_path : "";
  if (path.empty()) return -1;
  std::thread([delay_ms, path] {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
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
  }).detach();
  return 0;
}
