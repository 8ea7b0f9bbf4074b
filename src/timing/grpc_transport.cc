// libflare_exporter.so: the gRPC implementation of transport.h, loaded by libflare_hook.so with
// dlopen(RTLD_LOCAL) only when FLARE_DAEMON is set. It moves opaque byte buffers on the generic
// method "/flare.v1.Ingest/Stream" and contains no protobuf-generated code (see transport.h).
//
// Each open() makes a fresh channel with a private subchannel pool, so a reconnect after the
// daemon restarts is not held back by gRPC's own reconnect backoff (the exporter has its own)
// and never shares a connection with other gRPC users in the process.
#include <grpc/compression.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/sync_stream.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/timing/transport.h"

namespace flare::timing {
namespace {

constexpr char kMethod[] = "/flare.v1.Ingest/Stream";

class GrpcStream final : public TransportStream {
 public:
  GrpcStream(std::shared_ptr<grpc::Channel> channel, const TransportOptions& options)
      : channel_(std::move(channel)), method_(kMethod, grpc::internal::RpcMethod::BIDI_STREAMING) {
    if (options.gzip) context_.set_compression_algorithm(GRPC_COMPRESS_GZIP);
    context_.set_wait_for_ready(false);
    stream_.reset(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel_.get(), method_, &context_));
  }
  ~GrpcStream() override {
    if (!finished_) {
      context_.TryCancel();
      finish();
    }
  }

  bool write(const std::string& bytes) override {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    return stream_->Write(buffer);
  }

  bool read(std::string* bytes) override {
    grpc::ByteBuffer buffer;
    if (!stream_->Read(&buffer)) return false;
    std::vector<grpc::Slice> slices;
    if (!buffer.Dump(&slices).ok()) return false;
    bytes->clear();
    for (const auto& s : slices) bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
    return true;
  }

  void writesDone() override {
    std::lock_guard<std::mutex> lock(finish_mu_);
    if (writes_done_) return;
    writes_done_ = true;
    stream_->WritesDone();
  }

  void cancel() override { context_.TryCancel(); }

  std::string finish() override {
    std::lock_guard<std::mutex> lock(finish_mu_);
    if (finished_) return status_;
    finished_ = true;
    if (!writes_done_) {
      writes_done_ = true;
      stream_->WritesDone();
    }
    grpc::Status st = stream_->Finish();
    if (!st.ok())
      status_ = std::to_string(static_cast<int>(st.error_code())) + ": " + st.error_message();
    return status_;
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::internal::RpcMethod method_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
  std::mutex finish_mu_;
  bool finished_ = false;
  bool writes_done_ = false;
  std::string status_;
};

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(std::string target, const TransportOptions& options)
      : target_(std::move(target)), options_(options) {
    auto copy = [](const char* s) { return s != nullptr ? std::string(s) : std::string(); };
    tls_root_ = copy(options.tls_root_pem);
    tls_cert_ = copy(options.tls_cert_pem);
    tls_key_ = copy(options.tls_key_pem);
    tls_server_name_ = copy(options.tls_server_name);
    // Borrowed pointers do not outlive the create call.
    options_.tls_root_pem = options_.tls_cert_pem = options_.tls_key_pem = nullptr;
    options_.tls_server_name = nullptr;
  }

  std::unique_ptr<TransportStream> open(std::string* error) override {
    try {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
      args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, 64 << 20);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      if (options_.gzip) args.SetCompressionAlgorithm(GRPC_COMPRESS_GZIP);
      std::shared_ptr<grpc::ChannelCredentials> creds;
      if (options_.tls) {
        grpc::SslCredentialsOptions ssl;
        ssl.pem_root_certs = tls_root_;
        ssl.pem_cert_chain = tls_cert_;
        ssl.pem_private_key = tls_key_;
        creds = grpc::SslCredentials(ssl);
        if (!tls_server_name_.empty()) args.SetSslTargetNameOverride(tls_server_name_);
      } else {
        creds = grpc::InsecureChannelCredentials();
      }
      if (!creds) {
        *error = "cannot make TLS credentials";
        return nullptr;
      }
      auto channel = grpc::CreateCustomChannel(target_, creds, args);
      if (!channel) {
        *error = "cannot create a channel to " + target_;
        return nullptr;
      }
      const auto deadline =
          std::chrono::system_clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
      if (!channel->WaitForConnected(deadline)) {
        *error = options_.tls ? "cannot connect to " + target_ +
                                    " over TLS (daemon down, or its certificate does not verify "
                                    "against FLARE_TLS_CA / name FLARE_TLS_SERVER_NAME, or it "
                                    "refused the client certificate)"
                              : "cannot connect to " + target_;
        return nullptr;
      }
      return std::make_unique<GrpcStream>(std::move(channel), options_);
    } catch (const std::exception& e) {
      *error = e.what();
      return nullptr;
    }
  }

 private:
  std::string target_;
  TransportOptions options_;
  std::string tls_root_, tls_cert_, tls_key_, tls_server_name_;
};

}  // namespace
}  // namespace flare::timing

extern "C" __attribute__((visibility("default"))) flare::timing::Transport*
flare_transport_create_v2(const char* target, const flare::timing::TransportOptions* options,
                          char* error, unsigned long error_size) {
  auto fail = [&](const char* why) -> flare::timing::Transport* {
    if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", why);
    return nullptr;
  };
  if (target == nullptr || *target == '\0') return fail("empty daemon address");
  const char* colon = std::strrchr(target, ':');
  if (colon == nullptr || colon[1] == '\0') return fail("daemon address is not host:port");
  const flare::timing::TransportOptions defaults;
  const flare::timing::TransportOptions& o = options != nullptr ? *options : defaults;
  if (o.tls && (o.tls_root_pem == nullptr || *o.tls_root_pem == '\0')) {
    return fail("TLS needs the daemon's root certificate (FLARE_TLS_CA)");
  }
  if (o.tls && ((o.tls_cert_pem == nullptr || *o.tls_cert_pem == '\0') !=
                (o.tls_key_pem == nullptr || *o.tls_key_pem == '\0'))) {
    return fail("FLARE_TLS_CERT and FLARE_TLS_KEY go together");
  }
  try {
    return new flare::timing::GrpcTransport(target, o);
  } catch (...) {
    return fail("out of memory");
  }
}
