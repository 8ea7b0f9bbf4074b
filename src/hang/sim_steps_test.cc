// End to end on the simulated NCCL: four rank processes hang in an all-reduce (rank 1's link
// stalled, FLARE_SIM_HANG=1:collective:1); each reads its connection steps through the sim's
// private API (what the cuda-gdb scripts read on a GPU) and the analysis joins them and names
// the stalled connection's two ranks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <thread>
#include <vector>

#include "src/hang/analysis.h"
#include "src/hang/synthetic.h"
#include "src/sim/flare_sim.h"
#include "src/sim/flare_sim_nccl.h"

namespace flare::hang {
namespace {

constexpr int kRanks = 4;
constexpr int kMaxConn = 2 * kFlareSimNcclChannels;

// Child: joins, hangs in all-reduce #2 and writes its connections (or nothing) to `fd`.
void rankMain(int rank, ncclUniqueId id, int fd) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("FLARE_SIM_HANG", "1:collective:1", 1);
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, kRanks, id, rank) != ncclSuccess) _exit(2);
  cudaStream_t s;
  cudaStreamCreate(&s);
  flareSimSetStep(0);
  ncclAllReduce(nullptr, nullptr, 256, ncclFloat32, ncclSum, comm, s);
  flareSimSetStep(1);
  ncclAllReduce(nullptr, nullptr, 256, ncclFloat32, ncclSum, comm, s);
  FlareSimConnStep c[kMaxConn];
  int n = 0;
  for (int i = 0; i < 1000; ++i) {  // until every rank has arrived at #2 (10 s at most)
    uint64_t seq = 0;
    n = flareSimNcclConnectionSteps(comm, c, kMaxConn, &seq);
    if (n == kMaxConn && seq == 2 && c[0].step > 8 && c[1].step > 8) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (write(fd, c, sizeof(FlareSimConnStep) * size_t(n)) < 0) _exit(3);
  _exit(0);
}

TEST(HangSim, StalledLinkOfTheSimulatedRingIsNamed) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<int> fds;
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      rankMain(r, id, p[1]);
    }
    close(p[1]);
    fds.push_back(p[0]);
    pids.push_back(pid);
  }
  // Evidence as the daemon would assemble it: stacks all in the all-reduce, counters equal,
  // connection steps from each rank's inspection.
  auto ranks =
      testing::makeJob(testing::JobShape{kRanks, 1, 8}, testing::Scenario::kComputeHang, -1);
  for (int r = 0; r < kRanks; ++r) {
    FlareSimConnStep c[kMaxConn];
    ssize_t got = read(fds[r], c, sizeof(c));
    close(fds[r]);
    int status = 0;
    waitpid(pids[r], &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r;
    ASSERT_EQ(got, ssize_t(sizeof(c))) << "rank " << r;
    ranks[r].inspected = true;
    for (const FlareSimConnStep& s : c) {
      flare::v1::ConnectionStep cs;
      cs.set_channel(s.channel);
      cs.set_peer(s.peer);
      cs.set_step(s.step);
      cs.set_send(s.send != 0);
      ranks[r].connections.push_back(cs);
    }
  }
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kCommunication) << formatDiagnosis(d);
  ASSERT_TRUE(d.link.has_value()) << formatDiagnosis(d);
  EXPECT_EQ(d.link->sender, 1);
  EXPECT_EQ(d.link->receiver, 2);
  EXPECT_EQ(d.link->channels_agreeing, kFlareSimNcclChannels);
  ASSERT_EQ(d.suspects.size(), 2u);
  EXPECT_EQ(d.suspects[0].rank, 1);
  EXPECT_EQ(d.suspects[1].rank, 2);
  EXPECT_EQ(d.unmatched_connections, 0u);
  EXPECT_EQ(d.inconsistent_connections, 0u);
}

}  // namespace
}  // namespace flare::hang
