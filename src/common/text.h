// Small text helpers shared by the tools and the daemon: JSON string quoting and safe path
// components. Pure functions, any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace flare::common {

// `s` as a JSON string literal, quotes included: ", \ and control characters escaped (bytes of
// 0x80 and above pass through, so UTF-8 stays UTF-8).
std::string jsonQuote(std::string_view s);

// `s` safe to print on a terminal or in a log line: control characters (below 0x20 and 0x7f:
// ESC of ANSI sequences, CR, BEL, ...) and backslashes escaped as \xNN and \\; everything else
// (UTF-8 included) unchanged.
std::string printable(std::string_view s);

// A short identifier a peer sent (a GPU's name or UUID): at most `max` bytes and no control
// character (below 0x20, or DEL).
bool isPlainText(std::string_view s, size_t max);

// A protobuf enum value's name without its prefix, in lower case: ("OP_KIND_GEMM", "OP_KIND_")
// -> "gemm". A name without the prefix is only lower-cased.
std::string enumLabel(std::string_view enum_name, std::string_view prefix);

// The lines of `text`, without their '\n' (a '\r' stays); a final '\n' ends the last line
// rather than starting an empty one. Views into `text`.
std::vector<std::string_view> splitLines(std::string_view text);

// A C++ symbol demangled ("_ZN5flare3fooEv" -> "flare::foo()"); a name that is not mangled
// comes back unchanged, a null one as "?". Allocates; not for signal handlers.
std::string demangle(const char* name);

// `text` made safe as one path component: anything but [A-Za-z0-9._-] becomes '_'; "", "." and
// ".." become "_".
std::string safePathComponent(std::string_view text);

}  // namespace flare::common
