// flare-loadgen: opens many rank streams to one flared from one process (gRPC callback client)
// and sends realistic batches, then reports what the daemon accepted (from its /metrics) and
// its memory (VmRSS from /proc). See docs/benchmarks.md for the figures and commands.
//
// Cheap on the client: every batch is a small per-rank header plus blocks serialized once and
// shared by all streams (generic byte-buffer stubs), and --procs forks several generators.
//
//   summary mode: every rank sends one batch per --interval-ms: --sigs kernel summaries (two
//                 clusters each), the step's statistics (issue-latency sketch of --ops-per-step
//                 ops, two host causes), a step marker and drop counters; signatures in the
//                 first batch.
//   raw mode:     every rank sends batches of --records-per-batch kernel records back to back
//                 (one write in flight per stream).
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "flare/v1/protocol.h"
#include "flare/v1/service.grpc.pb.h"
#include "src/engine/load_shape.h"

namespace {

using namespace flare;
namespace load = flare::engine::load;

int64_t wallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Options {
  std::string target = "127.0.0.1:7070";
  int http_port = 9464;
  int ranks = 1000;
  int jobs = 1;
  std::string mode = "summary";
  int interval_ms = 1000;
  int records_per_batch = 1000;
  int sigs = 50;
  int ops_per_step = 1000;  // summary mode: ops in each step's statistics (0: none sent)
  int duration_s = 20;
  int warmup_s = 5;
  int channels = 0;  // 0: one per 100 streams
  int daemon_pid = 0;
  std::string token;
  int procs = 1;       // generator processes (forked before any gRPC use)
  int proc_index = 0;  // this process's index (pids and rank ranges differ per process)
};

std::atomic<uint64_t> g_acks{0}, g_refused{0}, g_rejected{0}, g_batches{0}, g_errors{0};

// The big parts of every batch, serialized once and shared (grpc::Slice is reference-counted, so
// every stream's write points at the same bytes): the signatures (first batch of a stream), the
// summaries of the current interval (rebuilt once per tick: only their window times change) and
// the kernel records (rebuilt every 100 ms in raw mode). A RecordBatch holding only those fields
// serializes to exactly their field entries, which may follow any other fields of the batch.
struct Blocks {
  grpc::Slice signatures;
  grpc::Slice body;  // summaries (+ nothing else) or kernels
  size_t body_items = 0;
};

std::string serialized(const v1::RecordBatch& b) {
  std::string out;
  b.SerializeToString(&out);
  return out;
}

grpc::Slice signaturesBlock(const Options& o) {
  v1::RecordBatch b;
  load::addSignatures(&b, o.sigs);
  return grpc::Slice(serialized(b));
}

std::shared_ptr<const Blocks> makeBlocks(const Options& o, const grpc::Slice& sigs) {
  auto blocks = std::make_shared<Blocks>();
  blocks->signatures = sigs;
  const int64_t now = wallNs();
  v1::RecordBatch b;
  if (o.mode == "raw") {
    for (int i = 0; i < o.records_per_batch; ++i) {
      v1::KernelRecord* k = b.add_kernels();
      k->set_signature_id(static_cast<uint32_t>(1 + i % o.sigs));
      k->set_stream_id(7);
      k->set_correlation_id(static_cast<uint64_t>(i));
      k->set_thread_id(1234);
      const int64_t start = now - 1000000000 + i * 1000;
      k->set_issue_ns(start - 20000);
      k->set_start_ns(start);
      k->set_end_ns(start + 800 + (i % 17) * 50);
      k->set_issue_latency_ns(20000);
    }
    blocks->body_items = static_cast<size_t>(o.records_per_batch);
  } else {
    blocks->body_items = static_cast<size_t>(
        load::addSummaryInterval(&b, o.sigs, o.ops_per_step, now, o.interval_ms * 1000000LL));
  }
  blocks->body = grpc::Slice(serialized(b));
  return blocks;
}

std::mutex g_blocks_mu;
std::shared_ptr<const Blocks> g_blocks;  // guarded by g_blocks_mu

std::shared_ptr<const Blocks> currentBlocks() {
  std::lock_guard lock(g_blocks_mu);
  return g_blocks;
}
void setBlocks(std::shared_ptr<const Blocks> b) {
  std::lock_guard lock(g_blocks_mu);
  g_blocks = std::move(b);
}

void putVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

const std::string kStreamMethod = "/flare.v1.Ingest/Stream";

// One rank: a generic (byte-buffer) bidirectional stream; each batch is a small per-rank header
// (rank, seq, time, step, drops) encoded here plus the shared blocks, no copy of those.
class RankStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RankStream(grpc::GenericStub* stub, const Options& o, const std::string& job, int rank, int world)
      : o_(o), rank_(rank) {
    v1::RankMessage hello;
    v1::RankHello* h = hello.mutable_hello();
    h->set_protocol_version(v1::kProtocolVersion);
    h->set_job_id(job);
    h->set_rank(rank);
    h->set_world_size(world);
    h->set_local_rank(rank % 8);
    h->set_host("loadgen-host" + std::to_string(rank / 8));
    h->set_pid(100000 + rank + 1000000 * o.proc_index);
    h->set_token(o.token);
    h->set_start_time_unix_ns(wallNs());
    h->set_mode(o.mode == "raw" ? v1::MODE_RAW : v1::MODE_SUMMARY);
    std::string bytes;
    hello.SerializeToString(&bytes);
    grpc::Slice hs(bytes);
    out_ = grpc::ByteBuffer(&hs, 1);
    stub->PrepareBidiStreamingCall(&ctx_, kStreamMethod, grpc::StubOptions(), this);
    StartRead(&in_);
    writing_ = true;
    StartWrite(&out_);
    StartCall();
  }

  // Driver thread: sends the next batch if the previous write is done.
  void maybeSend() {
    {
      std::lock_guard lock(mu_);
      if (writing_ || done_) return;
      writing_ = true;
    }
    buildBatch();
    StartWrite(&out_);
  }
  bool raw() const { return o_.mode == "raw"; }
  void stop() {
    std::lock_guard lock(mu_);
    if (!done_ && !writes_done_) {
      writes_done_ = true;
      if (!writing_) StartWritesDone();
    }
  }
  void waitDone() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      g_errors.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mu_);
      writing_ = false;
      return;
    }
    if (seq_ > 0) g_batches.fetch_add(1, std::memory_order_relaxed);
    bool again = false;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (writes_done_) {
        StartWritesDone();
        return;
      }
      again = raw();  // raw mode: a closed loop, the next batch as soon as one is written
      if (again) writing_ = true;
    }
    if (again) {
      buildBatch();
      StartWrite(&out_);
    }
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    v1::DaemonMessage msg;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (in_.Dump(&slices).ok()) {
      for (const auto& sl : slices)
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    if (msg.ParseFromString(bytes)) {
      if (msg.has_ack()) {
        (msg.ack().accepted() ? g_acks : g_refused).fetch_add(1, std::memory_order_relaxed);
      } else if (msg.has_rejected()) {
        g_rejected.fetch_add(1, std::memory_order_relaxed);
      }
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    if (!s.ok()) g_errors.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

 private:
  void buildBatch() {
    ++seq_;
    const std::shared_ptr<const Blocks> blocks = currentBlocks();
    const int64_t now = wallNs();
    header_.Clear();
    header_.set_rank(rank_);
    header_.set_batch_seq(seq_);
    header_.set_created_ns(now);
    if (!raw()) {
      load::addStepMarker(&header_, seq_, now, o_.interval_ms * 1000000LL);
      header_.mutable_drops()->set_ring_full(seq_ / 100);
    }
    std::string fields;
    header_.SerializeToString(&fields);
    const bool first = seq_ == 1;
    const size_t len =
        fields.size() + blocks->body.size() + (first ? blocks->signatures.size() : 0);
    std::string head;
    head.push_back(static_cast<char>(0x12));  // RankMessage.batch, length-delimited
    putVarint(&head, len);
    head += fields;
    grpc::Slice parts[3] = {grpc::Slice(head), blocks->body, blocks->signatures};
    out_ = grpc::ByteBuffer(parts, first ? 3 : 2);
  }

  const Options& o_;
  int rank_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  v1::RecordBatch header_;
  uint64_t seq_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false;
  bool writes_done_ = false;
  bool done_ = false;
};

std::string httpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  std::string out;
  timeval tv{30, 0};  // a daemon that does not answer within 30 s: an empty scrape, not a hang
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
    send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[65536];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

double metric(const std::string& text, const std::string& series) {
  const size_t p = text.find("\n" + series + " ");
  return p == std::string::npos ? 0 : std::stod(text.substr(p + series.size() + 2));
}

struct Sample {
  double kernels = 0, summarized = 0, batches = 0, rejected = 0, rejected_rate = 0,
         store_dropped = 0, raw_dropped = 0, hellos = 0;
};
Sample scrape(int port) {
  const std::string m = httpGet(port, "/metrics");
  Sample s;
  s.kernels = metric(m, "flare_ingest_records_total{type=\"kernel\"}");
  s.summarized = metric(m, "flare_ingest_summarized_kernels_total");
  s.batches = metric(m, "flare_ingest_batches_total");
  s.rejected_rate = metric(m, "flare_ingest_rejected_total{reason=\"rate_limited\"}");
  s.store_dropped = metric(m, "flare_store_dropped_total");
  s.raw_dropped = metric(m, "flare_ingest_raw_dropped_total");
  s.hellos = metric(m, "flare_ingest_hellos_accepted_total");
  // Every refusal, whatever the reason.
  for (size_t p = m.find("\nflare_ingest_rejected_total{"); p != std::string::npos;
       p = m.find("\nflare_ingest_rejected_total{", p + 1)) {
    const size_t sp = m.find("} ", p);
    if (sp != std::string::npos) s.rejected += std::stod(m.substr(sp + 2));
  }
  return s;
}

long rssKb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

// utime + stime of a process, in seconds.
double cpuSeconds(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// One generator process: opens its share of the streams, writes "connected A R\n" to `ready`,
// sends until `stop` is closed by the parent, then writes "done W E J\n" (batches written,
// stream errors, batch rejections) to `ready`.
int generate(const Options& o, int first_rank, int count, int ready, int stop_fd) {
  const int nch = o.channels > 0 ? std::max(1, o.channels / o.procs) : std::max(1, count / 100);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int c = 0; c < nch; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("flare.loadgen.channel", c);  // distinct subchannels: one connection each
    args.SetMaxSendMessageSize(64 << 20);
    channels.push_back(
        grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(std::make_unique<grpc::GenericStub>(channels.back()));
  }
  const grpc::Slice sigs = signaturesBlock(o);
  setBlocks(makeBlocks(o, sigs));
  const int per_job = std::max(1, o.ranks / std::max(1, o.jobs));
  std::vector<std::unique_ptr<RankStream>> streams;
  const auto t_connect = std::chrono::steady_clock::now();
  for (int r = first_rank; r < first_rank + count; ++r) {
    const int job = r / per_job;
    streams.push_back(std::make_unique<RankStream>(
        stubs[r % nch].get(), o, "loadgen-" + std::to_string(job), r % per_job, per_job));
  }
  while (g_acks + g_refused < static_cast<uint64_t>(count) &&
         std::chrono::steady_clock::now() - t_connect < std::chrono::seconds(120)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string line = "connected " + std::to_string(g_acks.load()) + " " +
                           std::to_string(g_refused.load()) + " " + std::to_string(nch) + "\n";
  if (write(ready, line.data(), line.size()) < 0) return 1;

  std::atomic<bool> stop{false};
  std::thread driver([&] {
    auto next = std::chrono::steady_clock::now();
    while (!stop) {
      if (o.mode == "raw") {
        // The closed loop runs in OnWriteDone; fresh record times every 100 ms.
        setBlocks(makeBlocks(o, sigs));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      setBlocks(makeBlocks(o, sigs));  // this interval's window times, shared by every rank
      for (auto& s : streams) s->maybeSend();
      next += std::chrono::milliseconds(o.interval_ms);
      std::this_thread::sleep_until(next);
    }
  });
  char c;
  while (read(stop_fd, &c, 1) > 0) {
  }
  stop = true;
  driver.join();
  for (auto& s : streams) s->stop();
  for (auto& s : streams) s->waitDone();
  const std::string done = "done " + std::to_string(g_batches.load()) + " " +
                           std::to_string(g_errors.load()) + " " +
                           std::to_string(g_rejected.load()) + "\n";
  return write(ready, done.data(), done.size()) < 0 ? 1 : 0;
}

// Reads one line from fd (blocking); "" at end of file.
std::string readLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1) {
    if (c == '\n') return line;
    line.push_back(c);
  }
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc || (i < argc && std::string(argv[i]) == "--help"); i += 2) {
    const std::string k = argv[i];
    if (k == "--help") {
      std::printf(
          "usage: flare-loadgen [--target HOST:PORT] [--http-port P] [--ranks N] [--jobs J]\n"
          "  [--mode summary|raw] [--interval-ms MS] [--records-per-batch K] [--sigs S]\n"
          "  [--ops-per-step N]\n"
          "  [--duration-s D] [--warmup-s W] [--channels C] [--daemon-pid PID] [--token T]\n"
          "  [--procs P]   (P generator processes share the ranks; default 1)\n");
      return 0;
    }
    const std::string v = argv[i + 1];
    int* num = nullptr;
    if (k == "--target")
      o.target = v;
    else if (k == "--mode")
      o.mode = v;
    else if (k == "--token")
      o.token = v;
    else if (k == "--http-port")
      num = &o.http_port;
    else if (k == "--ranks")
      num = &o.ranks;
    else if (k == "--jobs")
      num = &o.jobs;
    else if (k == "--interval-ms")
      num = &o.interval_ms;
    else if (k == "--records-per-batch")
      num = &o.records_per_batch;
    else if (k == "--ops-per-step")
      num = &o.ops_per_step;
    else if (k == "--sigs")
      num = &o.sigs;
    else if (k == "--duration-s")
      num = &o.duration_s;
    else if (k == "--warmup-s")
      num = &o.warmup_s;
    else if (k == "--channels")
      num = &o.channels;
    else if (k == "--daemon-pid")
      num = &o.daemon_pid;
    else if (k == "--procs")
      num = &o.procs;
    else {
      std::fprintf(stderr, "flare-loadgen: unknown flag %s\n", k.c_str());
      return 2;
    }
    if (num != nullptr) {
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0 || n > 10000000) {
        std::fprintf(stderr, "flare-loadgen: %s needs a non-negative integer, not '%s'\n",
                     k.c_str(), v.c_str());
        return 2;
      }
      *num = static_cast<int>(n);
    }
  }
  if (o.mode != "summary" && o.mode != "raw") {
    std::fprintf(stderr, "flare-loadgen: --mode is summary or raw\n");
    return 2;
  }
  if (o.ranks < 1 || o.procs < 1 || o.procs > o.ranks || o.sigs < 1 || o.interval_ms < 1) {
    std::fprintf(stderr, "flare-loadgen: need --ranks >= --procs >= 1, --sigs >= 1\n");
    return 2;
  }
  const long rss0 = o.daemon_pid ? rssKb(o.daemon_pid) : 0;
  const Sample start = scrape(o.http_port);

  // Generator processes, forked before any gRPC use in this one (it only scrapes over HTTP).
  struct Child {
    pid_t pid;
    int ready;
    int stop;
  };
  std::vector<Child> children;
  for (int p = 0; p < o.procs; ++p) {
    int ready[2], stop[2];
    if (pipe(ready) != 0 || pipe(stop) != 0) return 1;
    const int first = o.ranks * p / o.procs;
    const int count = o.ranks * (p + 1) / o.procs - first;
    const pid_t pid = fork();
    if (pid == 0) {
      close(ready[0]);
      close(stop[1]);
      for (const Child& c : children) {
        close(c.ready);
        close(c.stop);
      }
      Options mine = o;
      mine.proc_index = p;
      _exit(generate(mine, first, count, ready[1], stop[0]));
    }
    close(ready[1]);
    close(stop[0]);
    children.push_back({pid, ready[0], stop[1]});
  }
  const auto t_connect = std::chrono::steady_clock::now();
  uint64_t accepted = 0, refused = 0, nch = 0;
  for (const Child& c : children) {
    unsigned long long a = 0, r = 0, n = 0;
    std::sscanf(readLine(c.ready).c_str(), "connected %llu %llu %llu", &a, &r, &n);
    accepted += a;
    refused += r;
    nch += n;
  }
  const double connect_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_connect).count();
  std::printf("connected: %llu accepted, %llu refused in %.1f s over %llu channels, %d process%s\n",
              static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(refused),
              connect_s, static_cast<unsigned long long>(nch), o.procs, o.procs > 1 ? "es" : "");
  std::fflush(stdout);

  std::this_thread::sleep_for(std::chrono::seconds(o.warmup_s));
  const Sample a = scrape(o.http_port);
  const double cpu_a = o.daemon_pid ? cpuSeconds(o.daemon_pid) : 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(o.duration_s));
  const Sample b = scrape(o.http_port);
  const double cpu_b = o.daemon_pid ? cpuSeconds(o.daemon_pid) : 0;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long rss1 = o.daemon_pid ? rssKb(o.daemon_pid) : 0;
  uint64_t written = 0, errors = 0, rejections = 0;
  for (const Child& c : children) close(c.stop);  // the generators stop and report
  for (const Child& c : children) {
    unsigned long long w = 0, e = 0, j = 0;
    std::sscanf(readLine(c.ready).c_str(), "done %llu %llu %llu", &w, &e, &j);
    written += w;
    errors += e;
    rejections += j;
    close(c.ready);
    waitpid(c.pid, nullptr, 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the daemon reads the last ones
  const Sample end = scrape(o.http_port);

  const double kernels_s = (b.kernels - a.kernels) / dt;
  const double summarized_s = (b.summarized - a.summarized) / dt;
  const double batches_s = (b.batches - a.batches) / dt;
  std::printf("mode=%s ranks=%d sigs=%d window=%.1fs\n", o.mode.c_str(), o.ranks, o.sigs, dt);
  std::printf("daemon accepted: %.0f batches/s, %.0f kernel records/s, %.0f summarized kernels/s\n",
              batches_s, kernels_s, summarized_s);
  std::printf(
      "daemon rejected (rate limit) during window: %.0f; store dropped: %.0f; raw not "
      "stored: %.0f\n",
      b.rejected_rate - a.rejected_rate, b.store_dropped - a.store_dropped,
      b.raw_dropped - a.raw_dropped);
  std::printf("client: %llu batches written, %llu batch rejections, %llu stream errors\n",
              static_cast<unsigned long long>(written), static_cast<unsigned long long>(rejections),
              static_cast<unsigned long long>(errors));
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  const double gen_cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  std::printf("generator CPU (whole run, %d process%s): %.2f s, %.1f us per batch written\n",
              o.procs, o.procs > 1 ? "es" : "", gen_cpu,
              written > 0 ? gen_cpu / static_cast<double>(written) * 1e6 : 0.0);
  const double accepted_total = end.batches - start.batches;
  std::printf("whole run: daemon accepted %.0f of %llu batches written (%s), refused %.0f\n",
              accepted_total, static_cast<unsigned long long>(written),
              accepted_total == static_cast<double>(written) ? "all" : "NOT all",
              end.rejected - start.rejected);
  if (o.daemon_pid) {
    const double cpu = cpu_b - cpu_a;
    const double nb = b.batches - a.batches;
    std::printf("daemon CPU in window: %.2f s of %.1f s (%.0f%% of a core), %.1f us per batch", cpu,
                dt, 100 * cpu / dt, nb > 0 ? cpu / nb * 1e6 : 0.0);
    const double nk = (b.kernels - a.kernels);
    if (nk > 0) std::printf(", %.0f ns per kernel record", cpu / nk * 1e9);
    std::printf("\n");
    std::printf("daemon RSS: %.1f MiB before, %.1f MiB with %d ranks: %.1f KiB per rank\n",
                rss0 / 1024.0, rss1 / 1024.0, o.ranks, static_cast<double>(rss1 - rss0) / o.ranks);
  }
  return 0;
}
