// A small JSON reader and writer for the flare-stats tool (no JSON library is among Flare's
// dependencies). Reads RFC 8259 documents: objects, arrays, strings (with \uXXXX escapes,
// surrogate pairs), numbers, true/false/null; nesting is limited to 64 levels and errors name
// the byte offset. Not a general-purpose library: no streaming, no duplicate-key detection.
//
// Threading: plain values and pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flare::stats::json {

struct Value {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;

  // The member named `key` of an object; nullptr when absent or not an object.
  const Value* get(std::string_view key) const;
};

// Parses a whole document (surrounding whitespace allowed). nullopt and *error on failure.
std::optional<Value> parse(std::string_view text, std::string* error = nullptr);

// Writes a double as JSON: shortest round-trip form; NaN and infinities as null.
std::string number(double v);
// Writes a string literal with the escapes JSON needs.
std::string quote(std::string_view s);

}  // namespace flare::stats::json
