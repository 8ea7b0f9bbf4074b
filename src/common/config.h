// Typed configuration from environment variables.
//
// Every FLARE_* variable (and TRACED_PYTHON_API) is declared once, with its type, default,
// subsystem and help text, in the table in config.cc (conventions.md #8, after NCCL_PARAM).
// docs/configuration.md is checked against that table by a test.
//
// Reading never fails: a malformed or out-of-range value logs exactly one line naming the
// variable, the bad value and the value used instead, and the default is returned; each distinct
// (variable, value) warns once per process. The numeric and boolean readers do not allocate
// unless they warn. All functions are thread-safe (but, as with any getenv(), not against a
// concurrent setenv()), and none throws.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flare::common {

// One declared setting.
struct ParamInfo {
  const char* name;           // "FLARE_HANG_TIMEOUT"
  const char* type;           // "int", "double", "bool", "string", "duration", "ranks",
                              // "rank-list" (src/common/rank_list.h)
  const char* default_value;  // as a user would write it
  const char* subsystem;      // "sim", "hook", "timing", "pyprof", "exporter", "hang", "log"
  const char* help;           // one sentence
};

// All declared settings, in declaration order.
std::span<const ParamInfo> allParams();

// The declaration of `name`, or nullptr.
const ParamInfo* findParam(std::string_view name);

// Raw value of an environment variable; nullopt when unset. Empty counts as unset.
std::optional<std::string> getEnv(const char* name);

// Sink for the one-line warnings (defaults to the logger of log.h, at warn level, subsystem
// "config").
// Tests replace it to capture the lines. Not thread-safe to change while reading.
using WarningSink = void (*)(const std::string& line);
void setWarningSink(WarningSink sink);

// Typed readers. `name` need not be declared (tests use ad-hoc names), but production
// code only reads declared names. Each returns `def` after a warning on a bad value.
int64_t envInt(const char* name, int64_t def, int64_t min_value, int64_t max_value);
double envDouble(const char* name, double def, double min_value, double max_value);
bool envBool(const char* name, bool def);  // 1/0, true/false, yes/no, on/off
std::string envString(const char* name, const std::string& def);
// A "duration" setting in seconds: a bare number is seconds, or a number with a unit suffix
// ns|us|ms|s|m|h ("90", "1.5m", "500ms").
double envDurationSeconds(const char* name, double def, double min_value, double max_value);

// Readers of a declared setting with the default declared in the table: each default is
// written once, there (conventions.md #8), and docs/configuration.md shows the value the code
// uses. `name` must be declared with a default of the reader's type (the table test checks that
// every typed default parses); an undeclared name warns once and reads as 0, false or "".
int64_t paramInt(const char* name, int64_t min_value, int64_t max_value);
double paramDouble(const char* name, double min_value, double max_value);
bool paramBool(const char* name);
std::string paramString(const char* name);
double paramDurationSeconds(const char* name, double min_value, double max_value);
// The declared default of `name` as a user would write it ("" when undeclared).
const char* declaredDefault(std::string_view name);

// Parsing helpers, also used on values that come from elsewhere (command lines). Surrounding
// whitespace is ignored; anything else left over (trailing garbage), overflow, and for doubles
// inf/nan or an exponent out of range ("1e999") give nullopt.
std::optional<int64_t> parseInt(std::string_view s);
std::optional<double> parseDouble(std::string_view s);
std::optional<bool> parseBool(std::string_view s);
std::optional<double> parseDurationSeconds(std::string_view s);

// Emits a warning line through the sink (used by other modules for validation messages).
void configWarning(const std::string& line);
// As configWarning, but only the first time `key` is seen in this process; returns whether the
// line was emitted. Modules validating values key by (variable, value) so repeats stay quiet.
bool configWarningOnce(std::string_view key, const std::string& line);

}  // namespace flare::common
