#include "src/engine/api.h"

#include <google/protobuf/util/delimited_message_util.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "src/common/rank_list.h"
#include "src/common/text.h"
#include "src/engine/analyzer.h"
#include "src/engine/hang_monitor.h"

namespace flare::engine {
namespace {

HttpResponse json(const google::protobuf::Message& m) {
  return jsonResponse(m);
}

}  // namespace

HttpResponse jsonResponse(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, opts).ok()) {
    return {500, "text/plain; charset=utf-8", "cannot render JSON\n"};
  }
  out += '\n';
  return {200, "application/json", std::move(out)};
}

namespace {

HttpResponse error(int status, const std::string& msg) {
  std::string escaped;
  for (char c : msg) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  return {status, "application/json", "{\"error\":\"" + escaped + "\"}\n"};
}

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 1;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) parts.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

bool parseI64(const std::string& s, int64_t* out) {
  try {
    size_t used = 0;
    *out = std::stoll(s, &used);
    return used == s.size();
  } catch (...) {
    return false;
  }
}

// GET /api/v1/jobs/{job}/series[?max_steps=N&max_ranks=N&max_signatures=N&points=N&ranks=3,5-7
// &baseline=JOB]: the plot series of the job's detector window (diagnosis/series.h). Limits are
// clamped to the kSeries* hard limits; bad numbers are a 400, a job without a window a 404.
HttpResponse seriesResponse(Analyzer& analyzer, const std::string& job, const HttpRequest& r) {
  auto bad = [](const std::string& what) {
    return HttpResponse{400, "application/json",
                        "{\"error\":" + flare::common::jsonQuote(what) + "}\n"};
  };
  SeriesOptions opt;
  const std::pair<const char*, size_t*> limits[] = {{"max_steps", &opt.max_steps},
                                                    {"max_ranks", &opt.max_ranks},
                                                    {"max_signatures", &opt.max_signatures},
                                                    {"points", &opt.quantile_points}};
  for (const auto& [name, field] : limits) {
    const auto it = r.query.find(name);
    if (it == r.query.end()) continue;
    uint64_t v = 0;
    if (!parseU64(it->second, &v) || v == 0) return bad(std::string(name) + ": positive integer");
    *field = static_cast<size_t>(std::min<uint64_t>(v, 1u << 20));
  }
  if (const auto it = r.query.find("ranks"); it != r.query.end()) {
    std::string error;
    const auto set = flare::common::parseRankSet("ranks", it->second, &error);
    if (!set) return bad(error);
    if (!set->all()) opt.priority_ranks = set->ranks();
  }
  const auto base = r.query.find("baseline");
  const auto out =
      analyzer.seriesJson(job, opt, base == r.query.end() ? std::string() : base->second);
  if (!out) {
    return HttpResponse{
        404, "application/json",
        "{\"error\":" + flare::common::jsonQuote("no detector window for job " + job) + "}\n"};
  }
  return HttpResponse{200, "application/json", *out};
}

}  // namespace

// GET /api/v1/jobs/{job}/records[?ranks=0-7,64]: the raw records flared holds for a job — the
// detectors' window (every rank's ops, spans, step markers and kernel summaries; one batch per
// rank) followed by the deep-trace (CUPTI) records the store keeps of those ranks — as a
// protobuf delimited stream of RecordBatch, the spool file format (src/records/spool_format.h), so
// that `flare timeline --job` and `flare export --job` run the offline tools on it.
HttpResponse recordsResponse(Analyzer& analyzer, Store* store, const std::string& job,
                             const HttpRequest& r) {
  auto fail = [](int status, const std::string& what) {
    return HttpResponse{status, "application/json",
                        "{\"error\":" + flare::common::jsonQuote(what) + "}\n"};
  };
  std::vector<int> ranks;
  if (const auto it = r.query.find("ranks"); it != r.query.end()) {
    std::string error;
    const auto set = flare::common::parseRankSet("ranks", it->second, &error);
    if (!set) return fail(400, error);
    if (!set->all()) ranks = set->ranks();
  }
  const auto batches = analyzer.recordBatches(job, ranks);
  if (!batches) {
    return fail(404, "no records of job " + job +
                         " in flared's window (finished more than the window ago, or flared "
                         "restarted since; export the ranks' spools offline instead)");
  }
  std::ostringstream body;
  for (const auto& b : *batches) {
    google::protobuf::util::SerializeDelimitedToOstream(b, &body);
    if (store == nullptr) continue;
    flare::v1::RecordBatch deep;
    deep.set_rank(b.rank());
    for (DeepTraceRow& row : store->deepTrace(job, b.rank(), 1000000))
      *deep.add_deep_trace() = std::move(row.record);
    if (deep.deep_trace_size() > 0)
      google::protobuf::util::SerializeDelimitedToOstream(deep, &body);
  }
  return HttpResponse{200, "application/x-protobuf", body.str()};
}

int httpStatus(Code code) {
  switch (code) {
    case Code::kOk:
      return 200;
    case Code::kInvalidArgument:
      return 400;
    case Code::kUnauthenticated:
      return 401;
    case Code::kPermissionDenied:
      return 403;
    case Code::kNotFound:
      return 404;
    case Code::kResourceExhausted:
      return 429;
    case Code::kFailedPrecondition:
      return 400;
  }
  return 500;
}

Code QueryApi::listAlerts(const v1::ListAlertsRequest& req, v1::ListAlertsResponse* out) {
  if (store_ == nullptr) return Code::kOk;
  const size_t limit = req.limit() == 0 ? 1000 : std::min<uint32_t>(req.limit(), 100000);
  for (auto& a : store_->alerts(req.job_id(), req.since_unix_ns(), limit)) {
    *out->add_alerts() = std::move(a);
  }
  return Code::kOk;
}

Code QueryApi::report(const v1::GetReportRequest& req, v1::GetReportResponse* out) {
  const Code c = ingest_.report(req, out);
  if (c == Code::kOk && enrich_report_) enrich_report_(out);
  return c;
}

// The detector, baseline and hang routes (they need the Analyzer and the HangMonitor): matched
// on the path's suffix, before the other routes. False when the path is none of them.
std::optional<HttpResponse> QueryApi::analysisRoute(const HttpRequest& r) {
  if (analyzer_ == nullptr || hangs_ == nullptr || wall_ == nullptr) return std::nullopt;
  // /api/v1/jobs/{job}/diagnoses: the detectors on the job's current window, on demand.
  const std::string prefix = "/api/v1/jobs/", suffix = "/diagnoses";
  if (r.path.size() > prefix.size() + suffix.size() && r.path.rfind(prefix, 0) == 0 &&
      r.path.compare(r.path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string job =
        r.path.substr(prefix.size(), r.path.size() - prefix.size() - suffix.size());
    LookedAt looked_at;
    const std::vector<Diagnosis> found = analyzer_->diagnoseJob(job, &looked_at);
    return HttpResponse{200, "application/json", diagnosesToJson(found, looked_at)};
  }
  // /api/v1/jobs/{job}/records: the job's raw records (flare timeline/export --job).
  const std::string rsuffix = "/records";
  if (r.path.size() > prefix.size() + rsuffix.size() && r.path.rfind(prefix, 0) == 0 &&
      r.path.compare(r.path.size() - rsuffix.size(), rsuffix.size(), rsuffix) == 0) {
    if (r.method != "GET")
      return HttpResponse{405, "application/json", "{\"error\":\"GET only\"}\n"};
    return recordsResponse(
        *analyzer_, store_,
        r.path.substr(prefix.size(), r.path.size() - prefix.size() - rsuffix.size()), r);
  }
  // /api/v1/jobs/{job}/series: per rank x step series for plots (flare report --html).
  const std::string ssuffix = "/series";
  if (r.path.size() > prefix.size() + ssuffix.size() && r.path.rfind(prefix, 0) == 0 &&
      r.path.compare(r.path.size() - ssuffix.size(), ssuffix.size(), ssuffix) == 0) {
    return seriesResponse(
        *analyzer_, r.path.substr(prefix.size(), r.path.size() - prefix.size() - ssuffix.size()),
        r);
  }
  // Healthy history: POST/DELETE /api/v1/jobs/{job}/baseline, GET /api/v1/baselines.
  if (r.path == "/api/v1/baselines") {
    if (r.method != "GET")
      return HttpResponse{405, "application/json", "{\"error\":\"GET only\"}\n"};
    return jsonResponse(analyzer_->listBaselines());
  }
  const std::string bsuffix = "/baseline";
  if (r.path.size() > prefix.size() + bsuffix.size() && r.path.rfind(prefix, 0) == 0 &&
      r.path.compare(r.path.size() - bsuffix.size(), bsuffix.size(), bsuffix) == 0) {
    const std::string job =
        r.path.substr(prefix.size(), r.path.size() - prefix.size() - bsuffix.size());
    auto err = [](int status, const std::string& msg) {
      std::string q;
      for (char c : msg) {
        if (c == '"' || c == '\\') q += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) q += c;
      }
      return HttpResponse{status, "application/json", "{\"error\":\"" + q + "\"}\n"};
    };
    if (job.empty() || job.find('/') != std::string::npos) return err(404, "no such endpoint");
    if (r.method == "DELETE") {
      if (!analyzer_->removeBaseline(job)) return err(404, "job " + job + " is not a baseline");
      return HttpResponse{200, "application/json", "{\"removed\":true}\n"};
    }
    if (r.method != "POST") return err(405, "POST (add) or DELETE (remove)");
    flare::v1::HealthyBaseline given;  // body: {"backend": "..."} (optional)
    if (!r.body.empty() && !google::protobuf::util::JsonStringToMessage(r.body, &given).ok()) {
      return err(400, "body: {\"backend\": \"NAME\"} or nothing");
    }
    std::string why;
    auto added = analyzer_->addBaseline(job, given.backend(), wall_->nowNs(), &why);
    if (!added) return err(404, why);
    added->clear_issue_latency();
    added->clear_issue_latency_by_kind();
    added->clear_signatures();
    return jsonResponse(*added);
  }
  // /api/v1/jobs/{job}/hangs: the job's hang incidents (hang_monitor.h).
  const std::string hsuffix = "/hangs";
  if (r.path.size() > prefix.size() + hsuffix.size() && r.path.rfind(prefix, 0) == 0 &&
      r.path.compare(r.path.size() - hsuffix.size(), hsuffix.size(), hsuffix) == 0) {
    const std::string job =
        r.path.substr(prefix.size(), r.path.size() - prefix.size() - hsuffix.size());
    return HttpResponse{200, "application/json", hangs_->incidentsJson(job)};
  }
  return std::nullopt;
}

std::string QueryApi::requestToken(const HttpRequest& req) {
  if (const auto it = req.headers.find("x-flare-token"); it != req.headers.end()) return it->second;
  if (const auto it = req.headers.find("authorization"); it != req.headers.end()) {
    const std::string& v = it->second;
    if (v.size() > 7 && (v.compare(0, 7, "Bearer ") == 0 || v.compare(0, 7, "bearer ") == 0)) {
      size_t a = 7;
      while (a < v.size() && v[a] == ' ') ++a;
      return v.substr(a);
    }
  }
  return {};
}

std::optional<HttpResponse> QueryApi::authorize(const HttpRequest& req) const {
  if (!tokens_.enabled() || req.path == "/healthz") return std::nullopt;
  const std::string token = requestToken(req);
  if (tokens_.operatorToken(token)) return std::nullopt;
  auto deny = [&](const std::string& what) -> std::optional<HttpResponse> {
    if (token.empty()) {
      return error(401, what + " needs a token (X-Flare-Token or Authorization: Bearer)");
    }
    return error(403, "this token may not " + what);
  };
  const std::vector<std::string> p = split(req.path);
  // /api/v1/jobs/{job}/{route}[/{id}]: the job's own token. The path's job is what every job
  // route acts on (job ids hold no '/'); anything longer is no route, but still denied here.
  if (p.size() >= 5 && p[0] == "api" && p[1] == "v1" && p[2] == "jobs" &&
      req.path.rfind("/api/v1/jobs/", 0) == 0 && p.size() <= 6 &&
      req.path.compare(13, p[3].size() + 1, p[3] + "/") == 0) {
    if (!tokens_.jobToken(p[3], token)) return deny("access job " + p[3]);
    // A series compared with a baseline reads that job too.
    if (const auto b = req.query.find("baseline");
        b != req.query.end() && !b->second.empty() && !tokens_.jobToken(b->second, token)) {
      return deny("read job " + b->second);
    }
    return std::nullopt;
  }
  // Alerts of one job: that job's token.
  if (req.path == "/api/v1/alerts") {
    const auto j = req.query.find("job");
    if (j != req.query.end() && !j->second.empty()) {
      if (tokens_.jobToken(j->second, token)) return std::nullopt;
      return deny("read the alerts of job " + j->second);
    }
  }
  return deny("read " + req.path + " (an operator token)");
}

Code QueryApi::sendCommand(const v1::SendCommandRequest& req, const std::string& token,
                           v1::SendCommandResponse* out, std::string* err) {
  if (tokens_.enabled() && tokens_.operatorToken(token)) {
    if (req.command().has_exit()) {
      *err = "exit is sent only by flared after a hang diagnosis (FLARE_HANG_KILL)";
      return Code::kPermissionDenied;
    }
    return ingest_.sendCommandTrusted(req, out, err);
  }
  return ingest_.sendCommand(req, token, out, err);
}

HttpResponse QueryApi::http(const HttpRequest& req) {
  if (auto denied = authorize(req)) return *std::move(denied);
  return route(req);
}

HttpResponse QueryApi::route(const HttpRequest& req) {
  if (auto routed = analysisRoute(req)) return *std::move(routed);
  const std::vector<std::string> p = split(req.path);
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (req.path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
  if (req.path == "/metrics") {
    if (!get) return error(405, "GET only");
    return {200, "text/plain; version=0.0.4; charset=utf-8", metrics_ ? metrics_() : ""};
  }
  if (p.size() < 2 || p[0] != "api" || p[1] != "v1") return error(404, "no such endpoint");
  auto q = [&](const char* k) {
    const auto it = req.query.find(k);
    return it == req.query.end() ? std::string() : it->second;
  };
  if (p.size() == 3 && p[2] == "alerts" && get) {
    v1::ListAlertsRequest r;
    r.set_job_id(q("job"));
    int64_t v = 0;
    if (!q("since").empty()) {
      if (!parseI64(q("since"), &v)) return error(400, "since: integer nanoseconds");
      r.set_since_unix_ns(v);
    }
    if (!q("limit").empty()) {
      if (!parseI64(q("limit"), &v) || v < 0) return error(400, "limit: non-negative integer");
      r.set_limit(static_cast<uint32_t>(std::min<int64_t>(v, 100000)));
    }
    v1::ListAlertsResponse out;
    listAlerts(r, &out);
    return json(out);
  }
  if (p.size() == 3 && p[2] == "jobs" && get) {
    v1::ListJobsRequest r;
    const std::string f = q("include_finished");
    r.set_include_finished(f == "1" || f == "true");
    return json(ingest_.listJobs(r));
  }
  if (p.size() >= 5 && p[2] == "jobs") {
    const std::string& job = p[3];
    if (p.size() == 5 && p[4] == "report" && get) {
      v1::GetReportRequest r;
      r.set_job_id(job);
      v1::GetReportResponse out;
      const Code c = report(r, &out);
      return c == Code::kOk ? json(out) : error(httpStatus(c), "unknown job " + job);
    }
    if (p.size() == 5 && p[4] == "ranks" && get) {
      v1::ListRanksRequest r;
      r.set_job_id(job);
      v1::ListRanksResponse out;
      const Code c = ingest_.ranks(r, &out);
      return c == Code::kOk ? json(out) : error(httpStatus(c), "unknown job " + job);
    }
    if (p.size() == 5 && p[4] == "commands" && req.method == "POST") {
      v1::SendCommandRequest r;
      if (!req.body.empty() && !google::protobuf::util::JsonStringToMessage(req.body, &r).ok()) {
        return error(400, "body is not a SendCommandRequest in JSON");
      }
      r.set_job_id(job);
      v1::SendCommandResponse out;
      std::string err;
      const Code c = sendCommand(r, requestToken(req), &out, &err);
      return c == Code::kOk ? json(out) : error(httpStatus(c), err);
    }
    if (p.size() == 5 && p[4] == "deep-trace" && get) {
      // The deep-trace (CUPTI) records the store holds: {"records": [{"rank": R, ...}, ...]}.
      int64_t rank = -1, limit = 100000;
      if (!q("rank").empty() && (!parseI64(q("rank"), &rank) || rank < 0)) {
        return error(400, "rank: non-negative integer");
      }
      if (!q("limit").empty() && (!parseI64(q("limit"), &limit) || limit < 0)) {
        return error(400, "limit: non-negative integer");
      }
      if (store_ == nullptr) return error(404, "no store: deep-trace records are not kept");
      std::string body = "{\"records\":[";
      bool first = true;
      google::protobuf::util::JsonPrintOptions o;
      o.preserve_proto_field_names = false;
      for (const DeepTraceRow& r :
           store_->deepTrace(job, static_cast<int32_t>(rank),
                             static_cast<size_t>(std::min<int64_t>(limit, 1000000)))) {
        std::string one;
        if (!google::protobuf::util::MessageToJsonString(r.record, &one, o).ok()) continue;
        body += (first ? "" : ",") + std::string("{\"rank\":") + std::to_string(r.rank) +
                (one.size() > 2 ? "," + one.substr(1) : "}");
        first = false;
      }
      body += "]}\n";
      return {200, "application/json", body};
    }
    if (p.size() == 6 && p[4] == "commands" && get) {
      int64_t id = 0;
      if (!parseI64(p[5], &id) || id <= 0) return error(400, "command id: positive integer");
      v1::GetCommandResultsRequest r;
      r.set_job_id(job);
      r.set_command_id(static_cast<uint64_t>(id));
      v1::GetCommandResultsResponse out;
      const Code c = ingest_.commandResults(r, &out);
      return c == Code::kOk ? json(out) : error(httpStatus(c), "unknown job " + job);
    }
  }
  return error(404, "no such endpoint");
}

bool parseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  try {
    size_t used = 0;
    *out = std::stoull(s, &used);
    return used == s.size();
  } catch (...) {
    return false;
  }
}

}  // namespace flare::engine
