// GrpcServer: the gRPC adapter of flared. Ingest.Stream (one bidirectional stream per rank) is
// served by a callback generic service so that the daemon sees the raw bytes: undecodable or
// oversized messages are counted (flare_ingest_rejected_total) and answered with a status
// rather than dropped inside gRPC. Query is an ordinary callback service over QueryApi.
//
// Hygiene: the port is bound exclusively (no SO_REUSEPORT: a second daemon on it fails to start
// instead of the kernel splitting ranks between two); a stream must send an accepted hello
// within hello_timeout_ms (a thread checks four times a second); at most max_streams_per_peer
// rank streams from one IP address at once. Each refusal is counted (writeMetrics).
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
#include <thread>

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
  // A stream must send an accepted hello within this, or it is ended (DEADLINE_EXCEEDED).
  int64_t hello_timeout_ms = 10000;
  // Rank streams open at once from one peer address (IP); beyond: RESOURCE_EXHAUSTED. 0: none.
  size_t max_streams_per_peer = 4096;
};

struct GrpcCounters {
  std::atomic<uint64_t> streams_opened{0};
  std::atomic<uint64_t> streams_closed{0};
  std::atomic<uint64_t> writes_dropped{0};  // write queue of a stream full
  std::atomic<uint64_t> unknown_method{0};
  std::atomic<uint64_t> hello_timeouts{0};  // ended for no accepted hello in time
  std::atomic<uint64_t> peer_limited{0};    // refused over max_streams_per_peer
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
  void sweep();  // the hello-deadline thread
  Ingest& ingest_;
  QueryApi& api_;
  GrpcOptions options_;
  GrpcCounters counters_;
  std::unique_ptr<IngestService> ingest_service_;
  std::unique_ptr<QueryService> query_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread sweeper_;
  std::atomic<bool> stop_sweeper_{false};
};

}  // namespace flare::engine
