#include "src/common/rank_list.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>

#include "src/common/config.h"

namespace flare::common {
namespace {

constexpr char kSyntax[] = "a rank list is like 0,2,4-7, or * for every rank";

std::string_view trimmed(std::string_view s) {
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool isEvery(std::string_view s) {
  if (s == "*") return true;
  if (s.size() != 3) return false;
  return std::tolower(static_cast<unsigned char>(s[0])) == 'a' &&
         std::tolower(static_cast<unsigned char>(s[1])) == 'l' &&
         std::tolower(static_cast<unsigned char>(s[2])) == 'l';
}

// A rank: decimal digits only, at most kMaxRank.
std::optional<int> parseRank(std::string_view s) {
  if (s.empty() || s.size() > 8) return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > kMaxRank) return std::nullopt;
  return v;
}

// One ITEM (N or A-B, A <= B), surrounding whitespace allowed.
std::optional<std::pair<int, int>> parseItem(std::string_view item) {
  item = trimmed(item);
  const size_t dash = item.find('-');
  if (dash == std::string_view::npos) {
    const auto r = parseRank(item);
    if (!r) return std::nullopt;
    return std::make_pair(*r, *r);
  }
  const auto a = parseRank(trimmed(item.substr(0, dash)));
  const auto b = parseRank(trimmed(item.substr(dash + 1)));
  if (!a || !b || *a > *b) return std::nullopt;
  return std::make_pair(*a, *b);
}

}  // namespace

RankSet RankSet::every() {
  RankSet s;
  s.all_ = true;
  return s;
}

RankSet RankSet::range(int first, int last) {
  RankSet s;
  s.add(first, last);
  return s;
}

void RankSet::add(int first, int last) {
  if (all_) return;
  // Insert, then merge overlapping or adjacent ranges; lists are short.
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), std::make_pair(first, last));
  it = ranges_.insert(it, {first, last});
  std::vector<std::pair<int, int>> merged;
  merged.reserve(ranges_.size());
  for (const auto& r : ranges_) {
    if (!merged.empty() && static_cast<int64_t>(r.first) <= merged.back().second + int64_t{1}) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  ranges_ = std::move(merged);
}

bool RankSet::contains(int rank) const {
  if (rank < 0 || rank > kMaxRank) return false;
  if (all_) return true;
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(),
                             std::make_pair(rank, std::numeric_limits<int>::max()));
  return it != ranges_.begin() && std::prev(it)->second >= rank;
}

size_t RankSet::count() const {
  if (all_) return static_cast<size_t>(kMaxRank) + 1;
  size_t n = 0;
  for (const auto& [a, b] : ranges_) n += static_cast<size_t>(b - a) + 1;
  return n;
}

std::vector<int> RankSet::ranks() const {
  if (all_) return RankSet::range(0, kMaxRank).ranks();
  std::vector<int> out;
  out.reserve(count());
  for (const auto& [a, b] : ranges_)
    for (int r = a; r <= b; ++r) out.push_back(r);
  return out;
}

std::string RankSet::toString() const {
  if (all_) return "*";
  std::string out;
  for (const auto& [a, b] : ranges_) {
    if (!out.empty()) out += ',';
    out += a == b ? fmt::format("{}", a) : fmt::format("{}-{}", a, b);
  }
  return out;
}

std::optional<RankSet> parseRankSet(std::string_view what, std::string_view text,
                                    std::string* error) {
  auto fail = [&](std::string_view item) -> std::optional<RankSet> {
    if (error != nullptr) {
      *error = text.find_first_not_of(" \t\r\n") == std::string_view::npos
                   ? fmt::format("bad {} '{}': the list is empty ({})", what, text, kSyntax)
                   : fmt::format("bad {} '{}': '{}' is not a rank N or a range A-B ({})", what,
                                 text, item, kSyntax);
    }
    return std::nullopt;
  };
  if (isEvery(trimmed(text))) return RankSet::every();
  RankSet out;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    const auto range = parseItem(item);
    if (!range) return fail(trimmed(item));
    out.add(range->first, range->second);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::optional<RankSet> envRankSet(const char* name) {
  const auto raw = getEnv(name);
  if (!raw) return std::nullopt;
  std::string error;
  auto set = parseRankSet(name, *raw, &error);
  if (!set) {
    configWarningOnce(std::string(name) + '\0' + *raw, "flare: " + error + "; ignoring it");
  }
  return set;
}

std::vector<RankEntry> parsePerRankList(const char* name, std::string_view value, size_t min_fields,
                                        size_t max_fields) {
  std::vector<RankEntry> out;
  try {
    auto warn = [&](std::string_view entry, const std::string& line) {
      std::string key(name);
      key.push_back('\0');
      key.append(entry);
      configWarningOnce(key, line);
    };
    size_t pos = 0;
    while (pos <= value.size()) {
      size_t comma = value.find(',', pos);
      if (comma == std::string_view::npos) comma = value.size();
      const std::string_view entry = trimmed(value.substr(pos, comma - pos));
      pos = comma + 1;
      if (entry.empty()) continue;  // "a,,b" and a trailing comma are harmless

      RankEntry e;
      const size_t colon = entry.find(':');
      const std::string_view rank_text = trimmed(entry.substr(0, colon));
      if (colon != std::string_view::npos) {
        const std::string_view rest = entry.substr(colon + 1);
        size_t p = 0;
        while (true) {
          const size_t c = rest.find(':', p);
          e.fields.emplace_back(trimmed(rest.substr(p, c == std::string_view::npos ? c : c - p)));
          if (c == std::string_view::npos) break;
          p = c + 1;
        }
      }

      if (rank_text == "*") {
        e.ranks = RankSet::every();
      } else if (const auto range = parseItem(rank_text)) {
        e.ranks = RankSet::range(range->first, range->second);
      } else {
        warn(entry, fmt::format("flare: {} entry '{}' has a bad rank '{}' (expected a rank N, a "
                                "range A-B or '*'); ignoring the entry",
                                name, entry, rank_text));
        continue;
      }

      if (e.fields.size() < min_fields || e.fields.size() > max_fields) {
        const std::string expected = min_fields == max_fields
                                         ? fmt::format("{}", min_fields)
                                         : fmt::format("{} to {}", min_fields, max_fields);
        warn(entry, fmt::format("flare: {} entry '{}' has {} field(s) after the rank, expected {}; "
                                "ignoring the entry",
                                name, entry, e.fields.size(), expected));
        continue;
      }
      out.push_back(std::move(e));
    }
  } catch (...) {
    // Out of memory while parsing a setting: keep what was parsed.
  }
  return out;
}

const RankEntry* entryForRank(const std::vector<RankEntry>& list, int rank) {
  const RankEntry* best = nullptr;
  for (const auto& e : list) {
    if (!e.ranks.contains(rank)) continue;
    if (best == nullptr || e.ranks.count() < best->ranks.count()) best = &e;
  }
  return best;
}

}  // namespace flare::common
