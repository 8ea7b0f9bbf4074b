// Prometheus text exposition (format 0.0.4) for flared's /metrics.
//
// PromWriter appends families to a string: one HELP/TYPE header per family, then samples. Label
// values are escaped; names are the caller's constants (prefix flare_, base units, counters end
// in _total, bounded label sets: conventions.md). Components expose
// `void writeMetrics(PromWriter&) const` and the HTTP adapter concatenates them.
//
// Not thread-safe: one writer per scrape, owned by the caller.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace flare::engine {

class PromWriter {
 public:
  using Labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

  // Starts a family; `type` is "counter" or "gauge".
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, double value, Labels labels = {});
  void sample(std::string_view name, uint64_t value, Labels labels = {});
  void sample(std::string_view name, int64_t value, Labels labels = {});

  const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void labels(Labels labels);
  std::string out_;
};

// Escapes a label value (backslash, double quote, newline).
std::string escapeLabelValue(std::string_view v);

}  // namespace flare::engine
