// The byte-level transport under the exporter (exporter.h): one bidirectional stream to flared
// carrying serialized flare.v1.RankMessage upward and flare.v1.DaemonMessage downward.
//
// Why bytes: the gRPC implementation lives in its own shared object, libflare_exporter.so
// (grpc_transport.cc), which libflare_hook.so dlopens with RTLD_LOCAL only when FLARE_DAEMON is
// set. That object holds no protobuf-generated code (it moves opaque byte buffers on the
// generic method "/flare.v1.Ingest/Stream"), so the process's protobuf registry never sees a
// second copy of Flare's messages, and the process's global symbol scope never gets Flare's
// gRPC: a Python `grpcio` (or any other gRPC/protobuf copy) imported by the training script
// cannot bind to it, nor Flare to theirs. Encoding and decoding stay in the hook
// (exporter_stream.cc).
//
// The interfaces below are header-only and pure virtual, shared by both sides of the dlopen.
//
// Threading: a TransportStream is used by two threads at once: one writer (write, writesDone,
// finish) and one reader (read). cancel() may be called from any thread, any time before the
// stream is destroyed, and makes pending and later read/write calls return false soon.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace flare::timing {

class TransportStream {
 public:
  virtual ~TransportStream() = default;
  // Blocks until the message is handed to the transport (flow control) or the stream fails.
  virtual bool write(const std::string& bytes) = 0;
  // Blocks until a message arrives; false when the stream has ended or failed.
  virtual bool read(std::string* bytes) = 0;
  // Half-closes (no more writes); blocks until pending writes are done. At most once.
  virtual void writesDone() = 0;
  virtual void cancel() = 0;
  // Half-closes and waits for the final status; returns "" for OK, else "CODE: message".
  // Call after the reader has returned false (or after cancel()).
  virtual std::string finish() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Opens a new stream (the connection is made lazily; a first write or read fails when the
  // daemon cannot be reached). nullptr on immediate failure, with the reason in `error`.
  virtual std::unique_ptr<TransportStream> open(std::string* error) = 0;
};

// Plain data only: it crosses the dlopen boundary. The strings are borrowed for the duration of
// the create call (the transport copies them).
struct TransportOptions {
  bool gzip = true;                   // compress every message with gzip
  int64_t connect_timeout_ms = 1000;  // a stream whose channel is not ready by then fails
  // TLS (FLARE_TLS_*): when tls is set, the daemon's certificate must verify against
  // tls_root_pem (PEM contents, not a path); tls_cert_pem/tls_key_pem, both or neither, are the
  // rank's client certificate; tls_server_name overrides the name checked in the daemon's
  // certificate (default: the host of the target). Never falls back to plaintext.
  bool tls = false;
  const char* tls_root_pem = nullptr;
  const char* tls_cert_pem = nullptr;
  const char* tls_key_pem = nullptr;
  const char* tls_server_name = nullptr;
};

// The C entry point of libflare_exporter.so: a new Transport to `target` ("host:port"), or
// nullptr (with a message in `error`, which the caller owns, of `error_size` bytes).
extern "C" {
using FlareTransportCreateFn = Transport* (*)(const char* target, const TransportOptions* options,
                                              char* error, unsigned long error_size);
}
inline constexpr char kTransportCreateSymbol[] = "flare_transport_create_v2";

// Loads `library` (dlopen RTLD_NOW | RTLD_LOCAL) and creates its Transport to `target`.
// nullptr with the reason in `error` when the library, its symbol or the target is unusable.
// The library stays loaded for the life of the process. Defined in transport_loader.cc.
std::unique_ptr<Transport> loadTransport(const std::string& library, const std::string& target,
                                         const TransportOptions& options, std::string* error);

}  // namespace flare::timing
