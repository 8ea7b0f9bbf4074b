#include "src/engine/diagnosis/diagnosis.h"

#include <cmath>
#include <cstdio>

#include "src/common/text.h"

namespace flare::engine {

const char* teamName(Team team) {
  switch (team) {
    case Team::kOperations:
      return "operations";
    case Team::kAlgorithm:
      return "algorithm";
    case Team::kInfrastructure:
      return "infrastructure";
  }
  return "infrastructure";
}

namespace {

std::string jsonNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", std::isfinite(v) ? v : 0.0);
  return buf;
}

}  // namespace

std::string diagnosisToJson(const Diagnosis& d) {
  std::string out = "{\"kind\":" + common::jsonQuote(d.kind) + ",\"team\":\"" + teamName(d.team) +
                    "\",\"cause\":" + common::jsonQuote(d.cause) +
                    ",\"severity\":" + jsonNumber(d.severity) + ",\"ranks\":[";
  for (size_t r = 0; r < d.ranks.size(); ++r) out += (r ? "," : "") + std::to_string(d.ranks[r]);
  out += "],\"victims\":[";
  for (size_t r = 0; r < d.victims.size(); ++r)
    out += (r ? "," : "") + std::to_string(d.victims[r]);
  out += "],\"summary\":" + common::jsonQuote(d.summary) + ",\"evidence\":[";
  for (size_t e = 0; e < d.evidence.size(); ++e) {
    const Evidence& ev = d.evidence[e];
    out += (e ? "," : "") + std::string("{\"metric\":") + common::jsonQuote(ev.metric) +
           ",\"text\":" + common::jsonQuote(ev.text) + ",\"value\":" + jsonNumber(ev.value) +
           ",\"reference\":" + jsonNumber(ev.reference) + "}";
  }
  return out + "]}";
}

std::string diagnosesToJson(const std::vector<Diagnosis>& diagnoses) {
  std::string out = "{\"diagnoses\":[";
  for (size_t i = 0; i < diagnoses.size(); ++i)
    out += (i ? "," : "") + diagnosisToJson(diagnoses[i]);
  return out + "]}\n";
}

std::string formatDiagnoses(const std::vector<Diagnosis>& diagnoses) {
  std::string out;
  for (const Diagnosis& d : diagnoses) {
    out += "[" + std::string(teamName(d.team)) + "] " + d.summary + "\n";
    if (!d.victims.empty()) {
      out += "    victims (slowed by the culprit, not at fault): rank";
      out += d.victims.size() > 1 ? "s " : " ";
      for (size_t r = 0; r < d.victims.size(); ++r)
        out += (r ? "," : "") + std::to_string(d.victims[r]);
      out += "\n";
    }
    for (const Evidence& e : d.evidence) out += "    - " + e.text + "\n";
  }
  return out;
}

}  // namespace flare::engine
