// flare-loadgen: opens many rank streams to one flared from one process (gRPC callback client)
// and sends realistic batches, then reports what the daemon accepted (from its /metrics) and
// its memory (VmRSS from /proc). See docs/benchmarks.md for the figures and commands.
//
//   summary mode: every rank sends one batch per --interval-ms: --sigs kernel summaries (two
//                 clusters each), a step marker and drop counters; signatures in the first batch.
//   raw mode:     every rank sends batches of --records-per-batch kernel records back to back
//                 (one write in flight per stream).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flare/v1/protocol.h"
#include "flare/v1/service.grpc.pb.h"

namespace {

using namespace flare;

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
  int duration_s = 20;
  int warmup_s = 5;
  int channels = 0;  // 0: one per 100 streams
  int daemon_pid = 0;
  std::string token;
};

std::atomic<uint64_t> g_acks{0}, g_refused{0}, g_rejected{0}, g_batches{0}, g_errors{0};

class RankStream final : public grpc::ClientBidiReactor<v1::RankMessage, v1::DaemonMessage> {
 public:
  RankStream(v1::Ingest::Stub* stub, const Options& o, const std::string& job, int rank, int world)
      : o_(o), rank_(rank) {
    *hello_.mutable_hello() = [&] {
      v1::RankHello h;
      h.set_protocol_version(v1::kProtocolVersion);
      h.set_job_id(job);
      h.set_rank(rank);
      h.set_world_size(world);
      h.set_local_rank(rank % 8);
      h.set_host("loadgen-host" + std::to_string(rank / 8));
      h.set_pid(100000 + rank);
      h.set_token(o.token);
      h.set_start_time_unix_ns(wallNs());
      h.set_mode(o.mode == "raw" ? v1::MODE_RAW : v1::MODE_SUMMARY);
      return h;
    }();
    stub->async()->Stream(&ctx_, this);
    StartRead(&in_);
    writing_ = true;
    StartWrite(&hello_);
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
  bool done() {
    std::lock_guard lock(mu_);
    return done_;
  }
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
    if (in_.has_ack()) {
      (in_.ack().accepted() ? g_acks : g_refused).fetch_add(1, std::memory_order_relaxed);
    } else if (in_.has_rejected()) {
      g_rejected.fetch_add(1, std::memory_order_relaxed);
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
    v1::RecordBatch* b = out_.mutable_batch();
    const int64_t now = wallNs();
    if (seq_ == 1) {
      b->set_rank(rank_);
      for (int s = 1; s <= o_.sigs; ++s) {
        v1::Signature* sig = b->add_signatures();
        sig->set_id(static_cast<uint32_t>(s));
        sig->set_name(s % 5 == 0 ? "ncclAllReduce" : "ampere_bf16_s16816gemm_128x128");
        sig->set_kind(s % 5 == 0 ? v1::OP_KIND_COLLECTIVE : v1::OP_KIND_GEMM);
        sig->set_dtype(v1::DTYPE_BF16);
        for (int64_t d : {int64_t{1}, int64_t{4096}, int64_t{128} * s, int64_t{4096}})
          sig->add_shape(d);
        sig->set_flops_per_call(2ull * 4096 * 128 * static_cast<uint64_t>(s) * 4096);
        if (s % 5 == 0) {
          sig->set_collective(v1::COLLECTIVE_KIND_ALL_REDUCE);
          sig->set_bytes_per_call(64ull << 20);
        }
      }
    } else if (seq_ == 2) {
      b->clear_signatures();
    }
    b->set_batch_seq(seq_);
    b->set_created_ns(now);
    if (raw()) {
      if (b->kernels_size() == 0) {
        for (int i = 0; i < o_.records_per_batch; ++i) {
          v1::KernelRecord* k = b->add_kernels();
          k->set_signature_id(static_cast<uint32_t>(1 + i % o_.sigs));
          k->set_stream_id(7);
          k->set_correlation_id(static_cast<uint64_t>(i));
          k->set_thread_id(1234);
        }
      }
      for (int i = 0; i < b->kernels_size(); ++i) {
        v1::KernelRecord* k = b->mutable_kernels(i);
        const int64_t start = now - 1000000000 + i * 1000;
        k->set_issue_ns(start - 20000);
        k->set_start_ns(start);
        k->set_end_ns(start + 800 + (i % 17) * 50);
        k->set_issue_latency_ns(20000);
      }
    } else {
      if (b->summaries_size() == 0) {
        for (int s = 1; s <= o_.sigs; ++s) {
          v1::KernelSummary* sm = b->add_summaries();
          sm->set_signature_id(static_cast<uint32_t>(s));
          sm->set_stream_id(7);
          for (int c = 0; c < 2; ++c) {
            auto* cl = sm->add_clusters();
            cl->set_count(c == 0 ? 190 : 10);
            cl->set_p50_ns(100000 * (c + 1) + s * 100);
            cl->set_p99_ns(130000 * (c + 1) + s * 100);
            cl->set_sum_ns(cl->count() * cl->p50_ns());
          }
        }
        b->add_steps()->set_samples(1024);
      }
      for (auto& sm : *b->mutable_summaries()) {
        sm.set_window_start_ns(now - o_.interval_ms * 1000000LL);
        sm.set_window_end_ns(now);
      }
      v1::StepMarker* st = b->mutable_steps(0);
      st->set_step(seq_);
      st->set_start_ns(now - o_.interval_ms * 1000000LL);
      st->set_end_ns(now);
      b->mutable_drops()->set_ring_full(seq_ / 100);
    }
  }

  const Options& o_;
  int rank_;
  grpc::ClientContext ctx_;
  v1::RankMessage hello_;
  v1::RankMessage out_;
  v1::DaemonMessage in_;
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
  double kernels = 0, summarized = 0, batches = 0, rejected_rate = 0, store_dropped = 0;
};
Sample scrape(int port) {
  const std::string m = httpGet(port, "/metrics");
  Sample s;
  s.kernels = metric(m, "flare_ingest_records_total{type=\"kernel\"}");
  s.summarized = metric(m, "flare_ingest_summarized_kernels_total");
  s.batches = metric(m, "flare_ingest_batches_total");
  s.rejected_rate = metric(m, "flare_ingest_rejected_total{reason=\"rate_limited\"}");
  s.store_dropped = metric(m, "flare_store_dropped_total");
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

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc || (i < argc && std::string(argv[i]) == "--help"); i += 2) {
    const std::string k = argv[i];
    if (k == "--help") {
      std::printf(
          "usage: flare-loadgen [--target HOST:PORT] [--http-port P] [--ranks N] [--jobs J]\n"
          "  [--mode summary|raw] [--interval-ms MS] [--records-per-batch K] [--sigs S]\n"
          "  [--duration-s D] [--warmup-s W] [--channels C] [--daemon-pid PID] [--token T]\n");
      return 0;
    }
    const std::string v = argv[i + 1];
    if (k == "--target")
      o.target = v;
    else if (k == "--http-port")
      o.http_port = std::stoi(v);
    else if (k == "--ranks")
      o.ranks = std::stoi(v);
    else if (k == "--jobs")
      o.jobs = std::stoi(v);
    else if (k == "--mode")
      o.mode = v;
    else if (k == "--interval-ms")
      o.interval_ms = std::stoi(v);
    else if (k == "--records-per-batch")
      o.records_per_batch = std::stoi(v);
    else if (k == "--sigs")
      o.sigs = std::stoi(v);
    else if (k == "--duration-s")
      o.duration_s = std::stoi(v);
    else if (k == "--warmup-s")
      o.warmup_s = std::stoi(v);
    else if (k == "--channels")
      o.channels = std::stoi(v);
    else if (k == "--daemon-pid")
      o.daemon_pid = std::stoi(v);
    else if (k == "--token")
      o.token = v;
    else {
      std::fprintf(stderr, "flare-loadgen: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  const long rss0 = o.daemon_pid ? rssKb(o.daemon_pid) : 0;
  const int nch = o.channels > 0 ? o.channels : std::max(1, o.ranks / 100);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Ingest::Stub>> stubs;
  for (int c = 0; c < nch; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("flare.loadgen.channel", c);  // distinct subchannels: one connection each
    args.SetMaxSendMessageSize(64 << 20);
    channels.push_back(
        grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(v1::Ingest::NewStub(channels.back()));
  }
  const int per_job = std::max(1, o.ranks / std::max(1, o.jobs));
  std::vector<std::unique_ptr<RankStream>> streams;
  const auto t_connect = std::chrono::steady_clock::now();
  for (int r = 0; r < o.ranks; ++r) {
    const int job = r / per_job;
    streams.push_back(std::make_unique<RankStream>(
        stubs[r % nch].get(), o, "loadgen-" + std::to_string(job), r % per_job, per_job));
  }
  while (g_acks + g_refused < static_cast<uint64_t>(o.ranks) &&
         std::chrono::steady_clock::now() - t_connect < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double connect_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_connect).count();
  std::printf("connected: %llu accepted, %llu refused in %.1f s over %d channels\n",
              static_cast<unsigned long long>(g_acks.load()),
              static_cast<unsigned long long>(g_refused.load()), connect_s, nch);
  std::fflush(stdout);

  std::atomic<bool> stop{false};
  std::thread driver([&] {
    if (o.mode == "raw") return;  // the closed loop runs in OnWriteDone
    auto next = std::chrono::steady_clock::now();
    while (!stop) {
      for (auto& s : streams) s->maybeSend();
      next += std::chrono::milliseconds(o.interval_ms);
      std::this_thread::sleep_until(next);
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(o.warmup_s));
  const Sample a = scrape(o.http_port);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(o.duration_s));
  const Sample b = scrape(o.http_port);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long rss1 = o.daemon_pid ? rssKb(o.daemon_pid) : 0;
  stop = true;
  driver.join();
  for (auto& s : streams) s->stop();
  for (auto& s : streams) s->waitDone();

  const double kernels_s = (b.kernels - a.kernels) / dt;
  const double summarized_s = (b.summarized - a.summarized) / dt;
  const double batches_s = (b.batches - a.batches) / dt;
  std::printf("mode=%s ranks=%d sigs=%d window=%.1fs\n", o.mode.c_str(), o.ranks, o.sigs, dt);
  std::printf("daemon accepted: %.0f batches/s, %.0f kernel records/s, %.0f summarized kernels/s\n",
              batches_s, kernels_s, summarized_s);
  std::printf("daemon rejected (rate limit) during window: %.0f; store dropped: %.0f\n",
              b.rejected_rate - a.rejected_rate, b.store_dropped - a.store_dropped);
  std::printf("client: %llu batches written, %llu batch rejections, %llu stream errors\n",
              static_cast<unsigned long long>(g_batches.load()),
              static_cast<unsigned long long>(g_rejected.load()),
              static_cast<unsigned long long>(g_errors.load()));
  if (o.daemon_pid) {
    std::printf("daemon RSS: %.1f MiB before, %.1f MiB with %d ranks: %.1f KiB per rank\n",
                rss0 / 1024.0, rss1 / 1024.0, o.ranks, static_cast<double>(rss1 - rss0) / o.ranks);
  }
  return 0;
}
