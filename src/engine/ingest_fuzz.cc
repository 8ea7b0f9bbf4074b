// libFuzzer target: the ingest decoder and validator (Ingest::decode, hello, batch, report) on
// arbitrary bytes. Built with -DFLARE_FUZZ=ON by clang; ctest runs it for a fixed number of
// inputs (engine_ingest_fuzz_smoke). Run longer: build/bin/flare_ingest_fuzz -max_total_time=60
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/engine/ingest.h"
#include "src/engine/test_util.h"

namespace {

using namespace flare;
using namespace flare::engine;

class NullChannel : public CommandChannel {
 public:
  bool send(const v1::DaemonMessage&) override { return true; }
  void close(Code, const std::string&) override {}
};

}  // namespace

// protobuf's own error line per bad string would flood the run's log (flared turns it off too).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static common::FakeClock clock(testing::kNow);
  IngestConfig cfg;
  cfg.max_message_bytes = 1 << 20;
  cfg.rank_rate_limit = 1e6;
  Ingest ingest(cfg, nullptr, clock);
  auto ch = std::make_shared<NullChannel>();
  const auto hello = ingest.hello(testing::makeHello("fuzz", 0, 4), ch);
  // A valid signature table first, so that records referring to ids 1-2 get past the lookup.
  v1::RecordBatch seed;
  seed.set_rank(0);
  *seed.add_signatures() = testing::gemmSig(1, 64, 64, 64);
  *seed.add_signatures() = testing::allReduceSig(2, 1 << 20);
  ingest.batch(hello.session_id, seed);

  v1::RankMessage msg;
  if (ingest.decode(data, size, &msg).ok()) {
    if (msg.has_hello()) ingest.hello(msg.hello(), ch);
    if (msg.has_batch()) ingest.batch(hello.session_id, msg.batch());
    if (msg.has_command_result()) ingest.commandResult(hello.session_id, msg.command_result());
    if (msg.has_hang_report()) ingest.hangReport(hello.session_id, msg.hang_report());
  }
  // The same bytes as a bare batch of this rank.
  v1::RecordBatch b;
  if (size < (1u << 20) && b.ParseFromArray(data, static_cast<int>(size))) {
    b.set_rank(0);
    ingest.batch(hello.session_id, b);
  }
  v1::GetReportRequest req;
  req.set_job_id("fuzz");
  v1::GetReportResponse out;
  ingest.report(req, &out);
  v1::ListRanksRequest lr;
  lr.set_job_id("fuzz");
  v1::ListRanksResponse ranks;
  ingest.ranks(lr, &ranks);
  return 0;
}
