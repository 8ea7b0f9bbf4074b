#include "src/hang/stack_capture.h"

#include <gtest/gtest.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace flare::hang {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_ready{0};
std::atomic<uint32_t> g_futex_word{0};
std::atomic<bool> g_main_parked{false};

// The functions the capture must name. noinline + a side effect keep them as frames.
__attribute__((noinline)) void spinningWorker() {
  g_ready++;
  volatile uint64_t x = 0;
  while (!g_stop.load(std::memory_order_relaxed)) x = x + 1;
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void sleepingWorker() {
  g_ready++;
  while (!g_stop.load()) {
    timespec ts{0, 2'000'000};
    nanosleep(&ts, nullptr);
  }
  asm volatile("" ::: "memory");
}

std::mutex g_mu;
std::condition_variable g_cv;
__attribute__((noinline)) void waitingWorker() {
  g_ready++;
  std::unique_lock<std::mutex> lock(g_mu);
  g_cv.wait(lock, [] { return g_stop.load(); });
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void blockedSignalsWorker() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  g_ready++;
  while (!g_stop.load()) {
    timespec ts{0, 2'000'000};
    nanosleep(&ts, nullptr);
  }
  asm volatile("" ::: "memory");
}

// The main thread parks here in a raw futex wait until the capture is done.
__attribute__((noinline)) void mainStuckInFutex() {
  g_main_parked = true;
  while (g_futex_word.load() == 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_futex_word), FUTEX_WAIT_PRIVATE, 0, nullptr,
            nullptr, 0);
  }
  asm volatile("" ::: "memory");
}

bool hasFrame(const flare::v1::ThreadStack& t, std::string_view fn) {
  for (const auto& f : t.native_frames()) {
    if (f.symbol().find(fn) != std::string::npos) return true;
  }
  return false;
}

std::string describe(const flare::v1::StackDump& d) {
  std::string s;
  for (const auto& t : d.threads()) {
    s += "thread " + std::to_string(t.thread_id()) + " " + t.name() +
         (t.timed_out() ? " (timed out)" : "") + "\n";
    for (const auto& f : t.native_frames()) s += "  " + f.symbol() + " [" + f.module() + "]\n";
  }
  return s;
}

TEST(StackCapture, AllThreadsWhileTheMainThreadIsStuckInAFutex) {
  g_stop = false;
  g_ready = 0;
  g_futex_word = 0;
  std::thread a(spinningWorker), b(sleepingWorker), c(waitingWorker), blocked(blockedSignalsWorker);
  while (g_ready.load() < 4) std::this_thread::yield();

  flare::v1::StackDump dump;
  CaptureStats stats;
  std::string error;
  bool ok = false;
  const pid_t main_tid = getpid();
  std::thread helper([&] {
    while (!g_main_parked.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // into the futex wait
    CaptureOptions opts;
    opts.thread_timeout_ms = 1000;  // generous on a loaded machine; costs the blocked thread
    opts.python = false;
    ok = captureStacks(opts, &dump, &stats, &error);
    g_futex_word = 1;
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_futex_word), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
  });
  mainStuckInFutex();
  helper.join();
  g_stop = true;
  g_cv.notify_all();
  a.join();
  b.join();
  c.join();
  blocked.join();

  ASSERT_TRUE(ok) << error;
  const std::string text = describe(dump);
  if (getenv("FLARE_HANG_TEST_VERBOSE")) std::printf("%s", text.c_str());
  // main, 4 workers, the helper (gtest may add none).
  ASSERT_GE(dump.threads_size(), 6) << text;
  const auto& main = dump.threads(0);
  EXPECT_EQ(main.thread_id(), uint64_t(main_tid));
  EXPECT_TRUE(main.main_thread());
  EXPECT_TRUE(hasFrame(main, "mainStuckInFutex")) << text;
  EXPECT_TRUE(hasFrame(main, "StackCapture_AllThreadsWhileTheMainThreadIsStuckInAFutex")) << text;
  int spinning = 0, sleeping = 0, waiting = 0, timed_out = 0;
  for (const auto& t : dump.threads()) {
    spinning += hasFrame(t, "spinningWorker");
    sleeping += hasFrame(t, "sleepingWorker");
    waiting += hasFrame(t, "waitingWorker");
    timed_out += t.timed_out();
    if (!t.timed_out()) {
      EXPECT_GT(t.native_frames_size(), 0);
      // The signal handler's own frames are cut: no frame names the handler.
      EXPECT_FALSE(hasFrame(t, "onSignal")) << text;
    }
  }
  EXPECT_EQ(spinning, 1) << text;
  EXPECT_EQ(sleeping, 1) << text;
  EXPECT_EQ(waiting, 1) << text;
  EXPECT_EQ(timed_out, 1) << text;  // the thread that blocks every signal
  EXPECT_EQ(stats.timed_out, 1);
  EXPECT_EQ(dump.threads_not_answering(), 1u);
  EXPECT_EQ(stats.answered, dump.threads_size() - 1);
  EXPECT_EQ(stats.python_status, "");
  // Modules are absolute paths and offsets are within them.
  EXPECT_EQ(main.native_frames(0).module().substr(0, 1), "/");
}

std::atomic<int> g_app_handler_calls{0};
void appHandler(int) {
  g_app_handler_calls++;
}

TEST(StackCapture, NeverReplacesAnApplicationHandler) {
  flare::v1::StackDump dump;
  CaptureStats first, second;
  std::string error;
  CaptureOptions opts;
  opts.python = false;
  ASSERT_TRUE(captureStacks(opts, &dump, &first, &error)) << error;
  ASSERT_GT(first.signal, 0);
  // The application now takes the signal Flare used.
  struct sigaction sa {
  }, old{};
  sa.sa_handler = appHandler;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(first.signal, &sa, &old), 0);
  ASSERT_TRUE(captureStacks(opts, &dump, &second, &error)) << error;
  EXPECT_NE(second.signal, first.signal);
  EXPECT_GE(second.answered, 1);
  struct sigaction now {};
  sigaction(first.signal, nullptr, &now);
  EXPECT_EQ(now.sa_handler, appHandler);
  EXPECT_EQ(g_app_handler_calls.load(), 0);
  sigaction(first.signal, &old, nullptr);
}

TEST(StackCapture, NotAPythonProcess) {
  std::string text, why;
  EXPECT_FALSE(dumpPythonThreads(&text, &why));
  EXPECT_EQ(why, "not a Python process");
}

TEST(PythonDump, ParsesFaulthandlerText) {
  const char* text =
      "Thread 0x00007f3a1c7fe640 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "  File \"/job/worker.py\", line 12 in loop\n"
      "\n"
      "Current thread 0x00007f3a2d1b2740 (most recent call first):\n"
      "  File \"/job/train.py\", line ??? in <module>\n"
      "  <no Python frame>\n"
      "Thread 0x0000000000000abc (most recent call first):\n"
      "  File \"broken line\n"
      "  ...\n";
  int skipped = -1;
  auto threads = parsePythonDump(text, &skipped);
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads[0].ident, 0x00007f3a1c7fe640ull);
  EXPECT_FALSE(threads[0].current);
  ASSERT_EQ(threads[0].frames.size(), 2u);
  EXPECT_EQ(threads[0].frames[0].function(), "wait");
  EXPECT_EQ(threads[0].frames[0].file(), "/usr/lib/python3.11/threading.py");
  EXPECT_EQ(threads[0].frames[0].line(), 320);
  EXPECT_EQ(threads[0].frames[1].function(), "loop");
  EXPECT_TRUE(threads[1].current);
  ASSERT_EQ(threads[1].frames.size(), 1u);
  EXPECT_EQ(threads[1].frames[0].line(), -1);
  EXPECT_EQ(threads[1].frames[0].function(), "<module>");
  EXPECT_EQ(threads[2].ident, 0xabcull);
  EXPECT_TRUE(threads[2].frames.empty());
  EXPECT_EQ(skipped, 1);
  EXPECT_TRUE(parsePythonDump("").empty());
}

}  // namespace
}  // namespace flare::hang
