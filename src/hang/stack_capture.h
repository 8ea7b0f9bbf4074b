// Rank-side stack capture for hang diagnosis: the native stacks of every thread of this process
// and the Python stacks of every Python thread, taken from a helper thread while the main
// thread is stuck (in a futex, a busy loop, a CUDA synchronization). Neither the main thread nor
// the GIL needs to be free.
//
// Native: each thread (from /proc/self/task) is sent a real-time signal with tgkill. The
// handler, installed once on a real-time signal that has no handler yet (an application's
// handler is never replaced; another free signal is taken instead), walks its own stack with
// backtrace() into a slot of a buffer preallocated by the capturing thread, and records the
// interrupted PC and pthread_self(). Nothing in the handler allocates, locks or logs. The
// capturing thread waits for every slot until a deadline (per-thread timeout, threads are
// signalled together); a thread that does not answer in time (signal blocked, stopped, stuck in
// the kernel uninterruptibly) is recorded with timed_out = true. Symbolization (dladdr, then the
// object's .symtab for hidden/static functions, then __cxa_demangle) happens afterwards on the
// capturing thread. The calling thread itself is unwound directly.
//
// Python: CPython's _Py_DumpTracebackThreads(fd, interp, current_tstate) — the function
// faulthandler calls from signal handlers and from its watchdog thread, which reads the thread
// states without the GIL — found with dlsym, else in libpython's (or the executable's) .symtab
// (3.9, 3.10 and 3.13 do not export it), with interp = PyInterpreterState_Main() and
// current_tstate = NULL. It writes to a memfd; the text is parsed into frames per Python thread
// and joined with the native threads by pthread_self(). Best effort like faulthandler: the
// frames are read while Python threads run.
//
// Threading: captureStacks() may be called from any thread; captures are serialized by a
// mutex. It must not be called from a signal handler.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flare/v1/commands.pb.h"

namespace flare::hang {

struct CaptureOptions {
  int64_t thread_timeout_ms = 200;  // how long each signalled thread has to answer
  int max_frames = 64;              // native frames per thread (at most kMaxNativeFrames)
  bool native = true;
  bool python = true;
};

constexpr int kMaxNativeFrames = 128;

struct CaptureStats {
  int threads = 0;    // threads found
  int answered = 0;   // native stacks captured (the caller's included)
  int timed_out = 0;  // signalled, no answer before the deadline
  int vanished = 0;   // exited between listing and signalling
  int python_threads = 0;
  std::string python_status;  // "ok", "not a Python process", or why the dump failed
  int signal = 0;             // the real-time signal used
};

// Fills `out` (threads, main thread first, captured_ns). Returns false with `error` set only
// when nothing could be captured (no free real-time signal and no Python); partial results
// (timed-out threads, no Python) are reported in `stats` and in the ThreadStacks.
bool captureStacks(const CaptureOptions& options, flare::v1::StackDump* out, CaptureStats* stats,
                   std::string* error);

// One Python thread of a faulthandler-format dump.
struct PythonThreadDump {
  uint64_t ident = 0;  // threading.get_ident() (pthread_t)
  bool current = false;
  std::vector<flare::v1::PythonFrame> frames;  // innermost first
};

// Parses _Py_DumpTracebackThreads / faulthandler.dump_traceback(all_threads=True) text:
//   Thread 0x00007f... (most recent call first):
//     File "x.py", line 12 in func
// Lines it does not understand are counted in `skipped` (when given), never fatal.
std::vector<PythonThreadDump> parsePythonDump(std::string_view text, int* skipped = nullptr);

// Runs the CPython dump into `text`. Returns false with `why` when this process has no
// initialized CPython or the function cannot be found.
bool dumpPythonThreads(std::string* text, std::string* why);

}  // namespace flare::hang
