// flare-timeline: a distributed timeline (Chrome/Perfetto trace JSON shaped like PyTorch's
// Kineto traces) from an offline spool directory. See src/timeline/timeline.h for the format.
//
//   flare-timeline --input DIR [--job ID] [--ranks 0-7,64] [--steps 100-102] [--no-align]
//                  (-o trace.json | --per-rank DIR)
//
// Exit status: 0 written (warnings on stderr), 1 nothing usable written, 2 bad arguments.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/common/rank_list.h"
#include "src/timeline/timeline.h"

namespace {

constexpr char kUsage[] =
    "usage: flare-timeline --input DIR [--job ID] [--ranks LIST] [--steps A-B] [--no-align]\n"
    "                      (-o FILE | --per-rank DIR)\n"
    "  --input DIR      spool root (FLARE_OUTPUT_DIR) or one job's folder\n"
    "  --job ID         the job, when DIR holds several\n"
    "  --ranks LIST     ranks to export, e.g. 0-7,64 or * (default: all)\n"
    "  --steps A-B      steps A..B inclusive (from the DataLoader's __next__ spans)\n"
    "  --no-align       keep each rank's own clock (default: align on collectives)\n"
    "  -o FILE          one trace with every rank (Perfetto UI)\n"
    "  --per-rank DIR   one Kineto-shaped file per rank, DIR/rank<N>.trace.json (HTA)\n";

bool parseRange(const std::string& text, long* a, long* b) {
  char* end = nullptr;
  errno = 0;
  *a = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || errno != 0 || *a < 0) return false;
  if (*end == '\0') {
    *b = *a;
    return true;
  }
  if (*end != '-') return false;
  const char* rest = end + 1;
  *b = std::strtol(rest, &end, 10);
  return end != rest && *end == '\0' && errno == 0 && *b >= *a;
}

}  // namespace

int main(int argc, char** argv) {
  std::string input, job, output, per_rank;
  std::vector<int> ranks;
  flare::timeline::Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* dst) {
      if (i + 1 >= argc) return false;
      *dst = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--input" && value(&input)) continue;
    if (a == "--job" && value(&job)) continue;
    if (a == "-o" && value(&output)) continue;
    if (a == "--per-rank" && value(&per_rank)) continue;
    if (a == "--no-align") {
      options.align_clocks = false;
      continue;
    }
    if (a == "--ranks" && value(&v)) {
      std::string error;
      const auto set = flare::common::parseRankSet("--ranks", v, &error);
      if (!set) {
        std::fprintf(stderr, "flare-timeline: %s\n", error.c_str());
        return 2;
      }
      if (!set->all()) {
        const std::vector<int> more = set->ranks();
        ranks.insert(ranks.end(), more.begin(), more.end());
      }
      continue;
    }
    if (a == "--steps" && value(&v)) {
      long s0 = 0, s1 = 0;
      if (!parseRange(v, &s0, &s1)) {
        std::fprintf(stderr, "flare-timeline: bad --steps '%s' (e.g. 100-102)\n", v.c_str());
        return 2;
      }
      options.steps = std::make_pair(static_cast<uint64_t>(s0), static_cast<uint64_t>(s1));
      continue;
    }
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "flare-timeline: unexpected argument '%s'\n%s", a.c_str(), kUsage);
    return 2;
  }
  if (input.empty() || output.empty() == per_rank.empty()) {
    std::fprintf(stderr,
                 "flare-timeline: --input and exactly one of -o / --per-rank are needed\n%s",
                 kUsage);
    return 2;
  }
  std::vector<flare::timeline::RankSource> sources;
  std::string error;
  if (!flare::timeline::spoolSources(input, job, ranks, &sources, &error)) {
    std::fprintf(stderr, "flare-timeline: %s\n", error.c_str());
    return 1;
  }
  flare::timeline::Summary summary;
  bool ok = false;
  if (!output.empty()) {
    const std::string tmp = output + ".partial";
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "we"), &std::fclose);
    if (!f) {
      std::fprintf(stderr, "flare-timeline: %s: %s\n", tmp.c_str(), std::strerror(errno));
      return 1;
    }
    std::setvbuf(f.get(), nullptr, _IOFBF, 1 << 20);
    ok = flare::timeline::writeCombined(sources, options, f.get(), &summary, &error);
    ok = (std::fclose(f.release()) == 0) && ok;
    if (ok && std::rename(tmp.c_str(), output.c_str()) != 0) {
      error = std::string("renaming to ") + output + ": " + std::strerror(errno);
      ok = false;
    }
    if (!ok) std::remove(tmp.c_str());
  } else {
    ok = flare::timeline::writePerRank(
        sources, options,
        [&](int rank) { return per_rank + "/rank" + std::to_string(rank) + ".trace.json"; },
        &summary, &error);
  }
  for (const auto& w : summary.warnings)
    std::fprintf(stderr, "flare-timeline: warning: %s\n", w.c_str());
  if (!ok) {
    std::fprintf(stderr, "flare-timeline: %s\n", error.c_str());
    return 1;
  }
  std::fprintf(stderr,
               "flare-timeline: %zu ranks, %llu GPU ops, %llu CPU slices, %llu launch flows, "
               "%llu collective links\n",
               sources.size(), static_cast<unsigned long long>(summary.gpu_events),
               static_cast<unsigned long long>(summary.cpu_events),
               static_cast<unsigned long long>(summary.launch_flows),
               static_cast<unsigned long long>(summary.collective_flows));
  return 0;
}
