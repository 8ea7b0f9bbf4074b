// RunQueueReader (run_queue.h): the schedstat line's second field, and a real reading that grows
// when two threads share one CPU.
#include "src/timing/run_queue.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

namespace flare::timing {
namespace {

uint32_t gettidNow() {
  return static_cast<uint32_t>(::syscall(SYS_gettid));
}

TEST(RunQueueReader, ParsesTheSecondField) {
  EXPECT_EQ(parseSchedstatWait("123 456 7\n"), 456);
  EXPECT_EQ(parseSchedstatWait("123 0 7"), 0);
  EXPECT_FALSE(parseSchedstatWait("123"));
  EXPECT_FALSE(parseSchedstatWait("123 abc 7"));
  EXPECT_FALSE(parseSchedstatWait("123 -5 7"));
  EXPECT_FALSE(parseSchedstatWait("123 45x 7"));
  EXPECT_FALSE(parseSchedstatWait(""));
}

// Two threads pinned to one CPU, each busy for 300 ms of wall time: each is runnable the whole
// time and on the CPU about half of it, so the other half it waits in the run queue. The reader
// sees the spinning thread's counter grow by a good part of that (a loaded machine only adds).
TEST(RunQueueReader, ThreadsSharingACpuWaitForIt) {
  if (!std::filesystem::exists("/proc/self/task/" + std::to_string(gettidNow()) + "/schedstat"))
    GTEST_SKIP() << "no schedstat on this kernel";
  cpu_set_t one;
  CPU_ZERO(&one);
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) ++cpu;
  CPU_SET(cpu, &one);
  std::atomic<uint32_t> tids[2] = {0, 0};
  std::atomic<bool> go{false}, stop{false};
  auto spin = [&](int i) {
    sched_setaffinity(0, sizeof(one), &one);
    tids[i] = gettidNow();
    while (!go) std::this_thread::yield();
    while (!stop) {
    }
  };
  std::thread a(spin, 0), b(spin, 1);
  while (tids[0] == 0 || tids[1] == 0) std::this_thread::yield();
  RunQueueReader reader;
  const auto before = reader.read(tids[0]);
  ASSERT_TRUE(before.has_value());
  go = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto after = reader.read(tids[0]);
  stop = true;
  a.join();
  b.join();
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(*after - *before, 50'000'000) << "waited " << (*after - *before) << " ns";
  // A thread that is gone reads as nothing (its file is closed), without turning the reader off.
  EXPECT_FALSE(reader.read(tids[0]).has_value());
  EXPECT_TRUE(reader.read(gettidNow()).has_value());
  EXPECT_FALSE(reader.off());
}

// A reader that can read nothing turns itself off after its first failures.
TEST(RunQueueReader, NoSuchThreadsTurnItOff) {
  RunQueueReader reader;
  for (int i = 0; i < RunQueueReader::kFailuresBeforeOff; ++i)
    EXPECT_FALSE(reader.read(0x7ffffff0u - static_cast<uint32_t>(i)).has_value());
  EXPECT_TRUE(reader.off());
  EXPECT_FALSE(reader.read(gettidNow()).has_value());
}

}  // namespace
}  // namespace flare::timing
