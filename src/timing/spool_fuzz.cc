// libFuzzer target: the spool readers on arbitrary file contents — readSpoolFile (flare-export,
// flare-timeline, the replay) and the orphaned-spool uploader's parser (uploadSpoolFile: a
// pending file and its .meta, sent through a fake transport that accepts the hello). Built with
// -DFLARE_FUZZ=ON by clang (tools/fuzz/run.sh); seeds in tests/fuzz/spool/ (real spool files).
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "flare/v1/service.pb.h"
#include "src/records/spool_format.h"
#include "src/timing/spool_upload.h"

namespace {

using flare::timing::Transport;
using flare::timing::TransportStream;

// Answers the hello with an accepted ack, swallows the batches, ends cleanly.
class FakeStream final : public TransportStream {
 public:
  bool write(const std::string&) override { return true; }
  bool read(std::string* bytes) override {
    if (acked_) return false;
    acked_ = true;
    flare::v1::DaemonMessage m;
    m.mutable_ack()->set_accepted(true);
    m.mutable_ack()->set_resume_after_seq(2);
    return m.SerializeToString(bytes);
  }
  void writesDone() override {}
  void cancel() override {}
  std::string finish() override { return ""; }

 private:
  bool acked_ = false;
};

class FakeTransport final : public Transport {
 public:
  std::unique_ptr<TransportStream> open(std::string*) override {
    return std::make_unique<FakeStream>();
  }
};

bool writeFile(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = size == 0 || ::write(fd, data, size) == static_cast<ssize_t>(size);
  ::close(fd);
  return ok;
}

}  // namespace

// protobuf's own error line per bad string would flood the run's log (flared turns it off too).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/flare-spool-fuzz-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    return std::string(d ? d : "/tmp");
  }();
  const std::string pending = dir + "/pending-1.pb";
  // The file as a spool.
  if (!writeFile(pending, data, size)) return 0;
  std::vector<flare::v1::RecordBatch> batches;
  std::string error;
  flare::records::readSpoolFile(pending, &batches, &error);
  // The first half as the .meta, the rest as the pending file: the uploader's parser.
  const size_t half = size / 2;
  if (!writeFile(flare::timing::spoolMetaPath(pending), data, half) ||
      !writeFile(pending, data + half, size - half)) {
    return 0;
  }
  FakeTransport transport;
  flare::timing::SpoolUploadOptions o;
  o.ack_timeout_ms = 1000;
  o.drain_timeout_ms = 1000;
  flare::timing::SpoolUploadResult r;
  flare::timing::uploadSpoolFile(pending, transport, o, &r);
  ::unlink(pending.c_str());
  ::unlink(flare::timing::spoolMetaPath(pending).c_str());
  return 0;
}
