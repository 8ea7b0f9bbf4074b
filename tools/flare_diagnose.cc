// flare-diagnose: runs Flare's detectors on a job's records from an offline spool and prints
// the diagnoses (team, culprit ranks, evidence). The daemon runs the same detectors on live data.
//
//   flare-diagnose --input DIR [--job ID] [--baseline DIR [--baseline-job ID]] [--json]
//
// Exit status: 0 nothing found, 3 diagnoses printed, 1 unreadable input, 2 bad arguments.
#include <cstdio>
#include <string>
#include <vector>

#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/timeline/timeline.h"

namespace {

constexpr char kUsage[] =
    "usage: flare-diagnose --input DIR [--job ID] [--baseline DIR [--baseline-job ID]] [--json]\n";

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

bool load(const std::string& dir, const std::string& job, flare::engine::JobModel* model,
          std::string* error) {
  std::vector<flare::timeline::RankSource> sources;
  if (!flare::timeline::spoolSources(dir, job, {}, &sources, error)) return false;
  for (const auto& src : sources) {
    std::string e;
    if (!src.for_each_batch([&](const flare::v1::RecordBatch& b) { model->addBatch(src.rank, b); },
                            &e)) {
      std::fprintf(stderr, "flare-diagnose: warning: rank %d: %s\n", src.rank, e.c_str());
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string input, job, baseline_dir, baseline_job;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* dst) {
      if (i + 1 >= argc) return false;
      *dst = argv[++i];
      return true;
    };
    if ((a == "--input" && value(&input)) || (a == "--job" && value(&job)) ||
        (a == "--baseline" && value(&baseline_dir)) ||
        (a == "--baseline-job" && value(&baseline_job)))
      continue;
    if (a == "--json") {
      json = true;
      continue;
    }
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "flare-diagnose: unexpected argument '%s'\n%s", a.c_str(), kUsage);
    return 2;
  }
  if (input.empty()) {
    std::fprintf(stderr, "flare-diagnose: --input DIR is required\n%s", kUsage);
    return 2;
  }
  flare::engine::JobModel model, baseline;
  std::string error;
  if (!load(input, job, &model, &error)) {
    std::fprintf(stderr, "flare-diagnose: %s\n", error.c_str());
    return 1;
  }
  if (!baseline_dir.empty() && !load(baseline_dir, baseline_job, &baseline, &error)) {
    std::fprintf(stderr, "flare-diagnose: baseline: %s\n", error.c_str());
    return 1;
  }
  const auto diagnoses = flare::engine::diagnose(model, flare::engine::DiagnoseOptions{},
                                                 baseline_dir.empty() ? nullptr : &baseline);
  if (json) {
    std::printf("{\"diagnoses\":[");
    for (size_t i = 0; i < diagnoses.size(); ++i) {
      const auto& d = diagnoses[i];
      std::printf("%s{\"kind\":%s,\"team\":\"%s\",\"cause\":%s,\"severity\":%.4f,\"ranks\":[",
                  i ? "," : "", jsonString(d.kind).c_str(), flare::engine::teamName(d.team),
                  jsonString(d.cause).c_str(), d.severity);
      for (size_t r = 0; r < d.ranks.size(); ++r) std::printf("%s%d", r ? "," : "", d.ranks[r]);
      std::printf("],\"summary\":%s,\"evidence\":[", jsonString(d.summary).c_str());
      for (size_t e = 0; e < d.evidence.size(); ++e) {
        const auto& ev = d.evidence[e];
        std::printf("%s{\"metric\":%s,\"text\":%s,\"value\":%.6g,\"reference\":%.6g}", e ? "," : "",
                    jsonString(ev.metric).c_str(), jsonString(ev.text).c_str(), ev.value,
                    ev.reference);
      }
      std::printf("]}");
    }
    std::printf("]}\n");
  } else if (diagnoses.empty()) {
    std::printf("no anomaly found in %zu ranks\n", model.ranks().size());
  } else {
    std::fputs(flare::engine::formatDiagnoses(diagnoses).c_str(), stdout);
  }
  return diagnoses.empty() ? 0 : 3;
}
