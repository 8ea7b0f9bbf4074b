// GrpcServer: the gRPC adapter of flared. Ingest.Stream (one bidirectional stream per rank) is
// served by a callback generic service so that the daemon sees the raw bytes: undecodable or
// oversized messages are counted (flare_ingest_rejected_total) and answered with a status
// rather than dropped inside gRPC. Query is an ordinary callback service over QueryApi.
//
// Per stream: one read outstanding at a time (memory: one message, at most --max-message-bytes;
// gRPC itself refuses anything over twice that), a bounded write queue (acks, commands, batch
// rejections), and a session in Ingest from the accepted hello until the stream ends.
//
// Threads: gRPC's callback executor runs the reactors; Ingest methods are called from there.
// Owned by flared_main; shutdown() stops accepting, cancels the streams and waits for them.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "src/engine/api.h"
#include "src/engine/ingest.h"

namespace grpc {
class Server;
class CallbackGenericService;
}  // namespace grpc

namespace flare::engine {

struct GrpcOptions {
  std::string listen = "127.0.0.1:7070";  // port 0 picks a free one (see port())
  std::string tls_cert_file;              // both set: TLS; otherwise plaintext
  std::string tls_key_file;
  std::string tls_client_ca_file;  // set (with TLS): ranks must present a client certificate
                                   // that verifies against it
  size_t max_message_bytes = 8u << 20;
  size_t max_queued_writes = 256;  // per stream
};

struct GrpcCounters {
  std::atomic<uint64_t> streams_opened{0};
  std::atomic<uint64_t> streams_closed{0};
  std::atomic<uint64_t> writes_dropped{0};  // write queue of a stream full
  std::atomic<uint64_t> unknown_method{0};
};

class GrpcServer {
 public:
  GrpcServer(Ingest& ingest, QueryApi& api, GrpcOptions options);
  ~GrpcServer();
  bool start(std::string* error);
  int port() const { return port_; }
  void shutdown();
  void writeMetrics(PromWriter& w) const;

 private:
  class IngestService;
  class QueryService;
  Ingest& ingest_;
  QueryApi& api_;
  GrpcOptions options_;
  GrpcCounters counters_;
  std::unique_ptr<IngestService> ingest_service_;
  std::unique_ptr<QueryService> query_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace flare::engine
