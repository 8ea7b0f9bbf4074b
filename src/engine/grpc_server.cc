#include "src/engine/grpc_server.h"

#include <google/protobuf/arena.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "flare/v1/service.grpc.pb.h"
#include "src/common/log.h"
#include "src/engine/metrics.h"

namespace flare::engine {
namespace {

constexpr const char* kStreamMethod = "/flare.v1.Ingest/Stream";

grpc::StatusCode toGrpc(Code c) {
  switch (c) {
    case Code::kOk:
      return grpc::StatusCode::OK;
    case Code::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case Code::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
    case Code::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case Code::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case Code::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case Code::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
  }
  return grpc::StatusCode::UNKNOWN;
}

bool readFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

class StreamReactor;

// The rank streams alive: per-peer counts (the per-peer bound) and those still waiting for an
// accepted hello with their deadline (the hello deadline). Shared by the service, the reactors
// and the sweeper thread; one mutex, never held while taking a stream's mutex except by
// expire(), and a stream takes it only outside its own.
class StreamRegistry {
 public:
  // The IP address of a gRPC peer string ("ipv4:1.2.3.4:5", "ipv6:[::1]:5", "unix:...").
  static std::string peerAddress(const std::string& peer) {
    std::string p = peer;
    const size_t colon = p.find(':');
    if (colon != std::string::npos && p.compare(0, 3, "ipv") == 0) p = p.substr(colon + 1);
    if (p.rfind("unix", 0) == 0) return "unix";
    const size_t last = p.rfind(':');
    if (last != std::string::npos && p.find(']') == std::string::npos && p.find(':') == last) {
      return p.substr(0, last);  // a.b.c.d:port
    }
    if (const size_t close = p.find(']'); close != std::string::npos) return p.substr(0, close + 1);
    return p;
  }
  // False when `peer` already has `max` streams (max 0: no bound).
  bool admit(const std::string& peer, size_t max) {
    std::lock_guard lock(mu_);
    size_t& n = per_peer_[peer];
    if (max != 0 && n >= max) return false;
    ++n;
    return true;
  }
  void release(const std::string& peer) {
    std::lock_guard lock(mu_);
    auto it = per_peer_.find(peer);
    if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
  }
  void awaitHello(StreamReactor* r, std::chrono::steady_clock::time_point deadline) {
    std::lock_guard lock(mu_);
    awaiting_[r] = deadline;
  }
  void helloDone(StreamReactor* r) {
    std::lock_guard lock(mu_);
    awaiting_.erase(r);
  }
  // Ends the streams past their hello deadline; how many.
  size_t expire(std::chrono::steady_clock::time_point now);

 private:
  std::mutex mu_;
  std::map<std::string, size_t> per_peer_;
  std::map<StreamReactor*, std::chrono::steady_clock::time_point> awaiting_;
};

// The CommandChannel of one stream; outlives the reactor (Ingest may hold it a little longer).
class StreamChannel final : public CommandChannel {
 public:
  bool send(const v1::DaemonMessage& msg) override;
  void close(Code code, const std::string& error) override;

  std::recursive_mutex mu;
  StreamReactor* reactor = nullptr;  // null once the stream is done
};

class StreamReactor final : public grpc::ServerGenericBidiReactor {
 public:
  StreamReactor(Ingest& ingest, GrpcCounters& counters, size_t max_queued_writes,
                StreamRegistry& registry, std::string peer, int64_t hello_timeout_ms)
      : ingest_(ingest),
        counters_(counters),
        max_queued_(max_queued_writes),
        registry_(registry),
        peer_(std::move(peer)),
        channel_(std::make_shared<StreamChannel>()) {
    channel_->reactor = this;
    counters_.streams_opened.fetch_add(1, std::memory_order_relaxed);
    registry_.awaitHello(
        this, std::chrono::steady_clock::now() + std::chrono::milliseconds(hello_timeout_ms));
    StartRead(&in_);
  }

  // The sweeper: no accepted hello in time. Under the registry's mutex (the reactor is alive).
  void expireHello() {
    counters_.hello_timeouts.fetch_add(1, std::memory_order_relaxed);
    ingest_.countRejected(Reason::kNoHello);
    std::lock_guard lock(channel_->mu);
    finishLocked(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              "no accepted hello within --hello-timeout-ms"));
  }

  // Under channel_->mu.
  bool enqueueLocked(const v1::DaemonMessage& msg) {
    if (finish_requested_ || writes_.size() >= max_queued_) {
      counters_.writes_dropped.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    std::string bytes;
    msg.SerializeToString(&bytes);
    grpc::Slice slice(bytes);
    writes_.emplace_back(&slice, 1);
    if (!writing_) {
      writing_ = true;
      StartWrite(&writes_.front());
    }
    return true;
  }
  void finishLocked(const grpc::Status& status) {
    if (finish_requested_) return;
    finish_requested_ = true;
    status_ = status;
    if (!writing_) {
      finished_ = true;
      Finish(status_);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the rank half-closed or the stream broke
      std::lock_guard lock(channel_->mu);
      finishLocked(grpc::Status::OK);
      return;
    }
    handle();
    std::lock_guard lock(channel_->mu);
    if (!finish_requested_) StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(channel_->mu);
    writes_.pop_front();
    if (!ok) {
      finish_requested_ = true;
      writes_.clear();
    }
    if (!writes_.empty()) {
      StartWrite(&writes_.front());
      return;
    }
    writing_ = false;
    if (finish_requested_ && !finished_) {
      finished_ = true;
      Finish(status_);
    }
  }

  void OnDone() override {
    {
      std::lock_guard lock(channel_->mu);
      channel_->reactor = nullptr;
    }
    registry_.helloDone(this);
    registry_.release(peer_);
    if (session_ != 0) ingest_.close(session_);
    counters_.streams_closed.fetch_add(1, std::memory_order_relaxed);
    delete this;
  }

 private:
  void fail(const Verdict& v) {
    std::lock_guard lock(channel_->mu);
    finishLocked(grpc::Status(toGrpc(v.code), v.error));
  }

  // Where a gRPC thread parses the message in hand: an arena over a block the thread keeps, and
  // the buffer a message in several slices is joined in. A message lives only inside handle(),
  // so one per thread serves every stream (a per-stream arena freed and re-allocated its blocks
  // for every message: a tenth of flared's ingest CPU at 10,000 ranks, in malloc). `busy` sends a
  // nested handle() on the same thread, should gRPC ever run one inline, to its own arena.
  struct ParseSpace {
    static constexpr size_t kBlockBytes = 256 << 10;
    static constexpr size_t kScratchKeep = 1 << 20;  // a larger joined message is not kept
    std::unique_ptr<char[]> block{new char[kBlockBytes]};
    google::protobuf::Arena arena{block.get(), kBlockBytes};
    std::string scratch;
    bool busy = false;
  };

  void handle() {
    thread_local ParseSpace space;
    if (space.busy) {
      ParseSpace nested;
      handleWith(nested);
    } else {
      space.busy = true;
      handleWith(space);
      space.busy = false;
      if (space.scratch.capacity() > ParseSpace::kScratchKeep) std::string().swap(space.scratch);
    }
  }

  void handleWith(ParseSpace& space) {
    const size_t len = in_.Length();
    std::vector<grpc::Slice> slices;
    Verdict v;
    if (!in_.Dump(&slices).ok()) {
      ingest_.countRejected(Reason::kMalformed);
      return fail({Code::kInvalidArgument, Reason::kMalformed, "unreadable message", true});
    }
    const void* data = nullptr;
    if (slices.size() == 1) {
      data = slices[0].begin();
    } else {
      space.scratch.clear();
      space.scratch.reserve(len);
      for (const auto& s : slices)
        space.scratch.append(reinterpret_cast<const char*>(s.begin()), s.size());
      data = space.scratch.data();
    }
    // A fresh message on a reset arena: parsing allocates by bumping a pointer, and dropping the
    // previous message frees nothing one by one.
    space.arena.Reset();
    v1::RankMessage* msg = google::protobuf::Arena::CreateMessage<v1::RankMessage>(&space.arena);
    v = ingest_.decode(data, len, msg);
    in_.Clear();
    if (!v.ok()) return fail(v);
    switch (msg->msg_case()) {
      case v1::RankMessage::kHello: {
        if (session_ != 0 || hello_seen_) {
          ingest_.countRejected(Reason::kDuplicateHello);
          return fail(
              {Code::kInvalidArgument, Reason::kDuplicateHello, "second hello on a stream", true});
        }
        hello_seen_ = true;
        Ingest::HelloOutcome out = ingest_.hello(msg->hello(), channel_);
        session_ = out.session_id;
        registry_.helloDone(this);  // accepted, or the stream ends with the refusal below
        std::lock_guard lock(channel_->mu);
        v1::DaemonMessage ack;
        *ack.mutable_ack() = std::move(out.ack);
        enqueueLocked(ack);
        for (auto& c : out.pending) {
          v1::DaemonMessage m;
          *m.mutable_command() = std::move(c);
          enqueueLocked(m);
        }
        if (!out.verdict.ok())
          finishLocked(grpc::Status(toGrpc(out.verdict.code), out.verdict.error));
        return;
      }
      case v1::RankMessage::kBatch: {
        if (session_ == 0) {
          ingest_.countRejected(Reason::kNoHello);
          return fail({Code::kFailedPrecondition, Reason::kNoHello,
                       "batch before an accepted hello", true});
        }
        v = ingest_.batch(session_, msg->batch());
        if (v.ok() && v.items_dropped == 0) return;
        if (v.close_stream) return fail(v);
        if (v.reason == Reason::kDuplicateBatch) return;
        // Tell the rank what was refused: it logs it and sends its tables again.
        v1::DaemonMessage m;
        m.mutable_rejected()->set_batch_seq(msg->batch().batch_seq());
        m.mutable_rejected()->set_reason(reasonName(v.reason));
        m.mutable_rejected()->set_error(v.error);
        m.mutable_rejected()->set_batch_kept(v.ok());
        m.mutable_rejected()->set_items_dropped(v.items_dropped);
        std::lock_guard lock(channel_->mu);
        enqueueLocked(m);
        return;
      }
      case v1::RankMessage::kCommandResult: {
        if (session_ == 0) {
          ingest_.countRejected(Reason::kNoHello);
          return fail({Code::kFailedPrecondition, Reason::kNoHello,
                       "result before an accepted hello", true});
        }
        v = ingest_.commandResult(session_, msg->command_result());
        if (!v.ok() && v.close_stream) fail(v);
        return;
      }
      case v1::RankMessage::kHangReport: {
        if (session_ == 0) {
          ingest_.countRejected(Reason::kNoHello);
          return fail({Code::kFailedPrecondition, Reason::kNoHello,
                       "hang report before an accepted hello", true});
        }
        v = ingest_.hangReport(session_, msg->hang_report());
        if (!v.ok() && v.close_stream) fail(v);
        return;
      }
      default:
        return;
    }
  }

  Ingest& ingest_;
  GrpcCounters& counters_;
  const size_t max_queued_;
  StreamRegistry& registry_;
  const std::string peer_;
  std::shared_ptr<StreamChannel> channel_;
  grpc::ByteBuffer in_;
  uint64_t session_ = 0;
  bool hello_seen_ = false;
  // Under channel_->mu:
  std::deque<grpc::ByteBuffer> writes_;
  bool writing_ = false;
  bool finish_requested_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

bool StreamChannel::send(const v1::DaemonMessage& msg) {
  std::lock_guard lock(mu);
  return reactor != nullptr && reactor->enqueueLocked(msg);
}

void StreamChannel::close(Code code, const std::string& error) {
  std::lock_guard lock(mu);
  if (reactor != nullptr) reactor->finishLocked(grpc::Status(toGrpc(code), error));
}

size_t StreamRegistry::expire(std::chrono::steady_clock::time_point now) {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    it->first->expireHello();
    it = awaiting_.erase(it);
    ++n;
  }
  return n;
}

// Answers a call at once with `status` (a method this daemon does not serve, a peer over its
// stream bound).
class RefuseReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit RefuseReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

class GrpcServer::IngestService final : public grpc::CallbackGenericService {
 public:
  IngestService(Ingest& ingest, GrpcCounters& counters, const GrpcOptions& options)
      : ingest_(ingest), counters_(counters), options_(options) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    if (ctx->method() != kStreamMethod) {
      counters_.unknown_method.fetch_add(1, std::memory_order_relaxed);
      return new RefuseReactor(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no such method"));
    }
    std::string peer = StreamRegistry::peerAddress(ctx->peer());
    if (!registry_.admit(peer, options_.max_streams_per_peer)) {
      counters_.peer_limited.fetch_add(1, std::memory_order_relaxed);
      return new RefuseReactor(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       "too many rank streams from " + peer + " (--max-streams-per-peer " +
                           std::to_string(options_.max_streams_per_peer) + ")"));
    }
    return new StreamReactor(ingest_, counters_, options_.max_queued_writes, registry_,
                             std::move(peer), options_.hello_timeout_ms);
  }
  StreamRegistry& registry() { return registry_; }

 private:
  Ingest& ingest_;
  GrpcCounters& counters_;
  const GrpcOptions& options_;
  StreamRegistry registry_;
};

class GrpcServer::QueryService final : public v1::Query::CallbackService {
 public:
  explicit QueryService(QueryApi& api) : api_(api) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override {
    if (!api_.tokens().mayReadAll(token(ctx))) return denied(ctx, "list jobs");
    *resp = api_.ingest().listJobs(*req);
    return done(ctx, Code::kOk, "");
  }
  grpc::ServerUnaryReactor* GetReport(grpc::CallbackServerContext* ctx,
                                      const v1::GetReportRequest* req,
                                      v1::GetReportResponse* resp) override {
    if (!api_.tokens().mayAccessJob(req->job_id(), token(ctx)))
      return denied(ctx, "read job " + req->job_id());
    if (req->since_unix_ns() != 0) {  // aggregates cover the whole job (README: gaps)
      grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
      r->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                             "since_unix_ns is not supported yet; send 0 for the whole job"));
      return r;
    }
    return done(ctx, api_.report(*req, resp), "unknown job " + req->job_id());
  }
  grpc::ServerUnaryReactor* ListRanks(grpc::CallbackServerContext* ctx,
                                      const v1::ListRanksRequest* req,
                                      v1::ListRanksResponse* resp) override {
    if (!api_.tokens().mayAccessJob(req->job_id(), token(ctx)))
      return denied(ctx, "read job " + req->job_id());
    return done(ctx, api_.ingest().ranks(*req, resp), "unknown job " + req->job_id());
  }
  grpc::ServerUnaryReactor* ListAlerts(grpc::CallbackServerContext* ctx,
                                       const v1::ListAlertsRequest* req,
                                       v1::ListAlertsResponse* resp) override {
    if (req->job_id().empty() ? !api_.tokens().mayReadAll(token(ctx))
                              : !api_.tokens().mayAccessJob(req->job_id(), token(ctx)))
      return denied(ctx, "read these alerts");
    return done(ctx, api_.listAlerts(*req, resp), "");
  }
  grpc::ServerUnaryReactor* SendCommand(grpc::CallbackServerContext* ctx,
                                        const v1::SendCommandRequest* req,
                                        v1::SendCommandResponse* resp) override {
    std::string err;
    const Code c = api_.sendCommand(*req, token(ctx), resp, &err);
    return done(ctx, c, err);
  }
  grpc::ServerUnaryReactor* GetCommandResults(grpc::CallbackServerContext* ctx,
                                              const v1::GetCommandResultsRequest* req,
                                              v1::GetCommandResultsResponse* resp) override {
    if (!api_.tokens().mayAccessJob(req->job_id(), token(ctx)))
      return denied(ctx, "read job " + req->job_id());
    return done(ctx, api_.ingest().commandResults(*req, resp), "unknown job " + req->job_id());
  }

 private:
  // The caller's token: metadata x-flare-token, else "authorization: Bearer T" (auth.h).
  static std::string token(grpc::CallbackServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    if (auto it = md.find("x-flare-token"); it != md.end())
      return std::string(it->second.data(), it->second.size());
    if (auto it = md.find("authorization"); it != md.end()) {
      const std::string v(it->second.data(), it->second.size());
      if (v.rfind("Bearer ", 0) == 0) return v.substr(7);
    }
    return {};
  }
  grpc::ServerUnaryReactor* denied(grpc::CallbackServerContext* ctx, const std::string& what) {
    const bool none = token(ctx).empty();
    return done(ctx, none ? Code::kUnauthenticated : Code::kPermissionDenied,
                (none ? "a token is needed to " : "this token may not ") + what);
  }
  static grpc::ServerUnaryReactor* done(grpc::CallbackServerContext* ctx, Code c,
                                        const std::string& err) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(c == Code::kOk ? grpc::Status::OK : grpc::Status(toGrpc(c), err));
    return r;
  }
  QueryApi& api_;
};

GrpcServer::GrpcServer(Ingest& ingest, QueryApi& api, GrpcOptions options)
    : ingest_(ingest), api_(api), options_(std::move(options)) {}

GrpcServer::~GrpcServer() {
  shutdown();
}

bool GrpcServer::start(std::string* error) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    if (!readFile(options_.tls_key_file, &pair.private_key) ||
        !readFile(options_.tls_cert_file, &pair.cert_chain)) {
      *error = "cannot read --tls-cert/--tls-key (both are needed)";
      return false;
    }
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    if (!options_.tls_client_ca_file.empty()) {
      if (!readFile(options_.tls_client_ca_file, &ssl.pem_root_certs)) {
        *error = "cannot read --tls-client-ca " + options_.tls_client_ca_file;
        return false;
      }
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  ingest_service_ = std::make_unique<IngestService>(ingest_, counters_, options_);
  query_service_ = std::make_unique<QueryService>(api_);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, creds, &port_);
  // Exclusively: with SO_REUSEPORT (gRPC's default) a second daemon on the same port starts
  // fine and the kernel splits the ranks, and so each job, between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Twice the daemon's own limit: messages in between reach Ingest::decode and are counted.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<size_t>(2 * options_.max_message_bytes, INT32_MAX)));
  builder.RegisterService(query_service_.get());
  builder.RegisterCallbackGenericService(ingest_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    *error = "cannot listen on " + options_.listen +
             " (is another flared serving this port? it is bound exclusively), or the address "
             "is not one of this host's";
    server_.reset();
    return false;
  }
  sweeper_ = std::thread([this] { sweep(); });
  return true;
}

void GrpcServer::sweep() {
  while (!stop_sweeper_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    ingest_service_->registry().expire(std::chrono::steady_clock::now());
  }
}

void GrpcServer::shutdown() {
  if (sweeper_.joinable()) {
    stop_sweeper_ = true;
    sweeper_.join();
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }
}

void GrpcServer::writeMetrics(PromWriter& w) const {
  auto c = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  w.family("flare_grpc_streams_total", "counter", "Rank streams opened and closed.");
  w.sample("flare_grpc_streams_total", c(counters_.streams_opened), {{"event", "opened"}});
  w.sample("flare_grpc_streams_total", c(counters_.streams_closed), {{"event", "closed"}});
  w.family("flare_grpc_writes_dropped_total", "counter",
           "Messages to ranks dropped because a stream's write queue was full.");
  w.sample("flare_grpc_writes_dropped_total", c(counters_.writes_dropped));
  w.family("flare_grpc_unknown_method_total", "counter", "Calls of methods flared does not serve.");
  w.sample("flare_grpc_unknown_method_total", c(counters_.unknown_method));
  w.family("flare_grpc_streams_refused_total", "counter",
           "Rank streams ended for no accepted hello within --hello-timeout-ms (hello_timeout) or "
           "refused over --max-streams-per-peer (peer_limit).");
  w.sample("flare_grpc_streams_refused_total", c(counters_.hello_timeouts),
           {{"reason", "hello_timeout"}});
  w.sample("flare_grpc_streams_refused_total", c(counters_.peer_limited),
           {{"reason", "peer_limit"}});
}

}  // namespace flare::engine
