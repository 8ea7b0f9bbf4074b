#include "src/engine/metrics.h"

#include <fmt/format.h>

#include <cmath>

namespace flare::engine {

std::string escapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PromWriter::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void PromWriter::labels(Labels labels) {
  if (labels.size() == 0) return;
  out_ += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out_ += ',';
    first = false;
    out_ += k;
    out_ += "=\"";
    out_ += escapeLabelValue(v);
    out_ += '"';
  }
  out_ += '}';
}

void PromWriter::sample(std::string_view name, double value, Labels l) {
  out_ += name;
  labels(l);
  if (std::isnan(value)) {
    out_ += " NaN\n";
  } else if (std::isinf(value)) {
    out_ += value > 0 ? " +Inf\n" : " -Inf\n";
  } else {
    out_ += fmt::format(" {}\n", value);
  }
}

void PromWriter::sample(std::string_view name, uint64_t value, Labels l) {
  out_ += name;
  labels(l);
  out_ += fmt::format(" {}\n", value);
}

void PromWriter::sample(std::string_view name, int64_t value, Labels l) {
  out_ += name;
  labels(l);
  out_ += fmt::format(" {}\n", value);
}

}  // namespace flare::engine
