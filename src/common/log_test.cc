#include "src/common/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "src/common/config.h"

namespace flare::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::SizeIs;

// Logging is process-wide: each test resets what it changes.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setLogCapture([this](LogLevel level, std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(line);
      levels_.push_back(level);
    });
    setLogLevel(LogLevel::kInfo);
    setLogSubsystems("");
    setLogLabel("rank ?");
  }
  void TearDown() override {
    setLogCapture({});
    setLogLevel(LogLevel::kInfo);
    setLogSubsystems("");
    setLogLabel("rank ?");
    setWarningSink(nullptr);
    unsetenv("FLARE_LOG_LEVEL");
    unsetenv("FLARE_LOG_SUBSYSTEMS");
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

  std::mutex mu_;
  std::vector<std::string> lines_;
  std::vector<LogLevel> levels_;
};

// Runs `fn` with fd 2 pointed at a temporary file and returns what was written there.
template <typename Fn>
std::string captureStderr(Fn fn) {
  char path[] = "/tmp/flare_log_test_XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  unlink(path);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  fn();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  char buf[4096];
  lseek(fd, 0, SEEK_SET);
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(LogLevelTest, ParseAndName) {
  EXPECT_EQ(parseLogLevel("trace"), LogLevel::kTrace);
  EXPECT_EQ(parseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(parseLogLevel(" info "), LogLevel::kInfo);
  EXPECT_EQ(parseLogLevel("warn"), LogLevel::kWarn);
  EXPECT_EQ(parseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_EQ(parseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(parseLogLevel("off"), LogLevel::kOff);
  EXPECT_EQ(parseLogLevel("loud"), std::nullopt);
  EXPECT_EQ(parseLogLevel(""), std::nullopt);
  for (LogLevel l : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn,
                     LogLevel::kError, LogLevel::kOff}) {
    EXPECT_EQ(parseLogLevel(logLevelName(l)), l);
  }
}

TEST_F(LogTest, LineFormat) {
  Identity id;
  id.rank = 3;
  initLogging(id);
  FLARE_LOG_WARN("hook", "hello {} {}", 42, "x");
  FLARE_LOG_INFO("timing", "plain");
  auto got = lines();
  ASSERT_THAT(got, SizeIs(2));
  EXPECT_THAT(
      got[0],
      MatchesRegex(R"(\[flare rank 3 [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} W hook\] hello 42 x)"));
  EXPECT_THAT(got[1], MatchesRegex(R"(\[flare rank 3 .* I timing\] plain)"));
  EXPECT_EQ(levels_[0], LogLevel::kWarn);
}

TEST_F(LogTest, UsableBeforeInitAndWithOtherLabels) {
  FLARE_LOG_ERROR("engine", "boom");
  setLogLabel("flared");
  FLARE_LOG_ERROR("engine", "boom");
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("[flare rank ? "), HasSubstr("[flare flared ")));
}

TEST_F(LogTest, LevelFilter) {
  setLogLevel(LogLevel::kWarn);
  EXPECT_EQ(logLevel(), LogLevel::kWarn);
  FLARE_LOG_DEBUG("hook", "d");
  FLARE_LOG_INFO("hook", "i");
  FLARE_LOG_WARN("hook", "w");
  FLARE_LOG_ERROR("hook", "e");
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("W hook] w"), HasSubstr("E hook] e")));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, "hook"));
  setLogLevel(LogLevel::kTrace);
  FLARE_LOG_TRACE("hook", "t");
  EXPECT_THAT(lines().back(), HasSubstr("T hook] t"));
  setLogLevel(LogLevel::kOff);
  FLARE_LOG_ERROR("hook", "nothing");
  EXPECT_THAT(lines(), SizeIs(3));
  EXPECT_FALSE(logEnabled(LogLevel::kOff, "hook"));
}

TEST_F(LogTest, SubsystemFilter) {
  setLogSubsystems("hook, timing");
  FLARE_LOG_INFO("hook", "a");
  FLARE_LOG_INFO("sim", "b");
  FLARE_LOG_INFO("timing", "c");
  FLARE_LOG_WARN("sim", "warnings always show");
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("hook] a"), HasSubstr("timing] c"),
                                   HasSubstr("sim] warnings always show")));
  setLogSubsystems("^sim");
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, "hook"));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, "sim"));
  EXPECT_TRUE(logEnabled(LogLevel::kError, "sim"));
}

TEST_F(LogTest, LogOnceByKey) {
  uint64_t before = logCounters().once_suppressed;
  for (int i = 0; i < 3; ++i) {
    bool wrote = logOnce(LogLevel::kWarn, "hook", "log_test:once:key", "failed {}", i);
    EXPECT_EQ(wrote, i == 0);
  }
  EXPECT_TRUE(logOnce(LogLevel::kWarn, "hook", "log_test:once:other", "other"));
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("failed 0"), HasSubstr("other")));
  EXPECT_EQ(logCounters().once_suppressed - before, 2u);
}

TEST_F(LogTest, LogOncePerCallSite) {
  for (int i = 0; i < 5; ++i) FLARE_LOG_WARN_ONCE("pyprof", "call site {}", i);
  EXPECT_THAT(lines(), ElementsAre(HasSubstr("call site 0")));
}

TEST_F(LogTest, CountersCountWarningsAndErrors) {
  LogCounters before = logCounters();
  FLARE_LOG_WARN("x", "w");
  FLARE_LOG_WARN("x", "w");
  FLARE_LOG_ERROR("x", "e");
  LogCounters after = logCounters();
  EXPECT_EQ(after.warnings - before.warnings, 2u);
  EXPECT_EQ(after.errors - before.errors, 1u);
}

TEST_F(LogTest, ConfigWarningsGoToTheLoggerByDefault) {
  setWarningSink(nullptr);
  setenv("FLARE_TEST_LOG_SINK", "abc", 1);
  EXPECT_EQ(envInt("FLARE_TEST_LOG_SINK", 5, 0, 10), 5);
  unsetenv("FLARE_TEST_LOG_SINK");
  EXPECT_THAT(
      lines(),
      ElementsAre(MatchesRegex(
          R"(\[flare .* W config\] FLARE_TEST_LOG_SINK='abc' is not an integer; using 5)")));
}

TEST_F(LogTest, InitReadsTheEnvironment) {
  std::vector<std::string> warnings;
  static std::vector<std::string>* sink_lines = &warnings;
  setWarningSink([](const std::string& line) { sink_lines->push_back(line); });

  setenv("FLARE_LOG_LEVEL", "error", 1);
  setenv("FLARE_LOG_SUBSYSTEMS", "hook", 1);
  initLogging(Identity{});
  EXPECT_EQ(logLevel(), LogLevel::kError);
  setLogLevel(LogLevel::kInfo);
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, "hook"));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, "timing"));

  setenv("FLARE_LOG_LEVEL", "loud", 1);
  initLogging(Identity{});
  EXPECT_EQ(logLevel(), LogLevel::kInfo);
  initLogging(Identity{});
  EXPECT_THAT(warnings, ElementsAre("flare: FLARE_LOG_LEVEL='loud' is not a log level "
                                    "(trace|debug|info|warn|error|off); using info"));
}

TEST_F(LogTest, ConcurrentLinesAreWhole) {
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 500; ++i) FLARE_LOG_INFO("timing", "thread {} line {}", t, i);
    });
  }
  for (auto& t : threads) t.join();
  auto got = lines();
  ASSERT_THAT(got, SizeIs(2000));
  for (const std::string& l : got)
    EXPECT_THAT(l, MatchesRegex(R"(\[flare .* I timing\] thread [0-3] line [0-9]+)"));
}

TEST_F(LogTest, WritesToStderrWithoutCapture) {
  setLogCapture({});
  setLogLabel("rank 9");
  std::string out = captureStderr([] {
    FLARE_LOG_WARN("hang", "to stderr {}", 1);
    FLARE_LOG_INFO("hang", "second");
  });
  EXPECT_THAT(out, MatchesRegex(R"(\[flare rank 9 [0-9:.]+ W hang\] to stderr 1
\[flare rank 9 [0-9:.]+ I hang\] second
)"));
}

TEST_F(LogTest, RawLogIsOneLineOnStderr) {
  setLogLabel("rank 5");
  std::string out = captureStderr([] {
    rawLog(LogLevel::kWarn, "hook", "raw message");
    rawLog(LogLevel::kDebug, "hook", "below the level");
    rawLog(LogLevel::kError, "hook", std::string(2000, 'x').c_str());
  });
  auto nl = out.find('\n');
  ASSERT_NE(nl, std::string::npos);
  EXPECT_THAT(
      out.substr(0, nl + 1),
      MatchesRegex(R"(\[flare rank 5 [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} W hook\] raw message
)"));
  std::string second = out.substr(nl + 1);
  EXPECT_EQ(second.size(), 512u);  // cut to the buffer, newline kept
  EXPECT_THAT(second, HasSubstr("E hook] xxx"));
  EXPECT_EQ(second.back(), '\n');
}

// The first use reads FLARE_LOG_LEVEL; a bad value is reported once logging works. Runs in a
// re-executed child so that logging is really used for the first time there.
TEST(LogDeathTest, BadLevelAtFirstUseIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  setenv("FLARE_LOG_LEVEL", "bogus", 1);
  EXPECT_EXIT(
      {
        FLARE_LOG_INFO("x", "first line");
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      "W config\\] FLARE_LOG_LEVEL='bogus' is not a log level.*\n.* I x\\] first line");
  unsetenv("FLARE_LOG_LEVEL");
}

}  // namespace
}  // namespace flare::common
