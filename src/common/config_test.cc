#include "src/common/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/common/testing/warning_capture.h"

namespace flare::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Captures the warning lines (each test uses its own variable names: warnings are once per
// (variable, value) per process) and unsets the variables it set.
class ConfigTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& name : set_) unsetenv(name.c_str());
  }
  void set(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    set_.push_back(name);
  }
  std::vector<std::string> lines() const { return capture_.lines(); }

 private:
  testing::WarningCapture capture_;
  std::vector<std::string> set_;
};

TEST(ParseTest, IntAcceptsPlainIntegers) {
  EXPECT_EQ(parseInt("0"), 0);
  EXPECT_EQ(parseInt("42"), 42);
  EXPECT_EQ(parseInt("-7"), -7);
  EXPECT_EQ(parseInt("+5"), 5);
  EXPECT_EQ(parseInt("  12\t"), 12);
  EXPECT_EQ(parseInt("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parseInt("-9223372036854775808"), std::numeric_limits<int64_t>::min());
}

TEST(ParseTest, IntRejectsEverythingElse) {
  for (const char* bad : {"", " ", "abc", "12abc", "1.5", "0x10", "1e3", "+-1", "-+1", "- 1", "1 2",
                          "+", "-", "9223372036854775808", "99999999999999999999"}) {
    EXPECT_EQ(parseInt(bad), std::nullopt) << "'" << bad << "'";
  }
}

TEST(ParseTest, DoubleAcceptsNumbers) {
  EXPECT_EQ(parseDouble("400"), 400.0);
  EXPECT_EQ(parseDouble("1.5"), 1.5);
  EXPECT_EQ(parseDouble("-2"), -2.0);
  EXPECT_EQ(parseDouble("+2.5"), 2.5);
  EXPECT_EQ(parseDouble("1e3"), 1000.0);
  EXPECT_EQ(parseDouble(".5"), 0.5);
  EXPECT_EQ(parseDouble(" 3 "), 3.0);
}

TEST(ParseTest, DoubleRejectsGarbageOverflowAndNonFinite) {
  for (const char* bad : {"", "abc", "1e999", "-1e999", "inf", "-inf", "nan", "NaN", "1.5x", "1,5",
                          "0x1p3", "1e", "--1", "+-1"}) {
    EXPECT_EQ(parseDouble(bad), std::nullopt) << "'" << bad << "'";
  }
}

TEST(ParseTest, Bool) {
  for (const char* t : {"1", "true", "TRUE", "yes", "On", " on "}) EXPECT_EQ(parseBool(t), true);
  for (const char* f : {"0", "false", "No", "off"}) EXPECT_EQ(parseBool(f), false);
  for (const char* bad : {"", "2", "maybe", "truee", "01"}) {
    EXPECT_EQ(parseBool(bad), std::nullopt) << bad;
  }
}

TEST(ParseTest, Duration) {
  EXPECT_EQ(parseDurationSeconds("300"), 300.0);
  EXPECT_EQ(parseDurationSeconds("300s"), 300.0);
  EXPECT_EQ(parseDurationSeconds("5m"), 300.0);
  EXPECT_EQ(parseDurationSeconds("1.5h"), 5400.0);
  EXPECT_EQ(parseDurationSeconds("500ms"), 0.5);
  EXPECT_DOUBLE_EQ(*parseDurationSeconds("10us"), 10e-6);
  EXPECT_DOUBLE_EQ(*parseDurationSeconds("7ns"), 7e-9);
  for (const char* bad : {"", "ms", "5x", "m5", "5 m s", "1e999", "5mm"}) {
    EXPECT_EQ(parseDurationSeconds(bad), std::nullopt) << bad;
  }
}

TEST_F(ConfigTest, UnsetAndEmptyGiveTheDefaultSilently) {
  unsetenv("FLARE_TEST_UNSET");
  EXPECT_EQ(envInt("FLARE_TEST_UNSET", 7, 0, 10), 7);
  set("FLARE_TEST_EMPTY", "");
  EXPECT_EQ(envInt("FLARE_TEST_EMPTY", 7, 0, 10), 7);
  EXPECT_EQ(envDouble("FLARE_TEST_EMPTY", 1.5, 0, 10), 1.5);
  EXPECT_EQ(envBool("FLARE_TEST_EMPTY", true), true);
  EXPECT_EQ(envString("FLARE_TEST_EMPTY", "d"), "d");
  EXPECT_EQ(getEnv("FLARE_TEST_EMPTY"), std::nullopt);
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(ConfigTest, GoodValuesAreReturned) {
  set("FLARE_TEST_GOOD_INT", "9");
  set("FLARE_TEST_GOOD_DOUBLE", "2.5");
  set("FLARE_TEST_GOOD_BOOL", "off");
  set("FLARE_TEST_GOOD_STRING", "hello world");
  set("FLARE_TEST_GOOD_DURATION", "2m");
  EXPECT_EQ(envInt("FLARE_TEST_GOOD_INT", 7, 0, 10), 9);
  EXPECT_EQ(envDouble("FLARE_TEST_GOOD_DOUBLE", 1, 0, 10), 2.5);
  EXPECT_EQ(envBool("FLARE_TEST_GOOD_BOOL", true), false);
  EXPECT_EQ(envString("FLARE_TEST_GOOD_STRING", "d"), "hello world");
  EXPECT_EQ(getEnv("FLARE_TEST_GOOD_STRING"), "hello world");
  EXPECT_EQ(envDurationSeconds("FLARE_TEST_GOOD_DURATION", 300, 1, 3600), 120.0);
  EXPECT_THAT(lines(), IsEmpty());
}

TEST_F(ConfigTest, NotANumberWarnsOneExactLine) {
  set("FLARE_TEST_PEAK", "abc");
  EXPECT_EQ(envDouble("FLARE_TEST_PEAK", 400, 0.001, 1e6), 400);
  EXPECT_THAT(lines(), ElementsAre("flare: FLARE_TEST_PEAK='abc' is not a number; using 400"));
}

TEST_F(ConfigTest, BadIntegersWarnAndFallBack) {
  struct Case {
    const char* name;
    const char* value;
    const char* line;
  };
  const Case cases[] = {
      {"FLARE_TEST_I1", "abc", "flare: FLARE_TEST_I1='abc' is not an integer; using 8"},
      {"FLARE_TEST_I2", "12abc", "flare: FLARE_TEST_I2='12abc' is not an integer; using 8"},
      {"FLARE_TEST_I3", "1.5", "flare: FLARE_TEST_I3='1.5' is not an integer; using 8"},
      {"FLARE_TEST_I4", "99999999999999999999",
       "flare: FLARE_TEST_I4='99999999999999999999' is not an integer; using 8"},
      {"FLARE_TEST_I5", "-3", "flare: FLARE_TEST_I5='-3' is out of range [1, 1024]; using 8"},
      {"FLARE_TEST_I6", "2000", "flare: FLARE_TEST_I6='2000' is out of range [1, 1024]; using 8"},
      {"FLARE_TEST_I7", "1e999", "flare: FLARE_TEST_I7='1e999' is not an integer; using 8"},
  };
  for (const Case& c : cases) {
    set(c.name, c.value);
    EXPECT_EQ(envInt(c.name, 8, 1, 1024), 8) << c.name;
  }
  std::vector<std::string> expected;
  for (const Case& c : cases) expected.emplace_back(c.line);
  EXPECT_EQ(lines(), expected);
}

TEST_F(ConfigTest, BadDoublesWarnAndFallBack) {
  set("FLARE_TEST_D1", "1e999");
  set("FLARE_TEST_D2", "-5");
  set("FLARE_TEST_D3", "nan");
  set("FLARE_TEST_D4", "2.5GB");
  EXPECT_EQ(envDouble("FLARE_TEST_D1", 2000, 0.001, 1e6), 2000);
  EXPECT_EQ(envDouble("FLARE_TEST_D2", 1.5, 0, 10), 1.5);
  EXPECT_EQ(envDouble("FLARE_TEST_D3", 4, 0, 10), 4);
  EXPECT_EQ(envDouble("FLARE_TEST_D4", 4, 0, 10), 4);
  EXPECT_THAT(lines(), ElementsAre("flare: FLARE_TEST_D1='1e999' is not a number; using 2000",
                                   "flare: FLARE_TEST_D2='-5' is out of range [0, 10]; using 1.5",
                                   "flare: FLARE_TEST_D3='nan' is not a number; using 4",
                                   "flare: FLARE_TEST_D4='2.5GB' is not a number; using 4"));
}

TEST_F(ConfigTest, BadBoolAndDurationWarn) {
  set("FLARE_TEST_B1", "maybe");
  EXPECT_EQ(envBool("FLARE_TEST_B1", true), true);
  set("FLARE_TEST_DUR1", "5 minutes");
  EXPECT_EQ(envDurationSeconds("FLARE_TEST_DUR1", 300, 1, 86400), 300);
  set("FLARE_TEST_DUR2", "0");
  EXPECT_EQ(envDurationSeconds("FLARE_TEST_DUR2", 300, 1, 86400), 300);
  auto got = lines();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0],
            "flare: FLARE_TEST_B1='maybe' is not a boolean (1/0, true/false, yes/no, on/off); "
            "using 1");
  EXPECT_THAT(got[1], HasSubstr("FLARE_TEST_DUR1='5 minutes' is not a duration"));
  EXPECT_EQ(got[2], "flare: FLARE_TEST_DUR2='0' is out of range [1s, 86400s]; using 300s");
}

TEST_F(ConfigTest, EachVariableValuePairWarnsOnce) {
  set("FLARE_TEST_ONCE", "x1");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(envInt("FLARE_TEST_ONCE", 3, 0, 10), 3);
  // A different default does not make it a different warning.
  EXPECT_EQ(envInt("FLARE_TEST_ONCE", 4, 0, 10), 4);
  EXPECT_EQ(lines().size(), 1u);
  // A new bad value is news.
  set("FLARE_TEST_ONCE", "x2");
  EXPECT_EQ(envInt("FLARE_TEST_ONCE", 3, 0, 10), 3);
  EXPECT_EQ(lines().size(), 2u);
  for (const std::string& l : lines()) EXPECT_EQ(l.find('\n'), std::string::npos);
}

TEST_F(ConfigTest, ConcurrentReadersWarnOnce) {
  set("FLARE_TEST_THREADS", "zzz");
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) envDouble("FLARE_TEST_THREADS", 1, 0, 2);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(lines().size(), 1u);
}

TEST_F(ConfigTest, WarningOnceHelper) {
  EXPECT_TRUE(configWarningOnce("test-key-1", "flare: one"));
  EXPECT_FALSE(configWarningOnce("test-key-1", "flare: one again"));
  configWarning("flare: always");
  configWarning("flare: always");
  EXPECT_THAT(lines(), ElementsAre("flare: one", "flare: always", "flare: always"));
}

TEST_F(ConfigTest, ParamReadersTakeTheDeclaredDefault) {
  unsetenv("FLARE_BATCH_BYTES");
  unsetenv("FLARE_SIM_TIME_SCALE");
  unsetenv("FLARE_PYTHON_DEFAULTS");
  unsetenv("FLARE_SIM_DEVICE_NAME");
  unsetenv("FLARE_HANG_TIMEOUT");
  EXPECT_EQ(paramInt("FLARE_BATCH_BYTES", 1, 1 << 30), 65536);
  EXPECT_EQ(paramDouble("FLARE_SIM_TIME_SCALE", 0, 10), 1.0);
  EXPECT_TRUE(paramBool("FLARE_PYTHON_DEFAULTS"));
  EXPECT_EQ(paramString("FLARE_SIM_DEVICE_NAME"), "Flare Simulated GPU");
  EXPECT_EQ(paramDurationSeconds("FLARE_HANG_TIMEOUT", 0, 1e8), 300.0);
  EXPECT_STREQ(declaredDefault("FLARE_HANG_TIMEOUT"), "300");
  EXPECT_STREQ(declaredDefault("FLARE_NOT_DECLARED"), "");
  EXPECT_THAT(lines(), IsEmpty());

  // A set value wins; a bad one warns and falls back to the declared default.
  set("FLARE_BATCH_BYTES", "4096");
  EXPECT_EQ(paramInt("FLARE_BATCH_BYTES", 1, 1 << 30), 4096);
  set("FLARE_BATCH_BYTES", "lots");
  EXPECT_EQ(paramInt("FLARE_BATCH_BYTES", 1, 1 << 30), 65536);
  set("FLARE_HANG_TIMEOUT", "2m");
  EXPECT_EQ(paramDurationSeconds("FLARE_HANG_TIMEOUT", 0, 1e8), 120.0);
  set("FLARE_PYTHON_DEFAULTS", "off");
  EXPECT_FALSE(paramBool("FLARE_PYTHON_DEFAULTS"));
  EXPECT_THAT(lines(), ElementsAre("flare: FLARE_BATCH_BYTES='lots' is not an integer; using "
                                   "65536"));

  // An undeclared name (a programming error) reads as zero, with one warning.
  EXPECT_EQ(paramInt("FLARE_TEST_UNDECLARED", 0, 10), 0);
  EXPECT_EQ(paramInt("FLARE_TEST_UNDECLARED", 0, 10), 0);
  EXPECT_EQ(paramString("FLARE_TEST_UNDECLARED_S"), "");
  // A declared name of another type has no default of the reader's type.
  EXPECT_EQ(paramInt("FLARE_SIM_DEVICE_NAME", 0, 10), 0);
  const auto got = lines();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[1],
            "flare: FLARE_TEST_UNDECLARED has no declared default of its type in "
            "src/common/config.cc");
  EXPECT_THAT(got[2], HasSubstr("FLARE_TEST_UNDECLARED_S has no declared default"));
  EXPECT_THAT(got[3], HasSubstr("FLARE_SIM_DEVICE_NAME has no declared default"));
}

TEST(ParamTableTest, NamesAreUniqueDeclaredAndDocumented) {
  std::set<std::string> names;
  const std::set<std::string> types = {"int",      "double", "bool",     "string",
                                       "duration", "ranks",  "rank-list"};
  for (const ParamInfo& p : allParams()) {
    ASSERT_NE(p.name, nullptr);
    std::string name = p.name;
    EXPECT_TRUE(name.starts_with("FLARE_") || name == "TRACED_PYTHON_API") << name;
    EXPECT_TRUE(names.insert(name).second) << "declared twice: " << name;
    ASSERT_NE(p.help, nullptr) << name;
    EXPECT_GT(std::string(p.help).size(), 10u) << "no help text: " << name;
    EXPECT_EQ(std::string(p.help).back(), '.') << name;
    ASSERT_NE(p.subsystem, nullptr);
    EXPECT_FALSE(std::string(p.subsystem).empty()) << name;
    ASSERT_NE(p.type, nullptr);
    EXPECT_TRUE(types.count(p.type)) << name << " has type " << p.type;
    EXPECT_EQ(findParam(name), &p);
  }
  EXPECT_EQ(findParam("FLARE_NOT_DECLARED"), nullptr);
}

TEST(ParamTableTest, DefaultsParseAsTheirType) {
  for (const ParamInfo& p : allParams()) {
    std::string type = p.type;
    std::string_view def = p.default_value;
    bool parses = true;
    if (type == "int") parses = parseInt(def).has_value();
    if (type == "double") parses = parseDouble(def).has_value();
    if (type == "bool") parses = parseBool(def).has_value();
    if (type == "duration") parses = parseDurationSeconds(def).has_value();
    EXPECT_TRUE(parses) << p.name << " default '" << def << "' is not a " << type;
  }
}

TEST(ParamTableTest, DeclaresTheRequiredSettings) {
  struct Want {
    const char* name;
    const char* type;
    const char* def;
    const char* subsystem;
  };
  const Want wants[] = {
      {"FLARE_LOG_LEVEL", "string", "info", "log"},
      {"FLARE_LOG_SUBSYSTEMS", "string", "", "log"},
      {"FLARE_JOB_ID", "string", "", "identity"},
      {"FLARE_OUTPUT_DIR", "string", "", "exporter"},
      {"FLARE_DAEMON", "string", "", "exporter"},
      {"FLARE_TOKEN", "string", "", "exporter"},
      {"FLARE_HANG_TIMEOUT", "duration", "300", "hang"},
      {"TRACED_PYTHON_API", "string", "", "pyprof"},
      {"FLARE_PYTHON_DEFAULTS", "bool", "1", "pyprof"},
      {"FLARE_SIM_CLOCK_FACTOR", "rank-list", "", "sim"},
      {"FLARE_SIM_LINK_FACTOR", "rank-list", "", "sim"},
      {"FLARE_SIM_HOST_STALL", "rank-list", "", "sim"},
      {"FLARE_SIM_HANG", "rank-list", "", "sim"},
      {"FLARE_SIM_CRASH", "rank-list", "", "sim"},
      {"FLARE_SIM_PEAK_TFLOPS", "double", "400", "sim"},
      {"FLARE_SIM_MEM_BW_GBPS", "double", "2000", "sim"},
      {"FLARE_SIM_BUSBW_GBPS", "double", "100", "sim"},
      {"FLARE_SIM_LAUNCH_LATENCY_US", "double", "4", "sim"},
      {"FLARE_SIM_DEVICES", "int", "8", "sim"},
      {"FLARE_SIM_DEVICE_NAME", "string", "Flare Simulated GPU", "sim"},
      {"FLARE_SIM_TIME_SCALE", "double", "1.0", "sim"},
      {"FLARE_SIM_RDZV_DIR", "string", "/tmp", "sim"},
  };
  for (const Want& w : wants) {
    const ParamInfo* p = findParam(w.name);
    ASSERT_NE(p, nullptr) << w.name;
    EXPECT_STREQ(p->type, w.type) << w.name;
    EXPECT_STREQ(p->default_value, w.def) << w.name;
    EXPECT_STREQ(p->subsystem, w.subsystem) << w.name;
  }
}

}  // namespace
}  // namespace flare::common
