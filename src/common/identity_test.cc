#include "src/common/identity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "src/common/config.h"
#include "src/common/job_id.h"
#include "src/common/testing/warning_capture.h"

namespace flare::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class IdentityTest : public ::testing::Test {
 protected:
  std::vector<std::string> lines() const { return capture_.lines(); }
  testing::WarningCapture capture_;

  Identity resolve(const std::map<std::string, std::string>& vars) {
    EnvLookup env = [&vars](const char* name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
    return identityFromEnv(env, proc_);
  }

  ProcessInfo proc_{"node7", 4242, 4000};
};

TEST_F(IdentityTest, NoLauncherIsASingleProcess) {
  Identity id = resolve({});
  EXPECT_EQ(id.source, "local");
  EXPECT_EQ(id.rank, 0);
  EXPECT_EQ(id.local_rank, 0);
  EXPECT_EQ(id.world_size, 1);
  EXPECT_EQ(id.local_world_size, 1);
  EXPECT_EQ(id.job_id, "local-node7-4242");
  EXPECT_EQ(id.host, "node7");
  EXPECT_EQ(id.pid, 4242);
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(IdentityTest, Torchrun) {
  Identity id = resolve({{"RANK", "5"},
                         {"LOCAL_RANK", "1"},
                         {"WORLD_SIZE", "16"},
                         {"LOCAL_WORLD_SIZE", "4"},
                         {"TORCHELASTIC_RUN_ID", "job-abc"}});
  EXPECT_EQ(id.source, "torchrun");
  EXPECT_EQ(id.rank, 5);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.world_size, 16);
  EXPECT_EQ(id.local_world_size, 4);
  EXPECT_EQ(id.job_id, "job-abc");
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(IdentityTest, TorchrunWithoutRunIdUsesTheMasterAddress) {
  Identity id = resolve({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"TORCHELASTIC_RUN_ID", "none"},
                         {"MASTER_ADDR", "10.0.0.1"},
                         {"MASTER_PORT", "29500"}});
  EXPECT_EQ(id.job_id, "torchrun-10.0.0.1-29500");
  // Without LOCAL_* the job is taken to be on one node.
  EXPECT_EQ(id.local_rank, 0);
  EXPECT_EQ(id.local_world_size, 2);
}

TEST_F(IdentityTest, TorchrunWithoutRunIdOrMasterUsesTheAgentPid) {
  Identity id = resolve({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(id.job_id, "torchrun-node7-4000");
  EXPECT_EQ(id.local_rank, 1);
}

TEST_F(IdentityTest, Slurm) {
  Identity id = resolve({{"SLURM_PROCID", "5"},
                         {"SLURM_LOCALID", "1"},
                         {"SLURM_NTASKS", "8"},
                         {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                         {"SLURM_NODEID", "1"},
                         {"SLURM_JOB_ID", "123456"},
                         {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(id.source, "slurm");
  EXPECT_EQ(id.rank, 5);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.world_size, 8);
  EXPECT_EQ(id.local_world_size, 4);
  EXPECT_EQ(id.job_id, "123456.0");
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(IdentityTest, SlurmUnevenNodesAndNoStep) {
  Identity id = resolve({{"SLURM_PROCID", "6"},
                         {"SLURM_LOCALID", "0"},
                         {"SLURM_NTASKS", "7"},
                         {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                         {"SLURM_NODEID", "3"},
                         {"SLURM_JOB_ID", "77"}});
  EXPECT_EQ(id.local_world_size, 1);
  EXPECT_EQ(id.local_rank, 0);
  EXPECT_EQ(id.job_id, "77");
}

TEST_F(IdentityTest, TorchrunWinsOverSlurm) {
  Identity id = resolve({{"RANK", "3"},
                         {"WORLD_SIZE", "4"},
                         {"TORCHELASTIC_RUN_ID", "tr"},
                         {"SLURM_PROCID", "0"},
                         {"SLURM_NTASKS", "1"},
                         {"SLURM_JOB_ID", "9"}});
  EXPECT_EQ(id.source, "torchrun");
  EXPECT_EQ(id.rank, 3);
  EXPECT_EQ(id.job_id, "tr");
}

TEST_F(IdentityTest, FlareJobIdOverridesEverySource) {
  EXPECT_EQ(resolve({{"FLARE_JOB_ID", "mine"}}).job_id, "mine");
  EXPECT_EQ(resolve({{"FLARE_JOB_ID", "mine"},
                     {"RANK", "0"},
                     {"WORLD_SIZE", "1"},
                     {"TORCHELASTIC_RUN_ID", "tr"}})
                .job_id,
            "mine");
  EXPECT_EQ(resolve({{"FLARE_JOB_ID", "mine"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "1"},
                     {"SLURM_JOB_ID", "9"}})
                .job_id,
            "mine");
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(IdentityTest, UnsafeJobIdIsSanitized) {
  EXPECT_EQ(resolve({{"FLARE_JOB_ID", "a/b c"}}).job_id, "a_b_c");
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("FLARE_JOB_ID='a/b c' is not a valid job id")));
}

// The issue's case: '+' was accepted by the hook and refused by flared (the whole job then
// spooled silently). One rule now (job_id.h): the hook replaces it and says so.
TEST_F(IdentityTest, JobIdsFollowTheOneRule) {
  EXPECT_EQ(resolve({{"FLARE_JOB_ID", "a+b"}}).job_id, "a_b");
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("1 to 128 of A-Z a-z 0-9 . _ - : @")));
  capture_.clear();
  const std::string ok = "Job-1.x_y:z@host";
  EXPECT_EQ(resolve({{"FLARE_JOB_ID", ok}}).job_id, ok);
  EXPECT_THAT(lines(), IsEmpty());
  EXPECT_EQ(resolve({{"FLARE_JOB_ID", std::string(200, 'j')}}).job_id, std::string(128, 'j'));
  // Whatever the hook produces, flared accepts.
  for (const std::string& in :
       std::vector<std::string>{"a+b", "a/b c", "\x1b[31mred", std::string(300, 'x')}) {
    EXPECT_TRUE(validJobId(resolve({{"FLARE_JOB_ID", in}}).job_id)) << in;
  }
}

TEST(JobIdRuleTest, Alphabet) {
  EXPECT_TRUE(validJobId("a"));
  EXPECT_TRUE(validJobId(std::string(128, 'a')));
  EXPECT_FALSE(validJobId(std::string(129, 'a')));
  EXPECT_FALSE(validJobId(""));
  for (const char* bad : {"a+b", "a/b", "a b", "a\x1b", "a%b", "a?b", "a#b", "\xc3\xa9"})
    EXPECT_FALSE(validJobId(bad)) << bad;
}

TEST_F(IdentityTest, RankNotBelowWorldSizeFallsBack) {
  Identity id = resolve({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(id.source, "local");
  EXPECT_EQ(id.rank, 0);
  EXPECT_EQ(id.world_size, 1);
  EXPECT_THAT(lines(), ElementsAre("flare: RANK=4 is not below WORLD_SIZE=4; ignoring the "
                                   "torchrun variables"));
}

TEST_F(IdentityTest, BadTorchrunFallsBackToSlurm) {
  Identity id = resolve({{"RANK", "abc"},
                         {"WORLD_SIZE", "4"},
                         {"SLURM_PROCID", "1"},
                         {"SLURM_NTASKS", "2"},
                         {"SLURM_JOB_ID", "55"}});
  EXPECT_EQ(id.source, "slurm");
  EXPECT_EQ(id.rank, 1);
  EXPECT_EQ(id.job_id, "55");
  EXPECT_THAT(lines(), ElementsAre("flare: RANK='abc' is not a non-negative integer; ignoring "
                                   "the torchrun variables"));
}

TEST_F(IdentityTest, BadValuesWarnOnce) {
  struct Case {
    std::map<std::string, std::string> vars;
    const char* warning;
  };
  const Case cases[] = {
      {{{"RANK", "-1"}, {"WORLD_SIZE", "4"}}, "RANK='-1' is not a non-negative integer"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE='0' is not a positive integer"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "99999999999"}},
       "WORLD_SIZE='99999999999' is not a positive integer"},
      {{{"RANK", "1x"}, {"WORLD_SIZE", "4"}}, "RANK='1x' is not a non-negative integer"},
      {{{"RANK", "2"}}, "RANK is set but WORLD_SIZE is not"},
      {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
      {{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}},
       "SLURM_PROCID=3 is not below SLURM_NTASKS=2"},
  };
  for (const Case& c : cases) {
    capture_.clear();
    Identity id = resolve(c.vars);
    EXPECT_EQ(id.source, "local") << c.warning;
    EXPECT_EQ(id.rank, 0);
    ASSERT_EQ(lines().size(), 1u) << c.warning;
    EXPECT_THAT(lines()[0], HasSubstr(c.warning));
    // The same environment again says nothing new.
    capture_.clear();
    resolve(c.vars);
    EXPECT_THAT(lines(), IsEmpty()) << c.warning;
  }
}

TEST_F(IdentityTest, BadLocalValuesKeepTheGlobalRank) {
  Identity id = resolve(
      {{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "oops"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(id.source, "torchrun");
  EXPECT_EQ(id.rank, 6);
  EXPECT_EQ(id.local_world_size, 4);
  EXPECT_EQ(id.local_rank, 2);
  EXPECT_THAT(lines(), ElementsAre("flare: LOCAL_RANK='oops' is not a non-negative integer; "
                                   "using 2"));

  capture_.clear();
  id = resolve(
      {{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "16"}});
  EXPECT_EQ(id.local_world_size, 8);
  EXPECT_EQ(id.local_rank, 5);
  EXPECT_THAT(lines(), ElementsAre("flare: LOCAL_WORLD_SIZE=16 is above WORLD_SIZE=8; using 8"));

  capture_.clear();
  id =
      resolve({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(id.local_rank, 2);
  EXPECT_THAT(lines(), ElementsAre("flare: LOCAL_RANK=4 is not below the local world size 4; "
                                   "using 2"));
}

TEST_F(IdentityTest, MalformedSlurmTaskListFallsBackToOneNode) {
  Identity id = resolve({{"SLURM_PROCID", "1"},
                         {"SLURM_NTASKS", "2"},
                         {"SLURM_TASKS_PER_NODE", "2(x"},
                         {"SLURM_JOB_ID", "8"}});
  EXPECT_EQ(id.source, "slurm");
  EXPECT_EQ(id.local_world_size, 2);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("SLURM_TASKS_PER_NODE='2(x'")));
}

TEST(SlurmTasksPerNodeTest, Parses) {
  EXPECT_EQ(parseSlurmTasksPerNode("4", 0), 4);
  EXPECT_EQ(parseSlurmTasksPerNode("4(x2)", 1), 4);
  EXPECT_EQ(parseSlurmTasksPerNode("4(x2)", 2), std::nullopt);
  EXPECT_EQ(parseSlurmTasksPerNode("2(x3),1", 2), 2);
  EXPECT_EQ(parseSlurmTasksPerNode("2(x3),1", 3), 1);
  EXPECT_EQ(parseSlurmTasksPerNode("2,3,4", 1), 3);
  for (const char* bad :
       {"", "x", "4(2)", "4(x)", "4(x0)", "4(xa)", "4(x2", "(x2)", "-1", "2,,3"}) {
    EXPECT_EQ(parseSlurmTasksPerNode(bad, 0), std::nullopt) << bad;
  }
  EXPECT_EQ(parseSlurmTasksPerNode("4", -1), std::nullopt);
}

TEST(IdentityFromRealEnvTest, DescribesThisProcess) {
  Identity id = identityFromEnv();
  EXPECT_EQ(id.pid, static_cast<int>(getpid()));
  EXPECT_FALSE(id.host.empty());
  EXPECT_FALSE(id.job_id.empty());
  EXPECT_LT(id.rank, id.world_size);
  EXPECT_LT(id.local_rank, id.local_world_size);
  EXPECT_LE(id.local_world_size, id.world_size);
}

}  // namespace
}  // namespace flare::common
