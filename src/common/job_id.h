// The one job-id rule, shared by the hook (identity.cc), flared (ingest_session.cc) and the CLI
// (python/flare/cli.py: JOB_ID_CHARS and JOB_ID_MAX mirror the constants below; a test keeps
// them equal). Job ids become folder names in the spool, metric labels and URL path segments, so
// they are kept to an alphabet that is safe in all three: 1 to 128 of A-Z a-z 0-9 . _ - : @
// Header-only; no state.
#pragma once

#include <cstddef>
#include <string_view>

namespace flare::common {

inline constexpr size_t kMaxJobIdLength = 128;
// Besides ASCII letters and digits.
inline constexpr std::string_view kJobIdPunctuation = "._-:@";
// The rule in words, for error messages.
inline constexpr const char* kJobIdRule = "1 to 128 of A-Z a-z 0-9 . _ - : @";

inline bool jobIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         kJobIdPunctuation.find(c) != std::string_view::npos;
}

inline bool validJobId(std::string_view id) {
  if (id.empty() || id.size() > kMaxJobIdLength) return false;
  for (char c : id) {
    if (!jobIdChar(c)) return false;
  }
  return true;
}

}  // namespace flare::common
