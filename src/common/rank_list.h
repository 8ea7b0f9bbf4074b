// The one rank-list syntax of Flare: every input that names a set of ranks — FLARE_* variables,
// the programs' --ranks flags, the daemon's ?ranks= query parameters, the `flare` CLI (whose
// Python twin is python/flare/ranks.py) — is parsed here, with the same rules.
//
//   LIST := '*' | 'all' | ITEM (',' ITEM)*        "0,2,4-7"   "*"
//   ITEM := N | A '-' B                           decimal, 0 <= A <= B <= kMaxRank
//
// Whitespace around items is ignored; items may repeat or overlap ("0-3,2" is 0..3). Rejected,
// with an error naming the variable or flag: the empty list, an empty item ("0,,2", "0,"), a
// reversed range ("7-4"), a sign or anything but digits ("+1", "-1", "1.0", "0x2"), and a rank
// above kMaxRank. '*' and 'all' (any case) mean every rank and stand alone.
//
// The per-rank lists of the simulator's fault variables (FLARE_SIM_CLOCK_FACTOR="0-3:1.5,*:2")
// use one ITEM (or '*') as the rank part of each entry: see parsePerRankList below.
//
// Pure functions; thread-safe; nothing here throws but std::bad_alloc from the containers.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flare::common {

// The largest rank a list may name (2^20 - 1): larger than any job, small enough that the
// expansion of any list into rank ids stays bounded.
inline constexpr int kMaxRank = (1 << 20) - 1;

// A parsed rank list: every rank, or a union of closed ranges, sorted and merged.
class RankSet {
 public:
  RankSet() = default;  // the empty set (no list parses to it)
  static RankSet every();
  static RankSet range(int first, int last);  // requires 0 <= first <= last <= kMaxRank

  bool all() const { return all_; }
  bool empty() const { return !all_ && ranges_.empty(); }
  bool contains(int rank) const;
  // Number of ranks named; every() counts kMaxRank + 1.
  size_t count() const;
  // Sorted, merged, non-adjacent closed ranges; empty for every().
  const std::vector<std::pair<int, int>>& ranges() const { return ranges_; }
  // The ranks, ascending (at most kMaxRank + 1 of them); every() gives 0..kMaxRank.
  std::vector<int> ranks() const;
  // The canonical spelling: "*" or "0,2,4-7".
  std::string toString() const;

  void add(int first, int last);  // requires 0 <= first <= last <= kMaxRank

 private:
  bool all_ = false;
  std::vector<std::pair<int, int>> ranges_;
};

// Parses `text`, a rank list given by `what` (a variable or flag name: "FLARE_SIM_NOISE_RANKS",
// "--ranks"). On a malformed list returns nullopt and, when `error` is non-null, sets it to one
// line naming `what`, the text and the offending item, e.g.
//   bad --ranks '0,x': 'x' is not a rank N or a range A-B (a rank list is like 0,2,4-7, or *
//   for every rank)
std::optional<RankSet> parseRankSet(std::string_view what, std::string_view text,
                                    std::string* error);

// The rank list in environment variable `name`: nullopt when unset or empty; a malformed value
// logs one warning (once per value, config.h's sink) naming the variable and is ignored
// (nullopt), as every other setting is (config.h: reading never fails).
std::optional<RankSet> envRankSet(const char* name);

// One entry of a per-rank list "RANKS:F1[:F2...],RANKS:F1,...", RANKS being one ITEM (N or
// A-B) or '*'.
struct RankEntry {
  RankSet ranks;
  std::vector<std::string> fields;
};

// Parses `value` (the content of variable `name`). Empty entries are skipped ("a,,b", a trailing
// comma); entries with a bad rank part or a field count outside [min_fields, max_fields] are
// skipped, each with one warning naming the variable and the entry.
std::vector<RankEntry> parsePerRankList(const char* name, std::string_view value, size_t min_fields,
                                        size_t max_fields);

// The entry of `list` that applies to `rank`: of those whose ranks contain it, the one naming
// the fewest ranks (a rank's own entry before a range, a range before '*'), the first on a tie;
// nullptr when none does.
const RankEntry* entryForRank(const std::vector<RankEntry>& list, int rank);

}  // namespace flare::common
