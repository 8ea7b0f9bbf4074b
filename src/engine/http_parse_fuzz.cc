// libFuzzer target: the HTTP request-head parser (HttpServer::parseHead, urlDecode) and the
// token check in front of the routes (QueryApi::http with tokens configured: every request is
// answered 401/403 or routed without crashing). Built with -DFLARE_FUZZ=ON by clang
// (tools/fuzz/run.sh, `make fuzz-test`); seeds in tests/fuzz/http_parse/.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "src/common/clock.h"
#include "src/engine/api.h"
#include "src/engine/http_server.h"
#include "src/engine/ingest.h"

using namespace flare;
using namespace flare::engine;

// protobuf's own error line per bad string would flood the run's log (flared turns it off too).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static common::FakeClock clock(1795305600LL * 1000000000LL);
  static Ingest ingest(IngestConfig{}, nullptr, clock);
  static QueryApi* api = [] {
    auto* a = new QueryApi(ingest, nullptr, [] { return std::string("flare_up 1\n"); });
    TokenSet t;
    std::string err;
    parseTokenFile("jobA tokA\n* tokAny\n[operator] tokOp\n", "fuzz", &t, &err);
    a->setTokens(t);
    return a;
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The head ends before the blank line, as the server hands it over.
  const size_t end = text.find("\r\n\r\n");
  const std::string head = end == std::string::npos ? text : text.substr(0, end);
  HttpRequest req;
  size_t content_length = 0;
  std::string why;
  const int status = HttpServer::parseHead(head, 1 << 20, &req, &content_length, &why);
  if (status == 0) {
    if (end != std::string::npos) req.body = text.substr(end + 4, content_length);
    const HttpResponse r = api->http(req);
    if (r.status < 100 || r.status > 599) __builtin_trap();
  } else if (status != 400 && status != 413) {
    __builtin_trap();
  }
  std::string decoded;
  HttpServer::urlDecode(text, &decoded);
  return 0;
}
