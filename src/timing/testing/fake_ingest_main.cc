// flare-fake-ingest: a stand-in for flared's Ingest service, for the rank-side tests
// (tests/python/test_daemon_stream.py) until the real daemon is merged.
//
//   flare-fake-ingest --out DIR [--port N] [--token T] [--resume 0|1]
//
// Accepts streams (the hello's token must equal T when given; otherwise HelloAck accepted=false
// and the stream ends UNAUTHENTICATED), writes every batch it receives to
// DIR/<job>/<rank>/records-<pid>.pb (the spool layout, so flare-export reads it), once per
// (job, rank, pid, batch_seq): re-sent batches are counted as duplicates and dropped, like the
// daemon does. Its HelloAck carries resume_after_seq (the highest batch_seq it holds for the
// hello's pid), so a restarted fake gets no duplicates; --resume 0 leaves it 0. Prints "port N" on
// stdout once listening; one line per hello and per stream end on stderr. Runs until
// SIGTERM/SIGINT.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flare/v1/protocol.h"
#include "flare/v1/service.grpc.pb.h"
#include "src/records/spool_format.h"

namespace {

// Truncates `path` after its last complete length-delimited record.
void truncatePartialTail(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return;
  uint64_t good = 0;
  for (;;) {
    uint64_t length = 0;
    int shift = 0, c = 0;
    while ((c = std::fgetc(f)) != EOF) {
      length |= static_cast<uint64_t>(c & 0x7f) << shift;
      if ((c & 0x80) == 0 || (shift += 7) > 63) break;
    }
    if (c == EOF || length > (64ull << 20) ||
        std::fseek(f, static_cast<long>(length), SEEK_CUR) != 0)
      break;
    const long end = std::ftell(f);
    std::fseek(f, 0, SEEK_END);
    if (end > std::ftell(f)) break;  // the record runs past the end of the file
    std::fseek(f, end, SEEK_SET);
    good = static_cast<uint64_t>(end);
  }
  std::fclose(f);
  if (::truncate(path.c_str(), static_cast<off_t>(good)) != 0) {
    std::fprintf(stderr, "fake-ingest: cannot truncate %s\n", path.c_str());
  }
}

class Ingest final : public flare::v1::Ingest::Service {
 public:
  Ingest(std::string out, std::string token, bool resume)
      : out_(std::move(out)), token_(std::move(token)), resume_(resume) {
    // A restart remembers what it already holds (like a daemon with a store), so batches the
    // ranks re-send after the broken stream are recognised as duplicates.
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(out_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      const auto& p = it->path();
      const std::string name = p.filename().string();
      if (name.rfind("records-", 0) != 0 || p.extension() != ".pb") continue;
      const int pid = std::atoi(name.c_str() + 8);
      const int rank = std::atoi(p.parent_path().filename().c_str());
      const std::string job = p.parent_path().parent_path().filename().string();
      std::vector<flare::v1::RecordBatch> batches;
      std::string error;
      flare::records::readSpoolFile(p.string(), &batches, &error);
      for (const auto& b : batches) seen_.insert(std::make_tuple(job, rank, pid, b.batch_seq()));
    }
  }

  grpc::Status Stream(
      grpc::ServerContext* /*ctx*/,
      grpc::ServerReaderWriter<flare::v1::DaemonMessage, flare::v1::RankMessage>* rw) override {
    flare::v1::RankMessage m;
    if (!rw->Read(&m) || !m.has_hello()) return {grpc::StatusCode::INVALID_ARGUMENT, "no hello"};
    const flare::v1::RankHello h = m.hello();
    const bool ok = token_.empty() || h.token() == token_;
    std::fprintf(stderr, "hello job=%s rank=%d pid=%d %s\n", h.job_id().c_str(), h.rank(), h.pid(),
                 ok ? "accepted" : "refused");
    flare::v1::DaemonMessage ack;
    ack.mutable_ack()->set_protocol_version(flare::v1::kProtocolVersion);
    ack.mutable_ack()->set_accepted(ok);
    {
      // What this fake holds is on disk: tell the rank where to resume.
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t held = 0;
      for (const auto& k : seen_) {
        if (std::get<0>(k) == h.job_id() && std::get<1>(k) == h.rank() && std::get<2>(k) == h.pid())
          held = std::max(held, std::get<3>(k));
      }
      if (resume_) ack.mutable_ack()->set_resume_after_seq(held);
    }
    if (!ok) ack.mutable_ack()->set_error("wrong token");
    rw->Write(ack);
    if (!ok) return {grpc::StatusCode::UNAUTHENTICATED, "wrong token"};
    const std::filesystem::path dir =
        std::filesystem::path(out_) / h.job_id() / std::to_string(h.rank());
    std::filesystem::create_directories(dir);
    const std::string path = (dir / ("records-" + std::to_string(h.pid()) + ".pb")).string();
    // A previous instance killed in the middle of a write(2) (SIGKILL can cut a regular-file
    // write short) leaves a partial last batch: cut it off before appending, as a daemon
    // recovering its log would, so that the file stays a valid sequence of batches.
    truncatePartialTail(path);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    uint64_t batches = 0, dups = 0;
    while (rw->Read(&m)) {
      if (!m.has_batch()) continue;
      std::lock_guard<std::mutex> lock(mu_);
      auto key = std::make_tuple(h.job_id(), h.rank(), h.pid(), m.batch().batch_seq());
      if (!seen_.insert(key).second) {
        ++dups;
        continue;
      }
      std::string bytes;
      uint64_t size = m.batch().ByteSizeLong();
      while (size >= 0x80) {
        bytes += static_cast<char>((size & 0x7f) | 0x80);
        size >>= 7;
      }
      bytes += static_cast<char>(size);
      m.batch().AppendToString(&bytes);
      if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) break;
      ++batches;
    }
    ::close(fd);
    std::fprintf(stderr, "end job=%s rank=%d pid=%d batches=%llu duplicates=%llu\n",
                 h.job_id().c_str(), h.rank(), h.pid(), static_cast<unsigned long long>(batches),
                 static_cast<unsigned long long>(dups));
    return grpc::Status::OK;
  }

 private:
  std::string out_, token_;
  bool resume_;
  std::mutex mu_;
  std::set<std::tuple<std::string, int, int, uint64_t>> seen_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string out, token;
  int port = 0;
  bool resume = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--out")
      out = argv[i + 1];
    else if (a == "--port")
      port = std::atoi(argv[i + 1]);
    else if (a == "--token")
      token = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "usage: flare-fake-ingest --out DIR [--port N] [--token T]\n");
    return 2;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // gRPC's threads inherit it
  Ingest service(out, token, resume);
  grpc::ServerBuilder b;
  int selected = 0;
  b.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                     &selected);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  if (!server || selected == 0) {
    std::fprintf(stderr, "cannot listen on port %d\n", port);
    return 1;
  }
  std::printf("port %d\n", selected);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  return 0;
}
