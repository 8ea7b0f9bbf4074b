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
//   /api/v1/jobs/{job}/deep-trace[?rank=R//   /api/v1/jobs/{job}/commands/{id}
//   GetCommandResultsResponselimit=N]  stored deep-trace (CUPTI) records, JSON
//
// Thread-safe (it holds no state of its own). Does not own the Ingest or the Store.
#pragma once

#include <functional>
#include <string>

#include "flare/v1/service.pb.h"
#include "src/engine/http_server.h"
#include "src/engine/ingest.h"

namespace flare::engine {

class QueryApi {
 public:
  QueryApi(Ingest& ingest, Store* store, std::function<std::string()> metrics)
      : ingest_(ingest), store_(store), metrics_(std::move(metrics)) {}

  // Called on every kernel report the Ingest filled (gRPC and HTTP alike): the analyzer adds
  // the five metrics and the change against history. Set before serving.
  void setReportEnricher(std::function<void(v1::GetReportResponse*)> fn) {
    enrich_report_ = std::move(fn);
  }

  Code listAlerts(const v1::ListAlertsRequest& req, v1::ListAlertsResponse* out);
  Code report(const v1::GetReportRequest& req, v1::GetReportResponse* out);
  HttpResponse http(const HttpRequest& req);

  Ingest& ingest() { return ingest_; }

 private:
  Ingest& ingest_;
  Store* store_;
  std::function<std::string()> metrics_;
  std::function<void(v1::GetReportResponse*)> enrich_report_;
};

// The protobuf JSON mapping of a message (lowerCamelCase, every primitive field printed), as
// the HTTP API answers it.
HttpResponse jsonResponse(const google::protobuf::Message& m);

// HTTP status for a Code.
int httpStatus(Code code);

}  // namespace flare::engine
