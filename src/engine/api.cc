#include "src/engine/api.h"

#include <google/protobuf/util/json_util.h>

#include <string_view>
#include <vector>

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

}  // namespace

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

HttpResponse QueryApi::http(const HttpRequest& req) {
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
      const auto tok = req.headers.find("x-flare-token");
      v1::SendCommandResponse out;
      std::string err;
      const Code c =
          ingest_.sendCommand(r, tok == req.headers.end() ? "" : tok->second, &out, &err);
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

}  // namespace flare::engine
