#include "src/hang/inspect.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace flare::hang {
namespace {

// A stand-in for cuda-gdb: a shell script with the given body, in a temporary directory.
std::string fakeGdb(const std::string& name, const std::string& body) {
  std::string dir = ::testing::TempDir();
  std::string path = dir + "/" + name + "-" + std::to_string(getpid());
  std::ofstream(path) << "#!/bin/sh\n" << body;
  chmod(path.c_str(), 0755);
  return path;
}

TEST(InspectParse, StepsErrorsAndBadLines) {
  flare::v1::InspectResult r;
  ParseStats st = parseInspectOutput(
      "[New Thread 0x7f]\n"
      "FLARE-STEP channel=0 peer=3 step=120 send=1\r\n"
      "FLARE-STEP channel=0 peer=1 step=96 send=0\n"
      "FLARE-STEP channel=1 peer=3 step=-4 send=1\n"
      "FLARE-STEP channel=x peer=3 step=4 send=1\n"
      "FLARE-STEP channel=2 peer=3 send=1\n"
      "FLARE-ERROR no NCCL kernel is running\n"
      "FLARE-STEP channel=2 peer=3 step=18446744073709551616 send=1\n",
      &r);
  EXPECT_EQ(st.steps, 2);
  EXPECT_EQ(st.bad_lines, 4);
  ASSERT_EQ(st.errors.size(), 1u);
  EXPECT_EQ(st.errors[0], "no NCCL kernel is running");
  ASSERT_EQ(r.connections_size(), 2);
  EXPECT_EQ(r.connections(0).channel(), 0);
  EXPECT_EQ(r.connections(0).peer(), 3);
  EXPECT_EQ(r.connections(0).step(), 120u);
  EXPECT_TRUE(r.connections(0).send());
  EXPECT_FALSE(r.connections(1).send());
}

TEST(InspectRun, RunsTheDebuggerOnThisProcessAndParsesItsLines) {
  InspectOptions o;
  o.cuda_gdb = fakeGdb("gdb-ok",
                       "echo \"args: $*\"\n"
                       "echo \"layout=$FLARE_CUDA_GDB_LAYOUT\"\n"
                       "echo 'FLARE-STEP channel=0 peer=1 step=7 send=1'\n"
                       "echo 'FLARE-STEP channel=0 peer=3 step=5 send=0'\n");
  o.script = "/opt/flare/flare_nccl_steps.py";
  o.extra_env = {"FLARE_CUDA_GDB_LAYOUT=/x/layout.json"};
  flare::v1::InspectResult r;
  ParseStats st;
  std::string error;
  ASSERT_TRUE(runCudaGdb(o, &r, &st, &error)) << error;
  EXPECT_EQ(st.steps, 2);
  EXPECT_FALSE(r.timed_out());
  EXPECT_NE(r.raw_output().find("args: -batch -nx -p " + std::to_string(getpid()) +
                                " -x /opt/flare/flare_nccl_steps.py"),
            std::string::npos)
      << r.raw_output();
  EXPECT_NE(r.raw_output().find("layout=/x/layout.json"), std::string::npos);
  ASSERT_EQ(r.connections_size(), 2);
  EXPECT_EQ(r.connections(1).peer(), 3);
}

TEST(InspectRun, DeadlineKillsAHungDebugger) {
  InspectOptions o;
  o.cuda_gdb = fakeGdb("gdb-hang", "echo 'attaching'\nsleep 30\necho never\n");
  o.deadline_ms = 300;
  flare::v1::InspectResult r;
  std::string error;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(runCudaGdb(o, &r, nullptr, &error));
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_TRUE(r.timed_out());
  EXPECT_NE(error.find("did not finish"), std::string::npos);
  EXPECT_NE(r.raw_output().find("attaching"), std::string::npos);
  EXPECT_EQ(r.raw_output().find("never"), std::string::npos);
}

TEST(InspectRun, FailuresAreReportedNotFatal) {
  flare::v1::InspectResult r;
  std::string error;
  InspectOptions missing;
  missing.cuda_gdb = "/nonexistent/cuda-gdb";
  EXPECT_FALSE(runCudaGdb(missing, &r, nullptr, &error));
  EXPECT_EQ(error, "cannot execute cuda-gdb");

  InspectOptions script_error;
  script_error.cuda_gdb = fakeGdb("gdb-err", "echo 'FLARE-ERROR no NCCL kernel is running'\n");
  EXPECT_FALSE(runCudaGdb(script_error, &r, nullptr, &error));
  EXPECT_EQ(error, "no NCCL kernel is running");

  InspectOptions crash;
  crash.cuda_gdb = fakeGdb("gdb-crash", "exit 3\n");
  EXPECT_FALSE(runCudaGdb(crash, &r, nullptr, &error));
  EXPECT_NE(error.find("failed"), std::string::npos);

  InspectOptions chatty;  // output larger than the cap: the end is kept
  chatty.cuda_gdb = fakeGdb("gdb-chatty",
                            "i=0; while [ $i -lt 3000 ]; do echo \"noise line $i\"; i=$((i+1)); "
                            "done\necho 'FLARE-STEP channel=0 peer=1 step=1 send=1'\n");
  chatty.max_raw_output = 1024;
  ASSERT_TRUE(runCudaGdb(chatty, &r, nullptr, &error)) << error;
  EXPECT_LE(r.raw_output().size(), 1024u);
  EXPECT_NE(r.raw_output().find("FLARE-STEP"), std::string::npos);
}

}  // namespace
}  // namespace flare::hang
