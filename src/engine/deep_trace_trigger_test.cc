#include "src/engine/deep_trace_trigger.h"

#include <gtest/gtest.h>

namespace flare::engine {
namespace {

v1::Alert alert(const std::string& job, int32_t rank, const std::string& kind = "gpu_slow") {
  v1::Alert a;
  a.set_job_id(job);
  a.set_rank(rank);
  a.set_kind(kind);
  return a;
}

TEST(DeepTraceRanks, CulpritThenNextHealthyPeerWrapping) {
  EXPECT_EQ(deepTraceRanks(2, {0, 1, 2, 3}), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(deepTraceRanks(3, {3, 1, 0, 2}), (std::vector<int32_t>{3, 0}));  // wraps
  EXPECT_EQ(deepTraceRanks(5, {5, 7}), (std::vector<int32_t>{5, 7}));        // skips gaps
  EXPECT_EQ(deepTraceRanks(0, {0}), (std::vector<int32_t>{0}));              // alone
  EXPECT_TRUE(deepTraceRanks(4, {0, 1}).empty());                            // not connected
}

TEST(DeepTraceTrigger, SendsCulpritAndPeerOncePerIntervalPerJob) {
  std::vector<v1::SendCommandRequest> sent;
  DeepTraceTriggerOptions o;
  o.steps = 3;
  o.min_interval_ns = 100;
  DeepTraceTrigger t(
      o, [](const std::string&) { return std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}; },
      [&](const v1::SendCommandRequest& r) { sent.push_back(r); });
  auto out = t.onAlerts({alert("j", 5), alert("j", 6), alert("k", 7)}, 1000);
  ASSERT_EQ(out.size(), 2u);  // j's second alert rate-limited; k is another job
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].job_id(), "j");
  EXPECT_EQ(std::vector<int32_t>(sent[0].ranks().begin(), sent[0].ranks().end()),
            (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(sent[0].command().deep_trace().steps(), 3u);
  EXPECT_EQ(std::vector<int32_t>(sent[1].ranks().begin(), sent[1].ranks().end()),
            (std::vector<int32_t>{7, 0}));
  EXPECT_EQ(t.suppressed(), 1u);
  EXPECT_TRUE(t.onAlerts({alert("j", 1)}, 1099).empty());   // still inside the interval
  EXPECT_EQ(t.onAlerts({alert("j", 1)}, 1100).size(), 1u);  // interval passed
  EXPECT_EQ(t.triggered(), 3u);
}

TEST(DeepTraceTrigger, IgnoresJobWideAndHangAlertsAndCanBeOff) {
  int sends = 0;
  DeepTraceTrigger t(
      DeepTraceTriggerOptions{},
      [](const std::string&) {
        return std::vector<int32_t>{0, 1};
      },
      [&](const v1::SendCommandRequest&) { ++sends; });
  EXPECT_TRUE(t.onAlerts({alert("j", -1), alert("j", 0, "hang")}, 0).empty());
  DeepTraceTriggerOptions off;
  off.steps = 0;
  DeepTraceTrigger t_off(
      off,
      [](const std::string&) {
        return std::vector<int32_t>{0, 1};
      },
      [&](const v1::SendCommandRequest&) { ++sends; });
  EXPECT_TRUE(t_off.onAlerts({alert("j", 0)}, 0).empty());
  EXPECT_EQ(sends, 0);
}

}  // namespace
}  // namespace flare::engine
