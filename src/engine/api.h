// QueryApi: the daemon's query and command API, shared by the gRPC Query service and the JSON
// HTTP API so that both answer the same messages (JSON is the protobuf JSON mapping of the
// gRPC responses: lowerCamelCase fields, 64-bit integers as strings).
//
// HTTP routes (GET unless noted):
//   /healthz                                  "ok"
//   /metrics                                  Prometheus text (the `metrics` callback)
//   /api/v1/jobs[?include_finished=1]         ListJobsResponse
//   /api/v1/jobs/{job}/report                 GetReportResponse
//   /api/v1/jobs/{job}/ranks                  ListRanksResponse
//   /api/v1/alerts[?job=J&since=NS&limit=N]   ListAlertsResponse
//   POST /api/v1/jobs/{job}/commands          body: SendCommandRequest JSON (job_id from the path),
//                                             header X-Flare-Token when tokens are configured
//   /api/v1/jobs/{job}/commands/{id}          GetCommandResultsResponse
//   /api/v1/jobs/{job}/deep-trace[?rank=R&limit=N]  stored deep-trace (CUPTI) records, JSON
// With setAnalysis (flared sets it):
//   /api/v1/jobs/{job}/diagnoses              the detectors on the job's window, now
//   /api/v1/jobs/{job}/records[?ranks=0-7,64] the job's raw records, delimited RecordBatches
//                                             (window, else the store; + stored deep trace)
//   /api/v1/jobs/{job}/series[?max_steps=N&max_ranks=N&max_signatures=N&points=N&ranks=3,5
//     &baseline=JOB]                          plot series (diagnosis/series.h)
//   POST|DELETE /api/v1/jobs/{job}/baseline   mark / unmark a job as healthy history
//   /api/v1/baselines                         the healthy baselines
//   /api/v1/jobs/{job}/hangs                  the job's hang incidents (hang_monitor.h)
//
// Authentication (setTokens, auth.h): when tokens are configured every route but /healthz needs
// one, in the header X-Flare-Token or "Authorization: Bearer TOKEN". /api/v1/jobs/{job}/...
// (reads and writes) takes the job's token or an operator token; everything else (/metrics, the
// job list, /api/v1/alerts without ?job=, /api/v1/baselines) an operator token. No token: 401;
// a token that may not: 403.
//
// Thread-safe (its state is set before serving). Does not own the Ingest or the Store.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "flare/v1/service.pb.h"
#include "src/engine/auth.h"
#include "src/engine/http_server.h"
#include "src/engine/ingest.h"

namespace flare::common {
class Clock;
}

namespace flare::engine {

class Analyzer;
class HangMonitor;

// A non-negative decimal integer, the whole string (query parameters, flags).
bool parseU64(const std::string& s, uint64_t* out);

class QueryApi {
 public:
  QueryApi(Ingest& ingest, Store* store, std::function<std::string()> metrics)
      : ingest_(ingest), store_(store), metrics_(std::move(metrics)) {}

  // Called on every kernel report the Ingest filled (gRPC and HTTP alike): the analyzer adds
  // the five metrics and the change against history. Set before serving.
  void setReportEnricher(std::function<void(v1::GetReportResponse*)> fn) {
    enrich_report_ = std::move(fn);
  }

  // The diagnoses / series / baseline / hang routes: without it (nullptr) they are 404s. Not
  // owned; set before serving.
  void setAnalysis(Analyzer* analyzer, HangMonitor* hangs, const flare::common::Clock* wall) {
    analyzer_ = analyzer;
    hangs_ = hangs;
    wall_ = wall;
  }

  // The tokens that guard the routes (auth.h); default: none, every route open. Set before
  // serving.
  void setTokens(TokenSet tokens) { tokens_ = std::move(tokens); }
  const TokenSet& tokens() const { return tokens_; }

  // A command from a client (HTTP or gRPC Query): the job's token or an operator token.
  Code sendCommand(const v1::SendCommandRequest& req, const std::string& token,
                   v1::SendCommandResponse* out, std::string* error);

  // The caller's token of an HTTP request: X-Flare-Token, else "Authorization: Bearer T".
  static std::string requestToken(const HttpRequest& req);

  Code listAlerts(const v1::ListAlertsRequest& req, v1::ListAlertsResponse* out);
  Code report(const v1::GetReportRequest& req, v1::GetReportResponse* out);
  // Every HTTP route, behind the token check.
  HttpResponse http(const HttpRequest& req);

  Ingest& ingest() { return ingest_; }

 private:
  Ingest& ingest_;
  Store* store_;
  std::function<std::string()> metrics_;
  std::function<void(v1::GetReportResponse*)> enrich_report_;
  Analyzer* analyzer_ = nullptr;
  HangMonitor* hangs_ = nullptr;
  const flare::common::Clock* wall_ = nullptr;
  TokenSet tokens_;

  // Null when `req` may go on; else the 401/403 answer.
  std::optional<HttpResponse> authorize(const HttpRequest& req) const;
  HttpResponse route(const HttpRequest& req);

  std::optional<HttpResponse> analysisRoute(const HttpRequest& r);
};

// The protobuf JSON mapping of a message (lowerCamelCase, every primitive field printed), as
// the HTTP API answers it.
HttpResponse jsonResponse(const google::protobuf::Message& m);

// HTTP status for a Code.
int httpStatus(Code code);

}  // namespace flare::engine
